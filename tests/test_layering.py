"""Layering of the library: processes never import the estimator layer; no module imports or uses
a private name of another module; matplotlib is imported only where a plot is drawn; no import
cycle between modules, lazy imports inside functions included."""

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
    # experiments/paper.py draws results.png (the paper's experiments, shipped for infodiff-experiment)
    assert users == ["infodiff/evaluation/plots.py", "infodiff/experiments/paper.py"], users


# ---------------------------------------------------------------------------------------------
# The process registry: one reader of config.process.name, no upward import, no module argument
# ---------------------------------------------------------------------------------------------
# Each top-level part of the library and its layer; a module imports only its own layer or lower.
LAYERS = {
    "validation": 0, "schedules": 0, "denoisers": 0, "interrupts": 0, "supervise": 0, "files": 0,
    "config_rules": 0, "provenance": 0, "configs": 0, "progress": 0,
    "processes": 1, "oracles": 1, "count_oracles": 1, "parallel": 1,
    "likelihood": 2, "orders": 2, "networks": 2, "data": 2, "poisson_moments": 2,
    "tasks": 3,
    "training": 4, "evaluation": 4, "scoring": 4, "external": 4, "compare": 4, "config_usage": 4, "choices": 4,
    "windows": 4,
    "pretrained": 4,  # released checkpoints: ports (JAX), their files, and Runs over them (scoring, external)
    "harness": 6,
    "cli": 5, "__init__": 5,
    "commands": 6, "experiments": 6, "__main__": 6,  # the installed commands; the paper's experiments (public API only)
}


def _sources(paths):
    """(name shown, part of infodiff, AST) of each library file."""
    return [(str(p.relative_to(ROOT)), p.relative_to(ROOT / "infodiff").parts[0].removesuffix(".py"), _tree(p))
            for p in paths]


def _infodiff_imports(tree) -> list[tuple[int, str]]:
    """(line, imported part of infodiff) of every import, also those inside functions."""
    out = []
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [f"{node.module}.{a.name}" for a in node.names] if node.module == "infodiff" else [node.module]
        out += [(node.lineno, m.split(".")[1]) for m in mods if m.startswith("infodiff.")]
    return out


def upward_imports(sources) -> list[str]:
    """'file:line: part (layer) imports part (layer)' for every import of a higher layer, and
    'file: ... not in LAYERS' for a part without a layer."""
    bad = []
    for where, me, tree in sources:
        if me not in LAYERS:
            bad.append(f"{where}: {me!r} is not in LAYERS (give it a layer)")
            continue
        for line, other in _infodiff_imports(tree):
            if other != me and LAYERS.get(other, 99) > LAYERS[me]:
                bad.append(f"{where}:{line}: {me} ({LAYERS[me]}) imports {other} ({LAYERS.get(other)})")
    return bad


def str_consts(node) -> list[str]:
    """The str constants of ``node``: itself, or those a tuple / list / set holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for e in node.elts for v in str_consts(e)]
    return []


def compared_with(node, names) -> list[str]:
    """The names of ``names`` that ``node`` compares with, if it is a comparison."""
    if not isinstance(node, ast.Compare):
        return []
    return [v for e in (node.left, *node.comparators) for v in str_consts(e) if v in names]


def process_name_uses(sources, names) -> list[str]:
    """'file:line: ...' for every comparison with a registered process name (a str constant, or
    a tuple / list / set holding one) and every read of ``<x>.process.name`` /
    ``<x>.process['name']`` / ``<x>.process.get('name')``."""
    bad = []

    consts = str_consts

    def is_process(node):  # config.process (a report's r["process"]["name"] is its own field)
        return isinstance(node, ast.Attribute) and node.attr == "process"

    for where, _, tree in sources:
        for node in ast.walk(tree):
            if hit := compared_with(node, names):
                bad.append(f"{where}:{node.lineno}: compares with the process name {hit[0]!r}")
            elif isinstance(node, ast.Attribute) and node.attr == "name" and is_process(node.value):
                bad.append(f"{where}:{node.lineno}: reads .process.name")
            elif isinstance(node, ast.Subscript) and consts(node.slice) == ["name"] and is_process(node.value):
                bad.append(f"{where}:{node.lineno}: reads .process['name']")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and is_process(node.func.value) and node.args and consts(node.args[0]) == ["name"]):
                bad.append(f"{where}:{node.lineno}: reads .process.get('name')")
    return bad


def module_arguments(sources) -> list[str]:
    """'file:line: ...' for every call that passes a module of the library (a name bound by
    ``import infodiff...`` or ``from infodiff... import module``), or ``sys.modules[...]``.
    (numpy / jax.numpy as an array namespace argument is an idiom, not this.)"""
    import importlib.util

    bad = []
    for where, _, tree in sources:
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("infodiff")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("infodiff"):
                for a in node.names:
                    try:
                        is_module = importlib.util.find_spec(f"{node.module}.{a.name}") is not None
                    except (ImportError, ValueError):
                        is_module = False
                    if is_module:
                        modules.add(a.asname or a.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or (isinstance(node.func, ast.Name) and node.func.id == "getattr"):
                continue  # getattr(module, name): a lazy attribute, not a module handed to code
            for arg in (*node.args, *(k.value for k in node.keywords)):
                if isinstance(arg, ast.Name) and arg.id in modules:
                    bad.append(f"{where}:{node.lineno}: passes the module {arg.id!r}")
                elif (isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Attribute)
                      and arg.value.attr == "modules"):
                    bad.append(f"{where}:{node.lineno}: passes sys.modules[...]")
    return bad


def test_no_upward_import():
    bad = upward_imports(_sources(LIB))
    assert not bad, bad


def test_process_names_are_read_and_compared_only_in_the_registry():
    from infodiff import tasks

    # configs/ set config.process.name (the value the registry reads)
    outside = [p for p in LIB if p.relative_to(ROOT / "infodiff").parts[0] not in ("tasks", "configs")]
    bad = process_name_uses(_sources(outside), set(tasks.REGISTRY))
    assert not bad, bad


def test_no_module_is_passed_as_an_argument():
    bad = module_arguments(_sources(LIB))
    assert not bad, bad


def test_the_registry_checks_fail_on_what_they_guard():
    """Each check flags a file that breaks its rule (so an empty result means something)."""
    src = ast.parse(
        "import sys\n"
        "from infodiff import tasks\n"
        "from infodiff.processes import masked\n"
        "def f(config, kind, oracle_cases):\n"
        "    if kind == 'poisson' or kind in ('a', 'sedd'):\n"
        "        return config.process.name, config.process.get('name'), config.process['name']\n"
        "    oracle_cases.build(config, sys.modules[__name__])\n"
        "    return g(masked)\n")
    fake = [("infodiff/processes/fake.py", "processes", src)]
    assert [b.split(": ", 1)[1] for b in upward_imports(fake)] == ["processes (1) imports tasks (3)"]
    assert len(process_name_uses(fake, {"poisson", "sedd"})) == 5
    assert len(module_arguments(fake)) == 2
    assert upward_imports([("x.py", "newpart", ast.parse(""))])  # a part without a layer


# ---------------------------------------------------------------------------------------------
# The query registry: an input kind's name is compared only in its own file
# ---------------------------------------------------------------------------------------------
def input_kind_uses(sources, names) -> list[str]:
    """'file:line: ...' for every comparison with an input-kind name (a str constant, or a tuple /
    list / set holding one) and every dict literal keyed by kind names that is indexed or read
    with ``.get`` (``{"text": ..., "pairs": ...}[kind]``): a switch on the kind."""
    bad = []

    consts = str_consts

    def kind_keys(node):
        return isinstance(node, ast.Dict) and [v for k in node.keys if k is not None for v in consts(k) if v in names]

    for where, _, tree in sources:
        for node in ast.walk(tree):
            if hit := compared_with(node, names):
                bad.append(f"{where}:{node.lineno}: compares with the input kind {hit[0]!r}")
            elif isinstance(node, ast.Subscript) and kind_keys(node.value):
                bad.append(f"{where}:{node.lineno}: indexes a dict keyed by input kinds")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and kind_keys(node.func.value)):
                bad.append(f"{where}:{node.lineno}: reads a dict keyed by input kinds")
    return bad


def test_input_kinds_are_compared_only_in_their_own_query_files():
    from infodiff.evaluation import queries

    outside = [p for p in LIB if "queries" not in p.relative_to(ROOT / "infodiff").parts]
    bad = input_kind_uses(_sources(outside), set(queries.REGISTRY))
    assert not bad, bad


def test_the_input_kind_check_fails_on_a_planted_switch():
    """A synthetic module that switches on kinds the way evaluation/inputs.py, plots.py,
    comparison.py and report.py did before the query registry: every switch is flagged."""
    src = ast.parse(
        "def f(kind, cols, r):\n"
        "    if kind == 'choices' or r['input']['format'] in ('counts', 'x'):\n"
        "        return None\n"
        "    names = {'text': ('text',), 'pairs': ('response',)}[kind]\n"
        "    key = {'counts': 'eval.num_samples'}.get(kind, 'eval.input_samples')\n"
        "    return cols['text'] if kind != 'text' else names, key, {'text': 1}\n")
    fake = [("infodiff/evaluation/fake.py", "evaluation", src)]
    found = input_kind_uses(fake, {"text", "pairs", "ratios", "choices", "counts"})
    assert [b.split(": ", 1)[1] for b in sorted(found, key=lambda b: int(b.split(":")[1]))] == [
        "compares with the input kind 'choices'", "compares with the input kind 'counts'",
        "indexes a dict keyed by input kinds", "reads a dict keyed by input kinds",
        "compares with the input kind 'text'"], found


# ---------------------------------------------------------------------------------------------
# No import cycle between modules (also inside one layer, where test_no_upward_import is blind)
# ---------------------------------------------------------------------------------------------
def module_name(path) -> str:
    """'infodiff.a.b' of infodiff/a/b.py ('infodiff.a' of infodiff/a/__init__.py)."""
    parts = list(pathlib.Path(path).relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(modules, packages=()) -> dict[str, set[str]]:
    """{module: the library modules it imports} over ``modules`` ({dotted name: AST}), imports
    inside functions included. ``from infodiff.a import b`` is an edge to ``infodiff.a.b`` when
    that is a module, else to ``infodiff.a``. A package's (a name in ``packages``) edges to its
    own submodules are left out: the facade that imports its members to register or re-export
    them is not a cycle."""
    graph = {}
    for me, tree in modules.items():
        package = me if me in packages else None
        edges = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            for t in targets:
                while t not in modules and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != me and not (package and t.startswith(package + ".")):
                    edges.add(t)
        graph[me] = edges
    return graph


def cycles(graph) -> list[list[str]]:
    """The import cycles of ``graph``: one list of modules per strongly connected component with
    more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    modules = {module_name(p): _tree(p) for p in LIB}
    found = cycles(import_graph(modules, {module_name(p) for p in LIB if p.name == "__init__.py"}))
    assert not found, found


def test_the_cycle_check_fails_on_a_cycle_inside_one_layer():
    """A synthetic graph: scoring -> choices -> scoring (both layer 4, so the upward check is
    blind to it) is found, with a lazy import on one side; a package facade is not a cycle."""
    mods = {
        "infodiff.scoring": ast.parse("from infodiff import likelihood\n"
                                      "def choose():\n    from infodiff import choices\n"),
        "infodiff.choices": ast.parse("from infodiff import scoring, likelihood\n"),
        "infodiff.likelihood": ast.parse("import numpy\n"),
        "infodiff.tasks": ast.parse("from infodiff.tasks import masked\n"),
        "infodiff.tasks.masked": ast.parse("from infodiff.tasks import register\n"),
    }
    assert LAYERS["scoring"] == LAYERS["choices"]
    assert not upward_imports([(f"{m}.py", m.split(".")[1], t) for m, t in mods.items()])
    assert cycles(import_graph(mods, {"infodiff.tasks"})) == [["infodiff.choices", "infodiff.scoring"]]
    assert cycles(import_graph(mods)) == [["infodiff.choices", "infodiff.scoring"],
                                          ["infodiff.tasks", "infodiff.tasks.masked"]]
    del mods["infodiff.scoring"]
    assert cycles(import_graph(mods, {"infodiff.tasks"})) == []
