"""The report schema (infodiff/evaluation/report.py): report.json, report.txt and docs/report.md's
key tables agree with the dataclasses, for real reports of each kind (network, oracle, input)."""

import copy
import dataclasses
import json
import os
import shutil

import pytest

from infodiff import evaluation, tasks, training
from infodiff.evaluation import report as report_lib
from tests.test_evaluation import _check_bound

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "report.md")


def assert_report_agrees(rep: dict) -> None:
    """Every key of ``rep`` is a declared field of its kind, every required field is there (rows
    too: :func:`report.check_report`), every field appears in report.txt (its row or lines, the
    field whose row shows it, or the last line ``also in report.json: ...``) and in
    docs/report.md's key tables. Raises AssertionError naming what disagrees."""
    problems = report_lib.check_report(rep)
    assert not problems, problems
    schema = report_lib.KINDS[rep["kind"]]
    text = report_lib.format_report(rep)
    assert max(len(line) for line in text.splitlines()) <= report_lib.WIDTH, text
    lines = text.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("also in report.json: ")]
    last = " ".join(lines[at[0]:]) if at else lines[-1]  # its names wrapped to 100 columns
    only_json = [n.strip() for n in last.removeprefix("also in report.json: ").split(",")] if at else []
    flat = "".join(text.split())  # long lines are wrapped: compared without whitespace
    fields = {f.name: f for f in schema.keys()}
    with open(DOCS, encoding="utf-8") as f:
        docs = f.read()
    for name in rep:
        how = schema.text(fields[name])
        if isinstance(how, report_lib.Rows):
            for label, _ in how.render(rep):
                assert label in text, (name, label)
        elif isinstance(how, report_lib.Lines):
            for line in how.render(rep):
                assert "".join(line.split()) in flat, (name, line)
        elif isinstance(how, report_lib.Shown):
            target = how.key
            assert target == "title" or (target in rep and isinstance(
                schema.text(fields[target]), (report_lib.Rows, report_lib.Lines))), (name, target)
        else:
            assert name in only_json, (name, last)
        assert f"| `{name}` |" in docs, f"{name} is not in docs/report.md's tables"
    assert text.splitlines()[0] == schema.TITLE
    assert json.loads(json.dumps(report_lib.strict_json(rep), allow_nan=False))["kind"] == rep["kind"]


def _must_fail(rep: dict, match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        assert_report_agrees(rep)


def assert_flags_bad_copies(rep: dict) -> None:
    """The check can fail: an undeclared key, a missing required field, an undeclared key in a
    row are each named."""
    bad = copy.deepcopy(rep)
    bad["nll_bound"] = 1.0  # a field another issue adds, not yet declared
    _must_fail(bad, "nll_bound: not a field of")
    bad = copy.deepcopy(rep)
    del bad["seed"]
    _must_fail(bad, "seed: required by")
    rows_key = {"oracle": "results", "input": "rows_preview"}.get(rep["kind"])
    if rows_key:
        bad = copy.deepcopy(rep)
        row = bad["results"]["unconditional"][0] if rows_key == "results" else bad["rows_preview"][0]
        row["zz_undeclared"] = 0
        _must_fail(bad, r"(results\[0\]\.unconditional|rows_preview)\[0\]\.zz_undeclared: not a field of")


# ---------------------------------------------------------------------------------------------
# The schema alone
# ---------------------------------------------------------------------------------------------
def test_docs_tables_are_generated_from_the_schema(tmp_path):
    """docs/report.md's key tables equal report.docs_tables() (python scripts/report_docs.py
    writes them); an edited table is detected, and rewriting restores it."""
    assert report_lib.write_docs(DOCS, check=True), "run: python scripts/report_docs.py"
    edited = tmp_path / "report.md"
    shutil.copy(DOCS, edited)
    edited.write_text(edited.read_text().replace("| `nll_stderr` |", "| `nll_se` |"))
    assert not report_lib.write_docs(str(edited), check=True)
    assert not report_lib.write_docs(str(edited))  # rewritten
    assert edited.read_text() == open(DOCS, encoding="utf-8").read()
    edited.write_text("# no markers\n")
    with pytest.raises(ValueError, match="schema:common"):
        report_lib.write_docs(str(edited))


SCHEMAS = list(dict.fromkeys([*report_lib.KINDS.values(), *(s for v in report_lib.DOC_TABLES.values() for s in v)]))


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_every_field_is_documented_and_shown(schema):
    """Each field has a one-line description and appears in a docs table; in a report kind, each
    field is shown in report.txt (a row, lines, or with a field that is) or named as
    report.json-only; a field is declared once (no two kinds' tables disagree on a shared one)."""
    tables = report_lib.docs_tables()
    docs = "\n".join(tables.values())
    for f in dataclasses.fields(schema):
        doc = f.metadata["doc"]
        assert doc and "\n" not in doc, f.name
        assert f"| `{f.name}` |" in docs, f.name
        how = schema.text(f)
        assert how is None or isinstance(how, (report_lib.Rows, report_lib.Lines, report_lib.Shown)), f.name
        if schema in report_lib.KINDS.values() and isinstance(how, report_lib.Shown) and how.key != "title":
            assert isinstance(schema.text(schema.__dataclass_fields__[how.key]),
                              (report_lib.Rows, report_lib.Lines)), (f.name, how.key)


def test_constructor_rejects_an_undeclared_field():
    """A report is built by its dataclass: a key it does not declare is a TypeError at once."""
    with pytest.raises(TypeError, match="nll_bound"):
        report_lib.OracleRow(nll_bound=1.0)
    row = report_lib.SamplerCheck(steps=[1], tv={"a": [0.1]}, num_generate=10, tv_of_exact_sample=0.01)
    assert list(row.to_dict()) == ["steps", "tv", "num_generate", "tv_of_exact_sample"]  # optional w1 left out


def test_bound_values_are_declared_in_one_place():
    """``bound`` takes only a key of report.BOUNDS (each described, each with a report.txt label);
    an oracle row says ``exact``; a row or report built with another value is refused, naming the
    choices (the same check in every schema with a ``bound``: Schema.__post_init__)."""
    import numpy as np

    from infodiff import likelihood as lk

    assert set(report_lib.BOUNDS) == set(report_lib.BOUND_LABELS) >= {"exact", "nelbo", "nelbo_difference"}
    assert all(d and "\n" not in d for d in report_lib.BOUNDS.values())
    rng = np.random.default_rng(0)
    est = lk.Estimate("k_dce", rng.normal(5.0, 1.0, (3, 8)), forward_passes=8)
    row = report_lib.oracle_row(est, np.full(3, 5.0))
    assert row["bound"] == "exact" and not report_lib.check_report(row, report_lib.OracleRow)
    with pytest.raises(ValueError, match="bound='nll' is not one of"):
        report_lib.OracleRow(**{**row, "bound": "nll"})


def test_legacy_key_tuples_follow_the_schema():
    """COMMON_KEYS, NETWORK_KEYS, ... (older tests and readers) are the schema's required keys."""
    assert set(report_lib.COMMON_KEYS) == {"version", "kind", "process", "units", "plots", "experiment", "seed",
                                           "wall_time_s", "env", "argv", "git", "config", "provenance"}
    assert "nll" in report_lib.NETWORK_KEYS and "cleaning" not in report_lib.INPUT_KEYS
    assert "stderr_at_1024_forward_passes" in report_lib.ROW_KEYS


# ---------------------------------------------------------------------------------------------
# Real reports
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_oracle_report_agrees(tmp_path):
    from configs import oracle_tabular

    c = oracle_tabular.get_config()
    c.eval.output_dir, c.eval.num_samples, c.eval.num_sequences = str(tmp_path), 16, 2
    rep, _ = evaluation.evaluate(c, None)
    assert_report_agrees(rep)
    assert_flags_bad_copies(rep)
    _check_bound(rep)  # every row: bound "exact"
    assert "table" in rep and "lam_max" not in rep  # optional fields: present only where they apply


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from tests.test_evaluation import _masked

    cfg = _masked()
    wd = str(tmp_path_factory.mktemp("schema_run") / "run")
    training.train(tasks.make_task(cfg), wd)
    return cfg, wd


def test_network_report_agrees(tiny_run):
    cfg, wd = tiny_run
    rep, _ = evaluation.evaluate(cfg, wd)
    assert_report_agrees(rep)
    assert_flags_bad_copies(rep)
    assert rep["bound"] == "nelbo" and rep["units"]["nll"] == "nats per sequence"
    _check_bound(rep)
    meta = training.load_meta(wd)  # provenance: the checkpoint and split evaluated
    assert rep["provenance"]["checkpoint"] == {"step": rep["checkpoint_step"], "state_sha256": meta["state_sha256"]}
    assert rep["provenance"]["data"]["sha256"] == rep["data"]["checksum"] is not None


@pytest.mark.parametrize("kind", ["text", "ratios"])
def test_input_report_agrees(tiny_run, tmp_path, kind):
    from ml_collections import ConfigDict

    _, wd = tiny_run
    cfg = ConfigDict(training.saved_config(wd))
    if kind == "text":
        path = tmp_path / "docs.txt"
        path.write_text("the cat sat on the mat\nThe dog ate 42 hats!\n")
        cfg.eval.target_se = 50.0  # adds target_se, target_se_reached, max_samples_per_window
    else:
        path = tmp_path / "ab.jsonl"
        path.write_text(json.dumps({"prompt": "the cat", "a": "sat on", "b": "ate a"}) + "\n")
    cfg.eval.input = str(path)
    rep, _ = evaluation.evaluate(cfg, wd)
    assert rep["input"]["format"] == kind
    assert_report_agrees(rep)
    assert_flags_bad_copies(rep)
    assert ("cleaning" in rep) and (("target_se" in rep) == (kind == "text"))
    assert rep["bound"] == {"text": "nelbo", "ratios": "nelbo_difference"}[kind] and rep["units"]["nll"] == "nats per row"
    _check_bound(rep)
    assert rep["provenance"]["data"] == {"path": rep["input"]["path"], "sha256": rep["input"]["sha256"]}
    assert rep["provenance"]["checkpoint"]["state_sha256"] == training.load_meta(wd)["state_sha256"]


@pytest.mark.slow
def test_counts_input_report_agrees(tmp_path):
    """A Poisson run scoring a .npy of counts: the input report without text fields (no
    cleaning, rows with dims and bits_per_dim)."""
    import numpy as np

    from tests.test_evaluation import _poisson

    c = _poisson()
    wd = str(tmp_path / "run")
    training.train(tasks.make_task(c), wd)
    f = tmp_path / "counts.npy"
    np.save(f, np.array([[0], [3], [7]]))
    c.eval.input = str(f)
    rep, _ = evaluation.evaluate(c, wd)
    assert rep["input"]["format"] == "counts" and "cleaning" not in rep
    assert_report_agrees(rep)
    assert_flags_bad_copies(rep)
