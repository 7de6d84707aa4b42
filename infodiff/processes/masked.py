"""Masked (absorbing) discrete diffusion: forward corruption, mask samplers, DCE objectives,
ancestral sampler.

Token ids: the V real tokens are 0..V-1 and the MASK token is id V (MD4 convention: mask id =
vocab size). A *denoiser* is any function ``denoiser(z_BxL, t_B) -> logprobs_BxLxV`` that returns
log-probabilities normalised over the V real tokens (an x0-predictor / "mean" parameterisation,
RADD's c_theta). Networks and exact oracles go through the same code.

Every estimator of -log p(x0) used here has the form

    weight * sum_{i masked} -log c(z)_{i, x0_i}                                      (*)

with a random mask and a weight; only the mask law and the weight differ
(docs/discrete_diffusion.md §6; arXiv 2510.24088 Eqs. 13, 15):

  =============  =====================================================  ====================
  name           mask law                                                weight
  =============  =====================================================  ====================
  t_dce          t ~ U(0,1); mask each token w.p. 1 - alpha_t           -alpha'_t/(1-alpha_t)
  lambda_dce     lambda ~ U(0,1); mask each token w.p. lambda            1 / lambda
  k_dce          k ~ U{1..n}; uniform k-subset                           n / k
  time_free      m ~ P(m) ∝ 1/m on {1..n} (m = n included); m-subset    H_n
  interval       lambda integrated out analytically over [a, b]          Z_[a,b]
  stratified     one uniform m-subset for EACH m = 1..n (n passes)      1 / m, summed over m
  neyman         n_m uniform m-subsets per m, n_m ∝ sigma_m / m          1 / (m n_m), summed
                 (Neyman); cheap strata (and m = n) enumerated
  =============  =====================================================  ====================

n is the number of *target* positions of a row (all of them for -log p(x); the response for
-log p(y | x)). With exact conditionals all of them have expectation -log p(x0[target] |
x0[not target]) (t_dce exactly so only with `exact_boundaries=True`, see `draw_masks`).

The `interval` sampler is ours: for mask probability lambda restricted to [a, b],
  int_a^b (1/lambda) E_{S ~ Bern(lambda)^n} [C_S] d lambda
    = sum_m (1/m) [I_b(m, n-m+1) - I_a(m, n-m+1)] E_{|S| = m}[C_S],
(I = regularised incomplete beta), so drawing m with probability proportional to that
coefficient and weighting by their sum Z_[a,b] is unbiased with finite variance. [0, 1] gives
the time-free estimator (Z = H_n, I-MDCE Thm 4.1); it also covers the boundary pieces
[0, lambda(0)] and [lambda(1), 1] that a schedule with eps > 0 leaves out of the t-integral.

The `stratified` estimator is ours too (beyond arXiv 2510.24088): -log p = sum_m E[C_m] / m
is estimated by drawing one uniform m-subset for every m = 1..n (stratified sampling over the
mask count, one sample per stratum), so one Monte Carlo sample costs n forward passes and the
between-m variance that dominates the time-free and k-DCE estimators disappears. The caller
lays the rows out in rounds of n consecutive rows; row j of a round gets m = (j mod n) + 1.

The `neyman` estimator (ours) allocates the passes of a sample to the strata in proportion to
a_m = sigma_m / m (Neyman allocation, Cochran, *Sampling Techniques*, 1977, §5.5), sigma_m the
spread of C_m = sum_{i in S} -log c(z_S)_{i, x_i} over uniform m-subsets S. Three stages
(:func:`neyman_plan`):
  1. pilot: a separate run of 32 draws of every stratum m = 1..n-1, pooled over the first
     min(B, 16) sequences (:func:`pilot_rounds`), gives sigma_m (kept out of the estimate, so the
     allocation never weights the samples it was chosen from: the estimate is exactly unbiased);
  2. enumeration: the deterministic stratum m = n (one subset) and every stratum whose
     C(n, m) subsets lower the variance at the remaining budget are computed exactly (exact term
     'diffusion'); if all 2^n - 1 subsets fit the budget, everything is enumerated (SE 0);
  3. the remaining strata share a sample of R = block x n rows (block = min(4, S // 32)) as
     integers n_m >= 1 proportional to a_m; row weights 1 / (m n_m). Every sampled stratum
     has at least one row in every sample, so the estimate is exactly unbiased; the samples
     that fit the rest of the budget of S n passes are drawn.
Samples are i.i.d. given the plan, so the plain sample SE applies.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from infodiff import schedules as schedules_lib
from infodiff.denoisers import NoParams
from infodiff.processes import base
from infodiff.validation import validate_tokens

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]

OBJECTIVES = ("t_dce", "lambda_dce", "k_dce", "time_free")
# Fewest Monte Carlo samples at which each estimator's SE is calibrated (coverage of +-1.96 SE
# and mean z^2, tests/test_calibration.py); time_free's values are skewed (rare large m), so
# its sample SE is too small at S = 32 (mean z^2 1.7). lambda_dce: infinite variance, never.
MIN_SAMPLES = {"t_dce": 32, "k_dce": 16, "time_free": 128, "stratified": 8, "neyman": 8,
               "lambda_dce": 2**62}
ESTIMATORS = ("t_dce", "lambda_dce", "k_dce", "time_free", "stratified", "neyman")


# ---------------------------------------------------------------------------------------------
# Forward process
# ---------------------------------------------------------------------------------------------
def corrupt(x_BxL: jax.Array, mask_BxL: jax.Array, mask_id: int) -> jax.Array:
    """z = x with masked positions replaced by `mask_id`. int32 [B, L] -> int32 [B, L]."""
    return jnp.where(mask_BxL, jnp.int32(mask_id), x_BxL.astype(jnp.int32))


def forward_sample(key, x_BxL, t_B, schedule: schedules_lib.Schedule, mask_id: int):
    """Sample z_t ~ q(z_t | x0): each token kept w.p. alpha_t, else MASK (MD4 forward sample).

    Args: x_BxL int [B, L] clean tokens; t_B float [B] times in [0, 1].
    Returns: (z_BxL int32, mask_BxL bool).
    """
    lam_B = schedule.mask_prob(t_B)
    mask_BxL = jax.random.uniform(key, x_BxL.shape) < lam_B[:, None]
    return corrupt(x_BxL, mask_BxL, mask_id), mask_BxL


def masked_cross_entropy(logprobs_BxLxV, x_BxL, mask_BxL) -> jax.Array:
    """Sum over masked positions of -log c(z)_{i, x_i}, float32 [B], nats per sequence.

    This is l_DCE of arXiv 2510.24088 §3 (pointwise denoising cross-entropy).
    """
    logp_BxL = jnp.take_along_axis(
        logprobs_BxLxV.astype(jnp.float32), x_BxL[..., None].astype(jnp.int32), axis=-1
    )[..., 0]
    return -jnp.sum(jnp.where(mask_BxL, logp_BxL, 0.0), axis=-1)


# ---------------------------------------------------------------------------------------------
# Mask samplers
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NeymanPlan:
    """The allocation of the `neyman` estimator for rows with n target positions (hashable).

    pilot: True for the pilot stage: sample s of a row draws one uniform m-subset with
      m = (s mod (n - 1)) + 1 and weight 1 (the per-stratum values C_m themselves).
    counts: n_m uniform m-subsets per sample for m = 1..n (0 for enumerated strata, >= 1
      otherwise); rows = sum n_m passes per sample; num_samples: the samples S' to draw.
    enumerated: the strata m computed exactly by enumerating their C(n, m) subsets.
    Built by :func:`neyman_plan`; see the module docstring.
    """

    n: int
    pilot: bool = False
    counts: tuple = ()
    num_samples: int = 0
    enumerated: tuple = ()

    @property
    def rows(self) -> int:
        return int(sum(self.counts))

    @property
    def exact(self) -> bool:
        """Every stratum enumerated: no Monte Carlo term."""
        return not self.pilot and self.rows == 0

    def enumeration_passes(self) -> int:
        return int(sum(math.comb(self.n, m) for m in self.enumerated))


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """How masks and weights are drawn (hashable, so it can be a static jit argument).

    name: one of ESTIMATORS ('t_dce', 'lambda_dce', 'k_dce', 'time_free', 'stratified';
      the last only for likelihood estimation, see the module docstring).
    schedule: used by t_dce for (t, mask law, weight); by the others only to map a mask
      fraction to a time for time-conditioned denoisers (t = t(lambda = m / n)).
    exact_boundaries: t_dce only. If True, the pieces of the lambda-integral outside
      [lambda(0), lambda(1)] are added by the interval sampler in a mixture (probability
      `boundary_prob` each), so the estimate is unbiased for the exact NLL. If False, t_dce
      is the continuous-time objective of MD4 (a bound that misses O(eps) pieces).
    finite_T: t_dce only; 0 = continuous time, T > 0 = MD4's discrete-time ELBO with T steps.
    antithetic: t_dce / lambda_dce; low-discrepancy u_b = (u0 + b/B) mod 1 across the batch
      (MD4). Use only for training: the estimators need i.i.d. draws for honest standard errors.
    plan: neyman only: the :class:`NeymanPlan` (None until :func:`likelihood.nll` has run the
      pilot).
    """

    name: str = "time_free"
    schedule: schedules_lib.Schedule = schedules_lib.LinearSchedule()
    exact_boundaries: bool = True
    boundary_prob: float = 0.02
    finite_T: int = 0
    antithetic: bool = False
    plan: NeymanPlan | None = None

    def __post_init__(self):
        if self.name not in ESTIMATORS:
            raise ValueError(f"unknown estimator/objective {self.name!r}; choose from {ESTIMATORS}")
        if self.finite_T < 0:
            raise ValueError(f"finite_T must be >= 0; got {self.finite_T}")
        if not 0.0 < self.boundary_prob < 0.5:
            raise ValueError(f"boundary_prob must be in (0, 0.5); got {self.boundary_prob}")


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


def _subset_mask(key, target_BxL, m_B):
    """Uniformly random m_B-subset of the target positions of each row (argsort trick)."""
    u = jax.random.uniform(key, target_BxL.shape)
    u = jnp.where(target_BxL, u, 2.0)  # non-target positions rank last
    ranks = jnp.argsort(jnp.argsort(u, axis=-1), axis=-1)
    return ranks < m_B[:, None]


def _draw_interval(key, target_BxL, lam_lo, lam_hi):
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
    mask = _subset_mask(k2, target_BxL, m_B) & target_BxL
    return mask, m_B, weight_B


def _uniforms(key, B, antithetic):
    if antithetic:
        u0 = jax.random.uniform(key, ())
        return jnp.mod(u0 + jnp.arange(B, dtype=jnp.float32) / B, 1.0)
    return jax.random.uniform(key, (B,))


def _frac_time(spec, m_B, n_B):
    lam = m_B.astype(jnp.float32) / jnp.maximum(n_B, 1).astype(jnp.float32)
    return spec.schedule.t_from_lambda(lam).astype(jnp.float32)


def _draw_neyman(plan: NeymanPlan, key, target_BxL, sample_B):
    """Masks of the `neyman` estimator (module docstring): pilot or planned rows."""
    B = target_BxL.shape[0]
    n = plan.n
    if plan.pilot:
        if sample_B is None:
            raise ValueError("the neyman pilot needs each row's sample index (sample_R)")
        m_B = (sample_B % max(n - 1, 1) + 1).astype(jnp.int32)
        w_B = jnp.ones((B,), jnp.float32)
    else:
        R = plan.rows
        if R < 1:
            raise ValueError("this neyman plan enumerates every stratum: there is nothing to sample")
        counts = np.asarray(plan.counts, np.int64)
        m_table = np.repeat(np.arange(1, n + 1), counts)              # [R] stratum of row j
        w_table = 1.0 / (m_table * counts[m_table - 1])               # 1 / (m n_m)
        j_B = jnp.arange(B) % R
        m_B = jnp.asarray(m_table, jnp.int32)[j_B]
        w_B = jnp.asarray(w_table, jnp.float32)[j_B]
    mask = _subset_mask(key, target_BxL, m_B) & target_BxL
    return mask, m_B, w_B


def draw_masks(spec: MaskSpec, key: jax.Array, target_BxL: jax.Array, sample_B: jax.Array | None = None):
    """Draw one mask, time and weight per row, per the estimator `spec.name`.

    Args:
      spec: MaskSpec (static).
      key: PRNG key.
      target_BxL: bool [B, L], positions that may be masked (n_B = row sums). Context
        positions (a prompt) are never masked.
      sample_B: int32 [B] Monte Carlo sample index of each row (the neyman pilot only).
    Returns:
      mask_BxL bool, t_B float32 in [0, 1] (time to feed a time-conditioned denoiser),
      weight_B float32 such that weight * sum_masked CE is an unbiased one-sample estimate
      (see module docstring). Rows with n = 0 get weight 0.
    """
    target_BxL = target_BxL.astype(bool)
    B, L = target_BxL.shape
    n_B = jnp.sum(target_BxL, axis=-1)
    sched = spec.schedule
    k_u, k_mask, k_mix, k_bnd = jax.random.split(key, 4)

    if spec.name == "time_free":
        mask, m_B, w = _draw_interval(k_mask, target_BxL, 0.0, 1.0)
        return mask, _frac_time(spec, m_B, n_B), w

    if spec.name == "neyman":
        if spec.plan is None:
            raise ValueError("the neyman estimator needs a plan: run it through likelihood.nll, "
                             "which runs the pilot (or pass MaskSpec(plan=neyman_plan(...)))")
        mask, m_B, w = _draw_neyman(spec.plan, k_mask, target_BxL, sample_B)
        return mask, _frac_time(spec, m_B, n_B), w

    if spec.name == "stratified":
        m_B = (jnp.arange(B) % jnp.maximum(n_B, 1) + 1).astype(jnp.int32)
        mask = _subset_mask(k_mask, target_BxL, m_B) & target_BxL
        w = jnp.where(n_B > 0, 1.0 / m_B, 0.0).astype(jnp.float32)
        return mask, _frac_time(spec, m_B, n_B), w

    if spec.name == "k_dce":
        k_B = 1 + jnp.floor(jax.random.uniform(k_u, (B,)) * n_B).astype(jnp.int32)
        k_B = jnp.clip(k_B, 1, jnp.maximum(n_B, 1))
        mask = _subset_mask(k_mask, target_BxL, k_B) & target_BxL
        w = jnp.where(n_B > 0, n_B / k_B, 0.0).astype(jnp.float32)
        return mask, _frac_time(spec, k_B, n_B), w

    if spec.name == "lambda_dce":
        u = _uniforms(k_u, B, spec.antithetic)
        lam_B = jnp.maximum(1.0 - u, 1e-12)  # lambda in (0, 1]
        mask = (jax.random.uniform(k_mask, (B, L)) < lam_B[:, None]) & target_BxL
        return mask, sched.t_from_lambda(lam_B).astype(jnp.float32), (1.0 / lam_B).astype(jnp.float32)

    # t_dce
    u = _uniforms(k_u, B, spec.antithetic)
    if spec.finite_T > 0:
        T = spec.finite_T
        i_B = jnp.floor(u * T).astype(jnp.int32) + 1  # 1..T
        t_B = i_B.astype(jnp.float32) / T
        s_B = t_B - 1.0 / T
        a_t, a_s = sched.alpha(t_B), sched.alpha(s_B)
        w_int = T * (a_s - a_t) / (1.0 - a_t)  # MD4 discrete-time weight
    else:
        t_B = u
        w_int = sched.loss_weight(t_B)
    lam_B = sched.mask_prob(t_B)
    mask = (jax.random.uniform(k_mask, (B, L)) < lam_B[:, None]) & target_BxL
    w_int = w_int.astype(jnp.float32)
    if not spec.exact_boundaries or spec.finite_T > 0:
        # Continuous: MD4's diffusion term over [lambda(0), lambda(1)]. Finite T: MD4's
        # discrete-time ELBO (a bound even with exact conditionals; no boundary correction).
        return mask, t_B.astype(jnp.float32), w_int

    # Mixture with the boundary intervals [0, lambda(0)] and [lambda(1), 1], each drawn by the
    # interval sampler, so the sum of the three pieces is the exact lambda-integral (Eq. 13).
    lam_lo, lam_hi = sched.lambda_min, sched.lambda_max
    p_lo = spec.boundary_prob if lam_lo > 0 else 0.0
    p_hi = spec.boundary_prob if lam_hi < 1 else 0.0
    p_mid = 1.0 - p_lo - p_hi
    k_lo, k_hi = jax.random.split(k_bnd)
    mask_lo, m_lo, w_lo = _draw_interval(k_lo, target_BxL, 0.0, lam_lo)
    mask_hi, m_hi, w_hi = _draw_interval(k_hi, target_BxL, lam_hi, 1.0)
    v = jax.random.uniform(k_mix, (B,))
    seg = jnp.where(v < p_lo, 0, jnp.where(v < p_lo + p_hi, 2, 1))
    mask = jnp.where((seg == 0)[:, None], mask_lo, jnp.where((seg == 2)[:, None], mask_hi, mask))
    t_out = jnp.where(
        seg == 0, _frac_time(spec, m_lo, n_B), jnp.where(seg == 2, _frac_time(spec, m_hi, n_B), t_B)
    )
    w = jnp.where(
        seg == 0,
        w_lo / max(p_lo, 1e-30),
        jnp.where(seg == 2, w_hi / max(p_hi, 1e-30), w_int / p_mid),
    )
    return mask, t_out.astype(jnp.float32), w.astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# Training objective
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MaskNoise:
    """One mask per row: ``mask_RxL`` bool, ``t_R`` float32 (time fed to the denoiser),
    ``weight_R`` float32 (the estimator's weight). A pytree (registered below)."""

    mask: jax.Array
    t: jax.Array
    weight: jax.Array


jax.tree_util.register_dataclass(MaskNoise, data_fields=["mask", "t", "weight"], meta_fields=[])


@dataclasses.dataclass(frozen=True)
class MaskedProcess(base.Process):
    """Masked (absorbing) diffusion as a :class:`infodiff.processes.base.Process`.

    ``spec`` chooses the mask law and weight (``MaskSpec.name``: a training objective or an
    estimator); ``vocab_size`` V real tokens, MASK id V. The integrand is
    ``weight * sum_{masked} -log c(z)_{i, x_i}`` (module docstring, Eq. (*)), nats per sequence;
    a row without masks contributes 0 even where its weight is infinite (t = 0 exactly).
    """

    spec: MaskSpec
    vocab_size: int
    chunk_order: str = "rows"
    row_wise: bool = True  # each row's value reads only its own row (the driver may slice a call)
    denoiser_inputs: str = "(z_BxL int32, t_B float32) -> logprobs_BxLxV"

    @property
    def estimator(self) -> str:
        return self.spec.name

    @property
    def infinite_variance(self) -> bool:
        """lambda_dce always; t_dce when the schedule reaches lambda = 0 at t = 0 (weight ~ 1/t)."""
        return self.spec.name == "lambda_dce" or (
            self.spec.name == "t_dce" and self.spec.schedule.lambda_min <= 0.0)

    checks_normalised = True  # the denoiser's log-probabilities are normalised over the V real tokens

    @property
    def min_samples(self) -> int:
        """Fewest samples with a calibrated SE in tests/test_calibration.py (``MIN_SAMPLES``)."""
        return MIN_SAMPLES.get(self.spec.name, base.DEFAULT_MIN_SAMPLES)

    @property
    def pad_id(self) -> int:
        """Pads hold the mask token (id V) throughout: never noised, never scored."""
        return self.vocab_size

    @property
    def per_input_targets(self) -> bool:
        """False for the laws that stratify over one common target count (stratified, neyman)."""
        return self.spec.name not in ("stratified", "neyman")

    def draw_noise(self, key, target_RxL, sample_R=None) -> MaskNoise:
        mask, t, w = draw_masks(self.spec, key, target_RxL, sample_R)
        return MaskNoise(mask, t, w)

    def integrand(self, apply_fn, params, x_RxL, noise: MaskNoise, target_RxL=None):
        del target_RxL  # the mask is inside the target already
        V = self.vocab_size
        z = corrupt(x_RxL, noise.mask, V)
        logprobs = _check_logprobs(apply_fn(params, z, noise.t), x_RxL, V)
        ce = masked_cross_entropy(logprobs, x_RxL, noise.mask)
        return jnp.where(noise.mask.any(-1), noise.weight * ce, 0.0)

    def exact_terms(self, apply_fn, params, x_BxL, target_BxL, batch_size) -> dict:
        """neyman: {'diffusion': float64 [B]}, the enumerated strata sum_m (1/m) mean_{|S|=m} C_S
        (nats); {} otherwise."""
        plan = self.spec.plan
        if self.spec.name != "neyman" or plan is None or plan.pilot or not plan.enumerated:
            return {}
        check_plan(plan, target_BxL)
        return {"diffusion": enumerated_strata(apply_fn, params, x_BxL, target_BxL, plan.enumerated,
                                               self.spec, self.vocab_size, batch_size)}

    def extra_passes(self) -> int:
        """Forward passes per sequence of the exact terms (neyman's enumerated strata)."""
        plan = self.spec.plan
        if self.spec.name != "neyman" or plan is None or plan.pilot:
            return 0
        return plan.enumeration_passes()

    @property
    def needs_plan(self) -> bool:
        """True for an unplanned neyman process: :func:`likelihood.nll` runs
        :meth:`pilot_stage` and then :meth:`plan`."""
        return self.spec.name == "neyman" and self.spec.plan is None

    def pilot_stage(self, target_BxL, num_samples: int):
        """(pilot process, pilot samples per piloted row, number k of rows piloted: the first k)
        or None when no pilot is needed (everything enumerated) or affordable (equal allocation
        is used). See :func:`pilot_rounds`."""
        n = common_target_count(target_BxL, "neyman")
        budget = num_samples * n
        if n == 1 or 2**n - 1 <= budget:
            return None
        r, k = pilot_rounds(target_BxL.shape[0], n, budget)
        if r == 0:
            return None
        pilot = dataclasses.replace(self, spec=dataclasses.replace(self.spec, plan=NeymanPlan(n, pilot=True)))
        return pilot, r * (n - 1), k

    def plan(self, pilot_BxS, target_BxL, num_samples: int) -> tuple["MaskedProcess", int]:
        """(the planned neyman process, the Monte Carlo samples S' to draw) from the pilot
        values (None: no pilot was run); see :func:`neyman_plan`."""
        n = common_target_count(target_BxL, "neyman")
        B = np.shape(target_BxL)[0]
        spent = 0 if pilot_BxS is None else -(-np.shape(pilot_BxS)[0] * np.shape(pilot_BxS)[1] // B)
        plan = neyman_plan(pilot_BxS, n, int(num_samples), pilot_passes=spent)
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, plan=plan)), plan.num_samples

    def passes_per_sample(self, target_BxL) -> int:
        """n (the common target count) for 'stratified', R for a neyman plan, else 1.
        ValueError if the rows of a stratified estimate have different target counts."""
        return rows_per_sample(self.spec, target_BxL)

    def validate(self, x):
        return validate_tokens(x, self.vocab_size)

    def check_target(self, target_BxL) -> None:
        return None


def common_target_count(target_BxL, name: str) -> int:
    """The number n >= 1 of target positions shared by every row. ValueError otherwise."""
    counts = np.unique(np.asarray(target_BxL).sum(axis=-1))
    if len(counts) != 1 or counts[0] < 1:
        raise ValueError(
            f"the {name} estimator needs the same number (>= 1) of target positions in every "
            f"row; got counts {counts.tolist()}"
        )
    return int(counts[0])


def check_plan(plan: NeymanPlan, target_BxL) -> None:
    """ValueError unless the plan was built for the rows' common target count n."""
    n = common_target_count(target_BxL, "neyman")
    if plan.n != n:
        raise ValueError(f"this neyman plan was built for n = {plan.n} target positions per row, but the "
                         f"rows have n = {n}: build the plan for these rows (masked.neyman_plan(..., n={n}, ...)) "
                         "or let likelihood.nll plan it (MaskSpec(name='neyman') without a plan)")


def rows_per_sample(spec: MaskSpec, target_BxL) -> int:
    """Forward passes per Monte Carlo sample: n (the common target count) for 'stratified',
    R for a planned neyman estimator (1 for its pilot), else 1. Needs a concrete target array
    for 'stratified'; raises ValueError if its rows have different target counts."""
    if spec.name == "neyman" and spec.plan is not None:
        check_plan(spec.plan, target_BxL)
        return 1 if spec.plan.pilot else spec.plan.rows
    if spec.name not in ("stratified", "neyman"):
        return 1
    return common_target_count(target_BxL, spec.name)


# ---------------------------------------------------------------------------------------------
# The neyman estimator: pilot, plan, enumeration (module docstring)
# ---------------------------------------------------------------------------------------------
PILOT_DRAWS_POOLED = 32  # pilot draws per stratum, pooled over the sequences (at least 2 each)
PILOT_SHARE_MAX = 0.25   # the pilot never costs more than this share of the budget
NEYMAN_BLOCK_MAX = 4     # a sample spans up to this many stratified rounds (n rows each) ...
NEYMAN_MIN_SAMPLES = 32  # ... while keeping at least this many samples for the standard error


def pilot_rounds(num_sequences: int, n: int, budget: int) -> tuple[int, int]:
    """(r, k): r pilot draws per stratum on each of the first k sequences, r k >= PILOT_DRAWS_POOLED (32) pooled
    draws per stratum (r >= 2 for a within-sequence variance; k = min(B, 16)).
    (0, 0) (no pilot: equal allocation) when the pilot's r (n - 1) k / B passes per sequence
    would exceed PILOT_SHARE_MAX of the per-sequence ``budget``."""
    B = max(int(num_sequences), 1)
    k = min(B, PILOT_DRAWS_POOLED // 2)
    r = max(2, -(-PILOT_DRAWS_POOLED // k))
    cost = lambda r: r * (n - 1) * k / B  # noqa: E731
    while r > 2 and cost(r) > PILOT_SHARE_MAX * budget:
        r -= 1
    return (r, k) if cost(r) <= PILOT_SHARE_MAX * budget else (0, 0)


def _integer_allocation(a_K: np.ndarray, R: int) -> np.ndarray:
    """int64 [K] counts n_k >= 1 with sum R (R >= K), as close to R a_k / sum a as the floor
    of one allows (greedy on the largest shortfall)."""
    K = len(a_K)
    ideal = R * (a_K / a_K.sum() if a_K.sum() > 0 else np.full(K, 1.0 / K))
    counts = np.maximum(1, np.floor(ideal)).astype(np.int64)
    while counts.sum() > R:
        k = int(np.argmax(np.where(counts > 1, counts - ideal, -np.inf)))
        counts[k] -= 1
    while counts.sum() < R:
        counts[int(np.argmax(ideal - counts))] += 1
    return counts


def neyman_plan(pilot_BxS, n: int, num_samples: int, enumerate_strata: bool = True,
                pilot_passes: int = 0) -> NeymanPlan:
    """The neyman allocation for rows with n target positions and a budget of S n passes.

    Args:
      pilot_BxS: float [B, S_p] pilot values (sample s is stratum m = s mod (n-1) + 1), or None
        (no pilot: equal allocation over m = 1..n-1).
      n: target positions per row; num_samples: S, the budget in stratified rounds (n passes).
      enumerate_strata: False keeps only m = n exact (for measuring the allocation alone).
      pilot_passes: passes per sequence the pilot already spent (taken from the budget).
    Returns: a NeymanPlan within the budget of S n passes per sequence. Every stratum is
    enumerated when 2^n - 1 <= S n (exact, SE 0); otherwise m = n is, plus each stratum m whose
    C(n, m) passes lower the variance at the remaining budget P (enumerate if
    (A - a_m)^2 / (P - c_m) < A^2 / P, A = sum of a over the sampled strata; greedy from the
    cheapest, keeping 2 rounds for the Monte Carlo part), a_m = sigma_m / m with sigma_m^2 the
    within-sequence pilot variance pooled over sequences. A sample has R = block n rows
    (block = min(4, S // 32), at least 1) split as n_m >= 1 proportional to a_m (Neyman
    allocation); S' = max(2, P // R) samples are drawn.
    """
    budget = int(num_samples) * n
    if n == 1 or (enumerate_strata and 2**n - 1 <= budget):
        return NeymanPlan(n, enumerated=tuple(range(1, n + 1)))
    a = np.ones(n - 1)
    if pilot_BxS is not None:
        v = np.asarray(pilot_BxS, np.float64)
        r = v.shape[1] // (n - 1)
        v = v[:, : r * (n - 1)].reshape(v.shape[0], r, n - 1)
        a = np.sqrt(np.mean(v.var(axis=1, ddof=1), axis=0)) / np.arange(1, n)
    enumerated = [n]
    A, P = float(a.sum()), budget - int(pilot_passes) - 1  # m = n costs one pass
    for m in sorted(range(1, n), key=lambda m: (math.comb(n, m), m)):
        c = math.comb(n, m)
        if not enumerate_strata or c > P - 2 * n:
            break
        if A > 0 and (A - a[m - 1]) ** 2 * P < A**2 * (P - c):
            enumerated.append(m)
            A -= a[m - 1]
            P -= c
    rest = [m for m in range(1, n) if m not in enumerated]
    if not rest:
        return NeymanPlan(n, enumerated=tuple(range(1, n + 1)))
    block = max(1, min(NEYMAN_BLOCK_MAX, int(num_samples) // NEYMAN_MIN_SAMPLES))
    R = max(block * n, len(rest))
    counts = np.zeros(n, np.int64)
    counts[np.array(rest) - 1] = _integer_allocation(np.array([a[m - 1] for m in rest]), R)
    return NeymanPlan(n, counts=tuple(int(c) for c in counts), num_samples=max(2, P // R),
                      enumerated=tuple(sorted(enumerated)))


def stratum_masks(target_BxL, m: int) -> np.ndarray:
    """Every m-subset of each row's target positions: bool [B, C(n, m), L]."""
    target = np.asarray(target_BxL, bool)
    B, L = target.shape
    n = common_target_count(target, "enumeration")
    idx_BxN = np.argsort(~target, axis=1, kind="stable")[:, :n]
    combos_KxM = np.array(list(itertools.combinations(range(n), m)), np.int64)
    K = len(combos_KxM)
    out = np.zeros((B, K, L), bool)
    pos = idx_BxN[:, combos_KxM]  # [B, K, m]
    out[np.arange(B)[:, None, None], np.arange(K)[None, :, None], pos] = True
    return out


def _check_logprobs(logprobs, x_RxL, V: int):
    """The denoiser's output must be [R, L, V]; ValueError naming both shapes otherwise."""
    if logprobs.shape != (x_RxL.shape[0], x_RxL.shape[1], V):
        raise ValueError(
            f"the denoiser returned shape {logprobs.shape}, expected {(x_RxL.shape[0], x_RxL.shape[1], V)} "
            f"(vocab_size={V} does not match the denoiser?)")
    return logprobs


@functools.partial(jax.jit, static_argnames=("apply_fn", "vocab_size"))
def _masked_ce(apply_fn, params, x_RxL, mask_RxL, t_R, vocab_size):
    z = corrupt(x_RxL, mask_RxL, vocab_size)
    logprobs = _check_logprobs(apply_fn(params, z, t_R), x_RxL, vocab_size)
    return masked_cross_entropy(logprobs, x_RxL, mask_RxL)


def enumerated_strata(apply_fn, params, x_BxL, target_BxL, strata, spec: MaskSpec,
                      vocab_size: int, batch_size: int) -> np.ndarray:
    """sum_{m in strata} (1/m) mean_{|S| = m} C_S per row, float64 [B] nats: the strata of the
    stratified identity -log p = sum_m (1/m) E_{|S|=m}[C_S] computed exactly (every subset of
    the target positions; time t(lambda = m / n) for time-conditioned denoisers). Calls of a
    fixed shape (``batch_size`` rows, last padded)."""
    x = np.asarray(x_BxL)
    B, L = x.shape
    n = common_target_count(target_BxL, "enumeration")
    out = np.zeros(B, np.float64)
    for m in strata:
        masks = stratum_masks(target_BxL, m)
        K = masks.shape[1]
        rows = max(1, min(int(batch_size), B * K))
        xr = np.repeat(x, K, axis=0)
        mr = masks.reshape(B * K, L)
        t = float(spec.schedule.t_from_lambda(jnp.float32(m / n)))
        ce = np.zeros(B * K, np.float64)
        for r0 in range(0, B * K, rows):
            sel = np.arange(r0, r0 + rows) % (B * K)
            vals = _masked_ce(apply_fn, params, jnp.asarray(xr[sel]), jnp.asarray(mr[sel]),
                              jnp.full((rows,), t, jnp.float32), int(vocab_size))
            k = min(rows, B * K - r0)
            ce[r0:r0 + k] = np.asarray(vals, np.float64)[:k]
        if not np.all(np.isfinite(ce)):
            b = int(np.argwhere(~np.isfinite(ce))[0, 0]) // K
            raise FloatingPointError(f"non-finite cross-entropy for sequence {b} in the enumerated "
                                     f"stratum m = {m}: the denoiser returned -inf/NaN where the data has mass")
        out += ce.reshape(B, K).mean(axis=1) / m
    return out


def diffusion_loss(
    denoiser: Denoiser,
    x_BxL: jax.Array,
    key: jax.Array,
    spec: MaskSpec,
    vocab_size: int,
    target_BxL: jax.Array | None = None,
):
    """One-sample Monte Carlo of the chosen DCE objective for each sequence.

    Args:
      denoiser: (z_BxL int32, t_B float32) -> logprobs_BxLxV over the V real tokens.
      x_BxL: int [B, L] clean tokens in [0, V).
      key: PRNG key.
      spec: MaskSpec (objective, schedule, finite_T, antithetic).
      vocab_size: V; the mask id is V.
      target_BxL: optional bool mask of positions that may be masked (default: all).
    Returns:
      loss_B float32, nats per sequence: :meth:`MaskedProcess.integrand` with one fresh mask.
      With t_dce (continuous, exact_boundaries=False) this is MD4's continuous-time NELBO
      diffusion term (MD4 Eq. 5); with k_dce / time_free / lambda_dce the RADD losses.
    """
    if spec.name not in OBJECTIVES:
        raise ValueError(f"{spec.name!r} is an estimator, not a training objective; choose from {OBJECTIVES}")
    if target_BxL is None:
        target_BxL = jnp.ones(x_BxL.shape, bool)
    process = MaskedProcess(spec, int(vocab_size))
    noise = process.draw_noise(key, target_BxL)
    return process.integrand(NoParams(denoiser), None, x_BxL, noise, target_BxL)


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------
def exponential_from_bits(hi, lo):
    """Exp(1) variates E = -log1p(-U) from two uint32 words, U = (hi + (lo + 1/2) 2^-32) 2^-32.

    U has resolution about 2^-64 near 0, so E reaches ~1e-20 instead of float32 uniform's
    2^-24 floor; U is capped at 1 - 2^-24 (E <= 16.6, a tail of probability 6e-8).
    float32 output, same shape as hi.
    """
    u = hi.astype(jnp.float32) * (2.0**-32) + (lo.astype(jnp.float32) + 0.5) * (2.0**-64)
    u = jnp.minimum(u, 1.0 - 2.0**-24)
    return -jnp.log1p(-u)


def sample_categorical(key: jax.Array, logprobs_NxV: jax.Array) -> jax.Array:
    """Exact-tail categorical draw: argmax_v (log p_v - log E_v), E_v ~ Exp(1).

    The exponential variates are E = -log1p(-U) with U built from two 32-bit words, so U has
    resolution ~2^-64 near 0 and small E (which lets a rare category win) is not truncated the
    way float32 Gumbel noise truncates it (MD4 App. G; Zheng et al. arXiv 2409.02908): a
    category of probability 1e-12 is still drawn at its rate. int32 [...] output.
    """
    k1, k2 = jax.random.split(key)
    shape = logprobs_NxV.shape
    hi = jax.random.bits(k1, shape, jnp.uint32)
    lo = jax.random.bits(k2, shape, jnp.uint32)
    log_e = jnp.log(exponential_from_bits(hi, lo))
    return jnp.argmax(logprobs_NxV.astype(jnp.float32) - log_e, axis=-1).astype(jnp.int32)


def ancestral_sample(
    denoiser: Denoiser,
    key: jax.Array,
    num_samples: int,
    seq_len: int,
    vocab_size: int,
    schedule: schedules_lib.Schedule,
    num_steps: int,
    prompt_BxP: jax.Array | None = None,
) -> jax.Array:
    """MD4 ancestral sampler (arXiv 2406.04329 §4, Alg. 2), from all-MASK at t = 1 to t = 0.

    Step t -> s (s < t, uniform grid): every masked position is unmasked with probability
    u = (alpha_s - alpha_t) / (1 - alpha_t) and, if so, takes a token from c(z_t)
    (`sample_categorical`: two-stage draw, so the tiny u never multiplies the token
    probabilities, and rare tokens are not truncated by float32 Gumbel noise). The last
    step (to t = 0) unmasks every remaining position by sampling (not argmax), so with an
    exact denoiser the sampler is exact as num_steps -> inf; with num_steps = seq_len and a
    time-free exact denoiser the error is only from simultaneous unmasking.

    Args:
      prompt_BxP: optional int [num_samples, P] prefix that is kept fixed (conditional
        generation); the returned array then has seq_len columns including the prompt.
    Returns: int32 [num_samples, seq_len] tokens in [0, V).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    z = jnp.full((num_samples, seq_len), vocab_size, jnp.int32)
    P = 0
    if prompt_BxP is not None:
        P = prompt_BxP.shape[1]
        z = z.at[:, :P].set(prompt_BxP.astype(jnp.int32))

    def step(i, z):
        t = 1.0 - i / num_steps
        s = 1.0 - (i + 1) / num_steps
        a_t, a_s = schedule.alpha(t), schedule.alpha(s)
        u = jnp.where(i == num_steps - 1, 1.0, (a_s - a_t) / (1.0 - a_t))
        k = jax.random.fold_in(key, i)
        k_unmask, k_tok = jax.random.split(k)
        t_B = jnp.full((num_samples,), t, jnp.float32)
        logprobs = denoiser(z, t_B)
        tok = sample_categorical(k_tok, logprobs)
        unmask = (z == vocab_size) & (jax.random.uniform(k_unmask, z.shape) < u)
        return jnp.where(unmask, tok, z)

    return jax.lax.fori_loop(0, num_steps, step, z)
