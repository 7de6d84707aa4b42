"""The parts every mask law of the masked process shares: corruption, the masked cross-entropy,
uniform subsets, the interval sampler, and the law registry.

A *mask law* (:class:`MaskLaw`) is one estimator of ``-log p(x0)`` of the form
``weight * sum_{i masked} -log c(z)_{i, x0_i}`` (``processes/masked.py``, Eq. (*);
arXiv 2510.24088 Eqs. 13, 15): it declares how a row's mask, time and weight are drawn, the
fewest samples with a calibrated standard error, whether it can be a training objective,
whether it scores rows of different lengths, and (for a two-stage law) how it is planned.
:data:`LAWS` maps ``MaskSpec.name`` to its law; :func:`register_law` adds one. The built-in
laws live in ``processes/mask_laws/`` (one module each, or a table of small ones); a new
estimator is one module there that calls :func:`register_law`, picked up automatically.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from infodiff.processes.base import DEFAULT_MIN_SAMPLES

__all__ = ["MaskLaw", "MaskKeys", "LAWS", "register_law", "unregister_law", "law", "corrupt",
           "masked_cross_entropy", "check_logprobs", "masked_ce", "subset_mask", "interval_tables",
           "draw_interval", "harmonic", "uniforms", "frac_time", "common_target_count"]


# ---------------------------------------------------------------------------------------------
# Forward corruption and the masked cross-entropy
# ---------------------------------------------------------------------------------------------
def corrupt(x_BxL: jax.Array, mask_BxL: jax.Array, mask_id: int) -> jax.Array:
    """z = x with masked positions replaced by `mask_id`. int32 [B, L] -> int32 [B, L]."""
    return jnp.where(mask_BxL, jnp.int32(mask_id), x_BxL.astype(jnp.int32))


def masked_cross_entropy(logprobs_BxLxV, x_BxL, mask_BxL) -> jax.Array:
    """Sum over masked positions of -log c(z)_{i, x_i}, float32 [B], nats per sequence.

    This is l_DCE of arXiv 2510.24088 §3 (pointwise denoising cross-entropy).
    """
    logp_BxL = jnp.take_along_axis(
        logprobs_BxLxV.astype(jnp.float32), x_BxL[..., None].astype(jnp.int32), axis=-1
    )[..., 0]
    return -jnp.sum(jnp.where(mask_BxL, logp_BxL, 0.0), axis=-1)


def check_logprobs(logprobs, x_RxL, V: int):
    """The denoiser's output must be [R, L, V]; ValueError naming both shapes otherwise."""
    if logprobs.shape != (x_RxL.shape[0], x_RxL.shape[1], V):
        raise ValueError(
            f"the denoiser returned shape {logprobs.shape}, expected {(x_RxL.shape[0], x_RxL.shape[1], V)} "
            f"(vocab_size={V} does not match the denoiser?)")
    return logprobs


@functools.partial(jax.jit, static_argnames=("apply_fn", "vocab_size"))
def masked_ce(apply_fn, params, x_RxL, mask_RxL, t_R, vocab_size):
    """sum_{masked} -log c(z)_{i, x_i} per row (float32 [R], nats) of ``apply_fn(params, z, t_R)``
    with z = x masked at ``mask_RxL`` (mask id ``vocab_size``)."""
    z = corrupt(x_RxL, mask_RxL, vocab_size)
    logprobs = check_logprobs(apply_fn(params, z, t_R), x_RxL, vocab_size)
    return masked_cross_entropy(logprobs, x_RxL, mask_RxL)


# ---------------------------------------------------------------------------------------------
# Sampling primitives
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def interval_tables(L: int, lam_lo: float, lam_hi: float):
    """Tables for the interval sampler, for every target count n = 0..L.

    Returns (cdf_NxM, Z_N) as float64 numpy arrays, N = L + 1 rows (n), M = L columns (m = 1..L):
      coef[n, m] = (1/m) [I_hi(m, n-m+1) - I_lo(m, n-m+1)]  for 1 <= m <= n, else 0,
      Z[n] = sum_m coef[n, m]  (= H_n for [0, 1]),  cdf[n] = cumsum(coef[n]) / Z[n].
    Rows with n = 0 or Z = 0 have cdf = 1 everywhere (never used: weight 0).
    """
    coef = np.zeros((L + 1, L), dtype=np.float64)
    for n in range(1, L + 1):
        m = np.arange(1, n + 1, dtype=np.float64)
        hi = scipy.special.betainc(m, n - m + 1, lam_hi) if lam_hi < 1 else np.ones_like(m)
        lo = scipy.special.betainc(m, n - m + 1, lam_lo) if lam_lo > 0 else np.zeros_like(m)
        coef[n, :n] = np.maximum(hi - lo, 0.0) / m
    Z = coef.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cdf = np.where(Z[:, None] > 0, np.cumsum(coef, axis=1) / np.where(Z > 0, Z, 1)[:, None], 1.0)
    cdf[:, -1] = 1.0
    return cdf, Z


def harmonic(n: int) -> float:
    """H_n = sum_{m=1}^n 1/m (float64)."""
    return float(np.sum(1.0 / np.arange(1, n + 1))) if n > 0 else 0.0


def subset_mask(key, target_BxL, m_B):
    """Uniformly random m_B-subset of the target positions of each row (argsort trick)."""
    u = jax.random.uniform(key, target_BxL.shape)
    u = jnp.where(target_BxL, u, 2.0)  # non-target positions rank last
    ranks = jnp.argsort(jnp.argsort(u, axis=-1), axis=-1)
    return ranks < m_B[:, None]


def draw_interval(key, target_BxL, lam_lo, lam_hi):
    """m from the interval-sampler law for each row's n, then a uniform m-subset.

    Returns (mask_BxL bool, m_B int32, weight_B float32 = Z_[lo,hi](n)).
    """
    L = target_BxL.shape[-1]
    cdf, Z = interval_tables(L, float(lam_lo), float(lam_hi))
    n_B = jnp.sum(target_BxL, axis=-1).astype(jnp.int32)
    k1, k2 = jax.random.split(key)
    u_B = jax.random.uniform(k1, n_B.shape)
    cdf_BxM = jnp.asarray(cdf, jnp.float32)[n_B]
    m_B = 1 + jnp.sum(cdf_BxM < u_B[:, None], axis=-1).astype(jnp.int32)
    m_B = jnp.minimum(m_B, jnp.maximum(n_B, 1))
    weight_B = jnp.asarray(Z, jnp.float32)[n_B]
    mask = subset_mask(k2, target_BxL, m_B) & target_BxL
    return mask, m_B, weight_B


def uniforms(key, B, antithetic):
    """float32 [B] uniforms on [0, 1): i.i.d., or low-discrepancy u_b = (u0 + b/B) mod 1 (MD4)."""
    if antithetic:
        u0 = jax.random.uniform(key, ())
        return jnp.mod(u0 + jnp.arange(B, dtype=jnp.float32) / B, 1.0)
    return jax.random.uniform(key, (B,))


def frac_time(spec, m_B, n_B):
    """The time t(lambda = m / n) of the spec's schedule (float32 [B]) fed to a time-conditioned
    denoiser when m of n target positions are masked."""
    lam = m_B.astype(jnp.float32) / jnp.maximum(n_B, 1).astype(jnp.float32)
    return spec.schedule.t_from_lambda(lam).astype(jnp.float32)


def common_target_count(target_BxL, name: str) -> int:
    """The number n >= 1 of target positions shared by every row. ValueError otherwise."""
    counts = np.unique(np.asarray(target_BxL).sum(axis=-1))
    if len(counts) != 1 or counts[0] < 1:
        raise ValueError(
            f"the {name} estimator needs the same number (>= 1) of target positions in every "
            f"row; got counts {counts.tolist()}"
        )
    return int(counts[0])


# ---------------------------------------------------------------------------------------------
# Mask laws
# ---------------------------------------------------------------------------------------------
class MaskKeys(NamedTuple):
    """The four PRNG keys of one draw, split from the draw's key in this order (part of the
    random stream: every law receives all four and uses what it needs)."""

    u: jax.Array         # the law's scalar per row (time, mask fraction, subset size)
    mask: jax.Array      # which positions are masked
    mix: jax.Array       # a mixture component (t_dce's boundary pieces)
    boundary: jax.Array  # the boundary pieces' own draws


class MaskLaw:
    """One estimator of the masked process (the module docstring): a small stateless object.

    Declared by every law:
      name: ``MaskSpec.name`` (``config.eval.estimator`` / ``process.objective``).
      draw(spec, keys, target_BxL, n_B, sample_B): one mask, time and weight per row:
        ``(mask_BxL bool (inside the target), t_B float32 in [0, 1], weight_B float32)`` such that
        ``weight * sum_masked CE`` is an unbiased one-sample estimate; rows with n = 0 get no mask
        (their value is 0).
        ``keys``: :class:`MaskKeys`; ``n_B`` the target count of each row; ``sample_B`` int32 [B]
        the Monte Carlo sample index of each row (or None).
    With a default (override what differs):
      objective: also a training objective (``config.process.objective``, ``diffusion_loss``).
      min_samples: fewest samples with a calibrated standard error (tests/test_calibration.py).
      one_pass: one forward pass per sample whatever the rows' target counts, so rows of
        different lengths (pads) can be scored together (``infodiff.scoring``).
      per_input_targets: the two inputs of a pair may score different target positions.
      antithetic: reads ``MaskSpec.antithetic`` (draws a continuous time or mask fraction).
      finite_T: reads ``MaskSpec.finite_T`` (MD4's discrete-time ELBO).
      exact_boundaries: reads ``MaskSpec.exact_boundaries`` (without it, a bound: its training
        loss is not an unbiased estimate of -log p).
    Methods with a default (a law with planning needs, e.g. neyman, overrides them):
      infinite_variance(spec), passes_per_sample(spec, target_BxL), needs_plan(spec),
      pilot_stage(spec, target_BxL, num_samples), plan(spec, pilot_BxS, target_BxL, num_samples),
      exact_terms(spec, apply_fn, params, x_BxL, target_BxL, batch_size, vocab_size),
      extra_passes(spec): as the Process members of the same names
      (``infodiff/processes/base.py``), with the spec in place of the process.
    """

    name: str = ""
    objective: bool = False
    min_samples: int = DEFAULT_MIN_SAMPLES
    one_pass: bool = True
    per_input_targets: bool = True
    antithetic: bool = False
    finite_T: bool = False
    exact_boundaries: bool = False

    def draw(self, spec, keys: MaskKeys, target_BxL, n_B, sample_B):
        raise NotImplementedError

    def infinite_variance(self, spec) -> bool:
        return False

    def passes_per_sample(self, spec, target_BxL) -> int:
        return 1

    def needs_plan(self, spec) -> bool:
        return False

    def pilot_stage(self, spec, target_BxL, num_samples: int):
        """``(pilot spec, pilot samples per piloted row, rows piloted k)`` or None."""
        return None

    def plan(self, spec, pilot_BxS, target_BxL, num_samples: int) -> tuple[Any, int]:
        """``(planned spec, samples to draw)``."""
        return spec, num_samples

    def exact_terms(self, spec, apply_fn, params, x_BxL, target_BxL, batch_size: int, vocab_size: int) -> dict:
        return {}

    def extra_passes(self, spec) -> int:
        return 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


LAWS: dict[str, MaskLaw] = {}


def register_law(mask_law: MaskLaw) -> MaskLaw:
    """Add ``mask_law`` to :data:`LAWS` under its name (replacing one of that name); return it.
    ValueError for a law without a name or with a min_samples below 2."""
    if not isinstance(mask_law.name, str) or not mask_law.name:
        raise ValueError(f"{type(mask_law).__name__}.name must be a non-empty string; got {mask_law.name!r}")
    if int(mask_law.min_samples) < 2:
        raise ValueError(f"{mask_law!r}.min_samples={mask_law.min_samples} must be >= 2 (a standard error "
                         "needs two samples)")
    LAWS[mask_law.name] = mask_law
    return mask_law


def unregister_law(name: str) -> None:
    """Remove the law ``name`` from :data:`LAWS` (a test's throwaway law)."""
    LAWS.pop(name, None)


def law(name: str) -> MaskLaw:
    """The registered law ``name``; ValueError naming it and the registered names."""
    found = LAWS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"unknown estimator/objective {name!r}; choose from {tuple(LAWS)}")
    return found
