"""High-replica bias check of the Poisson NLL's channel draws, exact oracle (prints, asserts nothing).

    python benchmarks/poisson_channel_bias.py [--replicas 400] [--seeds 3]

The tests/test_poisson_calibration.py setting (zip law truncated at 40 counts, 41 support points
incl. x = 0, scaled to [1, 2], exact posterior-mean denoiser, the CLI's 1000 draws per example,
'stratified' sampler, proposal 'auto' v2), with many more replicas: for the defensive channel
draw (channel_defensive = 0.3, the default) and the plain Poisson draw (0), per seed and pooled,
the mean of estimate - exact -log p over all cases with its SE, the same restricted to the high-count
points (x >= 20), coverage of +-1.96 SE and mean z^2. The pooled bias over n cases has SE
sqrt(sum SE_i^2) / n; a bias at 4 of its SEs would be a real one. docs/poisson.md §3.5 quotes it.
"""

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from infodiff import likelihood as lk  # noqa: E402
from infodiff.data import count_synthetic as cs  # noqa: E402
from infodiff.evaluation.report import table  # noqa: E402
from infodiff.processes import poisson as P  # noqa: E402

MAX_COUNT = 40
NUM_SAMPLES = 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    dist = cs.get_distribution("zip", max_count=MAX_COUNT)
    sc = P.CountScaling(MAX_COUNT)
    orc = dist.oracle(sc)
    x = np.tile(sc.scale(dist.support), (args.replicas, 1))
    exact = np.tile(-np.log(dist.probs), args.replicas)
    high = np.tile(dist.support[:, 0] >= 20, args.replicas)
    rows_ = sc.scale(dist.sample(np.random.default_rng(0), 20000))
    loc, scale, clip = P.suggest_logistic(rows_, sc.spacing, recipe="v2")
    rows = []
    for eps in (0.3, 0.0):
        err, se2, err_hi, se2_hi, z = [], [], [], [], []
        for seed in range(args.seeds):
            t0 = time.time()
            est = lk.poisson_nll(orc, x, jax.random.PRNGKey(10_000 + seed), num_samples=NUM_SAMPLES,
                                 sampler="stratified", loc=loc, scale=scale, clip=clip, scaling=sc,
                                 batch_size=1 << 16, channel_defensive=eps)
            d, s = est.mean - exact, est.stderr
            err.append(d), se2.append(s**2), err_hi.append(d[high]), se2_hi.append(s[high] ** 2), z.append(d / s)
            n = d.size
            rows.append([f"{eps:g}", str(seed), str(n), f"{d.mean():+.4f} ± {np.sqrt(np.sum(s**2)) / n:.4f}",
                         f"{d[high].mean():+.4f} ± {np.sqrt(np.sum(s[high]**2)) / high.sum():.4f}",
                         f"{np.mean(np.abs(d / s) <= 1.96):.3f}", f"{np.mean((d / s)**2):.3f}",
                         f"{time.time() - t0:.0f}"])
            print(" | ".join(rows[-1]), flush=True)
        d, s2, dh, s2h, zz = (np.concatenate(a) for a in (err, se2, err_hi, se2_hi, z))
        rows.append([f"{eps:g}", "pooled", str(d.size), f"{d.mean():+.4f} ± {np.sqrt(s2.sum()) / d.size:.4f}",
                     f"{dh.mean():+.4f} ± {np.sqrt(s2h.sum()) / dh.size:.4f}",
                     f"{np.mean(np.abs(zz) <= 1.96):.3f}", f"{np.mean(zz**2):.3f}", ""])
    print()
    print(table(["channel_defensive", "seed", "cases", "bias (nats)", "bias, x >= 20", "coverage 95", "mean z^2",
                 "s"], rows))


if __name__ == "__main__":
    main()
