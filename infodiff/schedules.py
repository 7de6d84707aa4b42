"""Noise schedules for masked (absorbing) and score-entropy discrete diffusion.

One object per schedule owns the keep-probability alpha(t), its derivative, the total noise
sigma_bar(t) = -log alpha(t), the rate sigma(t) = d sigma_bar / dt, the mask probability
lambda(t) = 1 - alpha(t), the log-SNR log(alpha / (1 - alpha)) and the continuous-time loss
weight -alpha'(t) / (1 - alpha(t)) (positive; MD4 writes it with the opposite sign). Every
process shares these implementations, so a loss weight is a pure function of the schedule.

Conventions (see docs/discrete_diffusion.md §§1-2):
  * t in [0, 1]; alpha decreases from alpha(0) ~ 1 to alpha(1) ~ 0.
  * alpha_t = exp(-sigma_bar(t)) (the absorbing CTMC with rate sigma(t)).
  * MD4 alpha-form schedules (linear, cosine, polyK) are shifted as
    alpha(t) = (1 - 2 eps) alpha_tilde(t) + eps, eps = 1e-4 (MD4, arXiv 2406.04329, App. J).
  * SEDD sigma_bar-form schedules: loglinear sigma_bar(t) = -log(1 - (1 - eps) t), eps = 1e-3,
    and geometric sigma_bar(t) = sigma_min^(1-t) sigma_max^t (SEDD, arXiv 2310.16834, §5).

All methods take and return float arrays of any shape (elementwise), float32 under default JAX.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = [
    "Schedule",
    "LinearSchedule",
    "CosineSchedule",
    "PolySchedule",
    "LogLinearSchedule",
    "GeometricSchedule",
    "get_schedule",
    "SCHEDULES",
]


class Schedule:
    """Base class. Subclasses define `alpha`, `dalpha` and `t_from_lambda`.

    `lambda_min` / `lambda_max` are the mask probabilities at t = 0 and t = 1; the
    continuous-time objective integrates the I-MDCE integrand over [lambda_min, lambda_max].
    """

    name: str = "base"

    def alpha(self, t):
        """Keep probability alpha(t) in (0, 1). Dimensionless."""
        raise NotImplementedError

    def dalpha(self, t):
        """d alpha / dt (negative)."""
        raise NotImplementedError

    def t_from_lambda(self, lam):
        """Inverse of lambda(t) = 1 - alpha(t), clipped to [0, 1]."""
        raise NotImplementedError

    # Derived quantities -------------------------------------------------------------------
    def mask_prob(self, t):
        """lambda(t) = 1 - alpha(t): probability that a token is masked at time t."""
        return 1.0 - self.alpha(t)

    def sigma_bar(self, t):
        """Total noise sigma_bar(t) = -log alpha(t) (SEDD code calls this `sigma`)."""
        return -jnp.log(self.alpha(t))

    def sigma(self, t):
        """Rate sigma(t) = d sigma_bar / dt = -alpha'(t) / alpha(t) (SEDD code: `dsigma`)."""
        return -self.dalpha(t) / self.alpha(t)

    def log_snr(self, t):
        """log(alpha / (1 - alpha)) in nats."""
        a = self.alpha(t)
        return jnp.log(a) - jnp.log1p(-a)

    def loss_weight(self, t):
        """Continuous-time DCE weight -alpha'(t) / (1 - alpha(t)) >= 0 (MD4 Eq. 5, sign flipped).

        Multiplies the sum over masked positions of -log mu_theta(z_t)[x0]; in lambda form it
        is d lambda / (lambda dt), so the continuous-time objective is the lambda-integral of
        I-MDCE (arXiv 2510.24088 Eq. 13) over [lambda_min, lambda_max].
        """
        return -self.dalpha(t) / (1.0 - self.alpha(t))

    @property
    def lambda_min(self) -> float:
        """lambda(0) as a Python float (usable while tracing)."""
        with jax.ensure_compile_time_eval():
            return float(self.mask_prob(jnp.asarray(0.0)))

    @property
    def lambda_max(self) -> float:
        """lambda(1) as a Python float (usable while tracing)."""
        with jax.ensure_compile_time_eval():
            return float(self.mask_prob(jnp.asarray(1.0)))


def _check_eps(eps: float, upper: float) -> float:
    eps = float(eps)
    if not (0.0 <= eps < upper) or math.isnan(eps):
        raise ValueError(f"schedule eps must be in [0, {upper}); got eps={eps!r}")
    return eps


@dataclasses.dataclass(frozen=True)
class _ShiftedAlpha(Schedule):
    """alpha(t) = (1 - 2 eps) alpha_tilde(t) + eps (MD4 shift)."""

    eps: float = 1e-4

    def __post_init__(self):
        _check_eps(self.eps, 0.5)

    def _alpha_tilde(self, t):
        raise NotImplementedError

    def _dalpha_tilde(self, t):
        raise NotImplementedError

    def _t_from_lambda_tilde(self, lam_tilde):
        raise NotImplementedError

    def alpha(self, t):
        return (1.0 - 2.0 * self.eps) * self._alpha_tilde(t) + self.eps

    def dalpha(self, t):
        return (1.0 - 2.0 * self.eps) * self._dalpha_tilde(t)

    def t_from_lambda(self, lam):
        lam_tilde = jnp.clip((lam - self.eps) / (1.0 - 2.0 * self.eps), 0.0, 1.0)
        return jnp.clip(self._t_from_lambda_tilde(lam_tilde), 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class LinearSchedule(_ShiftedAlpha):
    """alpha_tilde(t) = 1 - t (MD4 `linear`)."""

    name = "linear"

    def _alpha_tilde(self, t):
        return 1.0 - t

    def _dalpha_tilde(self, t):
        return -jnp.ones_like(t)

    def _t_from_lambda_tilde(self, lam_tilde):
        return lam_tilde


@dataclasses.dataclass(frozen=True)
class CosineSchedule(_ShiftedAlpha):
    """alpha_tilde(t) = 1 - cos(pi/2 (1 - t)) (MD4 `cosine`)."""

    name = "cosine"

    def _alpha_tilde(self, t):
        return 1.0 - jnp.cos(0.5 * jnp.pi * (1.0 - t))

    def _dalpha_tilde(self, t):
        return -0.5 * jnp.pi * jnp.sin(0.5 * jnp.pi * (1.0 - t))

    def _t_from_lambda_tilde(self, lam_tilde):
        return 1.0 - (2.0 / jnp.pi) * jnp.arccos(lam_tilde)


@dataclasses.dataclass(frozen=True)
class PolySchedule(_ShiftedAlpha):
    """alpha_tilde(t) = 1 - t^K (MD4 `polyK`)."""

    power: float = 2.0
    name = "poly"

    def __post_init__(self):
        super().__post_init__()
        if not self.power > 0:
            raise ValueError(f"poly schedule power must be > 0; got {self.power!r}")

    def _alpha_tilde(self, t):
        return 1.0 - t**self.power

    def _dalpha_tilde(self, t):
        return -self.power * t ** (self.power - 1.0)

    def _t_from_lambda_tilde(self, lam_tilde):
        return lam_tilde ** (1.0 / self.power)


@dataclasses.dataclass(frozen=True)
class LogLinearSchedule(Schedule):
    """SEDD/RADD loglinear: sigma_bar(t) = -log(1 - (1 - eps) t), eps = 1e-3.

    Hence alpha(t) = 1 - (1 - eps) t exactly (linear masking), lambda(0) = 0 and
    lambda(1) = 1 - eps; sigma(t) = (1 - eps) / (1 - (1 - eps) t).
    """

    eps: float = 1e-3
    name = "loglinear"

    def __post_init__(self):
        _check_eps(self.eps, 1.0)

    def alpha(self, t):
        return 1.0 - (1.0 - self.eps) * t

    def dalpha(self, t):
        return -(1.0 - self.eps) * jnp.ones_like(t)

    def sigma_bar(self, t):
        return -jnp.log1p(-(1.0 - self.eps) * t)

    def t_from_lambda(self, lam):
        return jnp.clip(lam / (1.0 - self.eps), 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class GeometricSchedule(Schedule):
    """SEDD geometric: sigma_bar(t) = sigma_min^(1-t) sigma_max^t.

    alpha(t) = exp(-sigma_bar(t)); sigma(t) = sigma_bar(t) log(sigma_max / sigma_min).
    Defaults sigma_min = 1e-4, sigma_max = 20 (SEDD configs).
    """

    sigma_min: float = 1e-4
    sigma_max: float = 20.0
    name = "geometric"

    def __post_init__(self):
        if not (0 < self.sigma_min < self.sigma_max):
            raise ValueError(
                "geometric schedule needs 0 < sigma_min < sigma_max; got "
                f"sigma_min={self.sigma_min!r}, sigma_max={self.sigma_max!r}"
            )

    def sigma_bar(self, t):
        return self.sigma_min ** (1.0 - t) * self.sigma_max**t

    def alpha(self, t):
        return jnp.exp(-self.sigma_bar(t))

    def sigma(self, t):
        return self.sigma_bar(t) * math.log(self.sigma_max / self.sigma_min)

    def dalpha(self, t):
        return -self.sigma(t) * self.alpha(t)

    def mask_prob(self, t):
        return -jnp.expm1(-self.sigma_bar(t))

    def loss_weight(self, t):
        # sigma * alpha / (1 - alpha) = sigma / expm1(sigma_bar): stable as t -> 0.
        return self.sigma(t) / jnp.expm1(self.sigma_bar(t))

    def log_snr(self, t):
        return -jnp.log(jnp.expm1(self.sigma_bar(t)))

    def t_from_lambda(self, lam):
        sb = -jnp.log1p(-jnp.clip(lam, 0.0, 1.0 - 1e-7))
        t = jnp.log(jnp.maximum(sb, 1e-30) / self.sigma_min) / math.log(
            self.sigma_max / self.sigma_min
        )
        return jnp.clip(t, 0.0, 1.0)


SCHEDULES = {
    "linear": LinearSchedule,
    "cosine": CosineSchedule,
    "poly": PolySchedule,
    "loglinear": LogLinearSchedule,
    "geometric": GeometricSchedule,
}


def get_schedule(name: str, **kwargs) -> Schedule:
    """Build a schedule by name: linear, cosine, polyK (e.g. 'poly3'), loglinear, geometric.

    Keyword arguments (eps, power, sigma_min, sigma_max) go to the schedule's constructor;
    None values are dropped. Raises ValueError naming an unknown schedule.
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if name.startswith("poly") and name != "poly":
        try:
            kwargs["power"] = float(name[4:])
        except ValueError:
            raise ValueError(f"unknown schedule {name!r}; expected polyK with numeric K") from None
        name = "poly"
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose from {sorted(SCHEDULES)} or polyK")
    cls = SCHEDULES[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in fields})
