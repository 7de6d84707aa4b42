"""The training-curve plot of a network report: evaluate a tiny (resumed) run, check the PNG."""

from __future__ import annotations

import json
import os
import re
import struct

import numpy as np
import pytest

from infodiff import evaluation, tasks, training
from infodiff.evaluation import plots
from tests.test_training import PHRASE, compilation_cache, tiny_config  # noqa: F401

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk of a PNG file; AssertionError if it is not one."""
    head = open(path, "rb").read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def test_training_curves_join_resumed_sessions():
    """wall_time restarts in each session: the joined time axis continues; partial windows and
    a step recorded twice (a finished run started again) are handled."""
    rec = lambda step, split, t, loss, **kw: {"step": step, "split": split, "wall_time": t,  # noqa: E731
                                              "metrics": {"loss": loss, "bpd": loss / 2}, **kw}
    records = [rec(2, "train", 5.0, 9.0), rec(4, "train", 6.0, 8.0), rec(4, "valid", 7.0, 8.5),
               rec(5, "train", 8.0, 7.5, partial=True, first_step=5),  # interrupted at step 5
               rec(6, "train", 3.0, 7.0, partial=True, first_step=6),  # resumed: wall_time from 0
               rec(8, "valid", 4.0, 6.5), rec(8, "valid", 1.0, 6.4),   # started again when done
               {"step": 9}, {"split": "train", "metrics": {}}]         # not curve records
    c = plots.training_curves(records)
    assert c["bits_key"] == "bpd" and c["resumes_s"] == [8.0, 12.0]
    np.testing.assert_array_equal(c["train"]["step"], [2, 4, 5, 6])
    np.testing.assert_array_equal(c["train"]["time_s"], [5, 6, 8, 11])
    np.testing.assert_array_equal(c["train"]["partial"], [False, False, True, True])
    np.testing.assert_array_equal(c["train"]["session"], [0, 0, 0, 1])
    np.testing.assert_array_equal(c["valid"]["session"], [0, 2])
    np.testing.assert_array_equal(c["valid"]["step"], [4, 8])
    np.testing.assert_array_equal(c["valid"]["time_s"], [7, 13])  # the last record of step 8
    np.testing.assert_array_equal(c["valid"]["bits"], [4.25, 3.2])


def test_training_curves_png_refuses_what_it_cannot_draw(tmp_path):
    with pytest.raises(FileNotFoundError):
        plots.training_curves_png(str(tmp_path / "a.png"), str(tmp_path / "metrics.jsonl"))
    (tmp_path / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "split": "train", "wall_time": 1.0, "metrics": {"loss": 3.0, "bpc": 1.0}}) + "\n{torn")
    with pytest.raises(ValueError, match="has no validation records"):
        plots.training_curves_png(str(tmp_path / "a.png"), str(tmp_path / "metrics.jsonl"))
    assert not (tmp_path / "a.png").exists()


@pytest.mark.slow
def test_evaluate_writes_training_curves_beside_the_report(tmp_path):
    text8 = tmp_path / "tiny_text8"
    text8.write_text((PHRASE * 800)[:30000])
    cfg = tiny_config(**{"data.path": str(text8), "train.num_steps": 24, "train.log_every": 2,
                         "train.eval_every": 8, "train.ckpt_every": 4, "eval.num_samples": 2,
                         "eval.max_sequences": 8, "eval.batch_size": 32, "eval.num_generate": 0})
    wd = tmp_path / "run"
    training.train(tasks.make_task(cfg), str(wd), stop_at_step=9)  # interrupted, then resumed
    training.train(tasks.make_task(cfg), str(wd))
    recs = training.read_metrics(str(wd / "metrics.jsonl"))
    assert [r["step"] for r in recs if r["split"] == "valid"] == [8, 16, 24]
    assert any(r.get("partial") for r in recs)

    rep, out = evaluation.evaluate(cfg, str(wd))
    png = str(wd / "training_curves.png")
    assert rep["plots"] == [png] and rep["plot_notes"] == []
    assert not os.path.exists(png)  # drawn into the report's unit: written with report.json, not before
    jpath, tpath = evaluation.write_report(rep, out)
    width, height = _png_size(png)
    assert (width, height) == (1210, 792) and os.path.getsize(png) > 30_000
    assert os.readlink(png) == os.path.join(".reports", "current", "training_curves.png")  # one unit
    assert os.path.dirname(jpath) == os.path.dirname(png)  # beside report.json
    assert json.load(open(jpath))["plots"] == [png]
    assert f"plot:{png}" in re.sub(r"\s+", "", open(tpath).read())  # report.txt wraps at 100 columns
    assert sorted(p.name for p in wd.iterdir() if p.name.endswith(".tmp")) == []
    cfg.eval.overwrite = True  # the report written above is replaced by each evaluation below

    # Without validation records, or without metrics.jsonl, the evaluation goes on, with a note.
    os.remove(png)
    (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs if r["split"] == "train"))
    rep, _ = evaluation.evaluate(cfg, str(wd))
    assert rep["plots"] == [] and not os.path.exists(png)
    assert rep["plot_notes"] == [f"training_curves.png not drawn: {wd / 'metrics.jsonl'} has no validation "
                                 "records (split 'valid'; one is written every train.eval_every steps and "
                                 "at the end of a run)"]
    assert "note: training_curves.png not drawn" in evaluation.format_report(rep)
    os.remove(wd / "metrics.jsonl")
    rep, _ = evaluation.evaluate(cfg, str(wd))
    assert rep["plots"] == [] and "No such file" in rep["plot_notes"][0] and np.isfinite(rep["nll"])
