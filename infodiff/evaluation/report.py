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

import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

from infodiff.training import workdir as workdir_lib

__all__ = ["REPORT_VERSION", "COMMON_KEYS", "NETWORK_KEYS", "ORACLE_KEYS", "INPUT_KEYS", "ROW_KEYS", "TERMS", "env", "git_info",
           "oracle_row", "format_report", "table", "strict_json", "write_report"]

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
            "se_method", "se_note", "exact", "min_samples", "few_samples", "coverage_95", "mean_z2")
TERMS = ("diffusion", "prior", "recon", "total")


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
    """The report's warning when an NLL is not finite or lies more than 1.96 SE above the uniform
    model's (``uniform_nll``, the same unit): a diverged or broken model, not a result."""
    if uniform_nll is None:
        return [] if math.isfinite(nll) else [f"the NLL {nll} is not finite: the model is broken; do not report it"]
    if not math.isfinite(nll) or nll - 1.96 * stderr > uniform_nll:
        return [f"the NLL {nll:.6g} ± {stderr:.3g} {unit} is above the uniform model's {uniform_nll:.6g}: "
                "the model is worse than guessing uniformly (a diverged run or a broken checkpoint); do not "
                "report it, check the training curves"]
    return []


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
    rows = [[x["estimator"] + (" (inf. var.)" if x["infinite_variance"] else "")
             + (" (exact)" if x["exact"] else "") + (" (few samples)" if x["few_samples"] else ""),
             f"{x['mean_estimate']:.4f}", f"{x['mean_exact']:.4f}",
             f"{x['bias']:+.4f} ± {x['bias_stderr']:.4f}", f"{x['bias_z']:+.2f}",
             f"{x['per_sample_std']:.3f}", f"{x['variance_per_forward_pass']:.3f}",
             f"{x['stderr_at_1024_forward_passes']:.4f}", x.get("se_method", "iid"),
             _fmt_opt(x.get("coverage_95"), ".3f"), _fmt_opt(x.get("mean_z2"), ".2f")] for x in items]
    return table(headers, rows)


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
        out += f"\nwritten: {p}"
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


def write_report(report: dict, out_dir: str) -> tuple[str, str]:
    """Write report.json (strict JSON: undefined numbers are null) and report.txt into out_dir,
    each atomically (temporary file, fsync, rename: a failure leaves the previous files intact
    and no temporary file); return their paths.

    Raises StorageError (one line naming the path and the errno) if out_dir is full, read-only or
    not writable: print the report first (evaluate.py does), so that nothing is lost. In a
    multi-process run only process 0 writes (the others return the same paths)."""
    from infodiff import parallel

    if not parallel.is_primary():
        return os.path.join(out_dir, "report.json"), os.path.join(out_dir, "report.txt")
    text = format_report(report)
    with workdir_lib.storage_guard(out_dir, "create"):
        os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, content in (("report.json", json.dumps(strict_json(report), indent=2, allow_nan=False)),
                          ("report.txt", text + "\n")):
        path = os.path.join(out_dir, name)
        workdir_lib.atomic_write_text(path, content)
        paths.append(path)
    return paths[0], paths[1]
