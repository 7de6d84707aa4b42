"""Synthetic count distributions of ItDPDM's experiments, with exact pmfs, entropies and oracles.

Source: arXiv 2505.05082 Sec. 5.1, App. C.1 (Table 5 parameters) and App. C.5 (2-D);
docs/poisson.md §5.1. Every law is TRUNCATED to {0..max_count} per coordinate
(default 50: "most distributions are truncated at 50") and RENORMALISED; `truncated_mass`
records the probability the untruncated law puts beyond max_count. Conventions we had to choose
(the paper does not state them; docs/poisson.md §5.1):

  name        law (scipy conventions)                                      untruncated mass > 50
  poissmix    0.5 Pois(1) + 0.5 Pois(100)   (weights not stated: equal)    ~0.5  (!)
  zip         0.7 delta_0 + 0.3 Pois(5)                                    ~0
  nbinommix   0.8 NB(n=1, p=0.9) + 0.2 NB(n=10, p=0.1) (scipy nbinom)      ~0.185 (!)
  bnb         BetaNegBinom(n=5, a=0.5, b=1.5) (scipy betanbinom)           ~0.37 (power-law tail)
  zipf        Zipf(a=1.7) on {1, 2, ...}                                   ~0.045
  yulesimon   Yule-Simon(alpha=2.0) on {1, 2, ...}                         ~7.5e-4
  bivariate_poisson   X_i = U + V_i, U ~ Pois(3), V_i ~ Pois(2)  (2-D, dependent)
  gamma_poisson       Theta ~ Gamma(k=2, rate 1), X_i | Theta ~ Pois(Theta) iid (2-D, dependent)

(!) With truncation at 50 the lambda = 100 Poisson component and NB(10, 0.1) (mean 90) are
mostly cut off, so "poissmix" at max_count = 50 is essentially Pois(1): pass a larger max_count
(e.g. 200) to keep the second mode. The paper's "True NLL" column is not reproducible
(docs/poisson.md §5.1); use `entropy` here. Entropies at max_count = 50 (nats): poissmix 1.3048,
zip 1.2583, nbinommix 0.5001, bnb 3.6046, zipf 1.9599, yulesimon 1.2020, bivariate_poisson
4.1873, gamma_poisson 3.6288 (docs/poisson.md §5.1 quotes zip 1.258, zipf 1.960, bnb 3.60 truncated).

get_distribution(name, max_count=50) -> CountDistribution with support (raw counts), probs,
entropy (property; nats, exact for the truncated pmf), sample(rng, n), oracle(scaling=None, dim=None).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

from infodiff.count_oracles import FiniteCountOracle, ProductCountOracle

__all__ = ["NAMES", "NAMES_1D", "NAMES_2D", "CountDistribution", "get_distribution", "load_pmf",
           "wasserstein1", "sliced_wasserstein1"]

NAMES_1D = ("poissmix", "zip", "nbinommix", "bnb", "zipf", "yulesimon")
NAMES_2D = ("bivariate_poisson", "gamma_poisson")
NAMES = NAMES_1D + NAMES_2D


@dataclasses.dataclass(frozen=True)
class CountDistribution:
    """A pmf on a finite set of count vectors.

    name; support: int64 [K, D] atoms (raw counts); probs: float64 [K] (sum 1, renormalised after
    truncation); dim: D; max_count: per-coordinate truncation; truncated_mass: mass of the
    untruncated law outside the kept set (before renormalising).
    """

    name: str
    support: np.ndarray
    probs: np.ndarray
    dim: int
    max_count: int
    truncated_mass: float

    @property
    def entropy(self) -> float:
        """Exact entropy of the truncated pmf in nats (float64). A property (note:
        FiniteCountOracle.entropy() is a method)."""
        p = self.probs[self.probs > 0]
        return float(-(p * np.log(p)).sum())

    @property
    def entropy_bits(self) -> float:
        return self.entropy / math.log(2.0)

    def log_prob(self, x_NxD) -> np.ndarray:
        """log P(x), float64 [N] nats (-inf off the support); x int [N, D] (or [N] for D = 1)."""
        x = np.asarray(x_NxD).reshape(-1, self.dim)
        lut = {tuple(s): i for i, s in enumerate(self.support.tolist())}
        idx = np.array([lut.get(tuple(r), -1) for r in x.tolist()])
        with np.errstate(divide="ignore"):
            lp = np.log(self.probs)
        return np.where(idx >= 0, lp[np.maximum(idx, 0)], -np.inf)

    def sample(self, rng: np.random.Generator, n: int, dim: int | None = None) -> np.ndarray:
        """n iid draws, int64 [n, D]. For a 1-D law, dim=d draws d independent coordinates
        (the paper's Table 8 "independent products")."""
        if dim is not None and self.dim != 1:
            raise ValueError("dim= is only for 1-D laws (independent product)")
        reps = 1 if dim is None else int(dim)
        idx = rng.choice(len(self.probs), size=(int(n), reps), p=self.probs)
        if self.dim == 1:
            return self.support[idx, 0]
        return self.support[idx[:, 0]]

    def oracle(self, scaling=None, dim: int | None = None):
        """Exact posterior-mean denoiser for this law.

        scaling: optional CountScaling; the oracle then lives in the scaled space
          (support mapped by scaling.scale), else in raw counts (then x = 0 is a valid input).
        dim: for a 1-D law, a ProductCountOracle over `dim` iid coordinates.
        Raises ValueError if scaling.max_count < max_count.
        """
        s = self.support.astype(np.float64)
        if scaling is not None:
            if scaling.max_count < self.max_count:
                raise ValueError(f"scaling.max_count = {scaling.max_count} < max_count = {self.max_count}")
            s = scaling.scale(self.support)
        keep = self.probs > 0
        if dim is not None:
            if self.dim != 1:
                raise ValueError("dim= is only for 1-D laws (independent product)")
            return ProductCountOracle(s[keep, 0], self.probs[keep], dim=int(dim))
        return FiniteCountOracle(s[keep], self.probs[keep])


def _finish(name, support, raw_probs, dim, max_count):
    raw = np.asarray(raw_probs, np.float64)
    kept = float(raw.sum())
    return CountDistribution(name=name, support=np.asarray(support, np.int64).reshape(-1, dim),
                             probs=raw / kept, dim=dim, max_count=int(max_count),
                             truncated_mass=max(0.0, 1.0 - kept))


def get_distribution(name: str, max_count: int = 50) -> CountDistribution:
    """The synthetic law `name` (see module docstring) truncated to {0..max_count}^D.

    Raises ValueError for an unknown name (listing NAMES) or max_count < 1.
    """
    if name not in NAMES:
        raise ValueError(f"unknown distribution {name!r}; choose from {NAMES}")
    if isinstance(max_count, bool) or int(max_count) != max_count or max_count < 1:
        raise ValueError(f"max_count = {max_count!r} must be an integer >= 1")
    K = int(max_count)
    k = np.arange(K + 1)
    st = scipy.stats
    if name == "poissmix":
        p = 0.5 * st.poisson.pmf(k, 1.0) + 0.5 * st.poisson.pmf(k, 100.0)
    elif name == "zip":
        p = 0.3 * st.poisson.pmf(k, 5.0) + 0.7 * (k == 0)
    elif name == "nbinommix":
        p = 0.8 * st.nbinom.pmf(k, 1, 0.9) + 0.2 * st.nbinom.pmf(k, 10, 0.1)
    elif name == "bnb":
        p = st.betanbinom.pmf(k, 5, 0.5, 1.5)
    elif name == "zipf":
        p = st.zipf.pmf(k, 1.7)  # 0 at k = 0
    elif name == "yulesimon":
        p = st.yulesimon.pmf(k, 2.0)  # 0 at k = 0
    else:
        x1, x2 = np.meshgrid(k, k, indexing="ij")
        sup = np.stack([x1.ravel(), x2.ravel()], axis=1)
        a, b = sup[:, 0], sup[:, 1]
        if name == "bivariate_poisson":
            lp = np.full(a.shape, -np.inf)
            for u in range(K + 1):
                ok = (a >= u) & (b >= u)
                t = (st.poisson.logpmf(u, 3.0) + st.poisson.logpmf(np.where(ok, a - u, 0), 2.0)
                     + st.poisson.logpmf(np.where(ok, b - u, 0), 2.0))
                lp = np.where(ok, np.logaddexp(lp, t), lp)
        else:  # gamma_poisson, k = 2, beta = 1: int Gamma(2,1)(t) Pois(a;t) Pois(b;t) dt
            kk, beta = 2.0, 1.0
            lp = (kk * math.log(beta) - scipy.special.gammaln(kk) + scipy.special.gammaln(kk + a + b)
                  - (kk + a + b) * math.log(beta + 2.0) - scipy.special.gammaln(a + 1)
                  - scipy.special.gammaln(b + 1))
        return _finish(name, sup, np.exp(lp), 2, K)
    return _finish(name, k, p, 1, K)


PMF_SUM_TOLERANCE = 1e-6


def load_pmf(path, max_count: int = 0) -> CountDistribution:
    """A 1-D count pmf from a JSON file ``{count: probability}`` (e.g. ``{"0": 0.5, "3": 0.5}``).

    Counts: non-negative integers written with the digits 0-9 (JSON keys are strings: "3" is
    accepted, "3.5", "-1", "a", "²" are not), each at most once. Probabilities: finite and >= 0,
    summing to 1 within PMF_SUM_TOLERANCE (then renormalised). The lattice is {0..K} with K = ``max_count`` if > 0
    (it must be >= the largest count) else the largest count (K >= 1). Atoms of probability 0
    are kept in the support. Returns a CountDistribution named ``file:<basename>``
    (truncated_mass 0). Raises ValueError with one line naming the file for anything else
    (missing or unreadable file, bad JSON, bad key or value, bad sum, max_count too small).
    """
    import json
    import os

    name = os.fspath(path)
    try:
        with open(name) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"pmf file {name!r}: file not found") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"pmf file {name!r}: not readable JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"pmf file {name!r}: expected a non-empty JSON object {{count: probability}}")
    counts, probs = [], []
    for k, v in raw.items():
        ks = str(k).strip()
        if not (ks.isascii() and ks.isdigit()):  # str.isdigit() also takes '²', '٣', ... which int() refuses
            raise ValueError(f"pmf file {name!r}: key {k!r} is not a non-negative integer count"
                             + ("" if ks.isascii() else " (write counts with the digits 0-9)"))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"pmf file {name!r}: probability of count {ks} is {v!r}; need a finite number >= 0")
        counts.append(int(ks))
        probs.append(float(v))
    if len(set(counts)) != len(counts):
        raise ValueError(f"pmf file {name!r}: a count appears twice (e.g. '3' and '03')")
    total = float(np.sum(probs))
    if abs(total - 1.0) > PMF_SUM_TOLERANCE:
        raise ValueError(f"pmf file {name!r}: probabilities sum to {total:.9g}, not 1 "
                         f"(tolerance {PMF_SUM_TOLERANCE:g})")
    top = max(counts)
    K = int(max_count) if int(max_count) > 0 else max(1, top)
    if top > K:
        raise ValueError(f"pmf file {name!r}: count {top} exceeds max_count = {K}")
    order = np.argsort(counts)
    return CountDistribution(name=f"file:{os.path.basename(name)}",
                             support=np.asarray(counts, np.int64)[order].reshape(-1, 1),
                             probs=np.asarray(probs, np.float64)[order] / total, dim=1, max_count=K,
                             truncated_mass=0.0)


# ----------------------------------------------------------------------------------------
# Wasserstein-1
# ----------------------------------------------------------------------------------------
def sliced_wasserstein1(a_NxD, b_MxD, num_projections: int = 256, seed: int = 0) -> float:
    """Sliced W1: mean over `num_projections` random unit directions (fixed seed) of the 1-D W1
    of the projections. A lower bound on W1 (Euclidean ground metric); float64."""
    a = np.asarray(a_NxD, np.float64)
    b = np.asarray(b_MxD, np.float64)
    rng = np.random.default_rng(seed)
    th = rng.normal(size=(int(num_projections), a.shape[1]))
    th /= np.linalg.norm(th, axis=1, keepdims=True)
    return float(np.mean([scipy.stats.wasserstein_distance(a @ t, b @ t) for t in th]))


def wasserstein1(samples_a, samples_b, method: str = "auto") -> float:
    """Wasserstein-1 distance between two empirical laws (float64, units of the data).

    1-D ([N] or [N, 1]): exact, scipy.stats.wasserstein_distance (what the paper's Table 1 WD is
      [inferred]). D >= 2: method 'exact' = optimal assignment with Euclidean cost
      (scipy.optimize.linear_sum_assignment; needs equal sample sizes, O(N^3): N <= ~3000);
      'sliced' = `sliced_wasserstein1` (a lower bound); 'auto' = exact if N = M <= 3000 else sliced.
      The paper does not state its 2-D ground metric (Tables 8-9).
    Raises ValueError for empty inputs, mismatched dimensions, or 'exact' with N != M.
    """
    a = np.asarray(samples_a, np.float64)
    b = np.asarray(samples_b, np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("empty sample")
    if a.ndim == 1 or (a.ndim == 2 and a.shape[1] == 1):
        return float(scipy.stats.wasserstein_distance(a.reshape(-1), b.reshape(-1)))
    if b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"dimension mismatch: {a.shape} vs {b.shape}")
    if method == "auto":
        method = "exact" if a.shape[0] == b.shape[0] and a.shape[0] <= 3000 else "sliced"
    if method == "sliced":
        return sliced_wasserstein1(a, b)
    if method != "exact":
        raise ValueError(f"unknown method {method!r}; choose 'auto', 'exact' or 'sliced'")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"'exact' needs equal sample sizes; got {a.shape[0]} and {b.shape[0]}")
    cost = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=-1)
    r, c = scipy.optimize.linear_sum_assignment(cost)
    return float(cost[r, c].mean())
