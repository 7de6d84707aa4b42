"""What draws that do not depend on the other rows of a file would cost: a file scored in one
call (today's layout: the chunks of all rows' windows share the key schedule) against each row
scored alone (what a per-row key needs with today's estimator calls: one call per row).

    python benchmarks/per_row_draws.py --workdir runs/masked_text [--rows 48] [--samples 16]

Prints the wall time of both after one warm-up of each (compilations excluded), the ratio, and
the two estimates of the file's total NLL (the same estimator: they agree within their SEs).
Any text run works; the rows are lines of a fixed pseudo-random word list of 20-120 characters.
"""

import argparse
import time

import numpy as np

import infodiff


def rows(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = "the of and to in is was for on that with as by at from his her an are were it which".split()
    return [" ".join(rng.choice(words, int(rng.integers(5, 25)))) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--samples", type=int, default=16)
    a = ap.parse_args()
    run = infodiff.load_run(a.workdir, num_samples=a.samples)
    texts = rows(a.rows)

    def whole():
        return run.nll(texts, seed=0)

    def alone():
        return [run.nll([t], seed=0) for t in texts]

    whole(), alone()  # compile every shape once
    t0 = time.perf_counter()
    w = whole()
    t1 = time.perf_counter()
    each = alone()
    t2 = time.perf_counter()
    tot_each = sum(float(e.mean[0]) for e in each)
    se_each = float(np.sqrt(sum(float(e.stderr[0]) ** 2 for e in each)))
    tot, se = w.total()
    print(f"{a.rows} rows x {a.samples} samples per window, model length {run.seq_len}")
    print(f"  one call for the file: {t1 - t0:.2f} s; one call per row: {t2 - t1:.2f} s "
          f"({(t2 - t1) / (t1 - t0):.1f}x)")
    print(f"  total NLL: {tot:.2f} ± {se:.2f} (file) and {tot_each:.2f} ± {se_each:.2f} (rows alone), nats")


if __name__ == "__main__":
    main()
