"""Synthetic count laws of ItDPDM (docs/poisson.md §5.1): exact pmfs, entropies, oracles, Wasserstein-1."""

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats

from infodiff.data import count_synthetic as cs
from infodiff.processes import poisson as P


@pytest.mark.parametrize("name", cs.NAMES)
def test_pmf_sums_to_one_and_entropy(name):
    d = cs.get_distribution(name)
    assert np.all(d.probs >= 0) and abs(d.probs.sum() - 1) < 1e-12
    assert d.support.shape == (len(d.probs), d.dim) and d.support.max() == 50 and d.support.min() == 0
    p = d.probs[d.probs > 0]
    np.testing.assert_allclose(d.entropy, -np.sum(p * np.log(p)), rtol=1e-12)
    assert 0 <= d.truncated_mass < 1


def test_entropies_match_independent_formulas():
    k = np.arange(51)
    raw = {
        "zip": 0.7 * (k == 0) + 0.3 * scipy.stats.poisson.pmf(k, 5),
        "zipf": np.where(k >= 1, np.maximum(k, 1) ** -1.7, 0.0),
        "yulesimon": np.where(k >= 1, 2.0 * scipy.special.beta(np.maximum(k, 1), 3.0), 0.0),
        "poissmix": 0.5 * scipy.stats.poisson.pmf(k, 1) + 0.5 * scipy.stats.poisson.pmf(k, 100),
    }
    for name, p in raw.items():
        p = p / p.sum()
        q = p[p > 0]
        np.testing.assert_allclose(cs.get_distribution(name).entropy, -np.sum(q * np.log(q)), rtol=1e-10)
    # docs/poisson.md §5.1 reference values (computed independently).
    assert abs(cs.get_distribution("zip").entropy - 1.258) < 5e-4
    assert abs(cs.get_distribution("zipf").entropy - 1.960) < 5e-4
    assert abs(cs.get_distribution("bnb").entropy - 3.60) < 5e-3
    # Untruncated Yule-Simon entropy 1.211 (spec) is approached as max_count grows.
    assert abs(cs.get_distribution("yulesimon", max_count=5000).entropy - 1.2108) < 1e-3


def test_2d_marginals():
    bp = cs.get_distribution("bivariate_poisson")
    m = np.bincount(bp.support[:, 0], weights=bp.probs)
    np.testing.assert_allclose(m, scipy.stats.poisson.pmf(np.arange(51), 5.0), atol=1e-12)
    cov = np.sum(bp.probs * (bp.support[:, 0] - 5.0) * (bp.support[:, 1] - 5.0))
    np.testing.assert_allclose(cov, 3.0, rtol=1e-6)  # Cov = lambda_0
    gp = cs.get_distribution("gamma_poisson")
    m = np.bincount(gp.support[:, 1], weights=gp.probs)
    ref = scipy.stats.nbinom.pmf(np.arange(51), 2, 0.5)  # Gamma(2, 1) mixture of Pois
    np.testing.assert_allclose(m, ref / ref.sum(), atol=1e-10)


def test_sampling_and_log_prob():
    rng = np.random.default_rng(0)
    d = cs.get_distribution("zip")
    x = d.sample(rng, 40_000)
    assert x.shape == (40_000, 1) and x.dtype == np.int64
    mean = np.dot(d.probs, d.support[:, 0])
    sd = math.sqrt(np.dot(d.probs, (d.support[:, 0] - mean) ** 2))
    assert abs(x.mean() - mean) < 4 * sd / math.sqrt(x.shape[0])
    np.testing.assert_allclose(d.log_prob(np.array([[0]])), math.log(d.probs[0]))
    assert d.sample(rng, 5, dim=3).shape == (5, 3)
    b = cs.get_distribution("bivariate_poisson").sample(rng, 7)
    assert b.shape == (7, 2)


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="yulesimon"):
        cs.get_distribution("poisson_mixture")
    with pytest.raises(ValueError, match="max_count"):
        cs.get_distribution("zip", max_count=0)


def test_oracle_reproduces_nll():
    """The law's oracle: quadrature NLL = -log P(x) (raw counts, incl. x = 0, and scaled)."""
    d = cs.get_distribution("zip", max_count=20)
    o = d.oracle()
    x = np.array([[0.0], [5.0], [11.0]])
    grid = np.linspace(-25.0, 10.0, 701)
    np.testing.assert_allclose(o.quadrature_nll(x, grid), -d.log_prob(x.astype(np.int64)), atol=1e-4)
    sc = P.CountScaling(20)
    os_ = d.oracle(scaling=sc)
    xs = sc.scale(np.array([[0], [5]]))
    np.testing.assert_allclose(os_.quadrature_nll(xs, np.linspace(-22.0, 14.0, 721)),
                               -d.log_prob(np.array([[0], [5]])), atol=1e-4)
    assert d.oracle(dim=3).dim == 3


def test_wasserstein1():
    rng = np.random.default_rng(0)
    a = rng.poisson(3.0, 500).astype(float)
    assert abs(cs.wasserstein1(a, a + 2.0) - 2.0) < 1e-12
    a2 = rng.poisson(3.0, (300, 2)).astype(float)
    b2 = a2 + np.array([3.0, 4.0])
    np.testing.assert_allclose(cs.wasserstein1(a2, b2), 5.0, rtol=1e-12)  # exact (assignment)
    assert cs.wasserstein1(a2, b2, method="sliced") <= 5.0 + 1e-12
    with pytest.raises(ValueError):
        cs.wasserstein1(a2, b2[:10], method="exact")
