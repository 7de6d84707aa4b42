"""The report: one schema for every process and mode, a readable table, strict JSON on disk.

Schema (``version`` 2, documented in docs/report.md): every report has ``version``, ``kind``
('network' | 'oracle'), ``process`` ({'name', ...settings}), ``units``, ``seed``,
``wall_time_s``, ``env``, ``argv`` (the command line), ``git`` (``{"revision", "dirty"}`` of
the checkout infodiff was imported from, or None outside a git checkout), ``config``. A network report adds ``estimator``,
``infinite_variance``, ``data``, ``nll``, ``nll_stderr``, ``stderr_kind``, ``stderr_mc``,
``stderr_data_and_mc``, ``bits``, ``bits_stderr``, ``terms``, ``num_samples_per_item``,
``forward_passes``, ``per_sample_std``, ``samples``, ``extras``, ``se_method``, ``se_note``,
``exact``, ``min_samples``, ``few_samples_per_item``, ``plot_notes`` (why a figure, e.g. the
training curves, was not drawn). An oracle report adds
``oracle`` and ``results`` with lists of rows (:func:`oracle_row`) and ``samplers``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time

import numpy as np

from infodiff.training import workdir as workdir_lib

__all__ = ["REPORT_VERSION", "COMMON_KEYS", "NETWORK_KEYS", "ORACLE_KEYS", "INPUT_KEYS", "ROW_KEYS", "TERMS", "env", "git_info",
           "oracle_row", "format_report", "table", "strict_json", "write_report", "Report", "write_together",
           "clean_leftovers", "UNIT_DIR"]

REPORT_VERSION = 2
# The schema (docs/report.md): keys of every report, of each kind, and of an oracle row.
COMMON_KEYS = ("version", "kind", "process", "units", "experiment", "seed", "wall_time_s", "env", "argv", "git",
               "config", "plots")
NETWORK_KEYS = ("workdir", "checkpoint_step", "params", "data", "estimator", "infinite_variance",
                "num_samples_per_item", "forward_passes", "nll", "nll_stderr", "stderr_kind", "stderr_mc",
                "stderr_data_and_mc", "bits", "bits_stderr", "terms", "per_sample_std", "samples",
                "sampler", "sample_steps", "extras", "se_method", "se_note", "exact", "min_samples",
                "few_samples_per_item", "plot_notes", "uniform_nll", "warnings")
ORACLE_KEYS = ("oracle", "num_items", "item_size", "prompt_len", "results")
INPUT_KEYS = ("quantity", "input", "workdir", "checkpoint_step", "params", "model_length", "estimator", "infinite_variance",
              "num_samples_per_window", "forward_passes", "se_method", "se_note", "exact", "min_samples",
              "few_samples", "summary", "rows_preview", "files")  # text runs add "cleaning"
ROW_KEYS = ("estimator", "mean_estimate", "mean_exact", "bias", "bias_stderr", "bias_z",
            "max_abs_z_per_sequence", "per_sample_std", "per_sample_variance", "variance_per_forward_pass",
            "stderr_at_1024_forward_passes", "terms", "num_samples", "forward_passes", "infinite_variance",
            "se_method", "se_note", "exact", "min_samples", "few_samples", "coverage_95", "mean_z2",
            "se_calibration")
TERMS = ("diffusion", "prior", "recon", "total")
# An oracle row's SEs are flagged as miscalibrated when a test of calibration (coverage, bias)
# rejects at this level (two-sided): about 5 sigma, so that over the <= 20 rows of a report
# calibrated estimators are flagged by chance with probability about 4e-5.
SE_CHECK_P = 1e-6
SE_CHECK_EXACT_TOL = 1e-3  # an SE of 0 claims exactness: |estimate - exact| <= this x max(1, |exact|)


def env() -> dict:
    """Versions, backend and time of this run."""
    import jax

    return {"jax": jax.__version__, "backend": jax.default_backend(), "devices": len(jax.devices()), "processes": jax.process_count(),
            "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def git_info(path: str | None = None) -> dict | None:
    """``{"revision": commit sha, "dirty": uncommitted changes to tracked files}`` of the git
    checkout holding ``path`` (default: this package), or None (not a checkout, or no git)."""
    cwd = path or os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                            capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"revision": rev.stdout.strip(), "dirty": bool(st.stdout.strip()) if st.returncode == 0 else None}


def common(config, seed: int, t0: float) -> dict:
    """The keys every report ends with (``experiment``: the config's name; ``argv``: the command
    line; ``git``: :func:`git_info`)."""
    return {"experiment": str(config.get("experiment", "")), "seed": int(seed), "wall_time_s": time.time() - t0, "env": env(), "argv": list(sys.argv),
            "git": git_info(), "config": json.loads(config.to_json_best_effort())}


def se_fields(est) -> dict:
    """How the SE of an Estimate was computed: ``se_method`` (a key of likelihood.SE_METHODS),
    ``se_note`` (what it means, and the Student-t scaling), ``exact``, the minimum samples of a
    calibrated per-item SE and whether this run had fewer."""
    from infodiff import likelihood as lk

    return {"se_method": est.se_method, "se_note": f"{lk.SE_METHODS[est.se_method]}; {lk.T_SCALING}",
            "exact": bool(est.is_exact), "min_samples": int(est.min_samples),
            "few_samples": bool(est.few_samples)}


def se_calibration(estimate: np.ndarray, truth: np.ndarray, stderr: np.ndarray, bias_z: float) -> dict:
    """Whether an oracle row's standard errors are shown by the exact values to be wrong.

    Tests (each two-sided at :data:`SE_CHECK_P`), on the items with SE > 0: (1) coverage: the
    count k of items with |estimate - exact| > 1.96 SE is Binomial(n, 0.05) when the per-item
    SEs are calibrated (they are Student-t scaled for this: ``likelihood.T_SCALING``); a k far
    above 0.05 n means the SEs are too small (the +- values under-state the error), far below
    that they are too large (conservative). Coverage is used rather than the mean z², whose
    variance is infinite for t-distributed z at the SE's few degrees of freedom (one item with a
    small sampled SE moves it arbitrarily). (2) bias: ``bias_z`` (the mean bias over its Monte
    Carlo SE) is N(0, 1) for an unbiased estimator with a calibrated SE. And on the items with
    SE = 0 (the estimator claims to be exact): |estimate - exact| <= :data:`SE_CHECK_EXACT_TOL`
    x max(1, |exact|). Returns ``{"miscalibrated", "direction" ('too_small' | 'too_large' |
    None), "why" (one sentence, or None), "items", "misses_95", "expected_misses_95",
    "coverage_p_value", "bias_p_value", "threshold_p"}`` (p-values None where not tested)."""
    from scipy import special

    err = np.asarray(estimate, np.float64) - np.asarray(truth, np.float64)
    se = np.asarray(stderr, np.float64)
    pos = se > 0
    n = int(pos.sum())
    out = {"miscalibrated": False, "direction": None, "why": None, "items": n, "misses_95": None,
           "expected_misses_95": 0.05 * n, "coverage_p_value": None, "bias_p_value": None,
           "threshold_p": SE_CHECK_P}
    whys = []
    if n:
        k = int(np.sum(np.abs(err[pos]) > 1.959963984540054 * se[pos]))
        p_hi = float(special.bdtrc(k - 1, n, 0.05)) if k > 0 else 1.0  # P(K >= k)
        p_lo = float(special.bdtr(k, n, 0.05))  # P(K <= k)
        p = min(1.0, 2.0 * min(p_hi, p_lo))
        out.update(misses_95=k, coverage_p_value=p)
        if p < SE_CHECK_P:
            small = k > 0.05 * n
            out["direction"] = "too_small" if small else "too_large"
            z2 = float(np.mean((err[pos] / se[pos]) ** 2))
            whys.append(f"{k} of {n} items lie outside ±1.96 SE (a calibrated SE: {0.05 * n:.0f} ± "
                        f"{math.sqrt(n * 0.0475):.0f}; p = {p:.1e}; mean z² {z2:.2f}): the SEs are "
                        + ("too small, the ± values under-state the error" if small else "too large (conservative)"))
    if math.isfinite(bias_z):
        pb = float(special.erfc(abs(bias_z) / math.sqrt(2.0)))
        out["bias_p_value"] = pb
        if pb < SE_CHECK_P:
            out["direction"] = out["direction"] or "too_small"
            whys.append(f"the mean bias is {bias_z:+.1f} of its SE (p = {pb:.1e}): biased, or the SE too small")
    if (~pos).any():
        t = np.asarray(truth, np.float64)[~pos]
        off = np.abs(err[~pos]) > SE_CHECK_EXACT_TOL * np.maximum(1.0, np.abs(t))
        if off.any():
            out["direction"] = out["direction"] or "too_small"
            k0 = int(off.sum())
            whys.append(f"{k0} item{'s' * (k0 != 1)} ha{'ve' if k0 != 1 else 's'} SE 0 (exact) but miss"
                        f"{'' if k0 != 1 else 'es'} the exact value by up to "
                        f"{float(np.max(np.abs(err[~pos]))):.4g} nats")
    if whys:
        out.update(miscalibrated=True, why="; ".join(whys))
    return out


def oracle_row(est, truth: np.ndarray, budget: int = 1024) -> dict:
    """One estimator against the exact values: bias and its SE, per-sample spread (nats), and the
    calibration of the per-item SEs: ``coverage_95`` = fraction of items with |estimate - exact|
    <= 1.96 SE, ``mean_z2`` = mean of ((estimate - exact) / SE)^2 (~1 when calibrated; NaN when
    an SE is 0, e.g. exact). ``per_sample_variance`` is S x raw SE^2 averaged over items: the
    variance per draw of the estimator as its ``se_method`` measures it (for iid draws the sample
    variance; for strata it excludes the between-strata spread that stratification removes)."""
    bias = est.mean - truth
    bias_se = est.split_mean()["stderr_mc"]
    var_sample = float(np.mean(est.stderr_raw**2)) * est.num_samples
    pos = bool(np.all(est.stderr > 0))
    z = bias / est.stderr if pos else None
    fp_per_sample = est.forward_passes / est.num_samples if est.num_samples else 0.0
    return {
        "estimator": est.estimator,
        "mean_estimate": float(est.mean.mean()),
        "mean_exact": float(truth.mean()),
        "bias": float(bias.mean()),
        "bias_stderr": bias_se,
        # z is undefined (NaN -> null in report.json) when the estimator is exact (SE = 0).
        "bias_z": float(bias.mean() / bias_se) if bias_se > 0 else float("nan"),
        "max_abs_z_per_sequence": float(np.max(np.abs(z))) if pos else float("nan"),
        "coverage_95": float(np.mean(np.abs(z) <= 1.96)) if pos else float("nan"),
        "mean_z2": float(np.mean(z**2)) if pos else float("nan"),
        "se_calibration": se_calibration(est.mean, truth, est.stderr,
                                         float(bias.mean() / bias_se) if bias_se > 0 else float("nan")),
        "per_sample_std": math.sqrt(var_sample),
        "per_sample_variance": var_sample,
        "variance_per_forward_pass": var_sample * fp_per_sample,
        f"stderr_at_{budget}_forward_passes": math.sqrt(var_sample * fp_per_sample / budget),
        "terms": {k: float(v.mean()) for k, v in est.terms.items()},
        "num_samples": est.num_samples,
        "forward_passes": est.forward_passes,
        "infinite_variance": est.infinite_variance,
        **se_fields(est),
    }


def table(headers, rows) -> str:
    """Right-aligned plain-text table."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    out = ["  ".join(str(h).rjust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def _fmt_terms(terms: dict) -> str:
    return ", ".join(f"{k} {v:.6g}" for k, v in terms.items() if k != "total")


def worse_than_uniform(nll: float, stderr: float, uniform_nll: float | None, unit: str) -> list[str]:
    """The report's warnings about its NLL: not finite; a standard error that is not finite;
    more than 1.96 SE above the uniform model's NLL (``uniform_nll``, the same unit), or more than
    10x it whatever the SE (a heavy-tailed estimate's SE can be as large as the estimate)."""
    if not math.isfinite(nll):
        return [f"the NLL {nll} is not finite: the model is broken; do not report it"]
    out = [] if stderr is not None and math.isfinite(stderr) else [
        f"the standard error {stderr} is not finite (too few items or samples, or a diverging "
        "estimate): the ± is unknown; raise eval.num_samples / eval.max_sequences"]
    if uniform_nll is not None and (nll - 1.96 * (stderr or 0.0) > uniform_nll or nll > 10 * uniform_nll):
        out.append(f"the NLL {nll:.6g} ± {stderr:.3g} {unit} is above the uniform model's {uniform_nll:.6g}: "
                   "the model is worse than guessing uniformly (under-trained, diverged, or a broken "
                   "checkpoint); do not report it as a result, check the training curves")
    return out


def _format_network(r: dict) -> str:
    d, u = r["data"], r["units"]
    rows = [
        ["process", ", ".join(f"{k} {v}" for k, v in r["process"].items())],
        ["estimator", r["estimator"] + (" (INFINITE VARIANCE: SE unreliable)" if r["infinite_variance"] else "")],
        ["checkpoint", f"step {r['checkpoint_step']} ({r['params']} params)"],
        ["data", f"{d['name']} / {d['split']}: {d['num_items']} of {d['total_items']} {u['item']}s"
                 + (f" x {d['item_size']}" if d.get("item_size") else "")],
        ["MC samples / " + u["item"], r["num_samples_per_item"]],
        ["forward passes", r["forward_passes"]],
        [f"NLL ({u['nll']})", f"{r['nll']:.4f} ± {r['nll_stderr']:.4f}  [{r['stderr_kind']}]"],
        [u["bits"], f"{r['bits']:.5f} ± {r['bits_stderr']:.5f}"],
        ["terms (nats)", _fmt_terms(r["terms"])],
        ["SE: mc / data+mc", f"{r['stderr_mc']:.4f} / {r['stderr_data_and_mc']:.4f}"],
        ["SE method", r["se_method"] + (" (exact: every term enumerated)" if r["exact"] else "")
         + (f"; per-{u['item']} SEs rest on fewer than {r['min_samples']} samples (flagged; the split SE "
            "pools them)" if r["few_samples_per_item"] else "")],
    ]
    for k, v in r.get("extras", {}).items():
        if isinstance(v, (int, float, str)):
            rows.append([k.replace("_", " "), f"{v:.5g}" if isinstance(v, float) else v])
    rows.append(["wall time", f"{r['wall_time_s']:.1f} s"])
    out = "infodiff likelihood report\n" + table(["quantity", "value"], rows)
    if r.get("samples") and isinstance(r["samples"][0], str):
        out += (f"\n\nsamples ({r['sampler']}, {r['sample_steps']} steps):\n"
                + "\n".join(f"  | {s}" for s in r["samples"]))
    for p in r.get("plots", []):
        out += f"\nplot: {p}"
    for n in r.get("plot_notes", []):
        out += f"\nnote: {n}"
    for w in r.get("warnings", []):
        out += f"\nWARNING: {w}"
    return out


def _fmt_opt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _rows_table(items) -> str:
    headers = ["estimator", "estimate", "exact", "bias ± SE", "z", "sd/sample", "var/fwd", "SE@1024",
               "SE method", "cover95", "mean z²"]
    flagged = [x for x in items if (x.get("se_calibration") or {}).get("miscalibrated")]
    rows = [[x["estimator"] + (" (inf. var.)" if x["infinite_variance"] else "")
             + (" (exact)" if x["exact"] else "") + (" (few samples)" if x["few_samples"] else "")
             + (" (SE MISCALIBRATED)" if any(x is f for f in flagged) else ""),
             f"{x['mean_estimate']:.4f}", f"{x['mean_exact']:.4f}",
             f"{x['bias']:+.4f} ± {x['bias_stderr']:.4f}", _fmt_opt(x["bias_z"], "+.2f"),
             f"{x['per_sample_std']:.3f}", f"{x['variance_per_forward_pass']:.3f}",
             f"{x['stderr_at_1024_forward_passes']:.4f}", x.get("se_method", "iid"),
             _fmt_opt(x.get("coverage_95"), ".3f"), _fmt_opt(x.get("mean_z2"), ".2f")] for x in items]
    return table(headers, rows) + "".join(f"\nwarning: {x['estimator']}: SE miscalibrated: {x['se_calibration']['why']}"
                                          for x in flagged)


def _format_oracle(r: dict) -> str:
    u = r["units"]
    parts = [f"infodiff oracle report ({r['process']['name']}): {r['oracle']}, "
             f"{r['num_items']} {u['item']}s" + (f" of length {r['item_size']}" if r.get("item_size") else "")
             + (f", prompt {r['prompt_len']}" if r.get("prompt_len") else "")]
    res = r["results"]
    parts.append(f"\n-log p(x), {u['nll']}\n" + _rows_table(res["unconditional"]))
    if res.get("conditional"):
        parts.append("\n-log p(y | x), nats per response\n" + _rows_table(res["conditional"]))
    if res.get("ratio"):
        items = []
        for pair in res["ratio"]:
            for kind in ("coupled", "decoupled"):
                items.append(dict(pair[kind], estimator=f"{pair['estimator']}:{kind}"))
        parts.append("\nlog p(y | x) - log p(y' | x), nats\n" + _rows_table(items))
        parts.append("variance ratio decoupled / coupled: " + ", ".join(
            f"{p['estimator']} {p['variance_ratio_decoupled_over_coupled']:.1f}x" for p in res["ratio"]))
    for s in res.get("samplers", []):
        cols = list(s["steps"])
        rows = [[name, *[f"{v:.4f}" for v in vals]] for name, vals in s["tv"].items()]
        parts.append(f"\nsampler total variation to the true law ({s['num_generate']} samples; an exact "
                     f"sample of that size has TV {s['tv_of_exact_sample']:.4f}):\n"
                     + table(["sampler", *[f"{c} steps" for c in cols]], rows))
    for p in r.get("plots", []):
        parts.append(f"plot: {p}")
    parts.append(f"\nwall time {r['wall_time_s']:.1f} s")
    return "\n".join(parts)


def _format_input(r: dict) -> str:
    inp, s = r["input"], r["summary"]
    rows = [["input", f"{inp['path']} ({inp['format']}, {inp['rows']} rows)"],
            ["quantity", f"{r['quantity']}, {r['units']['nll']}"],
            ["checkpoint", f"step {r['checkpoint_step']} ({r['params']} params), model length {r['model_length']}"],
            ["estimator", f"{r['estimator']}, {r['num_samples_per_window']} samples per window"
             + (" (INFINITE VARIANCE: SEs unreliable)" if r["infinite_variance"] else "")],
            ["forward passes", r["forward_passes"]],
            ["SE method", r["se_method"] + ("" if r["infinite_variance"] or not r["few_samples"] else
                                           f"; per-row SEs rest on fewer than {r['min_samples']} samples")]]
    if inp["format"] == "ratios":
        rows += [["mean log-ratio", f"{s['mean_log_ratio']:+.4f} ± {s['mean_log_ratio_stderr']:.4f}"],
                 ["resolved at 2 SE", f"{s['fraction_resolved_2se']:.0%} coupled, "
                                      f"{s['fraction_resolved_2se_decoupled']:.0%} decoupled"],
                 ["a more likely", f"{s['fraction_a_more_likely']:.0%} of rows"],
                 ["SE decoupled / coupled", f"{s['se_ratio_decoupled_over_coupled_median']:.2f} (median)"]]
    elif inp["format"] == "counts":
        rows += [["total NLL (nats)", f"{s['total_nats']:.3f} ± {s['total_stderr']:.3f}"],
                 ["bits per dimension", f"{s['bits_per_dim']:.4f} ± {s['bits_per_dim_stderr']:.4f} "
                                        f"({s['dimensions']} dimensions)"]]
    else:
        rows += [["total NLL (nats)", f"{s['total_nats']:.3f} ± {s['total_stderr']:.3f}"],
                 ["bits per character", f"{s['bits_per_char']:.4f} ± {s['bits_per_char_stderr']:.4f} "
                                        f"({s['characters']} characters)"]]
    c = r.get("cleaning")
    if c is not None:
        rows.append(["cleaned (text8 rules)", f"{c['rows_changed']} rows changed; characters: "
                     + (", ".join(f"{k!r} x{v}" for k, v in sorted(c["characters"].items(), key=lambda kv: -kv[1])[:12])
                        or "none")])
    rows.append(["wall time", f"{r['wall_time_s']:.1f} s"])
    out = "infodiff input report\n" + table(["quantity", "value"], rows)
    prev = r["rows_preview"]
    if prev:
        if inp["format"] == "counts":
            hdr = ["row", "NLL (nats)", "SE", "bits/dim"]
            body = [[p["id"], f"{p['value']:.3f}", f"{p['se']:.3f}", f"{p['bits_per_dim']:.4f}"] for p in prev]
        elif inp["format"] == "ratios":
            hdr = ["id", "log-ratio", "SE", "SE decoupled", "resolved", "windows"]
            body = [[p["id"], f"{p['value']:+.3f}", f"{p['se']:.3f}", f"{p['se_decoupled']:.3f}",
                     "yes" if p["resolved_2se"] else "no", p["windows"]] for p in prev]
        else:
            hdr = ["id", "NLL (nats)", "SE", "chars", "bits/char", "windows", "changed"]
            body = [[p["id"], f"{p['value']:.3f}", f"{p['se']:.3f}", p["chars"], f"{p['bits_per_char']:.3f}",
                     p["windows"], p["changed_chars"]] for p in prev]
        out += f"\n\nfirst {len(prev)} of {inp['rows']} rows:\n" + table(hdr, body)
    for n in r.get("notes", []):
        out += f"\nnote: {n}"
    for p in r.get("files", []):
        out += f"\nfile: {p}"  # written with this report (after it is printed)
    for n in r.get("plot_notes", []):
        out += f"\nnote: {n}"
    return out


def format_report(report: dict) -> str:
    """Readable text of a report (what evaluate.py prints)."""
    kind = report["kind"]
    if kind == "input":
        return _format_input(report)
    return _format_network(report) if kind == "network" else _format_oracle(report)


def strict_json(obj):
    """NaN / inf -> None so report.json is strict JSON (jq, JavaScript)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


class Report(dict):
    """A report (a plain dict: JSON, the table) with the files that belong to it, written with it
    as one unit by :func:`write_report`: ``attachments`` {file name: bytes} (input mode's
    rows.jsonl, rows.csv, rows.png)."""

    def __init__(self, *args, attachments: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.attachments = dict(attachments or {})


def write_report(report: dict, out_dir: str) -> tuple[str, str]:
    """Write report.json (strict JSON: undefined numbers are null), report.txt and the report's
    ``attachments`` (:class:`Report`) into out_dir as one unit (:func:`write_together`: after a
    crash or kill -9 at any moment they are all from the same evaluation, old or new); return
    the paths of report.json and report.txt.

    Raises StorageError (one line naming report.json and the errno) if out_dir is full,
    read-only or not writable: print the report first (evaluate.py does), so that nothing is
    lost; the previous files stay as they were. In a multi-process run only process 0 writes
    (the others return the same paths)."""
    from infodiff import parallel

    if not parallel.is_primary():
        return os.path.join(out_dir, "report.json"), os.path.join(out_dir, "report.txt")
    files = {"report.json": json.dumps(strict_json(report), indent=2, allow_nan=False).encode("utf-8"),
             "report.txt": (format_report(report) + "\n").encode("utf-8")}
    files.update(getattr(report, "attachments", {}))
    paths = write_together(out_dir, files)
    return paths[0], paths[1]


# ---------------------------------------------------------------------------------------------
# Files of one evaluation as one unit
# ---------------------------------------------------------------------------------------------
# <out_dir>/.reports/<version>/   the files of one evaluation, written completely before use
# <out_dir>/.reports/current      symbolic link to the newest complete <version>: replacing it is
#                                 one rename, so a reader sees every file of the old version or
#                                 every file of the new one, never a mixture
# <out_dir>/<name>                symbolic link to .reports/current/<name> (report.json, report.txt,
#                                 rows.*): the paths users and scripts read stay the same
UNIT_DIR = ".reports"
CURRENT = "current"
_LINK_ERRNOS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}
_FOREIGN_AGE_S = 3600.0  # a leftover of a process on another host is removed after an hour


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"


def _owner_tag() -> str:
    return f"{_host()}-{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _abandoned(path: str, host: str, pid: int) -> bool:
    """A leftover of a writer that is gone: this host's dead process, or another host's after
    :data:`_FOREIGN_AGE_S` (its process cannot be checked from here)."""
    if host == _host():
        return pid != os.getpid() and not _pid_alive(pid)
    try:
        return time.time() - os.lstat(path).st_mtime > _FOREIGN_AGE_S
    except OSError:
        return False


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not supported by every file system
    finally:
        os.close(fd)


def _current(base: str) -> str | None:
    try:
        return os.readlink(os.path.join(base, CURRENT))
    except OSError:
        return None


_VERSION = re.compile(r"^(?:\.current-)?(?:\d{8}T\d{6}-)?(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]+(?:\.tmp)?$")
_OLD_TMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp$")  # atomic_write's temporary files
_LINK_TMP = re.compile(r"^\.(?P<name>.+)\.link-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]+\.tmp$")


def clean_leftovers(out_dir: str) -> list[str]:
    """Remove what killed writes left in ``out_dir``: temporary files of atomic writes
    (``.report.json.<pid>.<hex>.tmp``) and of links, and unfinished or superseded versions in
    ``.reports/`` of this process or of writers that are gone (a live writer's on this host are
    kept; another host's after :data:`_FOREIGN_AGE_S`). Never touches the version
    ``.reports/current`` names. Returns the removed paths; a failure to remove is ignored (the
    next write tries again)."""
    removed = []
    try:
        names = os.listdir(out_dir)
    except OSError:
        return removed
    for name in names:
        path, m, link = os.path.join(out_dir, name), _OLD_TMP.match(name), _LINK_TMP.match(name)
        if (m and _abandoned(path, _host(), int(m.group("pid")))) or \
                (link and _abandoned(path, link.group("host"), int(link.group("pid")))):
            _remove(path)
            removed.append(path)
    base = os.path.join(out_dir, UNIT_DIR)
    try:
        entries = os.listdir(base)
    except OSError:
        return removed
    current = _current(base)
    for name in entries:
        if name in (CURRENT, current):
            continue
        m = _VERSION.match(name)
        if not m:
            continue
        path, pid = os.path.join(base, name), int(m.group("pid"))
        own = m.group("host") == _host() and pid == os.getpid()
        if own or _abandoned(path, m.group("host"), pid):
            _remove(path)
            removed.append(path)
    return removed


def _swap(base: str, version: str) -> None:
    """Point ``base/current`` at ``version`` (one rename)."""
    tmp = os.path.join(base, f".current-{_owner_tag()}-{os.urandom(4).hex()}.tmp")
    os.symlink(version, tmp)
    try:
        os.replace(tmp, os.path.join(base, CURRENT))
    except BaseException:
        _remove(tmp)
        raise
    _fsync_dir(base)


def _link_names(out_dir: str, names) -> None:
    """Make each ``out_dir/<name>`` the link ``.reports/current/<name>``, replacing a regular
    file of an older infodiff in one rename (:func:`_adopt` first makes it a version of its own).
    A link to a file the current version lacks dangles, as if absent, until a version with it
    becomes current."""
    for name in names:
        path, target = os.path.join(out_dir, name), os.path.join(UNIT_DIR, CURRENT, name)
        if os.path.islink(path) and os.readlink(path) == target:
            continue
        tmp = os.path.join(out_dir, f".{name}.link-{_owner_tag()}-{os.urandom(4).hex()}.tmp")
        os.symlink(target, tmp)
        try:
            os.replace(tmp, path)
        except BaseException:
            _remove(tmp)
            raise
    _fsync_dir(out_dir)


def _unlink_dangling(out_dir: str) -> None:
    """Remove the links into ``.reports/current/`` to files the current version lacks (e.g. a
    figure the newest evaluation could not draw)."""
    prefix = os.path.join(UNIT_DIR, CURRENT) + os.sep
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if os.path.islink(path) and os.readlink(path).startswith(prefix) and not os.path.exists(path):
            _remove(path)


def _new_version(base: str, files: dict) -> str:
    """Write ``files`` {name: bytes} into a new version directory under ``base`` (each file
    fsynced, then the directory); return its name. Removes it again if a write fails."""
    version = f"{time.strftime('%Y%m%dT%H%M%S')}-{_owner_tag()}-{os.urandom(4).hex()}"
    vdir = os.path.join(base, version)
    os.mkdir(vdir)
    try:
        for name, data in files.items():
            with open(os.path.join(vdir, name), "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        _fsync_dir(vdir)
    except BaseException:
        _remove(vdir)
        raise
    return version


def _adopt(out_dir: str, base: str, names) -> None:
    """Files written by an older infodiff (regular files ``out_dir/<name>``, not links) become a
    version of their own before the new one replaces them: what a reader sees is unchanged at
    every step (same bytes, first as files, then through the links)."""
    plain = [n for n in names if os.path.isfile(os.path.join(out_dir, n))
             and not os.path.islink(os.path.join(out_dir, n))]
    if not plain:
        return
    shown = {}
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if name in plain or (os.path.islink(path) and os.path.isfile(path)
                             and os.readlink(path) == os.path.join(UNIT_DIR, CURRENT, name)):
            with open(path, "rb") as f:
                shown[name] = f.read()
    _swap(base, _new_version(base, shown))
    _link_names(out_dir, plain)


def _write_plain(out_dir: str, files: dict) -> list[str]:
    """Each file atomically on its own (a file system without symbolic links)."""
    paths = []
    for name, data in files.items():
        path = os.path.join(out_dir, name)
        workdir_lib.atomic_write_bytes(path, data)
        paths.append(path)
    return paths


def write_together(out_dir: str, files: dict) -> list[str]:
    """Write ``files`` {name: bytes} into ``out_dir`` as one unit and return their paths
    (``out_dir/<name>``, in order): a new version directory ``out_dir/.reports/<version>/`` is
    written completely (fsync), then the link ``.reports/current`` is replaced by one pointing
    to it (one rename), and ``out_dir/<name>`` are links to ``.reports/current/<name>``. Killed at
    any moment, every ``out_dir/<name>`` shows the old version or every one shows the new.
    Leftovers of killed writes are removed first (:func:`clean_leftovers`), superseded versions
    after. Where the file system has no symbolic links each file is written atomically on its
    own (a warning says so).

    Raises StorageError (one line naming ``out_dir/<first name>`` and the errno) if out_dir is
    full, read-only or not writable; the files shown before stay as they were."""
    names = list(files)
    with workdir_lib.storage_guard(os.path.join(out_dir, names[0])):
        made = []  # directories this write creates (removed again if it fails before showing anything)
        d = os.path.abspath(out_dir)
        while not os.path.isdir(d) and os.path.dirname(d) != d:
            made.append(d)
            d = os.path.dirname(d)
        os.makedirs(out_dir, exist_ok=True)
        clean_leftovers(out_dir)
        base = os.path.join(out_dir, UNIT_DIR)
        made_base = not os.path.isdir(base)
        if made_base:
            os.mkdir(base)
        try:
            version = _new_version(base, files)
        except BaseException:
            if made_base:
                shutil.rmtree(base, ignore_errors=True)  # as it was: nothing shown has changed
            for d in made:
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise
        try:
            _adopt(out_dir, base, names)
            _link_names(out_dir, names)  # the new names dangle (absent) until the swap
            _swap(base, version)
        except OSError as e:
            no_links = e.errno in _LINK_ERRNOS and _current(base) is None
            if _current(base) != version:
                _remove(os.path.join(base, version))
            if not no_links:
                raise
            if made_base:
                shutil.rmtree(base, ignore_errors=True)
            from absl import logging

            logging.warning("%s: no symbolic links on this file system (%s); the report's files are written "
                            "one by one, each atomically", out_dir, e)
            return _write_plain(out_dir, files)
        _unlink_dangling(out_dir)
        clean_leftovers(out_dir)
    return [os.path.join(out_dir, n) for n in names]
