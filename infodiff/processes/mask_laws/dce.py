"""The one-draw mask laws t_dce, lambda_dce, k_dce and time_free (arXiv 2510.24088 Eqs. 13, 15)
and the stratified estimator (ours), registered in :data:`infodiff.processes.masking.LAWS` in
that order; their laws and weights are the table of ``processes/masked.py``'s docstring.

min_samples: the fewest Monte Carlo samples at which the law's SE is calibrated (coverage of
+-1.96 SE and mean z^2, tests/test_calibration.py); time_free's values are skewed (rare large
m), so its sample SE is too small at S = 32 (mean z^2 1.7); lambda_dce has infinite variance:
never.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from infodiff.processes.masking import (MaskLaw, common_target_count, draw_interval, frac_time, register_law,
                                        subset_mask, uniforms)

__all__ = ["TDce", "LambdaDce", "KDce", "TimeFree", "Stratified"]


class TDce(MaskLaw):
    """t ~ U(0, 1) (or MD4's discrete grid with ``finite_T``), each target masked w.p. 1 - alpha_t,
    weight -alpha'_t / (1 - alpha_t); with ``exact_boundaries`` the pieces [0, lambda(0)] and
    [lambda(1), 1] outside the schedule's range are mixed in by the interval sampler (Eq. 13),
    so the estimate is of the exact NLL; without, MD4's continuous-time bound (MD4 Eq. 5)."""

    name = "t_dce"
    objective = True
    min_samples = 32
    antithetic = True
    finite_T = True
    exact_boundaries = True

    def infinite_variance(self, spec) -> bool:
        """When the schedule reaches lambda = 0 at t = 0 (weight ~ 1/t)."""
        return spec.schedule.lambda_min <= 0.0

    def draw(self, spec, keys, target_BxL, n_B, sample_B):
        B, L = target_BxL.shape
        sched = spec.schedule
        u = uniforms(keys.u, B, spec.antithetic)
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
        mask = (jax.random.uniform(keys.mask, (B, L)) < lam_B[:, None]) & target_BxL
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
        k_lo, k_hi = jax.random.split(keys.boundary)
        mask_lo, m_lo, w_lo = draw_interval(k_lo, target_BxL, 0.0, lam_lo)
        mask_hi, m_hi, w_hi = draw_interval(k_hi, target_BxL, lam_hi, 1.0)
        v = jax.random.uniform(keys.mix, (B,))
        seg = jnp.where(v < p_lo, 0, jnp.where(v < p_lo + p_hi, 2, 1))
        mask = jnp.where((seg == 0)[:, None], mask_lo, jnp.where((seg == 2)[:, None], mask_hi, mask))
        t_out = jnp.where(
            seg == 0, frac_time(spec, m_lo, n_B), jnp.where(seg == 2, frac_time(spec, m_hi, n_B), t_B)
        )
        w = jnp.where(
            seg == 0,
            w_lo / max(p_lo, 1e-30),
            jnp.where(seg == 2, w_hi / max(p_hi, 1e-30), w_int / p_mid),
        )
        return mask, t_out.astype(jnp.float32), w.astype(jnp.float32)


class LambdaDce(MaskLaw):
    """lambda ~ U(0, 1], each target masked w.p. lambda, weight 1 / lambda (Eq. 16; infinite
    variance)."""

    name = "lambda_dce"
    objective = True
    min_samples = 2**62
    antithetic = True

    def infinite_variance(self, spec) -> bool:
        return True

    def draw(self, spec, keys, target_BxL, n_B, sample_B):
        B, L = target_BxL.shape
        u = uniforms(keys.u, B, spec.antithetic)
        lam_B = jnp.maximum(1.0 - u, 1e-12)  # lambda in (0, 1]
        mask = (jax.random.uniform(keys.mask, (B, L)) < lam_B[:, None]) & target_BxL
        return mask, spec.schedule.t_from_lambda(lam_B).astype(jnp.float32), (1.0 / lam_B).astype(jnp.float32)


class KDce(MaskLaw):
    """k ~ U{1..n}, a uniform k-subset of the targets, weight n / k (RADD's k-DCE)."""

    name = "k_dce"
    objective = True
    min_samples = 16

    def draw(self, spec, keys, target_BxL, n_B, sample_B):
        B = target_BxL.shape[0]
        k_B = 1 + jnp.floor(jax.random.uniform(keys.u, (B,)) * n_B).astype(jnp.int32)
        k_B = jnp.clip(k_B, 1, jnp.maximum(n_B, 1))
        mask = subset_mask(keys.mask, target_BxL, k_B) & target_BxL
        w = jnp.where(n_B > 0, n_B / k_B, 0.0).astype(jnp.float32)
        return mask, frac_time(spec, k_B, n_B), w


class TimeFree(MaskLaw):
    """m ~ P(m) ∝ 1/m on {1..n}, a uniform m-subset, weight H_n (I-MDCE Thm 4.1): the interval
    sampler on [0, 1]."""

    name = "time_free"
    objective = True
    min_samples = 128

    def draw(self, spec, keys, target_BxL, n_B, sample_B):
        mask, m_B, w = draw_interval(keys.mask, target_BxL, 0.0, 1.0)
        return mask, frac_time(spec, m_B, n_B), w


class Stratified(MaskLaw):
    """One uniform m-subset for each m = 1..n, weight 1 / m: row j of a round of n consecutive
    rows gets m = (j mod n) + 1 (``processes/masked.py``'s docstring); n passes per sample."""

    name = "stratified"
    min_samples = 8
    one_pass = False
    per_input_targets = False

    def passes_per_sample(self, spec, target_BxL) -> int:
        return common_target_count(target_BxL, self.name)

    def draw(self, spec, keys, target_BxL, n_B, sample_B):
        B = target_BxL.shape[0]
        m_B = (jnp.arange(B) % jnp.maximum(n_B, 1) + 1).astype(jnp.int32)
        mask = subset_mask(keys.mask, target_BxL, m_B) & target_BxL
        w = jnp.where(n_B > 0, 1.0 / m_B, 0.0).astype(jnp.float32)
        return mask, frac_time(spec, m_B, n_B), w


for _law in (TDce(), LambdaDce(), KDce(), TimeFree(), Stratified()):
    register_law(_law)
