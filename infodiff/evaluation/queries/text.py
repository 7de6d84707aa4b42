"""Input kind 'text': a ``.txt`` file, one document per line (``eval.input_unit='line'``, empty
lines skipped, ids are line numbers) or the whole file as one document (``'file'``): -log p(document)
per row (:meth:`infodiff.scoring.Run.nll`), bits per character / byte, an any-order interval with
``eval.interval``."""

from __future__ import annotations

import os

import numpy as np

from infodiff.evaluation import inputs, plots
from infodiff.evaluation import report as report_lib
from infodiff.evaluation.queries import Query, register

TEXT_KEYS = ("eval.input_unit", "eval.input_samples", "eval.target_se", "eval.input_max_samples", "eval.limit")


def _estimate(run, ids, cols, tse, per):
    est = inputs.row_errors(lambda: run.nll(cols["text"], progress=True, target_se=tse), ids)
    chars = np.array([inputs.unit_count(run, t) for t in cols["text"]])
    return est, chars, inputs.totals(est, chars, per, run, cols["text"]), None


def _sample(folder: str) -> str:
    path = os.path.join(folder, "docs.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("the quick brown fox\njumps over the lazy dog\n")
    return path


def _malformed(folder: str) -> str:
    path = os.path.join(folder, "empty.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n   \n")
    return path


QUERY = register(Query(
    name="text", extension=".txt", input_format="text", evaluate=inputs.evaluate_text, score=inputs.score_rows,
    load=lambda path: inputs.read_input(path)[1],
    scoring=inputs.TextScoring(
        quantity="-log p(document)", estimate=_estimate, prompted=False,
        interval=lambda run, cols, kw: run.nll_interval(cols["text"], **kw)),
    draw=lambda axes, rows, quantity, bits: plots.nll_rows_axes(axes, rows, quantity, bits),
    summary_lines=report_lib.nll_summary_rows, preview=report_lib.nll_preview, config_keys=TEXT_KEYS,
    scored=("text",), shown=("text",),
    compare=lambda cols: ({"texts": cols["text"]}, cols["text"], "-log p(document)"),
    sample=_sample, malformed=_malformed))
