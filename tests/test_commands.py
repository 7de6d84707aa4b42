"""The commands (infodiff/commands/): ``--config`` by name or path from any directory, one-line
usage errors, and the installed ``infodiff-*`` entry points run from outside the checkout."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from infodiff import cli

REPO = Path(__file__).resolve().parents[1]
SHIPPED = Path(cli.CONFIG_DIR)
SCRIPTS = {"train.py": "infodiff-train", "evaluate.py": "infodiff-evaluate", "run_experiment.py": "infodiff-experiment"}
TINY = ["--config.model.num_layers=1", "--config.model.width=32", "--config.model.num_heads=2",
        "--config.data.seq_len=16", "--config.train.batch_size=8"]


def test_config_by_name_or_checkout_path_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    masked = str(SHIPPED / "masked_text.py")
    assert cli.resolve_config("masked_text") == masked
    assert cli.resolve_config("masked_text.py") == masked
    assert cli.resolve_config("configs/masked_text.py") == masked
    assert cli.resolve_config("configs/exp_dna128.py:paper") == str(SHIPPED / "exp_dna128.py") + ":paper"
    own = tmp_path / "configs" / "masked_text.py"  # a file that exists is taken as it is
    own.parent.mkdir()
    own.write_text("")
    assert cli.resolve_config("configs/masked_text.py") == "configs/masked_text.py"
    for bad in ("nope", "elsewhere/masked_text.py", "../common", "configs/nope.py:paper"):
        with pytest.raises(FileNotFoundError, match=f"--config {bad}: no such file"):
            cli.resolve_config(bad)
    argv = cli.resolve_config_arg(["p", "--config", "oracle_markov", "--config=masked_text", "--workdir", "w"])
    assert argv == ["p", "--config", str(SHIPPED / "oracle_markov.py"), f"--config={masked}", "--workdir", "w"]


def test_the_checkout_configs_are_the_shipped_ones():
    """configs/ and experiments/ at the root are the package's directories (links), so
    ``--config configs/NAME.py`` and ``from configs import NAME`` read the shipped files."""
    assert (REPO / "configs").resolve() == SHIPPED.resolve()
    assert (REPO / "experiments").resolve() == (REPO / "infodiff" / "experiments").resolve()
    assert {"masked_text", "oracle_markov", "exp_dna128", "saved_run"} <= set(cli.config_names())
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {name: f"infodiff.commands.{m}:run" for name, m in
                       [("infodiff-train", "train"), ("infodiff-evaluate", "evaluate"),
                        ("infodiff-experiment", "experiment"), ("infodiff-lm-eval", "lm_eval"),
                        ("infodiff-export", "export")]}  # docs/harness.md, docs/pretrained.md


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("args", [[], ["runs/x"], ["--workdir", "w", "extra"]])
def test_no_arguments_or_a_positional_one_is_one_line(tmp_path, script, args):
    p = subprocess.run([sys.executable, str(REPO / script), *args], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and p.stdout == "" and len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ") and "give --" in lines[0] and lines[0].endswith("see --help")
    if args:
        assert f"unexpected argument {args[-1]!r}" in lines[0]
    assert len(lines[0]) < 300


@pytest.mark.slow
def test_installed_commands_run_outside_the_checkout(tmp_path):
    """``pip install`` of the checkout (``--target``: no venv to build), then the three commands
    from a directory outside it: usage lines, --help, a 2-step tiny run by config name, its
    evaluation, whose provenance says 'not a git checkout' (the installed copy was run)."""
    src, target = tmp_path / "src", tmp_path / "site"  # a copy: pip's build writes build/ into the tree
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "runs", "results", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    isolation = ["--no-build-isolation"] if _has_wheel() else []
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation, "--target", str(target),
                        str(src)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (target / "infodiff" / "configs" / "masked_text.py").is_file()
    assert (target / "infodiff" / "data" / "chorales.npz").is_file()  # package data read at run time
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(target))

    def run(cmd, *args):
        return subprocess.run([str(target / "bin" / cmd), *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)

    for cmd in SCRIPTS.values():
        p = run(cmd)
        assert p.returncode == 1 and p.stderr.startswith("error: give --"), (cmd, p.stderr)
    p = run("infodiff-evaluate", "--config", "oracle_markov", "--help")
    assert p.returncode == 0 and "config keys of" in p.stdout and "oracle_markov.py" in p.stdout
    p = run("infodiff-train", "--config", "masked_text", *TINY, "--config.train.num_steps=2",
            "--config.train.ckpt_every=2", "--workdir", "run")
    assert p.returncode == 0, p.stderr[-3000:]
    p = run("infodiff-evaluate", "--workdir", "run", "--config.eval.max_sequences=4", "--config.eval.num_generate=0")
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads((work / "run" / "report.json").read_text())
    assert rep["provenance"]["git"] == "not a git checkout" and rep["provenance"]["checkpoint"]["step"] == 2
    assert rep["provenance"]["argv"][1] == str(target / "bin" / "infodiff-evaluate")


@pytest.mark.slow
def test_an_editable_install_is_not_shadowed_by_a_directory_named_infodiff(tmp_path):
    """``pip install -e .``, then Python started in a directory holding a directory ``infodiff``
    without ``__init__.py`` (a checkout's parent; ``~/.cache``, the data cache): ``import infodiff``
    is the package, not an empty namespace package without ``load_run`` (setuptools' editable
    import hook came after the namespace portion; the checkout on sys.path does not)."""
    import site
    import venv

    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "runs", "results", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")  # jax & co. and pip
    isolation = ["--no-build-isolation"] if _has_wheel() else []
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", *isolation, "--prefix", str(env_dir),
                        "-e", str(src)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (tmp_path / "parent" / "infodiff").mkdir(parents=True)
    p = subprocess.run([str(py), "-c", "import infodiff; print(infodiff.__file__, infodiff.load_run.__name__)"],
                       cwd=tmp_path / "parent", capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=""))
    assert p.returncode == 0 and p.stdout.split() == [str(src / "infodiff" / "__init__.py"), "load_run"], p.stderr


def _has_wheel() -> bool:
    """setuptools 65 builds a wheel with the ``wheel`` package: without it in this environment,
    pip builds in an isolated one (from the configured index)."""
    import importlib.util

    return importlib.util.find_spec("wheel") is not None
