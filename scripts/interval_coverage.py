"""Coverage of the NLL interval against exact values, by how inconsistent the network is
(RESULTS.md, "The model's own likelihood"): random networks of tests/test_orders.py
(length 6, V = 3, 5 targets after a 1-token prompt), 120 rows per line.

    python scripts/interval_coverage.py [--proposal uniform]

Per scale: the gap NELBO - exact per target token (nats), and for K = 16 and 64 the fraction of
rows whose 95 % interval contains the exact -log p_U (subset recursion), each side's misses and
the median ESS / K. Asserts nothing.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from infodiff import orders  # noqa: E402
from tests.test_orders import RandomDenoiser, _closed_form_elbo, _rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proposal", default="uniform", choices=orders.PROPOSALS)
    a = ap.parse_args()
    for scale in (0.3, 0.5, 0.75, 1.0, 1.5):
        for K in (16, 64):
            cov, gaps, lo, up, ess = [], [], [], [], []
            for c in range(3):
                den = RandomDenoiser(100 + c, L=6, V=3, scale=scale)
                x, target, _ = _rows(den, 40, 200 + c, m=5, prompt=1)
                ex = orders.exact_any_order(den, x, target_BxL=target)
                tr = ex["nll"]
                gaps += [(-_closed_form_elbo(lc, 5) - t) / 5 for lc, t in zip(ex["log_c"], tr)]
                iv = orders.nll_interval(den, x, jax.random.PRNGKey(c), target_BxL=target, num_orders=K,
                                         exact="never", proposal=a.proposal)
                cov += list((iv.lower <= tr) & (tr <= iv.upper))
                lo += list(iv.lower > tr)
                up += list(iv.upper < tr)
                ess += list(iv.ess / K)
            print(f"scale {scale} K {K}: gap/token {np.mean(gaps):.3f} coverage {np.mean(cov):.3f} "
                  f"lower>truth {np.mean(lo):.3f} upper<truth {np.mean(up):.3f} ess/K {np.median(ess):.2f}", flush=True)


if __name__ == "__main__":
    main()
