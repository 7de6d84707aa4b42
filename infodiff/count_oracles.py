"""Exact denoisers for the Poisson channel (count data), for testing Poisson-diffusion estimators.

An oracle follows the denoiser contract of `infodiff.processes.poisson`:

    oracle(z_BxD float32 counts, alpha_B float32) -> E[X | Z_gamma = z] float32 [B, D],  gamma = e^alpha

so every estimator can be checked against the exact likelihood. Oracles live in the space their
support is GIVEN in: pass raw counts {0, 1, ...} or scaled values (e.g. CountScaling.scale(...));
the data x given to the estimator must be in the same space. Supports must be >= 0 (a Poisson rate).

  * FiniteCountOracle(support_KxD, probs_K): any pmf on K points of R_{>=0}^D (dependent
    coordinates); posterior by a log-space softmax over the K atoms (docs/poisson.md §7 recipe).
  * ProductCountOracle(supports, probs): independent coordinates, each a 1-D pmf; posterior
    factorises (D up to ~64 or more).
  * GammaPriorOracle(shape, rate): X ~ Gamma(k, beta) (continuous; only for denoiser tests),
    E[X | Z = z] = (z + k) / (beta + gamma) (ItDPDM Lemma 2; docs/poisson.md §2.2).

Exact quantities (float64 numpy): log_prob, entropy, mprl(x, gamma) by summing over z (truncated
to gamma x +- 12 sqrt(gamma x) + 20 per coordinate, docs/poisson.md §7), quadrature_nll(x, alpha_grid) =
int e^alpha mprl dalpha (trapezoid), posterior_mean_tgr (Turing-Good-Robbins, ItDPDM Lemma 4).
Source: arXiv 2505.05082; docs/poisson.md §2, §7.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
import scipy.stats

from infodiff.processes.poisson import check_gamma, poisson_loglik, prl_np
from infodiff.validation import validate_rates

__all__ = ["FiniteCountOracle", "ProductCountOracle", "GammaPriorOracle", "z_range"]


def z_range(rate: float, width: float = 12.0, pad: int = 20) -> np.ndarray:
    """int64 z values covering Pois(rate) up to ~1e-30 tails: rate +- width sqrt(rate) + pad (docs/poisson.md §7)."""
    if rate <= 0:
        return np.zeros(1, np.int64)
    s = width * math.sqrt(rate) + pad
    return np.arange(max(0, int(math.floor(rate - s))), int(math.ceil(rate + s)) + 1, dtype=np.int64)


def _check_probs(probs, k):
    p = np.asarray(probs, np.float64)
    if p.ndim != 1 or p.size != k:
        raise ValueError(f"probs must have shape [{k}]; got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        i = int(np.argwhere(~(np.isfinite(p) & (p >= 0)))[0, 0])
        raise ValueError(f"probs[{i}] = {p[i]} must be finite and >= 0")
    if abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"probs sum to {p.sum():.9g}, not 1")
    return p / p.sum()


class _Base:
    def __call__(self, z_BxD, alpha_B):
        raise NotImplementedError

    def quadrature_nll(self, x_NxD, alpha_grid) -> np.ndarray:
        """int e^alpha mprl(x, e^alpha) dalpha by the trapezoid rule on alpha_grid (increasing,
        float [A]). Returns float64 [N] nats; equals -log P(x) when the grid covers the
        integrand (docs/poisson.md §7: [-25, 12], 741 points, for the toy pmfs)."""
        a = np.asarray(alpha_grid, np.float64)
        if a.ndim != 1 or a.size < 2 or np.any(np.diff(a) <= 0):
            raise ValueError("alpha_grid must be a strictly increasing 1-D array of >= 2 points")
        x = self._as_x(x_NxD)
        f = np.stack([math.exp(al) * self.mprl(x, math.exp(al)) for al in a])  # [A, N]
        return np.trapezoid(f, a, axis=0)

    def _as_x(self, x_NxD):
        x = validate_rates(x_NxD)
        if x.ndim == 1 and self.dim == 1:
            x = x[:, None]
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must be [N, {self.dim}]; got shape {x.shape}")
        return x


class FiniteCountOracle(_Base):
    """Exact posterior mean for a pmf on K atoms s_k in R_{>=0}^D (dependent coordinates).

    Args:
      support_KxD: float [K, D] (or [K] for D = 1) distinct atoms, >= 0, in the space of the data
        (raw counts or scaled; see module docstring).
      probs_K: float [K] probabilities (> 0 recommended; zeros allowed), summing to 1 (1e-6).
    Raises: ValueError for negative / non-finite atoms, duplicate atoms, bad probabilities.
    """

    def __init__(self, support_KxD, probs_K):
        s = validate_rates(support_KxD, "support")
        if s.ndim == 1:
            s = s[:, None]
        if s.ndim != 2:
            raise ValueError(f"support must be [K, D]; got shape {s.shape}")
        if len(np.unique(s, axis=0)) != len(s):
            raise ValueError("support atoms must be distinct")
        self.support = s
        self.probs = _check_probs(probs_K, s.shape[0])
        self.dim = s.shape[1]
        with np.errstate(divide="ignore"):
            self._logp = np.log(self.probs)
        self._s32 = jnp.asarray(s, jnp.float32)
        self._logp32 = jnp.asarray(self._logp, jnp.float32)

    # -- denoiser ---------------------------------------------------------------------------
    def __call__(self, z_BxD, alpha_B):
        """E[X | Z_gamma = z], float32 jax [B, D]; jit-able. gamma = exp(alpha_B)."""
        z = jnp.asarray(z_BxD, jnp.float32)
        gamma = jnp.exp(jnp.asarray(alpha_B, jnp.float32))
        rate = gamma[:, None, None] * self._s32[None]  # [B, K, D]
        ll = poisson_loglik(z[:, None, :], rate).sum(-1) + self._logp32  # [B, K]
        post = jax.nn.softmax(ll, axis=-1)
        return post @ self._s32

    def posterior_np(self, z_BxD, gamma_B) -> np.ndarray:
        """P(X = s_k | Z_gamma = z), float64 [B, K]."""
        z = np.asarray(z_BxD, np.float64).reshape(-1, self.dim)
        g = check_gamma(np.broadcast_to(np.asarray(gamma_B, np.float64), (z.shape[0],)))
        rate = g[:, None, None] * self.support[None]
        ll = poisson_loglik(z[:, None, :], rate, xp=np).sum(-1) + self._logp
        return scipy.special.softmax(ll, axis=-1)

    def posterior_mean_np(self, z_BxD, gamma_B) -> np.ndarray:
        """E[X | Z_gamma = z], float64 numpy [B, D] (gamma scalar or [B])."""
        return self.posterior_np(z_BxD, gamma_B) @ self.support

    def log_marginal_z(self, z_BxD, gamma: float) -> np.ndarray:
        """log P(Z_gamma = z), float64 [B] (full Poisson pmf, with the lgamma terms)."""
        z = np.asarray(z_BxD, np.float64).reshape(-1, self.dim)
        lp = scipy.stats.poisson.logpmf(z[:, None, :], gamma * self.support[None]).sum(-1)
        return scipy.special.logsumexp(lp + self._logp, axis=-1)

    def posterior_mean_tgr(self, z_BxD, gamma: float) -> np.ndarray:
        """Turing-Good-Robbins: E[X_i | Z = z] = (z_i + 1) P_Z(z + e_i) / (gamma P_Z(z)), from the
        marginal pmf of Z only (ItDPDM Lemma 4; docs/poisson.md §2.2). float64 [B, D]."""
        check_gamma(gamma)
        z = np.asarray(z_BxD, np.float64).reshape(-1, self.dim)
        base = self.log_marginal_z(z, gamma)
        out = np.empty_like(z)
        for i in range(self.dim):
            zi = z.copy()
            zi[:, i] += 1
            out[:, i] = (z[:, i] + 1) * np.exp(self.log_marginal_z(zi, gamma) - base) / gamma
        return out

    # -- exact quantities -------------------------------------------------------------------
    def _index(self, x):
        hits = np.all(np.isclose(x[:, None, :], self.support[None], rtol=0, atol=1e-9), axis=-1)
        idx = np.where(hits.any(1), hits.argmax(1), -1)
        return idx

    def log_prob(self, x_NxD) -> np.ndarray:
        """log P(x) in nats, float64 [N] (-inf off the support)."""
        x = self._as_x(x_NxD)
        idx = self._index(x)
        return np.where(idx >= 0, self._logp[np.maximum(idx, 0)], -np.inf)

    def entropy(self) -> float:
        """H(X) in nats (float64)."""
        p = self.probs[self.probs > 0]
        return float(-(p * np.log(p)).sum())

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n iid draws, float64 [n, D] (atoms). rng: numpy Generator."""
        return self.support[rng.choice(len(self.probs), size=int(n), p=self.probs)]

    def resolved_bound(self, gamma: float) -> float:
        """Rigorous upper bound on max_x gamma * mprl(x, gamma) (float64), used to skip the z sum
        once the atoms are resolved. Since E_x mprl(x, .) <= the expected loss of ANY denoiser,
        e.g. the atom maximum-likelihood decision, and mprl >= 0:
            mprl(x, gamma) <= (1 / P(x)) sum_{x'} P(x') sum_{k != x'} P(ML picks s_k | x') l(x', s_k),
        with the Bhattacharyya pairwise bound P(ML picks s_k | x') <= sum_z sqrt(p_k(z) p_x'(z))
        = exp(-gamma B(x', s_k) / 2), B = sum_d (sqrt(x'_d) - sqrt(s_kd))^2."""
        s = self.support
        B = ((np.sqrt(s[:, None, :]) - np.sqrt(s[None, :, :])) ** 2).sum(-1)  # [K, K]
        L = prl_np(s[:, None, :], s[None, :, :]).sum(-1)
        np.fill_diagonal(L, 0.0)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.where(L > 0, np.exp(-0.5 * gamma * B) * L, 0.0)
        tot = float((self.probs[:, None] * e).sum())
        pmin = self.probs[self.probs > 0].min()
        return gamma * tot / pmin

    def mprl(self, x_NxD, gamma: float, skip_below: float = 1e-16) -> np.ndarray:
        """Pointwise MPRL  E_{z ~ Pois(gamma x)} sum_d l(x_d, E[X_d | Z = z]), float64 [N] nats,
        by exact summation over the product grid of z (docs/poisson.md §7 truncation per coordinate).
        Returns 0 when `resolved_bound(gamma)` < skip_below (then gamma * mprl < skip_below
        rigorously), which keeps high-SNR grids cheap (the product grid grows like gamma^D)."""
        g = float(check_gamma(gamma))
        x = self._as_x(x_NxD)
        out = np.zeros(x.shape[0])
        if self.resolved_bound(g) < skip_below:
            return out
        for n in range(x.shape[0]):
            # Product grid handled by broadcasting: log-likelihood tables per coordinate.
            grids = [z_range(g * xd).astype(np.float64) for xd in x[n]]
            D = self.dim
            ll = self._logp.copy()  # broadcast to [n_1, ..., n_D, K]
            logw = 0.0
            for d, zd in enumerate(grids):
                shape = [1] * D + [1]
                shape[d] = zd.size
                ll = ll + poisson_loglik(zd[:, None], g * self.support[None, :, d], xp=np).reshape(
                    shape[:D] + [-1])
                shape_w = [1] * D
                shape_w[d] = zd.size
                logw = logw + scipy.stats.poisson.logpmf(zd, g * x[n, d]).reshape(shape_w)
            post = scipy.special.softmax(ll, axis=-1)
            loss = 0.0
            for d in range(D):
                loss = loss + prl_np(x[n, d], post @ self.support[:, d])
            out[n] = float(np.sum(np.exp(logw) * loss))
        return out


class ProductCountOracle(_Base):
    """Independent coordinates, coordinate d with a 1-D pmf (supports[d], probs[d]).

    Args:
      supports: sequence of D float arrays (atoms >= 0, distinct), or one [K] array shared by all
        D coordinates (then `dim` is required).
      probs: sequence of D probability arrays (or one shared array).
      dim: number of coordinates when support/probs are shared.
    The posterior factorises: E[X_d | Z] = E[X_d | Z_d].
    """

    def __init__(self, supports, probs, dim: int | None = None):
        if dim is not None:
            supports, probs = [supports] * int(dim), [probs] * int(dim)
        if len(supports) != len(probs) or len(supports) < 1:
            raise ValueError("supports and probs must be sequences of the same length >= 1")
        self.coords = [FiniteCountOracle(np.asarray(s, np.float64).reshape(-1, 1), p)
                       for s, p in zip(supports, probs)]
        self.dim = len(self.coords)
        K = max(len(c.probs) for c in self.coords)
        s_pad = np.zeros((self.dim, K))
        lp_pad = np.full((self.dim, K), -np.inf)
        for d, c in enumerate(self.coords):
            k = len(c.probs)
            s_pad[d, :k] = c.support[:, 0]
            lp_pad[d, :k] = c._logp
        self._s32 = jnp.asarray(s_pad, jnp.float32)
        self._lp32 = jnp.asarray(lp_pad, jnp.float32)

    def __call__(self, z_BxD, alpha_B):
        """E[X_d | Z_d = z_d], float32 jax [B, D]; jit-able."""
        z = jnp.asarray(z_BxD, jnp.float32)
        gamma = jnp.exp(jnp.asarray(alpha_B, jnp.float32))
        rate = gamma[:, None, None] * self._s32[None]  # [B, D, K]
        ll = poisson_loglik(z[:, :, None], rate) + self._lp32
        post = jax.nn.softmax(ll, axis=-1)
        return (post * self._s32[None]).sum(-1)

    def posterior_mean_np(self, z_BxD, gamma_B) -> np.ndarray:
        z = np.asarray(z_BxD, np.float64).reshape(-1, self.dim)
        return np.stack([c.posterior_mean_np(z[:, d:d + 1], gamma_B)[:, 0]
                         for d, c in enumerate(self.coords)], axis=1)

    def posterior_mean_tgr(self, z_BxD, gamma: float) -> np.ndarray:
        z = np.asarray(z_BxD, np.float64).reshape(-1, self.dim)
        return np.stack([c.posterior_mean_tgr(z[:, d:d + 1], gamma)[:, 0]
                         for d, c in enumerate(self.coords)], axis=1)

    def log_prob(self, x_NxD) -> np.ndarray:
        x = self._as_x(x_NxD)
        return sum(c.log_prob(x[:, d:d + 1]) for d, c in enumerate(self.coords))

    def entropy(self) -> float:
        return float(sum(c.entropy() for c in self.coords))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.concatenate([c.sample(rng, n) for c in self.coords], axis=1)

    def mprl(self, x_NxD, gamma: float) -> np.ndarray:
        """Sum over coordinates of the 1-D pointwise MPRL (exact; posterior factorises)."""
        x = self._as_x(x_NxD)
        return sum(c.mprl(x[:, d:d + 1], gamma) for d, c in enumerate(self.coords))


class GammaPriorOracle:
    """X_d ~ Gamma(shape k, rate beta) iid; E[X | Z_gamma = z] = (z + k) / (beta + gamma).

    ItDPDM Lemma 2 (posterior Gamma(k + z, beta + gamma); docs/poisson.md §2.2, parameters re-derived).
    Continuous prior: -log density is not a discrete NLL (the PRL integral diverges), so this
    oracle is only for denoiser / channel tests. Raises ValueError for shape, rate <= 0.
    """

    def __init__(self, shape: float, rate: float):
        if not (shape > 0 and rate > 0 and math.isfinite(shape) and math.isfinite(rate)):
            raise ValueError(f"shape = {shape!r} and rate = {rate!r} must be finite and > 0")
        self.shape, self.rate = float(shape), float(rate)

    def __call__(self, z_BxD, alpha_B):
        z = jnp.asarray(z_BxD, jnp.float32)
        gamma = jnp.exp(jnp.asarray(alpha_B, jnp.float32))
        return (z + self.shape) / (self.rate + gamma)[:, None]

    def posterior_mean_np(self, z, gamma):
        return (np.asarray(z, np.float64) + self.shape) / (self.rate + np.asarray(gamma, np.float64))

    def sample(self, rng: np.random.Generator, n: int, dim: int = 1) -> np.ndarray:
        return rng.gamma(self.shape, 1.0 / self.rate, size=(int(n), int(dim)))
