"""Total-variation table of the Poisson-diffusion samplers with the exact denoiser (docs/poisson.md §4.4).

    python benchmarks/poisson_samplers.py                       # 200k samples, T = 20, 100, 1000
    python benchmarks/poisson_samplers.py --num_samples=50000 --steps=20,100
    python benchmarks/poisson_samplers.py --decision=ml

Setup (docs/poisson.md §4.4): pmf on {1, 1.2, 1.4, 2} = CountScaling(5) of the counts
{0, 1, 2, 5} with probabilities (.4, .3, .2, .1); denoiser = exact posterior mean
(infodiff.count_oracles.FiniteCountOracle); gamma log-spaced from 1e-3 to 2000 with T points;
final lattice decision at gamma_max. Samplers: the pure-birth increment sampler (default) and the
paper-literal ItDPDM Algorithm 2 (fresh draws). Prints TV(empirical, true pmf) and the Monte
Carlo noise floor 0.5 sum_k sqrt(p_k (1 - p_k) / N) (an upper bound on E TV(empirical, law)).
docs/poisson.md §4.4 reference (200k samples): Alg. 2 0.143 / 0.103 / 0.084, increment 0.066 / 0.014 / 0.003.
A benchmark, not a test: it asserts nothing.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from infodiff.count_oracles import FiniteCountOracle  # noqa: E402
from infodiff.processes import poisson as P  # noqa: E402

_N = flags.DEFINE_integer("num_samples", 200_000, "Samples per (sampler, T).")
_STEPS = flags.DEFINE_list("steps", ["20", "100", "1000"], "Numbers of SNR levels T.")
_DECISION = flags.DEFINE_enum("decision", "round", list(P.DECISIONS), "Final lattice decision.")
_GMIN = flags.DEFINE_float("gamma_min", 1e-3, "Smallest SNR.")
_GMAX = flags.DEFINE_float("gamma_max", 2000.0, "Largest SNR.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")


def main(argv):
    del argv
    sc = P.CountScaling(5)
    counts = np.array([0, 1, 2, 5])
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    probs_lattice = np.zeros(sc.max_count + 1)
    probs_lattice[counts] = probs
    oracle = FiniteCountOracle(sc.scale(counts), probs)
    n = _N.value
    floor = 0.5 * np.sum(np.sqrt(probs * (1 - probs) / n))
    print(f"pmf on {sc.scale(counts).tolist()} w.p. {probs.tolist()}; gamma in "
          f"[{_GMIN.value:g}, {_GMAX.value:g}] log-spaced; decision={_DECISION.value}; N={n}; "
          f"MC noise floor {floor:.4f}")
    print(f"{'T':>6} | {'Alg. 2 (paper-literal)':>22} | {'increment (default)':>20} | seconds")
    key = jax.random.PRNGKey(_SEED.value)
    for t_str in _STEPS.value:
        T = int(t_str)
        g = P.log_spaced_gammas(_GMIN.value, _GMAX.value, T)
        t0 = time.time()
        s_paper = P.paper_sampler(oracle, jax.random.fold_in(key, 2 * T), n, 1, g, sc, _DECISION.value)
        s_inc = P.increment_sampler(oracle, jax.random.fold_in(key, 2 * T + 1), n, 1, g, sc,
                                    _DECISION.value)
        tv_p = P.total_variation(s_paper, probs_lattice)
        tv_i = P.total_variation(s_inc, probs_lattice)
        print(f"{T:>6} | {tv_p:>22.4f} | {tv_i:>20.4f} | {time.time() - t0:.1f}")


if __name__ == "__main__":
    app.run(main)
