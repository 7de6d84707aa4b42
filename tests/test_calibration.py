"""Standard errors are calibrated: over many oracle cases about 95 % of |estimate - exact| fall
within 1.96 SE, and the mean of z^2 is what it should be.

Every case is one sequence (or prompt/response pair) with its own independent noise, estimated
at the estimator's ``min_samples`` (the fewest samples its SE is claimed to be calibrated at;
fewer are flagged by ``Estimate.few_samples``). Tolerances are derived, not tuned:

* coverage: the number of cases with |z| <= 1.96 is Binomial(N, 0.95) under calibration; we
  accept its central 99.8 % range;
* mean z^2: with Gaussian per-sample values, z = (mean - truth) / SE with the Student-t scaled SE
  (``Estimate.stderr``, dof nu = S - 1) is c t_nu with c = 1.96 / t_{0.975, nu}, so
  z^2 / c^2 ~ F(1, nu): E[z^2] = c^2 nu / (nu - 2) (~0.96-1.0) and the standard deviation of
  the mean over N cases follows from Var F(1, nu); we accept E +- 3.3 of those deviations.
The per-process table is generated: every registration's ``calibration_cases()``
(infodiff/tasks; the test-only registration of tests/conftest.py included).
Run with ``pytest -s`` to see coverage and mean z^2 of every estimator.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
import scipy.stats

from infodiff import likelihood as lk
from infodiff import tasks
from infodiff.tasks import masked as masked_task

# N = 400 cases per estimator, sized by what the check must catch (simulated with Student-t z,
# dof 15 and 127, 2000 repetitions): a calibrated SE passes with probability >= 0.998; an SE
# too small by 30 % (SE x 0.7) fails always at N = 400 (>= 0.9995 at N = 200, only ~0.95 at
# N = 100); by 20 % (SE x 0.8, test_the_check_fails_for_an_overconfident_se) fails with
# probability >= 0.99 at N = 400 but only 0.86-0.94 at N = 200. So N stays 400: the cases are
# one vectorised batch per estimator, their cost is mostly compilation, not N.
N_CASES = masked_task.CALIBRATION_CASES


def calibration(mean_N, se_N, truth_N, dof: int) -> dict:
    """Coverage of +-1.96 SE and mean z^2 over N cases (SE with ``dof`` degrees of freedom),
    with their accepted ranges."""
    z = (np.asarray(mean_N) - np.asarray(truth_N)) / np.asarray(se_N)
    N = len(z)
    k = int(np.sum(np.abs(z) <= 1.96))
    k_lo, k_hi = scipy.stats.binom.ppf([0.001, 0.999], N, 0.95)
    nu = dof
    c2 = (1.959963984540054 / scipy.stats.t.ppf(0.975, nu)) ** 2
    mean_f = nu / (nu - 2)
    var_f = 2 * nu**2 * (nu - 1) / ((nu - 2) ** 2 * (nu - 4))
    e_z2, sd_z2 = c2 * mean_f, c2 * np.sqrt(var_f / N)
    return {"coverage": k / N, "coverage_range": (k_lo / N, k_hi / N), "mean_z2": float(np.mean(z**2)),
            "mean_z2_range": (e_z2 - 3.3 * sd_z2, e_z2 + 3.3 * sd_z2), "max_abs_z": float(np.max(np.abs(z)))}


def check(name: str, est: lk.Estimate, truth_N) -> dict:
    c = calibration(est.mean, est.stderr, truth_N, est.dof)
    print(f"\n  {name:32s} S={est.num_samples:4d} coverage {c['coverage']:.3f} "
          f"[{c['coverage_range'][0]:.3f}, {c['coverage_range'][1]:.3f}]  mean z^2 {c['mean_z2']:.3f} "
          f"[{c['mean_z2_range'][0]:.3f}, {c['mean_z2_range'][1]:.3f}]  max|z| {c['max_abs_z']:.2f}")
    assert not est.few_samples, f"{name}: S = {est.num_samples} is below its min_samples {est.min_samples}"
    lo, hi = c["coverage_range"]
    assert lo <= c["coverage"] <= hi, f"{name}: coverage {c['coverage']:.3f} outside [{lo:.3f}, {hi:.3f}]"
    lo, hi = c["mean_z2_range"]
    assert lo <= c["mean_z2"] <= hi, f"{name}: mean z^2 {c['mean_z2']:.3f} outside [{lo:.3f}, {hi:.3f}]"
    return c


@pytest.fixture(scope="module")
def tabular():
    """(the masked calibration table's tabular law, its 400 items, their exact -log p)."""
    return masked_task.calibration_laws()[0]


@pytest.mark.slow
def test_the_check_fails_for_an_overconfident_se(tabular):
    """The same cases with the SE shrunk by 20 % (what heavy tails do) fail the check."""
    tab, x, truth = tabular
    est = lk.nll(tab, x, jax.random.PRNGKey(3), estimator="k_dce", num_samples=16)
    check("k_dce", est, truth)
    c = calibration(est.mean, 0.8 * est.stderr, truth, est.dof)
    assert not (c["coverage_range"][0] <= c["coverage"] and c["mean_z2"] <= c["mean_z2_range"][1])


CALIBRATION = [(reg.name, case) for reg in tasks.REGISTRY.values() for case in reg.calibration_cases()]


def _params():
    out = []
    for reg_name, case in CALIBRATION:
        marks = [pytest.mark.slow]
        if case.xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=case.xfail))
        out.append(pytest.param(case, id=f"{reg_name}:{case.name}", marks=marks))
    return out


def test_the_table_is_generated_from_the_registry():
    ids = [f"{reg_name}:{case.name}" for reg_name, case in CALIBRATION]
    assert "test_masked:test_masked k_dce" in ids and "masked:neyman conditional" in ids
    assert {"masked", "sedd"} <= {reg_name for reg_name, _ in CALIBRATION}
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", _params())
def test_se_is_calibrated(case):
    est, truth = case.estimate()
    assert not est.is_exact
    check(case.name, est, truth)


@pytest.mark.slow
def test_split_se_with_few_samples_per_sequence(tabular):
    """A split's SE pools its items' variances: calibrated even at S = 4 per sequence (k_dce,
    below its per-item min_samples), over 100 splits of 8 sequences (dof 8 x 3)."""
    tab, _, _ = tabular
    rng = np.random.default_rng(9)
    x = tab.sample(rng, 800)
    truth = -tab.log_prob(x)
    est = lk.nll(tab, x, jax.random.PRNGKey(4), estimator="k_dce", num_samples=4)
    means, ses = [], []
    for g in range(100):
        part = lk.Estimate(est.estimator, est.samples[8 * g:8 * g + 8], est.forward_passes)
        split = part.split_mean()
        means.append(split["mean"])
        ses.append(split["stderr"])
    truth_g = truth.reshape(100, 8).mean(1)
    c = calibration(means, ses, truth_g, 8 * 3)
    print(f"\n  k_dce split of 8 (S=4 each)        coverage {c['coverage']:.3f} "
          f"[{c['coverage_range'][0]:.3f}, {c['coverage_range'][1]:.3f}]  mean z^2 {c['mean_z2']:.3f} "
          f"[{c['mean_z2_range'][0]:.3f}, {c['mean_z2_range'][1]:.3f}]")
    assert c["coverage_range"][0] <= c["coverage"] <= c["coverage_range"][1]
    assert c["mean_z2_range"][0] <= c["mean_z2"] <= c["mean_z2_range"][1]


def test_few_samples_are_flagged(tabular):
    tab, x, _ = tabular
    est = lk.nll(tab, x[:4], jax.random.PRNGKey(0), estimator="time_free", num_samples=32)
    assert est.few_samples and est.min_samples == 128
    assert not lk.nll(tab, x[:4], jax.random.PRNGKey(0), estimator="stratified", num_samples=8).few_samples
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert lk.nll(tab, x[:4], jax.random.PRNGKey(0), estimator="lambda_dce", num_samples=64).few_samples
