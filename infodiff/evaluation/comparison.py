"""``evaluate.py --workdir W1 --compare W2 --config.eval.input=FILE``: score a user's file with
two trained runs and write their per-row difference with a paired SE (:mod:`infodiff.compare`,
docs/scoring.md "Comparing two runs"): report.json / report.txt (kind 'compare', docs/report.md),
rows.jsonl, rows.csv and rows.png in ``W1/scores/<file name>.vs.<W2's name>-<hash>/`` (:func:`out_dir`); a folder that already holds a report is refused unless ``eval.overwrite``.

Run a is W1 with the command line's config (its ``eval.*`` overrides); run b is W2's saved run
with run a's ``eval.use_ema``, ``eval.input_samples`` and, when both runs are of the same process,
``eval.estimator``. Files: ``.txt`` documents or ``.jsonl`` ``{"prompt", "response"}`` pairs
(:func:`infodiff.evaluation.inputs.read_input`); ratio files are refused.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from infodiff import compare as compare_lib
from infodiff import scoring
from infodiff.evaluation import inputs, plots, queries
from infodiff.evaluation import report as report_lib

__all__ = ["evaluate_compare", "out_dir"]


def out_dir(workdir: str, path: str, other: str, step_a: int, step_b: int) -> str:
    """``W1/scores/<file name>.vs.<W2's directory name>-<hash>/``: ``<hash>`` is the first 8 hex
    digits of sha256 of the request (the input's absolute path, W2's absolute path, both
    checkpoint steps), so two different requests (another W2 of the same name, another input of
    the same name, a newer checkpoint) never share a folder."""
    request = "\0".join([os.path.abspath(path), os.path.abspath(other), str(step_a), str(step_b)])
    tag = hashlib.sha256(request.encode("utf-8", errors="surrogateescape")).hexdigest()[:8]
    name = f"{os.path.basename(path)}.vs.{os.path.basename(os.path.normpath(os.path.abspath(other)))}-{tag}"
    return os.path.join(workdir, "scores", name)


def _load_other(other: str, config) -> scoring.Run:
    import ml_collections

    from infodiff import pretrained, tasks, training

    if not os.path.isdir(other):
        raise FileNotFoundError(f"--compare {other!r} does not exist (a training run's or a checkpoint's directory)")
    ev = config.eval
    if pretrained.is_checkpoint_dir(other):  # a released checkpoint (infodiff/pretrained)
        from infodiff.pretrained import run as pretrained_run

        return pretrained_run.load_pretrained(other, num_samples=int(ev.input_samples) or None,
                                              batch_size=int(ev.batch_size), seed=int(ev.seed))
    saved = ml_collections.ConfigDict(training.saved_config(other))
    same = "pretrained" not in config and tasks.registration(saved).name == tasks.registration(config).name
    return scoring.load_run(other, estimator=str(ev.estimator) if same else None, use_ema=bool(ev.use_ema),
                            num_samples=int(ev.input_samples))


def _side(run: scoring.Run) -> dict:
    where = run.workdir if run.workdir is not None else getattr(run, "pretrained_path", None)
    return {"workdir": None if where is None else os.path.abspath(where), "checkpoint_step": run.checkpoint_step,
            "params": "ema" if bool(run.config.eval.get("use_ema", False)) else "raw", "model_length": run.seq_len,
            "estimator": run.process.estimator, "process": run.task.process_info(run.process)}


def evaluate_compare(config, workdir: str, other: str, run_a: scoring.Run | None = None) -> tuple[dict, str]:
    """Score ``config.eval.input`` with the runs in ``workdir`` (a) and ``other`` (b); returns
    (report, output dir), writing nothing (the caller writes the report with its rows files).
    Raises ValueError for no ``eval.input`` or a ratios file, FileNotFoundError for a missing
    ``other``, and the errors of :func:`infodiff.compare.compare` (naming the row's id)."""
    t0 = time.time()
    ev = config.eval
    path = str(ev.get("input", "") or "")
    if not path:
        raise ValueError("evaluate.py --compare scores a file with both runs: give it with --config.eval.input=FILE "
                         "(.txt, one document per line, or .jsonl {\"prompt\", \"response\"})")
    read_notes: list = []
    kind, ids, cols = inputs.read_input(path, str(ev.input_unit), notes=read_notes)
    query = queries.get(kind)
    if query.compare is None:
        raise ValueError(query.compare_refusal.format(path=path))
    run_a = run_a if run_a is not None else scoring.load_run(workdir, config=config)  # run_a: a checkpoint's
    run_b = _load_other(other, config)
    out = out_dir(workdir, path, other, run_a.checkpoint_step, run_b.checkpoint_step)
    report_lib.refuse_existing(out, config, "move that folder away")  # before any scoring
    tse = float(ev.target_se) or None
    if tse is not None and tse < 0:
        raise ValueError(f"config.eval.target_se={ev.target_se} must be >= 0 (0: a fixed budget)")
    rows_in, scored, what = query.compare(cols)
    c = inputs.row_errors(lambda: compare_lib.compare(run_a, run_b, **rows_in, target_se=tse, progress=True), ids)
    chars = [len(run_a.encode(t)) for t in scored]
    passes = c.a.info["forward_passes_per_row"] + c.b.info["forward_passes_per_row"]
    rows = [{"id": rid, "nll_a": float(c.a.mean[i]), "se_a": float(c.a.stderr[i]), "nll_b": float(c.b.mean[i]),
             "se_b": float(c.b.stderr[i]), "difference": float(c.difference[i]),
             "se_paired": float(c.stderr_paired[i]), "se_unpaired": float(c.stderr_unpaired[i]),
             "resolved_2se": bool(abs(c.difference[i]) > 2 * c.stderr_paired[i]), "samples": int(c.a.num_samples),
             "windows_a": int(c.a.info["windows_per_row"][i]), "windows_b": int(c.b.info["windows_per_row"][i]),
             "forward_passes": int(passes[i]), "changed_chars": int(sum(c.changed[i].values())), "chars": chars[i]}
            for i, rid in enumerate(ids)]
    attachments, plot_notes = inputs.row_attachments(rows, [("rows.png", lambda buf: plots.compare_rows_png(buf, rows))])
    files = [os.path.join(out, name) for name in attachments]
    all_changed: dict = {}
    for ch in c.changed:
        for k, v in ch.items():
            all_changed[k] = all_changed.get(k, 0) + v
    notes = list(read_notes)
    if not c.coupled:
        notes.append(f"the runs drew independent noise ({c.why_not}): the paired SE is the unpaired one")
    target = report_lib.ABSENT
    if tse is not None:
        target = {"target_se": tse, "reached": bool(c.a.info["target_se_reached"]),
                  "max_samples_per_window": int(c.a.info["max_samples"])}
        if not target["reached"]:
            notes.append(f"target_se {tse} not reached by every row at {c.a.num_samples} samples per window "
                         f"(config.eval.input_max_samples); the largest paired SE is {float(c.stderr_paired.max()):.4g}")
    rep = report_lib.CompareReport(
        quantity=f"{what.replace('p(', 'p_a(')} - ({what.replace('p(', 'p_b(')})", bound="model_difference",
        process=run_a.task.process_info(run_a.process), units={"item": "row", "nll": "nats per row"},
        input={"path": os.path.abspath(path), "sha256": inputs.sha256(path), "format": kind,
               "unit": str(ev.get("input_unit", "line")), "rows": len(ids)},
        runs={"a": _side(run_a), "b": _side(run_b)},
        coupling={"coupled": c.coupled, "why_not": c.why_not, "same_noise": c.same_noise,
                  "batch_size": run_a.batch_size},
        num_samples_per_window=int(c.a.num_samples),
        infinite_variance=bool(c.a.infinite_variance or c.b.infinite_variance), forward_passes=int(passes.sum()),
        **report_lib.se_fields(c.paired if c.coupled else c.a), summary=c.summary(),
        cleaning={"rules": "text8 (infodiff.data.text.CLEANING_RULES)",
                  "rows_changed": int(sum(1 for ch in c.changed if ch)), "characters": all_changed},
        target=target, rows_preview=rows[:10], notes=notes or report_lib.ABSENT, files=files,
        plots=[p for p in files if p.endswith(".png")], plot_notes=plot_notes or report_lib.ABSENT,
        **report_lib.common(config, int(ev.seed), t0,
                            checkpoint={"a": inputs.run_checkpoint(run_a), "b": inputs.run_checkpoint(run_b)},
                            data={"path": os.path.abspath(path), "sha256": inputs.sha256(path)}))
    return report_lib.Report(rep.to_dict(), attachments=attachments), out
