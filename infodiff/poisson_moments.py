"""Exact per-draw mean and variance of the Poisson-diffusion NLL integrand (1-D pmf, exact denoiser).

The Monte Carlo value of one draw (docs/poisson.md §3.2) is

    f(alpha, z) = w(alpha) l(x, xhat*(z, alpha)),   z ~ Pois(e^alpha x),   w = e^alpha / q(alpha),

with xhat* = E[X | Z = z] the exact posterior mean (:class:`infodiff.count_oracles.FiniteCountOracle`)
and l the PRL (docs/poisson.md §2.1). Everything below is computed without Monte Carlo:

  * `loss_moments`: m1(alpha) = E_z[l], v(alpha) = Var_z[l] at one log-SNR, by exact summation
    over z restricted to [F^-1(tail), F^-1(1 - tail)] of Pois(e^alpha x) (scipy.stats.poisson
    ppf / isf). The neglected z mass is <= 2 tail, and 0 <= l <= l_max(x) = max over the
    support's hull of l(x, .) (l is convex in xhat, so the max is at an end atom), so the
    truncation error is <= 2 tail l_max on m1 and <= 2 tail l_max^2 on E_z[l^2].
  * `moment_table`: m1 and v on a log-SNR grid (float64 [A, N]).
  * `sampler_variance`: for each sampler of `infodiff.processes.poisson` (iid truncated logistic,
    strata with pairs of draws, randomised QMC, trapezoid grid), the exact mean of the estimate
    and S x Var(estimate) at S draws (the per-draw variance; for iid draws it is Var(f)), by
    quadrature over the proposal quantile u in (0, 1) (alpha = alpha(u), draws are U ~ U(0, 1)).

Variance decompositions used (law of total variance over alpha, then z):
  iid:     Var(f) = E_u[w^2 (v + m1^2)] - (E_u[w m1])^2.
  strata:  H strata of width 1/H in u, n draws each (S = H n):
           S Var(mean) = (1/H) sum_h sigma_h^2,  sigma_h^2 = E_h[w^2 (v + m1^2)] - (E_h[w m1])^2.
  rqmc:    one random shift U of the S-point lattice (s + U)/S:
           S Var(mean) = S Var_U[(1/S) sum_s w m1((s+U)/S)] + (1/S) sum_s E_U[w^2 v].
  grid:    fixed nodes, trapezoid weights c_s: S Var(mean) = S sum_s c_s^2 v(alpha_s); plus a
           deterministic quadrature error (reported as ``bias``).
Source: docs/poisson.md §3.1-3.2 and the "How the standard error is computed" section.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.stats

from infodiff.count_oracles import FiniteCountOracle
from infodiff.processes.poisson import log_snr_grid, logistic_weight, prl_np

__all__ = ["loss_moments", "moment_table", "proposal_quantile_map", "sampler_variance", "interpolate", "SAMPLER_KINDS"]

SAMPLER_KINDS = ("iid", "strata_pairs", "rqmc", "grid")


def _loss_max(oracle: FiniteCountOracle, x: float) -> float:
    """max of l(x, xhat) over xhat in [min atom, max atom] (convex in xhat: an end atom)."""
    s = oracle.support[:, 0]
    return float(max(prl_np(x, s.min()), prl_np(x, s.max())))


def loss_moments(oracle: FiniteCountOracle, x_N, alpha: float, tail: float = 1e-15):
    """(m1_N, v_N, r3_N, r4_N): E_z[l], Var_z[l] (summed as E (l - m1)^2, no cancellation), E_z[l^3]
    and E_z[l^4] of l = l(x, xhat*(z)) for z ~ Pois(e^alpha x), float64 [N] each.

    Exact summation over z in [ppf(tail), isf(tail)] of Pois(e^alpha x_n) (neglected mass
    <= 2 tail; error bound in the module docstring); x = 0 gives z = 0 surely. x_N: float [N]
    atoms of the (1-D) oracle's space. Raises ValueError for a multi-dimensional oracle."""
    if oracle.dim != 1:
        raise ValueError("loss_moments needs a 1-D FiniteCountOracle")
    g = math.exp(float(alpha))
    x_N = np.asarray(x_N, np.float64).reshape(-1)
    m1, v, r3, r4 = (np.zeros(x_N.size) for _ in range(4))
    for n, x in enumerate(x_N):
        rate = g * x
        if rate == 0:
            z = np.zeros(1)
            pz = np.ones(1)
        else:
            lo = int(scipy.stats.poisson.ppf(tail, rate))
            hi = int(scipy.stats.poisson.isf(tail, rate))
            z = np.arange(lo, hi + 1, dtype=np.float64)
            pz = scipy.stats.poisson.pmf(z, rate)
        loss = prl_np(x, oracle.posterior_mean_np(z[:, None], g)[:, 0])
        pz = pz / pz.sum()
        m1[n] = float(np.sum(pz * loss))
        v[n] = float(np.sum(pz * (loss - m1[n]) ** 2))
        r3[n] = float(np.sum(pz * loss**3))
        r4[n] = float(np.sum(pz * loss**4))
    return m1, v, r3, r4


def moment_table(oracle: FiniteCountOracle, x_N, alpha_A, skip_below: float = 1e-30):
    """{'alpha', 'm1', 'v', 'r3', 'r4'}: float64 [A, N] each (alpha [A]) on the increasing
    log-SNR grid alpha_A (`loss_moments` at each).

    Above the SNR where the atoms are resolved the z sums are skipped (set to 0) once
    gamma^2 E_z[l^2] <= gamma l_max resolved_bound(gamma) < skip_below, a rigorous bound
    (E_z[l^2] <= l_max E_z[l] and gamma mprl <= `FiniteCountOracle.resolved_bound`)."""
    a = np.asarray(alpha_A, np.float64)
    x_N = np.asarray(x_N, np.float64).reshape(-1)
    lmax = max(_loss_max(oracle, x) for x in x_N)
    out = {k: np.zeros((a.size, x_N.size)) for k in ("m1", "v", "r3", "r4")}
    for i, al in enumerate(a):
        g = math.exp(al)
        if al > 0 and g * lmax * oracle.resolved_bound(g) < skip_below:
            continue
        out["m1"][i], out["v"][i], out["r3"][i], out["r4"][i] = loss_moments(oracle, x_N, al)
    out["alpha"] = a
    return out


def interpolate(alpha_table, m_AxN, alpha_M):
    """Log-linear interpolation of a non-negative table to alpha_M: float64 [M, N] (0 where the
    neighbouring table values are 0; 0 outside the table)."""
    out = np.zeros((np.size(alpha_M), m_AxN.shape[1]))
    with np.errstate(divide="ignore"):
        lm = np.log(m_AxN)
    for n in range(m_AxN.shape[1]):
        out[:, n] = np.exp(np.interp(alpha_M, alpha_table, lm[:, n], left=-np.inf, right=-np.inf))
    return out


def proposal_quantile_map(u_M, loc: float, scale: float, clip: float):
    """alpha(u) and w(alpha(u)) = e^alpha / q for the truncated logistic (docs/poisson.md §3.1):
    p = sigma(-c) + (sigma(c) - sigma(-c)) u, alpha = loc + scale logit(p). float64 [M] each."""
    lo = 1.0 / (1.0 + math.exp(clip))
    p = lo + (1.0 - 2.0 * lo) * np.asarray(u_M, np.float64)
    alpha = loc + scale * (np.log(p) - np.log1p(-p))
    return alpha, logistic_weight(alpha, loc, scale, clip, xp=np)


def sampler_variance(alpha_table, m1_AxN, v_AxN, kind: str, num_samples: int,
                     proposal=(-1.0, 5.0, 4.0), grid_range=(-28.0, 37.0), points_per_stratum: int = 64):
    """Exact mean of the diffusion-term estimate and S x Var(estimate) (nats^2) per x.

    Args:
      alpha_table, m1_AxN, v_AxN: a `moment_table` (its grid must cover the sampled range;
        outside it m1 = v = 0 is assumed, which the table's own range must justify).
      kind: 'iid' (iid truncated logistic), 'strata_pairs' (S / 2 quantile strata, 2 draws each),
        'rqmc' (one uniform shift of the S-point quantile lattice per row), 'grid' (S-point
        trapezoid grid on grid_range).
      num_samples: S (even for 'strata_pairs').
      proposal: (loc, scale, clip) of the truncated logistic (not used by 'grid').
      points_per_stratum: quadrature points in u per stratum / lattice cell (midpoint rule).
    Returns: dict with float64 [N] 'mean' (E of the estimate over the sampled range) and
      'var_per_draw' (S Var(estimate)).
    Raises ValueError for an unknown kind or odd S with 'strata_pairs'.
    """
    S = int(num_samples)
    if kind == "grid":
        a, c = log_snr_grid(grid_range[0], grid_range[1], S)  # c includes e^alpha
        m1 = interpolate(alpha_table, m1_AxN, a)
        v = interpolate(alpha_table, v_AxN, a)
        return {"mean": c @ m1, "var_per_draw": S * (c**2 @ v)}
    loc, scale, clip = proposal
    if kind in ("iid", "strata_pairs"):
        H = max(1, S // 2) if kind == "strata_pairs" else 1
        if kind == "strata_pairs" and S % 2:
            raise ValueError(f"strata_pairs needs an even number of samples; got {S}")
        M = points_per_stratum * (H if H > 1 else 4096 // points_per_stratum)
        u = (np.arange(M) + 0.5) / M
        alpha, w = proposal_quantile_map(u, loc, scale, clip)
        g1 = w[:, None] * interpolate(alpha_table, m1_AxN, alpha)  # [M, N]
        g2 = w[:, None] ** 2 * interpolate(alpha_table, v_AxN, alpha) + g1**2
        g1h = g1.reshape(H, -1, g1.shape[1]).mean(1)
        g2h = g2.reshape(H, -1, g2.shape[1]).mean(1)
        return {"mean": g1h.mean(0), "var_per_draw": (g2h - g1h**2).mean(0)}
    if kind == "rqmc":
        P = points_per_stratum
        shift = (np.arange(P) + 0.5) / P  # quadrature over the shift U
        u = (np.arange(S)[:, None] + shift[None, :]) / S  # [S, P]
        alpha, w = proposal_quantile_map(u.reshape(-1), loc, scale, clip)
        g1 = (w[:, None] * interpolate(alpha_table, m1_AxN, alpha)).reshape(S, P, -1)
        zv = (w[:, None] ** 2 * interpolate(alpha_table, v_AxN, alpha)).reshape(S, P, -1)
        est_U = g1.mean(0)  # [P, N]: the lattice mean for each shift
        var = est_U.var(0) + zv.mean(1).sum(0) / S**2
        return {"mean": est_U.mean(0), "var_per_draw": S * var}
    raise ValueError(f"unknown kind {kind!r}; choose from {SAMPLER_KINDS}")
