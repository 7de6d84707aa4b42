"""Per-item SE calibration of the masked and I-MDSE estimators: plain sample SE vs the Student-t
scaled SE the library reports, at small and large sample counts (prints, asserts nothing).

    python benchmarks/se_calibration.py

400 sequences of a random tabular law (ACGT, length 6, 64 sequences, temperature 0.5), each with
its own noise; for each estimator and S: coverage of +-1.96 SE and mean z^2 with the plain SE
(``Estimate.stderr_raw``) and with the reported one (``Estimate.stderr``), and the mean excess
kurtosis of the per-sample values. The plain-SE numbers of RESULTS.md ("Calibration of the
standard errors") come from this script; the tested property is tests/test_calibration.py.
"""

import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402

from infodiff import likelihood as lk  # noqa: E402
from infodiff import oracles, schedules  # noqa: E402
from infodiff.evaluation.report import table  # noqa: E402
from infodiff.processes import score_entropy as se  # noqa: E402


def main():
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    tab = oracles.random_tabular(rng, "ACGT", 6, 64, 0.5)
    x = tab.sample(rng, 400)
    truth = -tab.log_prob(x)
    lm = schedules.LogLinearSchedule().lambda_max
    runs = [(8, "stratified"), (16, "stratified"), (16, "k_dce"), (32, "t_dce"), (32, "k_dce"), (32, "time_free"),
            (32, "stratified"), (32, ("absorb", "defensive")), (32, ("uniform", "importance")),
            (32, ("uniform", "defensive")), (512, ("absorb", "defensive")), (512, ("uniform", "importance")),
            (512, ("uniform", "defensive")), (512, "time_free")]
    rows = []
    for S, spec in runs:
        if isinstance(spec, str):
            est = lk.nll(tab, x, jax.random.PRNGKey(S + 7), estimator=spec, num_samples=S)
            name = spec
        else:
            g, law = spec
            est = lk.imdse_nll(se.OracleScore(tab, g), x, jax.random.PRNGKey(S + 3), graph=g, lam_max=lm,
                               lambda_sampling=law, num_samples=S)
            name = f"imdse {g}:{law}"
        out = [name, S]
        for s_N in (est.stderr_raw, est.stderr):
            z = (est.mean - truth) / s_N
            out += [f"{np.mean(np.abs(z) <= 1.96):.3f}", f"{np.mean(z**2):.3f}"]
        out.append(f"{np.mean(scipy.stats.kurtosis(est.samples, axis=1)):.1f}")
        rows.append(out)
    print(table(["estimator", "S", "cover (plain)", "z^2 (plain)", "cover (t)", "z^2 (t)", "kurtosis"], rows))


if __name__ == "__main__":
    main()
