"""Input kind 'ratios': a ``.jsonl`` file, every line ``{"prompt", "a", "b"}`` (optionally
``"id"``): the coupled log p(a | prompt) - log p(b | prompt) per row
(:meth:`infodiff.scoring.Run.log_ratio`), with the decoupled estimate's SE beside it; no interval
(a difference of two -log p) and no ``--compare``."""

from __future__ import annotations

import numpy as np

from infodiff.evaluation import inputs, plots
from infodiff.evaluation import report as report_lib
from infodiff.evaluation.queries import Query, register
from infodiff.evaluation.jsonl import write_rows
from infodiff.evaluation.queries.text import TEXT_KEYS

ROW_KEYS = ("a", "b", "prompt")


def _estimate(run, ids, cols, tse, per):
    est = inputs.row_errors(lambda: run.log_ratio(cols["prompt"], cols["a"], cols["b"], coupled=True, target_se=tse),
                            ids)
    dec = run.log_ratio(cols["prompt"], cols["a"], cols["b"], coupled=False, num_samples=est.num_samples)
    ratio = dec.stderr / np.where(est.stderr > 0, est.stderr, np.nan)
    resolved = np.abs(est.mean) > 2 * est.stderr
    summary = {"mean_log_ratio": float(est.mean.mean()), "mean_log_ratio_stderr": est.pooled_stderr() / len(ids),
               "fraction_resolved_2se": float(resolved.mean()),
               "fraction_resolved_2se_decoupled": float((np.abs(dec.mean) > 2 * dec.stderr).mean()),
               "fraction_a_more_likely": float((est.mean > 0).mean()),
               "se_ratio_decoupled_over_coupled_median": float(np.nanmedian(ratio))}
    return est, None, summary, dec


def _row(est, i, dec) -> dict:
    r = dict(value_decoupled=float(dec.mean[i]), se_decoupled=float(dec.stderr[i]),
             resolved_2se=bool(abs(est.mean[i]) > 2 * est.stderr[i]))
    ea, eb = est.info["nll_a"], est.info["nll_b"]
    r.update(log_p_a=-float(ea.mean[i]), log_p_a_se=float(ea.stderr[i]),
             log_p_b=-float(eb.mean[i]), log_p_b_se=float(eb.stderr[i]))
    return r


def _draw(axes, rows, quantity, bits) -> None:
    """rows.png: each row's coupled log-ratio +- 2 SE with the decoupled +- 2 SE beside it, and a
    histogram of decoupled / coupled SE."""
    v = np.array([r["value"] for r in rows])
    se = np.array([r["se"] for r in rows])
    i = np.arange(1, len(rows) + 1)
    vd = np.array([r["value_decoupled"] for r in rows])
    sd = np.array([r["se_decoupled"] for r in rows])
    axes[0].errorbar(i - 0.15, v, yerr=2 * se, fmt="o", ms=3, capsize=2, color="C0", label="coupled")
    axes[0].errorbar(i + 0.15, vd, yerr=2 * sd, fmt="s", ms=3, capsize=2, color="C1", alpha=0.6,
                     label="decoupled")
    axes[0].axhline(0.0, color="grey", lw=0.8)
    axes[0].set_xlabel("row (1-based)")
    axes[0].set_ylabel("log p(a | prompt) - log p(b | prompt) (nats) ± 2 SE")
    axes[0].legend()
    axes[0].set_title(f"{len(rows)} rows; resolved at 2 SE: {np.mean(np.abs(v) > 2 * se):.0%}")
    axes[1].hist(sd / np.where(se > 0, se, np.nan), bins=min(30, max(5, len(rows) // 2)), color="C2",
                 edgecolor="white")
    axes[1].set_xlabel("SE decoupled / SE coupled")
    axes[1].set_ylabel("rows")
    axes[1].set_title("what the coupling saves")
    plots.integer_axis(axes[1].yaxis)  # row counts
    if len(rows) <= 30:
        axes[0].set_xticks(np.arange(1, len(rows) + 1), [str(r["id"]) for r in rows], rotation=90, fontsize=7)
        axes[0].set_xlabel("row id")


def _summary_lines(r) -> list:
    s = r["summary"]
    return [("mean log-ratio", f"{s['mean_log_ratio']:+.4f} ± {s['mean_log_ratio_stderr']:.4f}"),
            ("resolved at 2 SE", f"{s['fraction_resolved_2se']:.0%} coupled, "
                                 f"{s['fraction_resolved_2se_decoupled']:.0%} decoupled"),
            ("a more likely", f"{s['fraction_a_more_likely']:.0%} of rows"),
            ("SE decoupled / coupled", f"{s['se_ratio_decoupled_over_coupled_median']:.2f} (median)")]


def _preview(prev, name):
    hdr = ["id", "log-ratio", "SE", "SE decoupled", "resolved", "windows"]
    body = [[p["id"], f"{p['value']:+.3f}", f"{p['se']:.3f}", f"{p['se_decoupled']:.3f}",
             "yes" if p["resolved_2se"] else "no", p["windows"]] for p in prev]
    return hdr, body


QUERY = register(Query(
    name="ratios", extension=".jsonl", input_format="text", evaluate=inputs.evaluate_text, score=inputs.score_rows,
    load=lambda path: inputs.read_input(path)[1],
    detects=lambda obj: set(obj) - {"id"} == set(ROW_KEYS), row_keys=ROW_KEYS,
    scoring=inputs.TextScoring(
        quantity="log p(a | prompt) - log p(b | prompt), coupled", estimate=_estimate, row=_row,
        interval_refusal=("config.eval.interval=True: {path} holds ratios ({{prompt, a, b}}), which get no interval "
                          "(a difference of two -log p); drop --config.eval.interval or score a and b as pairs")),
    draw=_draw, summary_lines=_summary_lines, preview=_preview, config_keys=TEXT_KEYS,
    scored=("a", "b"), shown=("prompt", "a", "b"),
    compare_refusal=("{path} holds ratios ({{prompt, a, b}}); --compare scores documents (.txt) or "
                     "{{prompt, response}} pairs: score a and b as pairs"),
    sample=lambda folder: write_rows(folder, "ratios.jsonl", [{"prompt": "the cat", "a": " sat", "b": " dog"}]),
    malformed=lambda folder: write_rows(folder, "bad_ratios.jsonl", [{"prompt": "the cat", "a": " sat", "b": " dog"},
                                                                 {"prompt": "one", "a": " two"}])))
