"""A trained masked run's own likelihood against its NELBO (RESULTS.md, "The model's own likelihood").

    python scripts/nll_intervals.py --workdir runs/masked_text --out intervals.json

1. Conditional rows: responses of 8-12 characters after a 52-character prompt, both from the
   test split (row r: prompt = a test window's first 52 characters, response = the next 8 + r % 5).
   Per row: the exact -log p_U(response | prompt) of the network (the subset recursion,
   2^R - 1 forward passes), the closed-form NELBO from the same table, the library's k_dce
   NELBO estimate (``eval.input_samples`` samples) and its z against the closed form, IW at
   K = 1, 4, 16, 64 (uniform and informed orders), the interval at K = 16 and 64 and whether it
   contains the exact value; sums over rows and the gap NELBO - exact in bits per character.
2. Whole test windows (64 characters): the interval at K = 16 and 64 (width in bits per
   character, forward passes per window), the greedy-confidence and left-to-right samplers' exact
   likelihoods and the NELBO, all in bits per character.
Prints tables and writes every number to ``--out`` (JSON). Asserts nothing.
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import scipy.special  # noqa: E402

import infodiff  # noqa: E402
from infodiff import likelihood as lk  # noqa: E402
from infodiff import orders  # noqa: E402

LN2 = math.log(2.0)


def closed_form_nelbo(lc, m):
    """-sum_S w_S sum_{i not in S} log c(i, S), w_S = |S|! (m - |S| - 1)! / m! (nats)."""
    size = np.array([bin(a).count("1") for a in range(1 << m)])
    w = np.array([math.factorial(k) * math.factorial(m - k - 1) / math.factorial(m) if k < m else 0.0
                  for k in size])
    v = np.where(np.isfinite(lc), lc, 0.0).sum(axis=1)
    return -float(np.sum(w * v))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--windows", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--proposal", default="uniform", choices=orders.PROPOSALS, help="the interval's proposal")
    ap.add_argument("--reuse", default="", help="a previous --out of the same workdir, seed and rows: its exact "
                    "values instead of the recursion")
    a = ap.parse_args()
    run = infodiff.load_run(a.workdir)
    task = run.task
    den, sched = run.denoiser, task.schedule_obj
    x_all, _, _ = task.eval_items()
    x_all = np.asarray(x_all)
    L = x_all.shape[1]
    rng = np.random.default_rng(a.seed)
    pick = rng.permutation(len(x_all))
    key = jax.random.PRNGKey(a.seed)
    out = {"workdir": os.path.abspath(a.workdir), "checkpoint_step": run.checkpoint_step, "proposal": a.proposal}

    # 1. conditional rows
    P = 52
    xs = x_all[pick[:a.rows]]
    R_B = 8 + np.arange(a.rows) % 5
    target = np.zeros_like(xs, bool)
    pad = np.zeros_like(xs, bool)
    for b, R in enumerate(R_B):
        target[b, P:P + R] = True
        pad[b, P + R:] = True
    t0 = time.time()
    if a.reuse:
        with open(a.reuse) as f:
            old = json.load(f)["conditional"]
        ex = {"nll": np.array(old["exact"]), "best_order_nll": np.array(old["best_order"]),
              "forward_passes": np.array([old["exact_forward_passes"]])}
        nelbo_cf = np.array(old["nelbo_closed_form"])
    else:
        ex = orders.exact_any_order(den, xs, target_BxL=target, pad_BxL=pad, progress=True)
        nelbo_cf = np.array([closed_form_nelbo(lc, int(R)) for lc, R in zip(ex["log_c"], R_B)])
    t_exact = time.time() - t0
    exact = ex["nll"]
    est = lk.nll(den, xs, jax.random.fold_in(key, 1), process=run.process, num_samples=run.num_samples,
                 target_BxL=target, pad_BxL=pad, batch_size=256)
    z_nelbo = (est.mean - nelbo_cf) / est.stderr
    cond = {"rows": int(a.rows), "prompt_chars": P, "response_chars": R_B.tolist(),
            "exact": exact.tolist(), "best_order": ex["best_order_nll"].tolist(),
            "nelbo_closed_form": nelbo_cf.tolist(), "nelbo_estimate": est.mean.tolist(),
            "nelbo_stderr": est.stderr.tolist(), "nelbo_samples": est.num_samples,
            "exact_seconds": t_exact, "exact_forward_passes": int(ex["forward_passes"].sum())}
    chars = int(R_B.sum())
    print(f"\nconditional: {a.rows} rows, responses of 8-12 characters after {P}, {chars} characters")
    print(f"  exact -log p_U        {exact.sum():10.2f} nats  {exact.sum() / chars / LN2:.4f} bpc")
    print(f"  NELBO (closed form)   {nelbo_cf.sum():10.2f} nats  {nelbo_cf.sum() / chars / LN2:.4f} bpc  gap "
          f"{(nelbo_cf.sum() - exact.sum()) / chars / LN2:.4f} bpc ({100 * (nelbo_cf.sum() / exact.sum() - 1):.1f} %)")
    print(f"  NELBO estimate        {est.mean.sum():10.2f} ± {est.pooled_stderr():.2f}; per row z vs closed "
          f"form: |z| max {np.abs(z_nelbo).max():.2f}, within 1.96: {np.mean(np.abs(z_nelbo) < 1.96):.3f}")
    print(f"  best single order     {ex['best_order_nll'].sum():10.2f} nats")
    cond["iw"] = {}
    for prop in orders.PROPOSALS if not a.reuse else ():
        for K in (1, 4, 16, 64):
            lw, _ = orders.plan_log_weights(den, xs, jax.random.fold_in(key, 100 + K), K, target_BxL=target,
                                            pad_BxL=pad, mode=prop, temperature=0.5, schedule=sched)
            iw = -(scipy.special.logsumexp(lw, axis=1) - math.log(K))
            cond["iw"][f"{prop}_K{K}"] = iw.tolist()
            print(f"  IW {prop:8s} K={K:<3d}   {iw.sum():10.2f} nats  gap to exact "
                  f"{(iw.sum() - exact.sum()) / chars / LN2:.4f} bpc")
    cond["interval"] = {}
    for K in (16, 64):
        iv = orders.nll_interval(den, xs, jax.random.fold_in(key, 200 + K), target_BxL=target, pad_BxL=pad,
                                 num_orders=K, exact="never", schedule=sched, proposal=a.proposal)
        inside = (iv.lower <= exact) & (exact <= iv.upper)
        tot = iv.total()
        cond["interval"][f"K{K}"] = {"rows": iv.rows(), "covered": float(inside.mean()), "total": tot}
        print(f"  interval K={K:<3d} (+{K} pilot): sum [{tot['lower']:.2f}, {tot['upper']:.2f}] "
              f"(tube {tot['tube']:.2f}, iw {tot['iw']:.2f}); rows containing the exact value {inside.mean():.3f}; "
              f"mean width {iv.width.mean() / LN2:.3f} bits/row; median ESS {np.median(iv.ess):.1f}")
    out["conditional"] = cond

    # 2. whole windows
    W = x_all[pick[a.rows:a.rows + a.windows]]
    est = lk.nll(den, W, jax.random.fold_in(key, 2), process=run.process, num_samples=run.num_samples,
                 batch_size=256)
    per = W.size * LN2
    win = {"windows": int(a.windows), "length": int(L), "nelbo_bpc": float(est.mean.sum() / per),
           "nelbo_bpc_stderr": est.pooled_stderr() / per}
    print(f"\nwhole windows: {a.windows} x {L} characters")
    print(f"  NELBO ({run.process.estimator}, {est.num_samples} samples)  {win['nelbo_bpc']:.4f} ± "
          f"{win['nelbo_bpc_stderr']:.4f} bpc")
    for K in (16, 64):
        t0 = time.time()
        iv = orders.nll_interval(den, W, jax.random.fold_in(key, 300 + K), num_orders=K, exact="never",
                                 schedule=sched, progress=True, proposal=a.proposal)
        tot = iv.total()
        win[f"interval_K{K}"] = {"lower_bpc": tot["lower"] / per, "upper_bpc": tot["upper"] / per,
                                 "iw_bpc": tot["iw"] / per, "tube_bpc": tot["tube"] / per,
                                 "width_bpc": (tot["upper"] - tot["lower"]) / per,
                                 "row_width_bpc_mean": float(iv.width.mean() / (L * LN2)),
                                 "forward_passes_per_window": float(iv.forward_passes.mean()),
                                 "median_ess": float(np.median(iv.ess)),
                                 "max_pareto_k": float(np.nanmax(iv.pareto_k)) if np.any(np.isfinite(iv.pareto_k)) else None,
                                 "seconds": time.time() - t0}
        d = win[f"interval_K{K}"]
        print(f"  interval K={K:<3d}  [{d['lower_bpc']:.4f}, {d['upper_bpc']:.4f}] bpc (iw {d['iw_bpc']:.4f}, "
              f"tube {d['tube_bpc']:.4f}); per-window width {d['row_width_bpc_mean']:.3f} bpc; "
              f"{d['forward_passes_per_window']:.0f} passes/window; median ESS {d['median_ess']:.1f}")
    for s in ("greedy_confidence", "left_to_right", "margin"):
        r = orders.sampler_nll(den, W, key, sampler=s)
        win[f"sampler_{s}_bpc"] = float(r.iw.sum() / per)
        print(f"  sampler {s:18s} exact {r.iw.sum() / per:.4f} bpc ({int(r.forward_passes[0])} passes/window)")
    out["windows"] = win
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
