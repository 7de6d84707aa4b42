"""Exact per-draw variance of the Poisson NLL estimator for each log-SNR proposal and sampler.

python benchmarks/poisson_proposals.py                       # zip truncated at 40 (41 points)
python benchmarks/poisson_proposals.py --law zip --max-count 50 --cache /tmp/zip50.npz

No Monte Carlo: for every support point x of a 1-D count law (scaled to [1, 2]) with its exact
posterior-mean denoiser, infodiff.poisson_moments computes E_z[l] and Var_z[l] on a log-SNR grid
(exact sums over z ~ Pois(e^alpha x)), then the exact mean and S x Var(estimate) of each
(proposal, sampler) at S draws per example. Printed per row: the data-averaged variance per draw
sum_x p(x) S Var_x (what the split-mean SE pays), its max over x, and the worst per-example
excess kurtosis of an iid draw (the heavy tail that breaks sample-variance SEs). Asserts
nothing. docs/poisson.md §3.5 quotes the output.

The table takes ~4-7 minutes on one CPU core for 41 points (the z sums at alpha ~ 8-14 dominate);
--cache stores it.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infodiff import poisson_moments as pm  # noqa: E402
from infodiff.data import count_synthetic as cs  # noqa: E402
from infodiff.processes import poisson as P  # noqa: E402


def iid_kurtosis(tab, proposal, num_points: int = 8192):
    """Excess kurtosis of one iid draw f = w l, per x (from the exact raw moments E_z[l^k])."""
    u = (np.arange(num_points) + 0.5) / num_points
    al, w = pm.proposal_quantile_map(u, *proposal)
    a = tab["alpha"]
    m1 = pm.interpolate(a, tab["m1"], al)
    r2 = pm.interpolate(a, tab["v"], al) + m1**2
    e = [(w[:, None] ** k * mk).mean(0) for k, mk in
         ((1, m1), (2, r2), (3, pm.interpolate(a, tab["r3"], al)), (4, pm.interpolate(a, tab["r4"], al)))]
    var = e[1] - e[0] ** 2
    mu4 = e[3] - 4 * e[0] * e[2] + 6 * e[0] ** 2 * e[1] - 3 * e[0] ** 4
    return mu4 / var**2 - 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--law", default="zip")
    ap.add_argument("--max-count", type=int, default=40)
    ap.add_argument("--num-samples", type=int, default=200)
    ap.add_argument("--cache", default="")
    args = ap.parse_args()
    dist = cs.get_distribution(args.law, max_count=args.max_count)
    sc = P.CountScaling(args.max_count)
    orc = dist.oracle(sc)
    x = sc.scale(dist.support[:, 0])
    p = dist.probs
    if args.cache and os.path.exists(args.cache):
        tab = dict(np.load(args.cache))
    else:
        t0 = time.time()
        tab = pm.moment_table(orc, x, np.arange(-30.0, 20.0001, 0.05))
        print(f"moment table: {time.time() - t0:.0f} s")
        if args.cache:
            np.savez(args.cache, **tab)
    nll = np.trapezoid(np.exp(tab["alpha"])[:, None] * tab["m1"], tab["alpha"], axis=0)
    print(f"{args.law} at {args.max_count}: quadrature of e^alpha E_z l vs -log p(x): max error "
          f"{np.max(np.abs(nll + np.log(p))):.2e} nats")
    rng = np.random.default_rng(0)
    auto_old = P.suggest_logistic(sc.scale(dist.sample(rng, 20000)), sc.spacing, recipe="v1")
    auto = P.suggest_logistic(sc.scale(dist.sample(np.random.default_rng(0), 20000)), sc.spacing)
    props = {"paper (-1, 5, 4)": (-1.0, 5.0, 4.0), "auto v1 " + str(tuple(round(v, 2) for v in auto_old)): auto_old,
             "auto v2 " + str(tuple(round(v, 2) for v in auto)): auto}
    S = args.num_samples
    rows = []
    for name, prop in props.items():
        kurt = iid_kurtosis(tab, prop)
        for kind in ("iid", "strata_pairs", "rqmc"):
            r = pm.sampler_variance(tab["alpha"], tab["m1"], tab["v"], kind, S, prop)
            rows.append((name, kind, S, p @ r["var_per_draw"], r["var_per_draw"].max(),
                         kurt.max() if kind == "iid" else float("nan")))
    Sg = P.min_grid_samples(-28.0, 37.0)
    r = pm.sampler_variance(tab["alpha"], tab["m1"], tab["v"], "grid", Sg // 2)
    # grid: S / 2 nodes x 2 channel draws; sampler_variance(grid, S / 2) is S Var of that estimate
    rows.append(("grid [-28, 37]", f"{Sg // 2} nodes x 2", Sg, p @ r["var_per_draw"], r["var_per_draw"].max(),
                 float("nan")))
    print(f"\nS x Var(estimate) per example (nats^2; = variance per draw), S = {S} unless stated")
    print(f"{'proposal':34s} {'sampler':16s} {'S':>5s} {'sum_x p(x) SVar':>16s} {'max_x SVar':>11s} "
          f"{'max_x kurtosis (iid)':>21s}")
    for name, kind, s_, pv, mx, k in rows:
        print(f"{name:34s} {kind:16s} {s_:5d} {pv:16.2f} {mx:11.1f} " + (f"{k:21.0f}" if k == k else f"{'-':>21s}"))


if __name__ == "__main__":
    main()
