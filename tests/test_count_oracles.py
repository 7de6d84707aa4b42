"""Exact-oracle checks of the Poisson-channel likelihood identity (docs/poisson.md §2, §7)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

from infodiff.count_oracles import FiniteCountOracle, GammaPriorOracle, ProductCountOracle
from infodiff.processes import poisson as P

PROBS = np.array([0.4, 0.3, 0.2, 0.1])
ALPHA = np.linspace(-25.0, 12.0, 741)  # docs/poisson.md §7 grid


def test_quadrature_nll_toy_including_zero():
    """int mprl(x, gamma) dgamma = -log P(x) to 1e-4 on {0, 1, 2, 5} (docs/poisson.md §7: 0.91629, ...)."""
    o = FiniteCountOracle([0.0, 1.0, 2.0, 5.0], PROBS)
    got = o.quadrature_nll(o.support, ALPHA)
    np.testing.assert_allclose(got, -np.log(PROBS), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.dot(PROBS, got), o.entropy(), atol=1e-4)
    np.testing.assert_allclose(o.entropy(), 1.27985, atol=1e-5)
    # x = 0: mprl(0, gamma) = E[X | Z = 0] = -(d/dgamma) log E[e^{-gamma X}] (docs/poisson.md §2.3).
    g = 0.37
    mgf = lambda t: np.dot(PROBS, np.exp(-t * o.support[:, 0]))
    deriv = -(np.log(mgf(g + 1e-6)) - np.log(mgf(g - 1e-6))) / 2e-6
    np.testing.assert_allclose(o.mprl(np.array([[0.0]]), g)[0], deriv, rtol=1e-7)


def test_quadrature_nll_scaled_toy():
    """Same pmf on {1, 1.2, 1.4, 2}: identical values (scale invariance, docs/poisson.md §1)."""
    sc = P.CountScaling(5)
    o = FiniteCountOracle(sc.scale(np.array([0, 1, 2, 5])), PROBS)
    np.testing.assert_allclose(o.quadrature_nll(o.support, ALPHA), -np.log(PROBS), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_quadrature_nll_2d_dependent():
    """2-D pmf on {(1,1), (1,1.5), (1.5,1.5), (2,1)}: summed-coordinate integral = -log P(x)."""
    o = FiniteCountOracle([[1, 1], [1, 1.5], [1.5, 1.5], [2, 1]], PROBS)
    grid = np.linspace(-25.0, 12.0, 371)
    np.testing.assert_allclose(o.quadrature_nll(o.support, grid), -np.log(PROBS), atol=1e-4, rtol=0)


def test_resolved_bound_is_an_upper_bound():
    o = FiniteCountOracle([[1, 1], [1, 1.5], [1.5, 1.5], [2, 1]], PROBS)
    for g in (2.0, 20.0, 200.0, 600.0, 1500.0):
        exact = o.mprl(o.support, g, skip_below=0.0)
        assert np.all(g * exact <= o.resolved_bound(g) * (1 + 1e-9))


def test_tgr_matches_direct_posterior_mean():
    """Turing-Good-Robbins ratio = direct posterior mean (docs/poisson.md §7: 7e-14 at gamma = 0.7)."""
    o = FiniteCountOracle([0.0, 1.0, 2.0, 5.0], PROBS)
    z = np.arange(0, 25)[:, None]
    assert np.max(np.abs(o.posterior_mean_tgr(z, 0.7) - o.posterior_mean_np(z, 0.7))) < 1e-12
    o2 = FiniteCountOracle([[1, 1], [1, 1.5], [1.5, 1.5], [2, 1]], PROBS)
    z2 = np.array([[0, 0], [1, 3], [4, 2], [7, 7]])
    np.testing.assert_allclose(o2.posterior_mean_tgr(z2, 0.7), o2.posterior_mean_np(z2, 0.7), rtol=1e-12)


def test_jax_oracle_matches_float64():
    """float32 jit path vs float64 numpy, from low to very high SNR."""
    o = FiniteCountOracle([1.0, 1.2, 1.4, 2.0], PROBS)
    for g in (1e-6, 0.7, 30.0, 1e4, 1e8):
        z = np.array([[0.0], [1.0], [round(g * 1.1)], [round(g * 1.3)], [round(g * 2.0)]])
        got = np.asarray(o(jnp.asarray(z, jnp.float32), jnp.full((5,), math.log(g), jnp.float32)))
        np.testing.assert_allclose(got, o.posterior_mean_np(z, g), rtol=2e-5)


def test_gamma_prior_affine_posterior_mean():
    """E[X | Z = z] = (z + k) / (beta + gamma) vs numerical integration (ItDPDM Lemma 2)."""
    k, beta = 2.5, 1.5
    o = GammaPriorOracle(k, beta)
    for g in (0.3, 4.0):
        for z in (0, 1, 7):
            f = lambda t, m: t**m * scipy.stats.gamma.pdf(t, k, scale=1 / beta) * scipy.stats.poisson.pmf(z, g * t)
            num = scipy.integrate.quad(f, 0, np.inf, args=(1,), epsabs=0, epsrel=1e-12)[0]
            den = scipy.integrate.quad(f, 0, np.inf, args=(0,), epsabs=0, epsrel=1e-12)[0]
            np.testing.assert_allclose(o.posterior_mean_np(z, g), num / den, rtol=1e-8)
            got = o(jnp.array([[float(z)]]), jnp.array([math.log(g)], jnp.float32))
            np.testing.assert_allclose(float(got[0, 0]), num / den, rtol=1e-5)
    with pytest.raises(ValueError):
        GammaPriorOracle(0.0, 1.0)


def test_product_oracle():
    s1, p1 = [0.0, 1.0, 3.0], [0.5, 0.3, 0.2]
    s2, p2 = [0.0, 2.0], [0.6, 0.4]
    o = ProductCountOracle([s1, s2], [p1, p2])
    joint = FiniteCountOracle([[a, b] for a in s1 for b in s2], [pa * pb for pa in p1 for pb in p2])
    z = np.array([[0, 0], [1, 2], [3, 0], [5, 5]])
    np.testing.assert_allclose(o.posterior_mean_np(z, 0.9), joint.posterior_mean_np(z, 0.9), rtol=1e-12)
    got = np.asarray(o(jnp.asarray(z, jnp.float32), jnp.full((4,), math.log(0.9), jnp.float32)))
    np.testing.assert_allclose(got, joint.posterior_mean_np(z, 0.9), rtol=1e-5)
    x = np.array([[0.0, 2.0], [3.0, 0.0]])
    np.testing.assert_allclose(o.mprl(x, 1.3), joint.mprl(x, 1.3), rtol=1e-10)
    np.testing.assert_allclose(o.log_prob(x), joint.log_prob(x), rtol=1e-12)
    np.testing.assert_allclose(o.entropy(), joint.entropy(), rtol=1e-12)
    nll = o.quadrature_nll(x, np.linspace(-25.0, 10.0, 701))
    np.testing.assert_allclose(nll, -o.log_prob(x), atol=1e-4)
    shared = ProductCountOracle(s1, p1, dim=64)
    assert shared.dim == 64 and shared(jnp.zeros((2, 64)), jnp.zeros(2)).shape == (2, 64)


def test_oracle_sampling_and_log_prob():
    o = FiniteCountOracle([0.0, 1.0, 2.0, 5.0], PROBS)
    n = 50_000
    s = o.sample(np.random.default_rng(0), n)[:, 0]
    f = np.array([(s == v).mean() for v in (0.0, 1.0, 2.0, 5.0)])
    assert np.all(np.abs(f - PROBS) < 4 * np.sqrt(PROBS * (1 - PROBS) / n))
    np.testing.assert_allclose(o.log_prob(np.array([[2.0], [3.0]])), [math.log(0.2), -np.inf])


def test_oracle_bad_input():
    with pytest.raises(ValueError, match="negative"):
        FiniteCountOracle([-1.0, 1.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="sum"):
        FiniteCountOracle([0.0, 1.0], [0.5, 0.6])
    with pytest.raises(ValueError, match="distinct"):
        FiniteCountOracle([1.0, 1.0], [0.5, 0.5])
    o = FiniteCountOracle([0.0, 1.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="gamma"):
        o.mprl(np.array([[1.0]]), 0.0)
