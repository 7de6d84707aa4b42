"""The Process protocol: what a diffusion process gives the training loop and the estimators.

A process is a small frozen (hashable) object, like optax's ``GradientTransformation`` a pair of
pure functions plus a few facts. :class:`Process` declares every member that the Monte Carlo
driver (:mod:`infodiff.likelihood`) and the training loop read, and is also the base class of
the processes (:class:`infodiff.processes.masked.MaskedProcess`,
:class:`infodiff.processes.score_entropy.ScoreEntropyProcess`,
:class:`infodiff.processes.poisson.PoissonProcess`), which inherit the defaults below and
declare the rest. The driver reads nothing else (tests/test_protocol.py).

Required (no default):

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
``passes_per_sample(target_BxL) -> int``
    Denoiser evaluations (rows) per Monte Carlo sample: 1, or n for the stratified estimator
    (also for an unplanned two-stage process: the passes of one round, used to size the budget).
``validate(x) -> np.ndarray``
    The data checked and converted (refuses bad data up front, naming the value).
``estimator: str``
    A name for reports (e.g. 'neyman', 'imdse_absorb:defensive', 'poisson_stratified').
``denoiser_inputs: str``
    The denoiser's signature, for error messages.
``vocab_size: int | None``
    V real tokens (ids 0..V-1), or None for data that are not tokens (Poisson counts).

With a default (inherited from :class:`Process`; a process overrides what differs):

``exact_terms(apply_fn, params, x_BxL, target_BxL, batch_size) -> {name: float64 [B]}`` = ``{}``
    Terms of ``-log p`` computed without Monte Carlo error (``prior``, ``recon``, ``diffusion``).
``extra_passes() -> int`` = 0
    Denoiser evaluations per sequence of ``exact_terms``.
``check_target(target_BxL) -> None`` = refuse a target that is not every position
    (NotImplementedError): a process that conditions on context positions says so.
``infinite_variance: bool`` = False
    The estimator's variance is infinite: its standard error is not trustworthy (a warning).
``se_method: str`` = 'iid'
    How the standard error is computed from the samples: a key of
    ``infodiff.likelihood.SE_METHODS`` ('iid', 'strata_pairs').
``min_samples: int`` = 32 (``DEFAULT_MIN_SAMPLES``)
    The fewest samples with a calibrated SE (tests/test_calibration.py); fewer are flagged.
``chunk_order: str`` = 'rows'
    How the driver groups (row, sample) pairs into calls, a key of ``CHUNK_ORDERS``: part of
    the random stream (:func:`infodiff.likelihood.chunk_shape`).
``row_wise: bool`` = False
    Each row's integrand reads only that row of x, noise and target, so the driver may evaluate
    a call in slices or split it over devices. False (the safe default) when the noise holds a
    key shared by all rows.
``pad_id: int | None`` = None
    The token placed at padded positions (``pad_BxL`` of :func:`infodiff.likelihood.nll`),
    which are never noised or scored (the masked process: its mask id V); None = no padding.
``checks_normalised: bool`` = False
    The denoiser returns log-probabilities normalised over ``vocab_size``; the driver checks
    that on the first rows (``infodiff.validation.check_normalised``; the masked process).
``per_input_targets: bool`` = True
    The two inputs of a pair may score different target positions (each input's noise is then
    drawn from the same key on its own target); False for a law that needs one common target
    (the stratified and neyman estimators).
``needs_plan: bool`` = False
    A two-stage process: the driver first calls ``pilot_stage(target_BxL, num_samples)`` ->
    ``(pilot process, pilot samples per row, rows piloted k)`` or None, runs the pilot on an
    independent key, then ``plan(pilot_BxS or None, target_BxL, num_samples)`` ->
    ``(planned process, samples to draw)`` (the neyman estimator). The defaults plan nothing.

Declared by a subclass of this dataclass-free base, a member with a default must not be a
dataclass field without one: ``dataclasses`` would take the inherited value as its default.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Process", "CHUNK_ORDERS", "DEFAULT_MIN_SAMPLES", "training_loss"]

CHUNK_ORDERS = ("rows", "samples")
DEFAULT_MIN_SAMPLES = 32  # a process's min_samples unless it measured its own


@runtime_checkable
class Process(Protocol):
    """Every member the driver reads, with its default (the module docstring)."""

    estimator: str
    denoiser_inputs: str
    vocab_size: int | None
    infinite_variance: bool = False
    se_method: str = "iid"
    min_samples: int = DEFAULT_MIN_SAMPLES
    chunk_order: str = "rows"
    row_wise: bool = False
    pad_id: int | None = None
    checks_normalised: bool = False
    per_input_targets: bool = True
    needs_plan: bool = False

    def draw_noise(self, key: jax.Array, target_RxL: jax.Array, sample_R: jax.Array) -> Any: ...

    def integrand(self, apply_fn, params, x_RxL: jax.Array, noise: Any,
                  target_RxL: jax.Array) -> jax.Array: ...

    def passes_per_sample(self, target_BxL: np.ndarray) -> int: ...

    def validate(self, x: Any) -> np.ndarray: ...

    def exact_terms(self, apply_fn, params, x_BxL: np.ndarray, target_BxL: np.ndarray,
                    batch_size: int) -> dict:
        return {}

    def extra_passes(self) -> int:
        return 0

    def check_target(self, target_BxL: np.ndarray) -> None:
        if not np.asarray(target_BxL).all():
            raise NotImplementedError(f"the {type(self).__name__} ({self.estimator}) has no conditional "
                                      "likelihood: score every position (no target_BxL)")

    def pilot_stage(self, target_BxL: np.ndarray, num_samples: int):
        return None

    def plan(self, pilot_BxS, target_BxL: np.ndarray, num_samples: int) -> tuple[Process, int]:
        return self, num_samples


def training_loss(process: Process, apply_fn, params, x_BxL: jax.Array, key: jax.Array) -> jax.Array:
    """One-sample Monte Carlo loss per row, float32 [B] nats: ``integrand`` with fresh noise
    over every position (the training objective of ``process``'s noise law)."""
    target = jnp.ones(x_BxL.shape, bool)
    noise = process.draw_noise(key, target, jnp.zeros(x_BxL.shape[:1], jnp.int32))
    return process.integrand(apply_fn, params, x_BxL, noise, target)
