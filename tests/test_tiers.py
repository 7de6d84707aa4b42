"""The fast tier, ``pytest -m "not slow"`` (README "Tests"): the ``slow`` marker is registered with
strict markers (a misspelt mark is an error, not a test silently kept in the fast tier), and every
test module keeps at least one test outside ``slow``, so the edit loop still runs every module."""

import ast
import pathlib
import tomllib

from tests._source import parse_source

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted((ROOT / "tests").glob("test_*.py"))
# Modules whose every test is slow, and where the fast tier covers what they check.
ALL_SLOW = {
    "test_poisson_calibration.py": "SE calibration over 1640 oracle cases; test_poisson.py holds the estimator to 4 SE",
    "test_trained_model_estimators.py": "trains a model; test_processes.py runs every estimator against exact values",
    "test_pretrained_sharded.py": "a subprocess with 2 host devices; test_pretrained_run.py loads the same weights whole",
}


def _marks_slow(expr: ast.expr) -> bool:
    """True for ``pytest.mark.slow`` (also called, or in a list / tuple of marks)."""
    if isinstance(expr, (ast.List, ast.Tuple)):
        return any(_marks_slow(e) for e in expr.elts)
    if isinstance(expr, ast.Call):
        expr = expr.func
    return isinstance(expr, ast.Attribute) and expr.attr == "slow" and ast.unparse(expr.value).endswith("mark")


def _tests(body, slow: bool):
    """(name, marked slow) of every test function in a module's or class's body."""
    for node in body:
        marked = slow or any(_marks_slow(d) for d in getattr(node, "decorator_list", ()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            yield node.name, marked
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from _tests(node.body, marked)


def _module_tests(tree: ast.Module):
    """(name, marked slow) of every test of a module, a module-wide ``pytestmark`` included."""
    slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)
               and _marks_slow(n.value) for n in tree.body)
    return list(_tests(tree.body, slow))


def test_the_slow_marker_is_registered_and_markers_are_strict():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "slow" in [m.split(":")[0].strip() for m in options["markers"]]
    assert "--strict-markers" in options["addopts"].split()


def test_every_test_module_keeps_a_fast_test():
    assert len(MODULES) > 30
    all_slow = [path.name for path in MODULES
                if (tests := _module_tests(parse_source(path))) and all(slow for _, slow in tests)]
    assert sorted(all_slow) == sorted(ALL_SLOW), (
        f"modules with every test marked slow: {all_slow}; keep a fast one for pytest -m 'not slow' "
        f"or say in ALL_SLOW what covers them")


def test_the_slow_mark_is_seen_wherever_it_is_written():
    source = '''
import pytest
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
def test_a(): pass
'''
    assert _module_tests(ast.parse(source)) == [("test_a", True)]
    tree = ast.parse('''
import pytest
@pytest.mark.slow
def test_a(): pass
@pytest.mark.parametrize("x", [1])
def test_b(x): pass
@pytest.mark.slow
class TestC:
    def test_d(self): pass
''')
    assert _module_tests(tree) == [("test_a", True), ("test_b", False), ("test_d", True)]
