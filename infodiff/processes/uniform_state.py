"""Uniform-state diffusion (UDLM / duo): uniform noise, a mean-parametrised denoiser, the NELBO.

Conventions (docs/uniform_state.md; UDLM arXiv 2412.10193, duo arXiv 2506.10892):

* **Forward process.** Each token independently stays with probability ``alpha_t`` and is
  otherwise redrawn uniformly over the V real tokens (possibly itself):
  ``q(z_t | x) = alpha_t x + (1 - alpha_t) 1 / V`` per token. Every function here uses the
  noise level ``lam = 1 - alpha_t`` in [0, 1] (the same kernel as SEDD's uniform graph at its
  ``lam``, :class:`infodiff.processes.score_entropy.UniformGraph`), so estimators need no schedule.
* **Denoiser (mean parametrisation).** ``x_theta(z_BxL int32, lam_B float32) -> log x_theta
  [B, L, V]``, normalised log-probabilities over the V clean tokens at every position.
* **NELBO.** UDLM's continuous-time closed form (:func:`nelbo_density`): per position, with
  ``xbar = V alpha x + (1 - alpha) 1`` (x one-hot), ``xbar_theta = V alpha x_theta + (1 - alpha) 1``
  and ``i = z_t`` the noised token, the integrand per unit t is
  ``-alpha'_t / (V alpha_t) * sum_j r_j phi(s_j / r_j)``, ``r_j = xbar_j / xbar_i``,
  ``s_j = xbar_theta_j / xbar_theta_i``, ``phi(u) = u - 1 - log u >= 0``; this is UDLM's
  ``N / xbar_i - N / xbar_theta_i - sum_j (xbar_j / xbar_i) log(...)`` rewritten with
  ``sum_j xbar_j = sum_j xbar_theta_j = V``. Per unit ``lam`` (``d lam = -alpha'_t dt``) it is
  ``sum_j r_j phi(s_j / r_j) / (V (1 - lam))``: SEDD's uniform-graph score entropy with the score
  ``s_j`` (docs/uniform_state.md §3).
* **Exact denoiser.** The NELBO is tight (equal to -log p(x) in expectation) iff ``s_j`` is the
  exact score ratio p_lam(z with z_i := j) / p_lam(z), i.e. iff ``x_theta`` is the
  *leave-one-out* posterior ``P(x_0^i = . | z_t^{-i})`` (:class:`OracleMean` with
  ``posterior='loo'``). The full posterior mean ``E[x_0^i | z_t]`` (``posterior='full'``) is NOT
  the minimiser: its NELBO exceeds -log p on average (docs/uniform_state.md §4, measured in
  tests/test_uniform_state.py).
* **Terms.** ``diffusion`` (the Monte Carlo integral over lam in (0, lam_max]), ``prior`` =
  KL(q(z_1 | x) || uniform) (closed form, 0 at lam_max = 1), and ``recon`` (the truncation term at
  the low-noise end): exactly 0, because the integral starts at lam = 0 (alpha_0 = 1).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.processes import base
from infodiff.processes import score_entropy as se

__all__ = ["NOISE_LAWS", "UniformNoise", "UniformStateProcess", "OracleMean", "POSTERIORS", "log_xbar",
           "nelbo_density", "MIN_SAMPLES"]

# 'power<p>' (estimation): lam = lam_max u^p, u ~ U(0, 1], weight p lam_max u^(p - 1) = 1 / q(lam)
# (:func:`sample_lam`); 'time': t ~ U[0, 1) with a schedule, weight d lam / dt = -alpha'_t
# (training: UDLM / duo's objective).
POWERS = {"power2": 2, "power3": 3}
NOISE_LAWS = tuple(POWERS) + ("time",)
# Fewest samples with a calibrated SE (tests/test_calibration.py) under 'power3' (heavy tails:
# docs/uniform_state.md §5, where 'power2', the SEDD uniform graph's law, under-covers at 512).
MIN_SAMPLES = 512
POSTERIORS = ("loo", "full")


def log_xbar(log_x_BxLxV: jax.Array, lam_B: jax.Array) -> jax.Array:
    """log xbar = log(V alpha x + (1 - alpha)), alpha = 1 - lam, for a probability vector x given
    by its logs (a one-hot x: 0 / -inf). float32 [B, L, V]; lam_B [B] in (0, 1).
    Source: UDLM arXiv 2412.10193 (xbar of the continuous-time NELBO)."""
    lx = log_x_BxLxV.astype(jnp.float32)
    V = lx.shape[-1]
    lam = se.per_token(jnp.asarray(lam_B, jnp.float32))
    return jnp.logaddexp(math.log(V) + jnp.log1p(-lam) + lx, jnp.log(lam))


def nelbo_density(log_x_theta_BxLxV: jax.Array, x0_BxL: jax.Array, z_BxL: jax.Array, lam_B: jax.Array,
                  target_BxL: jax.Array | None = None) -> jax.Array:
    """UDLM's continuous-time NELBO integrand per unit lam = 1 - alpha_t, summed over positions:
    float32 [B] (nats per unit lam; integrate over lam in (0, 1] for the diffusion term).

    ``sum_i sum_j r_ij phi(s_ij / r_ij) / (V (1 - lam))`` with ``r_ij = xbar_j / xbar_{z_i}`` (x0
    one-hot), ``s_ij = xbar_theta_j / xbar_theta_{z_i}``, ``phi(u) = u - 1 - log u``: non-negative,
    zero iff s = r. Equal to UDLM's ``-alpha'/(N alpha) [N / xbar_i - N / xbar_theta_i -
    sum_j xbar_j / xbar_i log(xbar_theta_i xbar_j / (xbar_theta_j xbar_i))]`` per unit t divided by
    -alpha'_t. Positions outside ``target_BxL`` contribute nothing.

    Args:
      log_x_theta_BxLxV: float [B, L, V] log x_theta (normalised over V).
      x0_BxL, z_BxL: int [B, L] clean and noised tokens in [0, V).
      lam_B: float32 [B] noise levels in (0, 1) (clip with score_entropy.clip_lam).
    Source: UDLM arXiv 2412.10193 (continuous-time NELBO); duo arXiv 2506.10892 (same form).
    """
    V = log_x_theta_BxLxV.shape[-1]
    lam = jnp.asarray(lam_B, jnp.float32)
    lxt = log_xbar(log_x_theta_BxLxV, lam)
    onehot = jax.nn.one_hot(x0_BxL, V, dtype=bool)
    lx = log_xbar(jnp.where(onehot, 0.0, -jnp.inf), lam)
    z_oh = jax.nn.one_hot(z_BxL, V, dtype=bool)
    at_z = lambda a: jnp.sum(jnp.where(z_oh, a, 0.0), axis=-1, keepdims=True)  # noqa: E731
    log_r = lx - at_z(lx)
    d = (lxt - at_z(lxt)) - log_r  # log(s / r)
    per_pos = jnp.sum(jnp.where(z_oh, 0.0, jnp.exp(log_r) * jnp.maximum(jnp.expm1(d) - d, 0.0)), axis=-1)
    if target_BxL is not None:
        per_pos = jnp.where(target_BxL, per_pos, 0.0)
    return jnp.sum(per_pos, axis=-1) / (V * (1.0 - lam))


def sample_lam(key: jax.Array, shape, lam_max: float, power: int):
    """Noise levels lam = lam_max u^p on (0, lam_max] (u ~ U(0, 1]) with their importance weights
    1 / q(lam) = p lam_max u^(p - 1): (lam, weight), float32 ``shape``.

    Near lam = 0 the exact denoiser's integrand is about (1 / lam) log(1 / lam) with probability
    ~ L lam (one redrawn token), so a sample is ~ p log(1 / u) / u with probability ~ u^p: p = 2
    (the SEDD uniform graph's 'importance' law) has a finite variance but an infinite third
    moment (heavy tails, a too-small SE at moderate sample sizes); p = 3 has finite moments up to
    the third. docs/uniform_state.md §5."""
    u = 1.0 - jax.random.uniform(key, shape, jnp.float32)  # (0, 1]
    return lam_max * u**power, power * lam_max * u ** (power - 1)


@dataclasses.dataclass(frozen=True)
class UniformNoise:
    """One Monte Carlo sample per row: ``lam`` [R] (clipped to (0, 1)), ``weight`` [R] (the
    integrand is ``weight * nelbo_density``), ``hit`` / ``new`` [R, L] (which positions are
    redrawn and to what). Independent of the clean tokens (coupled estimates may share it)."""

    lam: jax.Array
    weight: jax.Array
    hit: jax.Array
    new: jax.Array


jax.tree_util.register_dataclass(UniformNoise, data_fields=["lam", "weight", "hit", "new"], meta_fields=[])


@dataclasses.dataclass(frozen=True)
class UniformStateProcess(base.Process):
    """Uniform-state diffusion (UDLM / duo) as a :class:`infodiff.processes.base.Process`.

    The integrand is ``weight * nelbo_density(x_theta(z, lam), x, z, lam)``:

    * ``noise_law='power3'`` (estimation; or 'power2'): lam = lam_max u^3 on (0, lam_max], weight
      3 lam_max u^2 = 1 / q(lam) (:func:`sample_lam`): an unbiased estimate of the diffusion term
      ``int_0^{lam_max} nelbo_density d lam``;
    * ``noise_law='time'`` (training, UDLM / duo): t ~ U[0, 1) (antithetic across the batch if
      ``antithetic``), lam = 1 - alpha_t of ``schedule``, weight -alpha'_t.

    ``exact_terms``: ``prior`` KL(q(z_{lam_max} | x) || uniform) (0 at lam_max = 1) and ``recon``
    (the truncation term at lam = 0) = 0. Only unconditional likelihoods (every position a
    target): ``check_target`` refuses others. A denoiser is ``(z_BxL int32, lam_B float32) ->
    log x_theta [B, L, V]``.
    """

    vocab_size: int
    noise_law: str = "power3"
    lam_max: float = 1.0
    schedule: object = None
    antithetic: bool = True
    chunk_order: str = "samples"
    row_wise: bool = True
    min_samples: int = MIN_SAMPLES
    denoiser_inputs: str = "(z_BxL int32, lam_B float32) -> log x_theta [B, L, V]"

    def __post_init__(self):
        if self.noise_law not in NOISE_LAWS:
            raise ValueError(f"unknown noise law {self.noise_law!r}; choose from {NOISE_LAWS}")
        if self.noise_law == "time" and self.schedule is None:
            raise ValueError("noise_law='time' (training) needs a schedule")
        if not 0.0 < float(self.lam_max) <= 1.0:
            raise ValueError(f"lam_max must be in (0, 1]; got {self.lam_max}")

    @property
    def estimator(self) -> str:
        return f"udlm:{self.noise_law}"

    def draw_noise(self, key, target_RxL, sample_R=None) -> UniformNoise:
        del sample_R
        R = target_RxL.shape[0]
        k_a, k_z = jax.random.split(key)
        if self.noise_law == "time":
            if self.antithetic:
                t = jnp.mod(jax.random.uniform(k_a, ()) + jnp.arange(R, dtype=jnp.float32) / R, 1.0)
            else:
                t = jax.random.uniform(k_a, (R,))
            lam, weight = self.schedule.mask_prob(t), -self.schedule.dalpha(t)
        else:
            lam, weight = sample_lam(k_a, (R,), self.lam_max, POWERS[self.noise_law])
        lam = se.clip_lam(lam)
        hit, new = se.UNIFORM.draw_corruption(k_z, target_RxL.shape, lam, self.vocab_size, target_RxL)
        return UniformNoise(lam, jnp.asarray(weight, jnp.float32), hit, new)

    def integrand(self, apply_fn, params, x_RxL, noise: UniformNoise, target_RxL=None):
        z = se.apply_corruption(x_RxL, noise.hit, noise.new)
        log_x_theta = apply_fn(params, z, noise.lam)
        expected = (x_RxL.shape[0], x_RxL.shape[1], self.vocab_size)
        if log_x_theta.shape != expected:
            raise ValueError(f"the denoiser returned shape {log_x_theta.shape}, expected {expected} "
                             f"(vocab_size={self.vocab_size} mismatch?)")
        return noise.weight * nelbo_density(log_x_theta, x_RxL, z, noise.lam, target_RxL)

    def exact_terms(self, apply_fn, params, x_BxL, target_BxL, batch_size) -> dict:
        n = np.asarray(target_BxL).sum(axis=1)
        prior = np.array([se.prior_kl_uniform(self.lam_max, self.vocab_size, int(k)) for k in n], np.float64)
        return {"prior": prior, "recon": np.zeros(len(n), np.float64)}

    def passes_per_sample(self, target_BxL) -> int:
        return 1

    def validate(self, x):
        from infodiff.validation import validate_tokens

        return validate_tokens(x, self.vocab_size)

    def check_target(self, target_BxL) -> None:
        """Every position a target: NotImplementedError otherwise (a clean prompt would need a
        per-position noise level, which this process's denoiser contract does not carry)."""
        if not np.asarray(target_BxL).all():
            raise NotImplementedError("the uniform-state process (udlm) scores whole sequences only: no "
                                      "conditional likelihoods or log-ratios (no target_BxL)")


@dataclasses.dataclass(frozen=True)
class OracleMean:
    """The exact mean-parametrised denoiser of an oracle (:mod:`infodiff.oracles`):
    ``(z_BxL int32, lam_B float32) -> log x_theta [B, L, V]`` (float32, jit-compatible).

    ``posterior='loo'``: the leave-one-out posterior ``P(x_0^i = . | z^{-i})``, the minimiser of the
    UDLM NELBO (its s_j are the exact score ratios, so the NELBO equals -log p(x) in expectation);
    ``'full'``: the posterior mean ``E[x_0^i | z]`` (the loo posterior times the emission
    ``K_lam(z_i | .)``, normalised), which is NOT tight (docs/uniform_state.md §4). Both come from
    the oracle's noised hidden-Markov forward-backward (Markov) or table sums (tabular), the ones
    behind the SEDD uniform graph's exact scores. Hashed by (oracle identity, posterior).
    """

    oracle: object
    posterior: str = "loo"

    def __post_init__(self):
        if self.posterior not in POSTERIORS:
            raise ValueError(f"posterior={self.posterior!r}; choose from {POSTERIORS}")

    @property
    def vocab_size(self) -> int:
        return int(self.oracle.vocab_size)

    def __call__(self, z_BxL, lam_B):
        z = jnp.asarray(z_BxL, jnp.int32)
        lam = jnp.broadcast_to(se.clip_lam(lam_B), z.shape[:1])
        lq = self.oracle.loo_log_posterior(jnp, z, lam, se.UNIFORM)
        if self.posterior == "loo":
            return lq
        lp = lq + se.UNIFORM.rel_log_emission(jnp, z, lam, self.vocab_size)
        return lp - jax.nn.logsumexp(lp, axis=-1, keepdims=True)
