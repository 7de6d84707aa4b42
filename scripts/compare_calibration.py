"""Calibration of the paired SE of infodiff.compare against exact differences (RESULTS.md,
"Model vs model"): the two first-order Markov oracles of tests/test_compare.py (chain b mixes
chain a's table with another random one), 20 documents of 5 to 60 characters sampled from chain
a, model length 16, 32 k_dce samples per window, one comparison per seed.

    python scripts/compare_calibration.py [--seeds 100]

Prints the coverage of +-1.96 paired SE and the mean z^2 over the rows and over the totals, the
mean z^2 of the totals with the unpaired SE, and the last seed's SE ratio. Asserts nothing.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from infodiff import compare as compare_lib  # noqa: E402
from infodiff import oracles, scoring  # noqa: E402
from infodiff.data import text as text_data  # noqa: E402
from tests.test_compare import L, _doc_nll, _oracle_run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    args = ap.parse_args()
    rng = np.random.default_rng(11)
    a = oracles.random_markov(rng, text_data.VOCAB, order=1, temperature=0.3, seq_len=L)
    other = oracles.random_markov(rng, text_data.VOCAB, order=1, temperature=0.3, seq_len=L)
    b = oracles.MarkovOracle(0.7 * a.trans + 0.3 * other.trans, text_data.VOCAB, seq_len=L)
    r = np.random.default_rng(5)
    texts = [scoring.clean(text_data.decode(a.sample(r, 1, length=n)[0]))[0] for n in r.integers(5, 60, 20)]
    ids = [text_data.encode(t).astype(np.int32) for t in texts]
    exact = np.array([_doc_nll(a, x) - _doc_nll(b, x) for x in ids])
    run_a, run_b = _oracle_run(a), _oracle_run(b)
    t0, z_rows, z_total, z_unpaired = time.time(), [], [], []
    for seed in range(args.seeds):
        c = compare_lib.compare(run_a, run_b, texts, seed=seed, num_samples=32)
        z_rows += list((c.difference - exact) / c.stderr_paired)
        z_total.append((c.total - exact.sum()) / c.total_stderr_paired)
        z_unpaired.append((c.total - exact.sum()) / c.total_stderr_unpaired)
    z_rows, z_total, z_unpaired = map(np.asarray, (z_rows, z_total, z_unpaired))
    print(f"rows {len(z_rows)}: coverage of 1.96 SE {np.mean(np.abs(z_rows) < 1.96):.3f}, mean z^2 "
          f"{np.mean(z_rows**2):.3f}; totals {len(z_total)}: coverage {np.mean(np.abs(z_total) < 1.96):.3f}, mean z^2 "
          f"{np.mean(z_total**2):.3f}; unpaired SE: mean z^2 {np.mean(z_unpaired**2):.3f}; SE unpaired / paired "
          f"{c.se_ratio:.2f} (last seed); {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
