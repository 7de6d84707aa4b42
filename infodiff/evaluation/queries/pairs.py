"""Input kind 'pairs': a ``.jsonl`` file, every line ``{"prompt", "response"}`` (optionally
``"id"``): -log p(response | prompt) per row (:meth:`infodiff.scoring.Run.conditional_nll`), bits
per character / byte of the response, an any-order interval with ``eval.interval``."""

from __future__ import annotations

import numpy as np

from infodiff.evaluation import inputs, plots
from infodiff.evaluation.jsonl import write_rows
from infodiff.evaluation import report as report_lib
from infodiff.evaluation.queries import Query, register
from infodiff.evaluation.queries.text import TEXT_KEYS

ROW_KEYS = ("prompt", "response")


def _estimate(run, ids, cols, tse, per):
    est = inputs.row_errors(lambda: run.conditional_nll(cols["prompt"], cols["response"], progress=True,
                                                        target_se=tse), ids)
    chars = np.array([inputs.unit_count(run, t) for t in cols["response"]])
    return est, chars, inputs.totals(est, chars, per, run, cols["response"]), None


QUERY = register(Query(
    name="pairs", extension=".jsonl", input_format="text", evaluate=inputs.evaluate_text, score=inputs.score_rows,
    load=lambda path: inputs.read_input(path)[1],
    detects=lambda obj: set(obj) - {"id"} == set(ROW_KEYS), row_keys=ROW_KEYS,
    scoring=inputs.TextScoring(
        quantity="-log p(response | prompt)", estimate=_estimate,
        interval=lambda run, cols, kw: run.conditional_nll_interval(cols["prompt"], cols["response"], **kw)),
    draw=lambda axes, rows, quantity, bits: plots.nll_rows_axes(axes, rows, quantity, bits),
    summary_lines=report_lib.nll_summary_rows, preview=report_lib.nll_preview, config_keys=TEXT_KEYS,
    scored=("response",), shown=("prompt", "response"),
    compare=lambda cols: ({"prompts": cols["prompt"], "responses": cols["response"]}, cols["response"],
                          "-log p(response | prompt)"),
    sample=lambda folder: write_rows(folder, "pairs.jsonl", [{"prompt": "the cat", "response": " sat"},
                                                         {"id": "b", "prompt": "one", "response": " two"}]),
    malformed=lambda folder: write_rows(folder, "bad_pairs.jsonl", [{"prompt": "the cat", "response": " sat"},
                                                                {"prompt": "one", "response": 2}])))
