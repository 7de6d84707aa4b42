"""pyproject.toml declares what the library imports: `pip install -e .` gives a working infodiff.

Every third-party module imported by infodiff/ and the entry points train.py / evaluate.py
(at module level or inside a function) must come from a declared dependency, no declared
dependency may be unused, and each lower bound is the version pinned in requirements.txt.
"""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

from tests._source import parse_source

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIRST_PARTY = {"infodiff", "configs", "experiments"}
# Imported by jax, not by infodiff; declared so that the tested jaxlib comes with it.
BACKENDS = {"jaxlib"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(spec: str) -> tuple[str, str, str]:
    """'orbax-checkpoint>=0.12.8' -> ('orbax-checkpoint', '>=', '0.12.8')."""
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(==|>=)\s*([^\s;#]+)\s*", spec)
    assert m, f"unexpected requirement {spec!r}"
    return _canonical(m.group(1)), m.group(2), m.group(3)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} over infodiff/, train.py and evaluate.py."""
    files = sorted((ROOT / "infodiff").rglob("*.py")) + [ROOT / "train.py", ROOT / "evaluate.py"]
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_runtime_import_is_a_declared_dependency():
    project = _project()
    declared = {_requirement(s)[0] for s in project["dependencies"]}
    # an extra's packages are imported only by its module (infodiff/harness.py: lm-eval; the
    # metric mirrors of config.train.log_to: tensorboard, wandb)
    owners = {"harness": "infodiff/harness.py", "tensorboard": "infodiff/training/sinks.py",
              "wandb": "infodiff/training/sinks.py"}
    extras = {_requirement(s)[0]: extra for extra in owners for s in project["optional-dependencies"][extra]}
    dists = importlib.metadata.packages_distributions()
    imported = set()
    for module, users in sorted(_third_party_imports().items()):
        names = {_canonical(d) for d in dists.get(module, [])}
        if not names and _canonical(module) in extras:  # an extra not installed here (wandb)
            names = {_canonical(module)}
        assert names, f"{module} (imported by {sorted(users)}) is not installed: which package provides it?"
        if names & set(extras):
            extra = extras[sorted(names & set(extras))[0]]
            assert users == {owners[extra]}, f"{module} (the {extra} extra) is imported by {sorted(users)}"
            continue
        assert names & declared, f"{module} (imported by {sorted(users)}) comes from {names}: not in pyproject.toml"
        imported |= names & declared
    assert declared - imported - BACKENDS == set(), "declared in pyproject.toml but never imported"


def test_lower_bounds_are_the_requirements_pins():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, op, version = _requirement(line)
            assert op == "==", line
            pins[name] = version
    project = _project()
    # wandb (the wandb extra) is not pinned: not installed for the tests, its test skips without it
    specs = [*project["dependencies"], *project["optional-dependencies"]["test"],
             *project["optional-dependencies"]["harness"], *project["optional-dependencies"]["tensorboard"]]
    bounds = {}
    for spec in specs:
        name, op, version = _requirement(spec)
        assert op == ">=", f"{spec}: a lower bound, the pin stays in requirements.txt"
        bounds[name] = version
    assert bounds == pins  # every pin is declared (pytest, lm-eval under their extras), at its version
    assert [_requirement(s)[0] for s in project["optional-dependencies"]["test"]] == ["pytest", "pytest-xdist"]
