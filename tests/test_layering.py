"""Layering of the library: processes never import the estimator layer; no module imports or uses
a private name of another module; matplotlib is imported only where a plot is drawn."""

import ast
import pathlib

from tests._source import parse_source

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIB = sorted((ROOT / "infodiff").rglob("*.py"))


def _tree(path):
    return parse_source(path)


def _imported_modules(tree):
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def test_processes_do_not_import_the_estimator_layer():
    for path in (ROOT / "infodiff" / "processes").glob("*.py"):
        mods = _imported_modules(_tree(path)).values()
        bad = [m for m in mods if m.startswith(("infodiff.likelihood", "infodiff.evaluation",
                                                "infodiff.training", "infodiff.tasks"))]
        assert not bad, (path.name, bad)


def test_no_private_name_crosses_a_module_boundary():
    bad = []
    for path in LIB:
        tree = _tree(path)
        mods = _imported_modules(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("infodiff"):
                bad += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_")]
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in mods and mods[node.value.id].startswith("infodiff")
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not bad, bad


def test_matplotlib_only_where_plots_are_drawn():
    users = [p.relative_to(ROOT).as_posix() for p in LIB
             if any(m.startswith("matplotlib") for m in _imported_modules(_tree(p)).values())]
    assert users == ["infodiff/evaluation/plots.py"], users
