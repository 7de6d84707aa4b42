"""The Process protocol: what a diffusion process gives the training loop and the estimators.

A process is a small frozen (hashable) object, like optax's ``GradientTransformation`` a pair of
pure functions plus a few facts:

``draw_noise(key, target_RxL, sample_R) -> noise``
    The randomness of one Monte Carlo sample per row: a pytree whose leaves have leading
    dimension R (masks, times, noise levels, weights). It never reads the clean data, so two
    inputs can share it (the coupled log-ratio, docs/discrete_diffusion.md §7.2); a process
    whose corruption is intrinsically data-dependent (the Poisson channel) puts the key of that
    part in the noise. ``target_RxL`` (bool) marks the positions whose likelihood is estimated;
    ``sample_R`` (int32) is each row's Monte Carlo sample index (used by stratified or
    quasi-random laws that are common across sequences).

``integrand(apply_fn, params, x_RxL, noise, target_RxL) -> values_R``
    float32 nats per sequence (or per example). The SAME function is the training loss (with a
    training noise law) and the one-sample Monte Carlo estimate of ``-log p`` (with an
    estimation noise law): each identity lives in one place.

``exact_terms(apply_fn, params, x_BxL, target_BxL, batch_size) -> {name: float64 [B]}``
    Terms of ``-log p`` computed without Monte Carlo error (``prior``, ``recon``); may be {}.

``passes_per_sample(target_BxL) -> int``
    Denoiser evaluations (rows) per Monte Carlo sample: 1, or n for the stratified estimator.

plus ``validate(x)`` (refuses bad data up front, naming the value), ``check_target(target)``,
``estimator`` (a name for reports), ``infinite_variance`` (the SE is not trustworthy),
``chunk_order`` (how the driver groups (row, sample) pairs into calls: 'rows' or 'samples';
part of the random stream, see :func:`infodiff.likelihood.estimate`), ``row_wise`` (each
row's integrand reads only that row of x, noise and target, so the driver may evaluate a call
in slices; False when the noise holds a key shared by all rows) and ``denoiser_inputs`` (a line
for error messages). The Monte Carlo driver, :class:`infodiff.likelihood.Estimate`,
the training loop and the reports are written once against this protocol; the processes are
:class:`infodiff.processes.masked.MaskedProcess`,
:class:`infodiff.processes.score_entropy.ScoreEntropyProcess` and
:class:`infodiff.processes.poisson.PoissonProcess`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Process", "CHUNK_ORDERS", "training_loss"]

CHUNK_ORDERS = ("rows", "samples")


@runtime_checkable
class Process(Protocol):
    """See the module docstring."""

    estimator: str
    infinite_variance: bool
    chunk_order: str
    row_wise: bool

    def draw_noise(self, key: jax.Array, target_RxL: jax.Array, sample_R: jax.Array) -> Any: ...

    def integrand(self, apply_fn, params, x_RxL: jax.Array, noise: Any,
                  target_RxL: jax.Array) -> jax.Array: ...

    def exact_terms(self, apply_fn, params, x_BxL: np.ndarray, target_BxL: np.ndarray,
                    batch_size: int) -> dict: ...

    def passes_per_sample(self, target_BxL: np.ndarray) -> int: ...

    def validate(self, x: Any) -> np.ndarray: ...

    def check_target(self, target_BxL: np.ndarray) -> None: ...


def training_loss(process: Process, apply_fn, params, x_BxL: jax.Array, key: jax.Array) -> jax.Array:
    """One-sample Monte Carlo loss per row, float32 [B] nats: ``integrand`` with fresh noise
    over every position (the training objective of ``process``'s noise law)."""
    target = jnp.ones(x_BxL.shape, bool)
    noise = process.draw_noise(key, target, jnp.zeros(x_BxL.shape[:1], jnp.int32))
    return process.integrand(apply_fn, params, x_BxL, noise, target)
