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

Each row of the table is a mask law (:class:`infodiff.processes.masking.MaskLaw`, registered in
``masking.LAWS``; ``processes/mask_laws/``): its draw, weight, fewest calibrated samples and
planning needs. This module dispatches on the law only; a new estimator is a new law module.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from infodiff import schedules as schedules_lib
from infodiff.denoisers import NoParams
from infodiff.processes import base
from infodiff.processes import mask_laws  # noqa: F401  (registers the built-in laws)
from infodiff.processes.mask_laws.neyman import (  # noqa: F401  (re-exported)
    NEYMAN_BLOCK_MAX, NEYMAN_MIN_SAMPLES, PILOT_DRAWS_POOLED, PILOT_SHARE_MAX, NeymanPlan, check_plan,
    enumerated_strata, neyman_plan, pilot_rounds, stratum_masks)
from infodiff.processes.masking import (  # noqa: F401  (re-exported)
    LAWS, MaskKeys, MaskLaw, common_target_count, corrupt, harmonic, interval_tables, law, masked_cross_entropy,
    register_law)
from infodiff.processes.masking import check_logprobs as _check_logprobs
from infodiff.processes.masking import masked_ce as _masked_ce  # noqa: F401  (benchmarks/estimator_variance.py)
from infodiff.validation import validate_tokens

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]


def __getattr__(name: str):
    """The registered laws' names, read when asked (a law registered later, a test's included):
    ESTIMATORS (every law), OBJECTIVES (those that are training objectives), MIN_SAMPLES
    ({name: the fewest samples with a calibrated SE})."""
    if name == "ESTIMATORS":
        return tuple(LAWS)
    if name == "OBJECTIVES":
        return tuple(n for n, m in LAWS.items() if m.objective)
    if name == "MIN_SAMPLES":
        return {n: m.min_samples for n, m in LAWS.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# Forward process
# ---------------------------------------------------------------------------------------------
def forward_sample(key, x_BxL, t_B, schedule: schedules_lib.Schedule, mask_id: int):
    """Sample z_t ~ q(z_t | x0): each token kept w.p. alpha_t, else MASK (MD4 forward sample).

    Args: x_BxL int [B, L] clean tokens; t_B float [B] times in [0, 1].
    Returns: (z_BxL int32, mask_BxL bool).
    """
    lam_B = schedule.mask_prob(t_B)
    mask_BxL = jax.random.uniform(key, x_BxL.shape) < lam_B[:, None]
    return corrupt(x_BxL, mask_BxL, mask_id), mask_BxL


# ---------------------------------------------------------------------------------------------
# Mask samplers
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """How masks and weights are drawn (hashable, so it can be a static jit argument).

    name: a registered mask law (``masking.LAWS``: 't_dce', 'lambda_dce', 'k_dce', 'time_free',
      'stratified', 'neyman'; the last two only for likelihood estimation, see the module docstring).
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
        law(self.name)  # ValueError naming the registered laws
        if self.finite_T < 0:
            raise ValueError(f"finite_T must be >= 0; got {self.finite_T}")
        if not 0.0 < self.boundary_prob < 0.5:
            raise ValueError(f"boundary_prob must be in (0, 0.5); got {self.boundary_prob}")


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
      (see module docstring). Rows with n = 0 get no mask (their value is 0).
    """
    target_BxL = target_BxL.astype(bool)
    n_B = jnp.sum(target_BxL, axis=-1)
    keys = MaskKeys(*jax.random.split(key, 4))
    return law(spec.name).draw(spec, keys, target_BxL, n_B, sample_B)


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
    def law(self) -> MaskLaw:
        """The registered :class:`MaskLaw` of ``spec.name``."""
        return law(self.spec.name)

    @property
    def infinite_variance(self) -> bool:
        """The law's: lambda_dce always; t_dce when the schedule reaches lambda = 0 at t = 0."""
        return self.law.infinite_variance(self.spec)

    checks_normalised = True  # the denoiser's log-probabilities are normalised over the V real tokens

    @property
    def min_samples(self) -> int:
        """Fewest samples with a calibrated SE in tests/test_calibration.py (the law's)."""
        return self.law.min_samples

    @property
    def pad_id(self) -> int:
        """Pads hold the mask token (id V) throughout: never noised, never scored."""
        return self.vocab_size

    @property
    def per_input_targets(self) -> bool:
        """False for the laws that stratify over one common target count (stratified, neyman)."""
        return self.law.per_input_targets

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
        """The law's terms computed without Monte Carlo error (neyman: {'diffusion': float64 [B]},
        the enumerated strata, nats); {} for the others."""
        return self.law.exact_terms(self.spec, apply_fn, params, x_BxL, target_BxL, batch_size, self.vocab_size)

    def extra_passes(self) -> int:
        """Forward passes per sequence of the exact terms (neyman's enumerated strata)."""
        return self.law.extra_passes(self.spec)

    @property
    def needs_plan(self) -> bool:
        """True for a law that is planned first (an unplanned neyman process): :func:`likelihood.nll`
        runs :meth:`pilot_stage` and then :meth:`plan`."""
        return self.law.needs_plan(self.spec)

    def pilot_stage(self, target_BxL, num_samples: int):
        """(pilot process, pilot samples per piloted row, number k of rows piloted: the first k)
        or None (the law's ``pilot_stage``)."""
        stage = self.law.pilot_stage(self.spec, target_BxL, num_samples)
        if stage is None:
            return None
        spec, samples, k = stage
        return dataclasses.replace(self, spec=spec), samples, k

    def plan(self, pilot_BxS, target_BxL, num_samples: int) -> tuple["MaskedProcess", int]:
        """(the planned process, the Monte Carlo samples S' to draw) from the pilot values (None:
        no pilot was run): the law's ``plan``."""
        spec, samples = self.law.plan(self.spec, pilot_BxS, target_BxL, num_samples)
        return dataclasses.replace(self, spec=spec), samples

    def passes_per_sample(self, target_BxL) -> int:
        """n (the common target count) for 'stratified', R for a neyman plan, else 1.
        ValueError if the rows of a stratified estimate have different target counts."""
        return rows_per_sample(self.spec, target_BxL)

    def validate(self, x):
        return validate_tokens(x, self.vocab_size)

    def check_target(self, target_BxL) -> None:
        return None


def rows_per_sample(spec: MaskSpec, target_BxL) -> int:
    """Forward passes per Monte Carlo sample (the law's): n (the common target count) for
    'stratified', R for a planned neyman estimator (1 for its pilot), else 1. Needs a concrete
    target array for 'stratified'; raises ValueError if its rows have different target counts."""
    return law(spec.name).passes_per_sample(spec, target_BxL)


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
    if not law(spec.name).objective:
        objectives = tuple(n for n, m in LAWS.items() if m.objective)
        raise ValueError(f"{spec.name!r} is an estimator, not a training objective; choose from {objectives}")
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
