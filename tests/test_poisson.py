"""Tests for infodiff.processes.poisson against exact truth (docs/poisson.md)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import scipy.stats

from infodiff.count_oracles import FiniteCountOracle
from infodiff import likelihood as lk
from infodiff.processes import poisson as P

TOY_SUPPORT = np.array([0.0, 1.0, 2.0, 5.0])
TOY_PROBS = np.array([0.4, 0.3, 0.2, 0.1])
TOY_NLL = -np.log(TOY_PROBS)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("g", [0.0, -1.0, np.nan, np.inf])
def test_gamma_rejected(g):
    with pytest.raises(ValueError, match="gamma"):
        P.check_gamma(np.array([1.0, g]))
    with pytest.raises(ValueError, match="gamma"):
        P.sample_channel(jax.random.PRNGKey(0), np.ones((2, 3)), np.array([1.0, g]))


def test_channel_rejects_negative_data():
    with pytest.raises(ValueError, match=r"x\[0, 1\] = -1.0 is negative"):
        P.sample_channel(jax.random.PRNGKey(0), np.array([[1.0, -1.0]]), np.array([2.0]))


def test_count_scaling():
    s = P.CountScaling(4)
    np.testing.assert_allclose(s.lattice(), [1, 1.25, 1.5, 1.75, 2])
    np.testing.assert_allclose(s.scale(np.array([0, 4, 2])), [1, 2, 1.5])
    np.testing.assert_allclose(s.unscale(s.scale(np.array([3]))), [3])
    assert s.to_lattice(np.array([1.1, 1.13, 1.9, 5.0, -3.0])).tolist() == [0, 1, 4, 4, 0]
    assert s.to_lattice(jnp.array([1.1, 1.9])).tolist() == [0, 4]
    assert P.CountScaling(3, low=0.0, high=3.0).scale(np.array([0]))[0] == 0.0  # low = 0 allowed
    for kw in ({"max_count": 0}, {"max_count": 3, "low": -0.1}, {"max_count": 3, "low": 2.0, "high": 2.0}):
        with pytest.raises(ValueError):
            P.CountScaling(**kw)
    with pytest.raises(ValueError, match="exceeds max_count"):
        s.scale(np.array([5]))
    with pytest.raises(ValueError, match="negative"):
        s.scale(np.array([-1]))


# --------------------------------------------------------------------------- PRL
def test_prl_properties():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 3.0, 1000)
    xh = rng.uniform(0.01, 3.0, 1000)
    l = np.asarray(P.prl(x, xh), np.float64)
    np.testing.assert_allclose(l, P.prl_np(x, xh), rtol=2e-5, atol=1e-6)
    # Reference formula in float64 (xlogy form).
    ref = scipy.special.xlogy(x, x) - scipy.special.xlogy(x, xh) - x + xh
    np.testing.assert_allclose(P.prl_np(x, xh), ref, rtol=1e-10, atol=1e-12)
    assert np.all(P.prl_np(x, xh) >= 0)
    assert np.all(np.asarray(P.prl(x, x)) == 0) and np.all(P.prl_np(x, x) == 0)
    np.testing.assert_allclose(np.asarray(P.prl(0.0, xh)), xh.astype(np.float32), rtol=1e-7)  # l(0, xhat) = xhat
    # 1-homogeneity l(a x, a xhat) = a l(x, xhat).
    a = rng.uniform(0.1, 10.0, 1000)
    np.testing.assert_allclose(P.prl_np(a * x, a * xh), a * P.prl_np(x, xh), rtol=1e-9, atol=1e-12)
    # Convexity in xhat and in x: value at a midpoint <= mean of the endpoint values.
    xh2 = rng.uniform(0.01, 3.0, 1000)
    assert np.all(P.prl_np(x, 0.5 * (xh + xh2)) <= 0.5 * (P.prl_np(x, xh) + P.prl_np(x, xh2)) + 1e-12)
    x2 = rng.uniform(0.0, 3.0, 1000)
    assert np.all(P.prl_np(0.5 * (x + x2), xh) <= 0.5 * (P.prl_np(x, xh) + P.prl_np(x2, xh)) + 1e-12)
    assert np.isinf(P.prl_np(1.0, 0.0)) and P.prl_np(0.0, 0.0) == 0.0


def test_prl_float32_accurate_near_x():
    """gamma * l(x, x(1 + eps)) must be accurate in float32 at gamma ~ 1e8 (docs/poisson.md §3.4)."""
    x = np.array([1.0, 1.5, 2.0], np.float32)
    for eps in (1e-2, 1e-3, 1e-4):
        xh = (x * (1 + eps)).astype(np.float32)
        got = np.asarray(P.prl(x, xh), np.float64)
        ref = P.prl_np(x.astype(np.float64), xh.astype(np.float64))
        np.testing.assert_allclose(got, ref, rtol=1e-4)


def test_prl_gradient():
    g = jax.grad(lambda xh: P.prl(1.5, xh))(2.0)
    np.testing.assert_allclose(g, 1 - 1.5 / 2.0, rtol=1e-6)
    assert jax.grad(lambda xh: P.prl(0.0, xh))(2.0) == 1.0
    assert np.isfinite(jax.grad(lambda xh: P.prl(1.0, xh))(1.0))


# --------------------------------------------------------------------------- channel
@pytest.mark.slow
@pytest.mark.parametrize("rate", [0.7, 40.0, 2.0e4, 4.0e8])
def test_channel_moments(rate):
    n = 100_000
    x = np.full((n, 1), 2.0)
    z = np.asarray(P.sample_channel(jax.random.PRNGKey(1), x, np.full(n, rate / 2.0)), np.float64)[:, 0]
    assert np.all(z >= 0) and np.all(z == np.floor(z))
    # Mean and variance within 4 SE (Var(sample var) ~ (mu4 - sigma^4) / n = (rate + 2 rate^2) / n).
    assert abs(z.mean() - rate) < 4 * math.sqrt(rate / n)
    assert abs(z.var() - rate) < 4 * math.sqrt((rate + 2 * rate**2) / n)
    if rate < 100:  # exact pmf check (chi-square style: every frequency within 4 SE)
        k = np.arange(int(rate + 10 * math.sqrt(rate) + 10))
        p = scipy.stats.poisson.pmf(k, rate)
        f = np.bincount(z.astype(np.int64), minlength=k.size)[: k.size] / n
        assert np.all(np.abs(f - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-4)


def test_channel_zero_rate_and_network_input():
    z = P.sample_channel(jax.random.PRNGKey(0), np.zeros((3, 2)), np.array([1.0, 1e8, 1e-9]))
    assert np.all(np.asarray(z) == 0)
    zt = P.network_input(jnp.array([[3.0, 0.0]]), jnp.array([2.0]))
    np.testing.assert_allclose(zt, [[1.0, 0.0]])


# --------------------------------------------------------------------------- log-SNR samplers
def test_truncated_logistic_weights():
    """E_q[w e^-alpha] = int 1 dalpha over the truncated range = 2 clip scale (within 4 SE)."""
    loc, scale, clip = -1.0, 5.0, 4.0
    a, w = P.truncated_logistic(jax.random.PRNGKey(0), (200_000,), loc, scale, clip)
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
    assert a.min() >= loc - clip * scale and a.max() <= loc + clip * scale
    v = w * np.exp(-a)
    assert abs(v.mean() - 2 * clip * scale) < 4 * v.std() / math.sqrt(v.size)
    # Density check: alpha ~ logistic truncated (KS test against the truncated cdf).
    F = lambda t: (scipy.special.expit((t - loc) / scale) - scipy.special.expit(-clip)) / math.tanh(clip / 2)
    assert scipy.stats.kstest(a[:20000], F).pvalue > 1e-4
    aq, wq = P.truncated_logistic_qmc(4000, loc, scale, clip)
    np.testing.assert_allclose(np.mean(wq * np.exp(-aq)), 2 * clip * scale, rtol=1e-3)
    ag, wg = P.log_snr_grid(-28.0, 37.0, 651)
    np.testing.assert_allclose(np.sum(wg * np.exp(-ag)), 65.0, rtol=1e-12)
    # e^alpha over the grid: int e^alpha dalpha = e^37 - e^-28 (trapezoid, step 0.1).
    np.testing.assert_allclose(np.sum(wg), math.exp(37) - math.exp(-28), rtol=1e-3)
    with pytest.raises(ValueError):
        P.truncated_logistic(jax.random.PRNGKey(0), (2,), 0.0, -1.0, 4.0)


@pytest.mark.slow
def test_suggest_logistic_covers_integrand():
    """For 256-level data on [1, 2] the suggested support covers the docs/poisson.md §3.4 mass (alpha ~ 0..16)."""
    rng = np.random.default_rng(0)
    c = np.clip(np.round(rng.normal(128, 50, (4000, 4))), 0, 255)
    sc = P.CountScaling(255)
    loc, scale, clip = P.suggest_logistic(sc.scale(c.astype(np.int64)), sc.spacing)
    assert loc - clip * scale < -0.8 and loc + clip * scale > 16.0
    assert 6.0 < loc < 11.0 and scale >= 1.0


# --------------------------------------------------------------------------- estimators
def _toy(scaled: bool):
    if scaled:
        sc = P.CountScaling(5)  # {0,1,2,5} -> {1, 1.2, 1.4, 2}
        return FiniteCountOracle(sc.scale(np.array([0, 1, 2, 5])), TOY_PROBS), sc
    return FiniteCountOracle(TOY_SUPPORT, TOY_PROBS), P.CountScaling(5, low=0.0, high=5.0)


@pytest.mark.slow
@pytest.mark.parametrize("scaled", [False, True])
def test_mc_nll_exact_oracle_within_4se(scaled):
    """Logistic importance sampling with the exact denoiser: -log P(x) within 4 SE, incl. x = 0."""
    oracle, sc = _toy(scaled)
    x = oracle.support
    # Proposal matched to where the toy integrand lives (raw: alpha ~ -5..5; scaled: +1.6).
    loc = 0.0 if not scaled else 1.6
    r = lk.poisson_nll(oracle, x, jax.random.PRNGKey(3), num_samples=40_000, loc=loc, scale=2.0,
                      clip=6.0, scaling=sc, batch_size=8192)
    err = r.mean - TOY_NLL
    assert np.all(np.abs(err) < 4 * r.stderr), (err, r.stderr)
    assert np.all(r.stderr < 0.05)  # the test has power
    assert r.forward_passes == 40_000 and r.samples.shape == (4, 40_000)
    assert np.all(r.prior >= 0) and np.all(r.prior < 1e-4) and np.all(r.recon < 1e-8)
    d = r.split_mean()
    assert abs(d["mean"] - np.mean(r.mean)) < 1e-12
    np.testing.assert_allclose(r.mean, r.diffusion + r.prior + r.recon)
    np.testing.assert_allclose(r.terms["total"], r.mean)


@pytest.mark.slow
def test_mc_nll_paper_defaults_and_guard():
    """ItDPDM's logistic(-1, 5) proposal, with and without the high-SNR rounding guard."""
    oracle, sc = _toy(True)
    x = oracle.support
    for guard in (None, "round"):
        r = lk.poisson_nll(oracle, x, jax.random.PRNGKey(5), num_samples=40_000, scaling=sc,
                          high_snr_guard=guard, alpha_guard=9.0, batch_size=8192)
        err = r.mean - TOY_NLL
        assert np.all(np.abs(err) < 4 * r.stderr), (guard, err, r.stderr)
        if guard:
            assert r.info["alpha_top"] == 9.0 and np.all(r.recon > 0)


@pytest.mark.slow
def test_grid_and_qmc_samplers_agree_with_truth():
    oracle, sc = _toy(True)
    x = oracle.support
    for sampler in ("grid", "qmc"):
        kw = dict(alpha_min=-20.0, alpha_max=14.0) if sampler == "grid" else dict(loc=1.6, scale=2.0, clip=6.0)
        r = lk.poisson_nll(oracle, x, jax.random.PRNGKey(7), num_samples=20_000, sampler=sampler,
                          scaling=sc, batch_size=8192, **kw)
        assert np.all(np.abs(r.mean - TOY_NLL) < 4 * r.stderr + 1e-4), (sampler, r.mean - TOY_NLL, r.stderr)


def test_rounding_tail_exact():
    """The rounding denoiser's expected loss equals a direct sum over z (one gamma)."""
    sc = P.CountScaling(5)
    x = sc.lattice()
    g = 61.3  # not a tie: gamma (low + (j - 1/2) spacing) is never an integer
    got = P._rounding_expected_loss(x, g, sc)
    for i, xi in enumerate(x):
        z = np.arange(0, int(g * xi + 40 * math.sqrt(g * xi) + 50))
        pz = scipy.stats.poisson.pmf(z, g * xi)
        xr = sc.lattice()[sc.to_lattice(z / g)]
        np.testing.assert_allclose(got[i], np.sum(pz * P.prl_np(xi, xr)), rtol=1e-7, atol=1e-300)


@pytest.mark.slow
def test_diffusion_loss_expectation_equals_mprl_integral():
    """E[diffusion_loss] = int_{trunc. range} e^alpha mprl(x, e^alpha) dalpha (exact oracle)."""
    oracle, _ = _toy(True)
    loc, scale, clip = 1.6, 2.0, 6.0
    n = 100_000
    for xv in (1.0, 1.4):
        x = np.full((n, 1), xv, np.float32)
        loss = np.asarray(jax.jit(lambda k: P.diffusion_loss(oracle, k, x, loc, scale, clip))(
            jax.random.PRNGKey(11)), np.float64)
        grid = np.linspace(loc - clip * scale, loc + clip * scale, 961)
        truth = oracle.quadrature_nll(np.array([[xv]]), grid)[0]
        se = loss.std(ddof=1) / math.sqrt(n)
        assert abs(loss.mean() - truth) < 4 * se, (xv, loss.mean(), truth, se)
        assert se < 0.03


@pytest.mark.slow
def test_diffusion_loss_differentiable_and_paper_weighting():
    x = jnp.array([[1.0, 1.4], [2.0, 1.2]])

    def make(params):
        return lambda z, alpha: 1.0 + jax.nn.sigmoid(params["a"] * P.network_input(z, jnp.exp(alpha)) + params["b"])

    params = {"a": jnp.float32(0.3), "b": jnp.float32(-0.2)}
    key = jax.random.PRNGKey(0)

    @jax.jit
    def run(p):  # one compilation for the three quantities
        g = jax.grad(lambda q: P.diffusion_loss(make(q), key, x).mean())(p)
        return g, P.diffusion_loss(make(p), key, x), P.diffusion_loss(make(p), key, x, weighting="paper")

    g, lik, pap = run(params)
    assert all(np.isfinite(v) and v != 0 for v in jax.tree_util.tree_leaves(g))
    alpha, _ = P.truncated_logistic(jax.random.split(key)[0], (2,), -1.0, 5.0, 4.0)
    np.testing.assert_allclose(pap, lik * np.exp(-np.asarray(alpha)), rtol=1e-5)
    with pytest.raises(ValueError, match="weighting"):
        P.diffusion_loss(make(params), key, x, weighting="bogus")


def test_poisson_nll_errors():
    oracle, sc = _toy(True)
    k = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="sampler"):
        lk.poisson_nll(oracle, oracle.support, k, sampler="bogus")
    with pytest.raises(ValueError, match="num_samples"):
        lk.poisson_nll(oracle, oracle.support, k, num_samples=1)
    with pytest.raises(ValueError, match="alpha_guard"):
        lk.poisson_nll(oracle, oracle.support, k, high_snr_guard="round")
    with pytest.raises(ValueError, match="negative"):
        lk.poisson_nll(oracle, -oracle.support, k)
    with pytest.raises(FloatingPointError, match="xhat"):
        lk.poisson_nll(lambda z, a: jnp.zeros_like(z), oracle.support, k, num_samples=4)
    # A grid too coarse to resolve the integrand would report ~0 nats with a tiny "SE".
    with pytest.raises(ValueError, match="spacing"):
        lk.poisson_nll(oracle, oracle.support, k, num_samples=4, sampler="grid")
    # Raw counts passed with a scaling (instead of scaling.scale(counts)) are refused.
    with pytest.raises(ValueError, match="not on the lattice"):
        lk.poisson_nll(oracle, sc.unscale(oracle.support), k, num_samples=4, scaling=sc)


# --------------------------------------------------------------------------- samplers
@pytest.mark.slow
def test_increment_sampler_converges_and_beats_paper_sampler():
    """docs/poisson.md §4.4 setup (pmf on {1, 1.2, 1.4, 2}, gamma 1e-3..2000, round decision), 40k samples.

    Expected TV (spec, 200k samples): increment 0.066 (T=20), 0.014 (T=100); Alg. 2 0.103 (T=100).
    Tolerance: |TV_hat - TV| <= TV(empirical, sampler law), whose mean is at most
    0.5 sum_k sqrt(p_k (1 - p_k) / N) = `noise`; we require differences > 8 noise (4 per term).
    """
    sc = P.CountScaling(5)
    probs6 = np.array([0.4, 0.3, 0.2, 0.0, 0.0, 0.1])
    oracle = FiniteCountOracle(sc.scale(np.array([0, 1, 2, 5])), TOY_PROBS)
    n = 40_000
    noise = 0.5 * np.sum(np.sqrt(TOY_PROBS * (1 - TOY_PROBS) / n))
    tv = {}
    for T in (20, 100):
        g = P.log_spaced_gammas(1e-3, 2000.0, T)
        tv["inc", T] = P.total_variation(P.increment_sampler(oracle, jax.random.PRNGKey(T), n, 1, g, sc), probs6)
    g = P.log_spaced_gammas(1e-3, 2000.0, 100)
    tv["paper", 100] = P.total_variation(P.paper_sampler(oracle, jax.random.PRNGKey(1), n, 1, g, sc), probs6)
    assert tv["inc", 20] - tv["inc", 100] > 8 * noise, tv
    assert tv["paper", 100] - tv["inc", 100] > 8 * noise, tv
    assert tv["inc", 100] < 0.014 + 4 * noise, tv


@pytest.mark.slow
def test_sampler_output_and_errors():
    sc = P.CountScaling(5)
    oracle = FiniteCountOracle(sc.scale(np.array([0, 1, 2, 5])), TOY_PROBS)
    g = P.log_spaced_gammas(1e-3, 2000.0, 10)
    s = P.increment_sampler(oracle, jax.random.PRNGKey(0), 50, 1, g, sc, decision="ml")
    assert s.dtype == np.int64 and s.shape == (50, 1) and s.min() >= 0 and s.max() <= 5
    # Decisions: round / ML (log-mean boundary) / denoiser output.
    z = jnp.array([[0.0], [105.0], [111.0], [200.0]])
    assert P.lattice_decision(z, 100.0, sc, "round").ravel().tolist() == [0, 0, 1, 5]
    # ML boundary between 1.0 and 1.2 is 0.2 / log(1.2) = 1.097: z/gamma = 1.11 -> 1.2.
    assert P.lattice_decision(z, 100.0, sc, "ml").ravel().tolist() == [0, 0, 1, 5]
    assert P.lattice_decision(z, 100.0, sc, "denoiser", jnp.array([[1.0], [1.29], [1.31], [3.0]])
                              ).ravel().tolist() == [0, 1, 2, 5]
    with pytest.raises(ValueError, match="increasing"):
        P.increment_sampler(oracle, jax.random.PRNGKey(0), 5, 1, g[::-1], sc)
    with pytest.raises(ValueError, match="gamma"):
        P.log_spaced_gammas(0.0, 1.0, 5)
    with pytest.raises(ValueError, match="decision"):
        P.paper_sampler(oracle, jax.random.PRNGKey(0), 5, 1, g, sc, decision="mode")


@pytest.mark.slow
def test_suggest_alpha_guard_makes_rounding_tail_negligible():
    sc = P.CountScaling(255)
    ag = P.suggest_alpha_guard(sc)
    np.testing.assert_allclose(ag, math.log(121 * 2.0 * 255**2), rtol=1e-12)
    x = sc.scale(np.array([[0, 1, 128, 254, 255]]))
    tail = P.rounding_loss_integral(x, ag, sc)
    assert 0 < tail[0] < 1e-6
    # ... while a guard 4 e-folds lower costs a visible amount (the tail is not trivially 0).
    assert P.rounding_loss_integral(x, ag - 4.0, sc)[0] > 1e-3


@pytest.mark.slow
def test_float32_scaled_data_is_snapped_to_the_lattice():
    """float32 copies of lattice values (1e-8 off) give the same estimate as float64 ones."""
    oracle, sc = _toy(True)
    x64 = oracle.support
    a = lk.poisson_nll(oracle, x64, jax.random.PRNGKey(1), num_samples=64, scaling=sc)
    b = lk.poisson_nll(oracle, x64.astype(np.float32), jax.random.PRNGKey(1), num_samples=64, scaling=sc)
    np.testing.assert_array_equal(a.mean, b.mean)
