"""``evaluate.py --workdir W --config.eval.input=FILE``: score a user's file with a trained
masked text run (:mod:`infodiff.scoring`) and write a report, per-row files and plots.

Formats (by extension):
  * ``.txt``: one document per line (``eval.input_unit = 'line'``, empty lines skipped; ids are
    line numbers) or the whole file as one document (``'file'``): -log p(document);
  * ``.jsonl``, every line ``{"prompt", "response"}``: -log p(response | prompt);
  * ``.jsonl``, every line ``{"prompt", "a", "b"}``: the coupled log p(a | prompt) -
    log p(b | prompt), with the decoupled estimate's SE beside it.
  An optional ``"id"`` per JSONL line names the row. Output in ``W/scores/<file stem>/``:
  report.json / report.txt (schema: docs/report.md, kind 'input'), rows.jsonl, rows.csv and
  rows.png. The Monte Carlo budget is ``eval.input_samples`` samples per window.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import time

import numpy as np

from infodiff import scoring
from infodiff.evaluation import plots
from infodiff.evaluation import report as report_lib
from infodiff.training import workdir as workdir_lib

__all__ = ["read_input", "evaluate_input", "INPUT_UNITS"]

INPUT_UNITS = ("line", "file")
LN2 = math.log(2.0)
_KINDS = {("prompt", "response"): "pairs", ("a", "b", "prompt"): "ratios"}


def read_input(path: str, unit: str = "line") -> tuple[str, list[str], dict]:
    """(kind 'text' | 'pairs' | 'ratios', row ids, columns {name: list of str}) of a user file.

    Raises FileNotFoundError for a missing file; ValueError (naming the file and line) for an
    unknown extension or unit, a line that is not a JSON object, missing or non-string fields,
    lines of different kinds, or a file with no rows."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"eval.input: file not found: {path!r}")
    if unit not in INPUT_UNITS:
        raise ValueError(f"config.eval.input_unit={unit!r}; choose from {INPUT_UNITS}")
    ext = os.path.splitext(path)[1].lower()
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if ext == ".txt":
        if unit == "file":
            return "text", ["file"], {"text": [text]}
        rows = [(str(i + 1), ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
        if not rows:
            raise ValueError(f"eval.input {path!r} has no non-empty lines")
        return "text", [r[0] for r in rows], {"text": [r[1] for r in rows]}
    if ext != ".jsonl":
        raise ValueError(f"eval.input {path!r}: unknown format {ext or '(no extension)'!r}; use .txt (one "
                         "document per line) or .jsonl ({\"prompt\", \"response\"} or {\"prompt\", \"a\", \"b\"})")
    if unit != "line":
        raise ValueError("config.eval.input_unit='file' applies to .txt inputs only")
    kind, ids, cols = None, [], {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        keys = tuple(sorted(k for k in obj if k != "id"))
        k = _KINDS.get(keys)
        if k is None:
            raise ValueError(f"{path}:{i}: keys {sorted(obj)}; expected {{\"prompt\", \"response\"}} or "
                             "{\"prompt\", \"a\", \"b\"} (and optionally \"id\")")
        if kind is not None and k != kind:
            raise ValueError(f"{path}:{i}: a {k} line in a file of {kind} (line 1): use one kind per file")
        kind = k
        for name in keys:
            if not isinstance(obj[name], str):
                raise ValueError(f"{path}:{i}: {name!r} must be a string, got {type(obj[name]).__name__}")
            cols.setdefault(name, []).append(obj[name])
        ids.append(str(obj.get("id", i)))
    if kind is None:
        raise ValueError(f"eval.input {path!r} has no rows")
    return kind, ids, cols


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _row_errors(fn, ids):
    """Re-raise a scoring ValueError about row i (texts[3], a[0], ...) naming the row's id."""
    import re

    try:
        return fn()
    except ValueError as e:
        m = re.match(r"(\w+)\[(\d+)\] (.*)", str(e))
        if m and int(m.group(2)) < len(ids):
            raise ValueError(f"row {ids[int(m.group(2))]!r}: {m.group(1)} {m.group(3)}") from None
        raise


def evaluate_input(config, workdir: str) -> tuple[dict, str]:
    """Score ``config.eval.input`` with the run in ``workdir``; returns (report, output dir) and
    writes rows.jsonl, rows.csv and rows.png there (the caller writes the report)."""
    t0 = time.time()
    ev = config.eval
    path = str(ev.input)
    kind, ids, cols = read_input(path, str(ev.input_unit))
    run = scoring.load_run(workdir, config=config)
    out_dir = os.path.join(workdir, "scores", os.path.splitext(os.path.basename(path))[0])
    rows, summary = [], {}
    if kind == "text":
        est = _row_errors(lambda: run.nll(cols["text"], progress=True), ids)
        chars = np.array([len(scoring.clean(t)[0]) for t in cols["text"]])
        summary = _totals(est, chars)
    elif kind == "pairs":
        est = _row_errors(lambda: run.conditional_nll(cols["prompt"], cols["response"], progress=True), ids)
        chars = np.array([len(scoring.clean(t)[0]) for t in cols["response"]])
        summary = _totals(est, chars)
    else:
        est = _row_errors(lambda: run.log_ratio(cols["prompt"], cols["a"], cols["b"], coupled=True), ids)
        dec = run.log_ratio(cols["prompt"], cols["a"], cols["b"], coupled=False)
        chars = None
        ratio = dec.stderr / np.where(est.stderr > 0, est.stderr, np.nan)
        resolved = np.abs(est.mean) > 2 * est.stderr
        summary = {"mean_log_ratio": float(est.mean.mean()), "mean_log_ratio_stderr": est.pooled_stderr() / len(ids),
                   "fraction_resolved_2se": float(resolved.mean()),
                   "fraction_resolved_2se_decoupled": float((np.abs(dec.mean) > 2 * dec.stderr).mean()),
                   "fraction_a_more_likely": float((est.mean > 0).mean()),
                   "se_ratio_decoupled_over_coupled_median": float(np.nanmedian(ratio))}
    changed = run.last_changed
    passes = est.info["forward_passes_per_row"]
    for i, rid in enumerate(ids):
        r = {"id": rid, "value": float(est.mean[i]), "se": float(est.stderr[i]), "samples": int(est.num_samples),
             "windows": int(est.info["windows_per_row"][i]), "forward_passes": int(passes[i]),
             "changed_chars": int(sum(changed[i].values()))}
        if chars is not None:
            r.update(chars=int(chars[i]), bits_per_char=float(est.mean[i] / (chars[i] * LN2)))
        else:
            r.update(value_decoupled=float(dec.mean[i]), se_decoupled=float(dec.stderr[i]),
                     resolved_2se=bool(abs(est.mean[i]) > 2 * est.stderr[i]))
        rows.append(r)
    all_changed: dict = {}
    for c in changed:
        for k, v in c.items():
            all_changed[k] = all_changed.get(k, 0) + v
    quantity = {"text": "-log p(document)", "pairs": "-log p(response | prompt)",
                "ratios": "log p(a | prompt) - log p(b | prompt), coupled"}[kind]
    se = report_lib.se_fields(est)
    rep = {"version": report_lib.REPORT_VERSION, "kind": "input", "quantity": quantity,
           "process": run.task.process_info(run.process), "units": {"item": "row", "nll": "nats per row"},
           "input": {"path": os.path.abspath(path), "sha256": _sha256(path), "format": kind,
                     "unit": str(ev.input_unit), "rows": len(ids)},
           "workdir": os.path.abspath(workdir), "checkpoint_step": run.checkpoint_step,
           "params": "ema" if bool(ev.use_ema) else "raw", "model_length": run.seq_len,
           "estimator": est.estimator, "num_samples_per_window": int(est.num_samples),
           "forward_passes": int(passes.sum()), **se, "summary": summary,
           "cleaning": {"rules": "text8 (infodiff.data.text.CLEANING_RULES)",
                        "rows_changed": int(sum(1 for c in changed if c)), "characters": all_changed},
           "rows_preview": rows[:10]}
    files = _write_rows(out_dir, rows)
    png = os.path.join(out_dir, "rows.png")
    try:
        plots.input_rows_png(png, rows, kind, quantity)
        files.append(png)
    except (OSError, ValueError) as e:
        rep["plot_notes"] = [f"rows.png not written: {e}"]
    rep["files"] = files
    rep["plots"] = [png] if png in files else []
    rep.update(report_lib.common(config, int(ev.seed), t0))
    return rep, out_dir


def _totals(est, chars) -> dict:
    total, total_se = est.total()
    n = int(chars.sum())
    return {"total_nats": total, "total_stderr": total_se, "mean_nll_per_row": float(est.mean.mean()),
            "characters": n, "bits_per_char": total / (n * LN2), "bits_per_char_stderr": total_se / (n * LN2)}


def _write_rows(out_dir: str, rows: list[dict]) -> list[str]:
    with workdir_lib.storage_guard(out_dir, "create"):
        os.makedirs(out_dir, exist_ok=True)
    jpath, cpath = os.path.join(out_dir, "rows.jsonl"), os.path.join(out_dir, "rows.csv")
    workdir_lib.atomic_write_text(jpath, "".join(json.dumps(report_lib.strict_json(r)) + "\n" for r in rows))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    workdir_lib.atomic_write_text(cpath, buf.getvalue())
    return [jpath, cpath]
