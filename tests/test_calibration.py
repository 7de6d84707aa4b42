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
Run with ``pytest -s`` to see coverage and mean z^2 of every estimator.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import numpy as np
import pytest
import scipy.stats

from infodiff import likelihood as lk
from infodiff import oracles, schedules
from infodiff.processes import masked
from infodiff.processes import score_entropy as se

N_CASES = 400


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
    rng = np.random.default_rng(0)
    tab = oracles.random_tabular(rng, "ACGT", 6, 64, 0.5)
    x = tab.sample(rng, N_CASES)
    return tab, x, -tab.log_prob(x)


@pytest.fixture(scope="module")
def markov():
    rng = np.random.default_rng(1)
    mk = oracles.random_markov(rng, "ACGT", 2, 0.5, seq_len=20)
    x = mk.sample(rng, N_CASES)
    target = np.zeros(x.shape, bool)
    target[:, 8:] = True
    return mk, x, -mk.cond_log_prob(x, target)


@pytest.mark.slow
def test_the_check_fails_for_an_overconfident_se(tabular):
    """The same cases with the SE shrunk by 20 % (what heavy tails do) fail the check."""
    tab, x, truth = tabular
    est = lk.nll(tab, x, jax.random.PRNGKey(3), estimator="k_dce", num_samples=16)
    check("k_dce", est, truth)
    c = calibration(est.mean, 0.8 * est.stderr, truth, est.dof)
    assert not (c["coverage_range"][0] <= c["coverage"] and c["mean_z2"] <= c["mean_z2_range"][1])


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["t_dce", "k_dce", "time_free", "stratified"])
def test_masked_unconditional(tabular, estimator):
    tab, x, truth = tabular
    S = masked.MIN_SAMPLES[estimator]
    est = lk.nll(tab, x, jax.random.PRNGKey(10 + S), estimator=estimator, num_samples=S)
    check(estimator, est, truth)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["k_dce", "stratified", "neyman"])
def test_masked_conditional(markov, estimator):
    mk, x, truth = markov
    # neyman: a budget of 16 rounds leaves >= min_samples Monte Carlo samples after its pilot
    S = 16 if estimator == "neyman" else masked.MIN_SAMPLES[estimator]
    est = lk.conditional_nll(mk, x[:, :8], x[:, 8:], jax.random.PRNGKey(20 + S), estimator=estimator,
                             num_samples=S)
    assert not est.is_exact
    check(f"{estimator} conditional", est, truth)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["k_dce", "neyman"])
def test_coupled_log_ratio(markov, estimator):
    mk, x, _ = markov
    rng = np.random.default_rng(5)
    y_alt = mk.sample_response(rng, x[:, :8], 12)
    target = np.zeros(x.shape, bool)
    target[:, 8:] = True
    x_alt = np.concatenate([x[:, :8], y_alt], 1)
    truth = mk.cond_log_prob(x, target) - mk.cond_log_prob(x_alt, target)
    S = 16 if estimator == "neyman" else masked.MIN_SAMPLES[estimator]
    est = lk.log_ratio(mk, x[:, :8], x[:, 8:], y_alt, jax.random.PRNGKey(7), estimator=estimator, num_samples=S)
    check(f"{estimator} coupled log-ratio", est, truth)


@pytest.mark.slow
@pytest.mark.parametrize("graph,law", [("absorb", "defensive"), ("absorb", "importance"),
                                       ("uniform", "importance")])
def test_score_entropy(graph, law):
    rng = np.random.default_rng(2)
    tab = oracles.random_tabular(rng, "ACG", 4, 27, 0.5)
    n = 300 if graph == "uniform" else N_CASES
    x = tab.sample(rng, n)
    process = se.ScoreEntropyProcess(graph=graph, vocab_size=3, noise_law=law,
                                     lam_max=schedules.LogLinearSchedule().lambda_max)
    est = lk.nll(se.OracleScore(tab, graph), x, jax.random.PRNGKey(30), process=process,
                 num_samples=process.min_samples)
    check(f"imdse {graph}:{law}", est, -tab.log_prob(x))


@pytest.mark.slow
@pytest.mark.parametrize("kind", [
    pytest.param("conditional", marks=pytest.mark.xfail(strict=True, reason=(
        "the uniform graph's SE under-covers at min_samples = 512: coverage 0.900 (accepted "
        "[0.907, 0.983]); heavy tails (the 'importance' law's third moment diverges), a known "
        "limit reported to the lead, not hidden"))),
    "coupled log-ratio"])
def test_score_entropy_uniform_conditional(kind):
    """The uniform graph with a clean prompt (the score model sees it at lam = 0): -log p(y | x)
    and the coupled log-ratio, 300 prompt/response cases of test_score_entropy's table (the same
    law as its unconditional case). The uniform graph's per-sample values are very heavy-tailed
    (excess kurtosis ~40): on other tables coverage at min_samples = 512 was measured at
    0.88-0.90, unconditional and conditional alike (see the branch's report)."""
    rng = np.random.default_rng(2)
    tab = oracles.random_tabular(rng, "ACG", 4, 27, 0.5)
    x = tab.sample(rng, 300)
    target = np.zeros(x.shape, bool)
    target[:, 1:] = True
    process = se.ScoreEntropyProcess(graph="uniform", vocab_size=3, noise_law="importance",
                                     lam_max=schedules.LogLinearSchedule().lambda_max)
    score = se.OracleScore(tab, "uniform")
    if kind == "conditional":
        est = lk.conditional_nll(score, x[:, :1], x[:, 1:], jax.random.PRNGKey(31), process=process,
                                 num_samples=process.min_samples)
        truth = -tab.cond_log_prob(x, target)
    else:
        y_alt = tab.sample_response(rng, x[:, :1])
        truth = tab.cond_log_prob(x, target) - tab.cond_log_prob(np.concatenate([x[:, :1], y_alt], 1), target)
        est = lk.log_ratio(score, x[:, :1], x[:, 1:], y_alt, jax.random.PRNGKey(32), process=process,
                           num_samples=process.min_samples)
        same = np.all(y_alt == x[:, 1:], axis=1)  # an identical pair: exactly 0 with SE 0
        assert np.all(est.mean[same] == 0) and np.all(est.stderr[same] == 0)
        est = dataclasses.replace(est, samples=est.samples[~same], exact={k: v[~same] for k, v in est.exact.items()})
        truth = truth[~same]
    check(f"imdse uniform {kind}", est, truth)


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
