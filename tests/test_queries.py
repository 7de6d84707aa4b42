"""The query registry (infodiff/evaluation/queries/): contract tests generated from it, and a
throwaway input kind registered from this file that is detected, scored and reported with no
library edit (a new input kind is one file and its test)."""

import dataclasses
import json

import ml_collections
import pytest

from infodiff import config_usage
from infodiff.evaluation import inputs, queries

KINDS = sorted(queries.REGISTRY)


def test_the_five_input_kinds_are_registered():
    assert {"text", "pairs", "ratios", "choices", "counts"} <= set(KINDS)


@pytest.mark.parametrize("name", KINDS)
def test_a_kind_detects_and_reads_its_own_sample(name, tmp_path):
    q = queries.REGISTRY[name]
    path = q.sample(str(tmp_path))
    assert path.endswith(q.extension)
    assert queries.detect(path, q.input_format) is q
    assert len(q.load(path)) >= 1
    if q.input_format == "text":  # the shared reader names the kind it read
        assert inputs.read_input(path)[0] == name


@pytest.mark.parametrize("name", KINDS)
def test_a_kind_refuses_a_malformed_file_in_one_line(name, tmp_path):
    q = queries.REGISTRY[name]
    path = q.malformed(str(tmp_path))
    with pytest.raises(ValueError) as e:
        q.load(path)
    assert "\n" not in str(e.value) and str(e.value)


def _config(path, **eval_keys) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.eval = ml_collections.ConfigDict({"input": str(path), "target_se": 0.0, **eval_keys})
    return c


@pytest.mark.parametrize("name", [k for k in KINDS if queries.REGISTRY[k].input_format == "text"])
def test_a_kinds_declared_keys_are_the_ones_config_usage_accepts(name, tmp_path):
    """Every conditional input key is accepted for a file of this kind exactly when the kind
    declares it (infodiff.config_usage.CONDITIONAL reads the registry's detection)."""
    q = queries.REGISTRY[name]
    cfg = _config(q.sample(str(tmp_path)))
    rules = {r.key: r for r in config_usage.CONDITIONAL if r.key in queries.INPUT_KEYS + ("eval.limit",)}
    assert set(rules) == set(queries.INPUT_KEYS + ("eval.limit",))
    cfg.eval.target_se = 0.01  # eval.input_max_samples is read only with a target SE
    accepted = {k for k, r in rules.items() if r.test(cfg)}
    assert accepted == set(q.config_keys), (name, accepted)


def test_no_input_reads_no_input_key():
    cfg = _config("")
    assert not any(queries.reads_key(cfg, k) for k in queries.INPUT_KEYS + ("eval.limit",))


def test_an_unclaimed_jsonl_is_read_by_the_shared_reader_which_names_the_line(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"prompt": "a", "x": "b"}) + "\n")
    assert queries.detect(str(path)) is None
    with pytest.raises(ValueError, match=r"odd\.jsonl:1: keys \['prompt', 'x'\]"):
        inputs.read_input(str(path))


# ---------------------------------------------------------------------------------------------
# A throwaway input kind, registered from this test: {"prefix", "middle", "suffix"} rows scored as
# -log p(middle | prefix) through the shared text scorer. Nothing in infodiff/ names it.
# ---------------------------------------------------------------------------------------------
INFILL = queries.Query(
    name="test_infill", extension=".jsonl", input_format="text", evaluate=inputs.evaluate_text,
    score=inputs.score_rows, detects=lambda obj: set(obj) - {"id"} == {"prefix", "middle", "suffix"},
    row_keys=("middle", "prefix", "suffix"), scored=("middle",), shown=("prefix", "middle", "suffix"),
    scoring=inputs.TextScoring(
        quantity="-log p(middle | prefix)",
        estimate=lambda run, ids, cols, tse, per: _infill_estimate(run, ids, cols, tse, per), prompted=False,
        interval_refusal="config.eval.interval=True: {path}: no interval for infill rows"),
    draw=queries.REGISTRY["pairs"].draw, summary_lines=queries.REGISTRY["pairs"].summary_lines,
    preview=queries.REGISTRY["pairs"].preview, config_keys=queries.REGISTRY["pairs"].config_keys,
    compare_refusal="{path}: no --compare for infill rows",
    sample=lambda folder: _write_infill(folder, "infill.jsonl", [
        {"prefix": "the quick ", "middle": "brown fox", "suffix": " jumps"},
        {"id": "b", "prefix": "one two ", "middle": "three", "suffix": " four"}]),
    malformed=lambda folder: _write_infill(folder, "bad_infill.jsonl", [
        {"prefix": "a", "middle": "b", "suffix": "c"}, {"prefix": "a", "middle": 3, "suffix": "c"}]))
INFILL = dataclasses.replace(INFILL, load=lambda path: inputs.read_input(path)[1])


def _infill_estimate(run, ids, cols, tse, per):
    import numpy as np

    est = inputs.row_errors(lambda: run.conditional_nll(cols["prefix"], cols["middle"], target_se=tse), ids)
    chars = np.array([len(run.encode(t)) for t in cols["middle"]])
    return est, chars, inputs.totals(est, chars, per), None


def _write_infill(folder, name, rows):
    from infodiff.evaluation.jsonl import write_rows

    return write_rows(folder, name, rows)


@pytest.fixture
def infill_registered():
    queries.register(INFILL)
    yield INFILL
    del queries.REGISTRY[INFILL.name]


def test_a_throwaway_kind_is_detected_read_and_refused_like_the_others(infill_registered, tmp_path):
    q = infill_registered
    path = q.sample(str(tmp_path))
    assert queries.detect(path) is q
    kind, ids, cols = inputs.read_input(path)
    assert kind == q.name and ids == ["1", "b"] and cols["middle"] == ["brown fox", "three"]
    with pytest.raises(ValueError, match=r"bad_infill\.jsonl:2: 'middle' must be a string"):
        inputs.read_input(q.malformed(str(tmp_path)))
    assert queries.reads_key(_config(path), "eval.input_samples")
    assert not queries.reads_key(_config(path), "eval.choice_samples")


@pytest.mark.slow
def test_a_throwaway_kind_is_scored_and_reported_with_no_library_edit(infill_registered, tmp_path):
    from infodiff import evaluation, training
    from tests.test_training import tiny_config, train_run

    run = tmp_path / "run"
    c = tiny_config()
    c.train.num_steps = 4
    c.train.ckpt_every = 4
    train_run(c, str(run))
    cfg = ml_collections.ConfigDict(training.saved_config(str(run)))
    cfg.eval.input = infill_registered.sample(str(tmp_path))
    cfg.eval.input_samples = 4
    cfg.eval.output_dir = str(tmp_path / "out")
    rep, out = evaluation.evaluate(cfg, str(run))
    assert rep["input"]["format"] == "test_infill" and rep["quantity"] == "-log p(middle | prefix)"
    assert [r["id"] for r in rep["rows_preview"]] == ["1", "b"]
    assert all(r["value"] > 0 and r["se"] >= 0 and r["middle"] for r in rep["rows_preview"])
    text = evaluation.format_report(rep)
    assert "bits per character" in text and "first 2 of 2 rows" in text
    evaluation.write_report(rep, out)
    rows = [json.loads(ln) for ln in open(f"{out}/rows.jsonl")]
    assert [r["prefix"] for r in rows] == ["the quick ", "one two "]
