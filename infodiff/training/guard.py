"""The divergence guard: a run whose state or loss has blown up stops before it saves.

Two rules, checked over every step (the step metrics are kept until checked, whatever the
log / checkpoint cadence):

* **Always** (the state cannot be trusted): a non-finite training loss, or a train state
  (parameters, EMA, optimizer moments) with a NaN or inf. Such a state is never saved, so
  ``keep_checkpoints`` never deletes a finite checkpoint for it (:meth:`DivergenceGuard.check_state`
  runs before every save).
* **Unless** ``train.divergence_guard = False``: a non-finite gradient norm at any step, or a
  loss above ``train.max_loss_ratio`` times the *reference*: the larger of the uniform model's
  NLL (``task.uniform_nll``, ``L ln V`` nats for text) and the untrained network's loss, on a
  fixed validation batch. That loss is taken of the parameters and of their EMA before every
  save, and the validation loss at every validation: deterministic numbers (a single training
  step's Monte Carlo loss is heavy-tailed). A text network starts at about 1x the uniform model
  and a diverged one is orders of magnitude above it (``optim.lr=10``: 25x at step 50, 1700x
  later). Tasks whose healthy loss has no such bound (``task.loss_is_bounded`` False: the
  Poisson ELBO of a young network sat 40x above its untrained value) get no loss rule.

Either stops the run with :class:`DivergenceError`: one line naming the step, what was seen,
the newest checkpoint that passes verification and the config keys to change.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

__all__ = ["DivergenceError", "all_finite", "DivergenceGuard"]


class DivergenceError(FloatingPointError):
    """Training diverged (non-finite or exploding values); nothing after the last good
    checkpoint was saved. One line; ``step`` and ``newest_good`` attributes."""

    def __init__(self, message: str, step: int, newest_good: int | None):
        super().__init__(message)
        self.step, self.newest_good = step, newest_good


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def all_finite(tree: Any) -> bool:
    """Whether every floating-point leaf of ``tree`` (e.g. a :class:`TrainState`, sharded or
    not) is free of NaN and inf. One jitted reduction; a host bool."""
    return bool(jax.device_get(_all_finite(tree)))


class DivergenceGuard:
    """Checks a run's step metrics (``loss`` nats per example, ``grad_norm``), its validation
    losses and each state before it is saved.

    Args:
      config: the run's config (``train.divergence_guard``, ``train.max_loss_ratio``,
        ``optim.lr``, ``optim.grad_clip`` are read).
      reference: the loss scale a run must not exceed ``max_loss_ratio`` times (nats per
        example: the larger of the uniform model's NLL and the untrained network's loss), or
        None when the losses checked are not on that scale (then only the finiteness rules).
      newest_good: returns the newest checkpoint step that passes verification (or None).
    """

    def __init__(self, config, reference: float | None, newest_good: Callable[[], int | None]):
        tr = config.train
        self.enabled = bool(tr.get("divergence_guard", True))
        self.max_ratio = float(tr.get("max_loss_ratio", 10.0))  # > 1: checked with the other train.* values
        self.reference = reference
        self.newest_good = newest_good
        self._lr, self._clip = float(config.optim.lr), float(config.optim.get("grad_clip", 0.0))

    def _fail(self, step: int, what: str, loss_rule: bool = False):
        good = self.newest_good()
        where = (f"the newest good checkpoint is step {good} (finite, verified)" if good is not None
                 else "there is no good checkpoint yet")
        # clipping cannot be switched on in a resumed run (it changes the optimizer state)
        clip = (f" or --config.optim.grad_clip (now {self._clip:g})" if self._clip > 0 else
                " or --config.optim.grad_clip=1.0 (now off)" if good is None else "")
        resume = f"resumes from step {good}" if good is not None else "starts again"
        off = (" or --config.train.max_loss_ratio (now %g) / --config.train.divergence_guard=False to "
               "train on regardless" % self.max_ratio if loss_rule else
               " or --config.train.divergence_guard=False to train on regardless" if "grad_norm" in what else "")
        raise DivergenceError(
            f"training diverged at step {step}: {what}; nothing from this state was saved and {where}. "
            f"Rerun the same command with a smaller --config.optim.lr (now {self._lr:g}){clip} "
            f"(it {resume}){off}", step, good)

    def check_steps(self, metrics: list[dict], last_step: int) -> None:
        """Check the metrics of the consecutive steps ending at ``last_step`` (device or host
        scalars: ``loss``, ``grad_norm``). DivergenceError naming the first bad step."""
        if not metrics:
            return
        host = jax.device_get([{k: m[k] for k in ("loss", "grad_norm") if k in m} for m in metrics])
        first = last_step - len(host) + 1
        for i, m in enumerate(host):
            loss, gnorm = float(m["loss"]), float(m.get("grad_norm", 0.0))
            if not math.isfinite(loss):
                self._fail(first + i, f"non-finite training loss {loss}")
            if self.enabled and not math.isfinite(gnorm):
                self._fail(first + i, f"non-finite gradient norm (grad_norm {gnorm}, loss {loss:.4g} nats)")

    def check_valid(self, loss: float, step: int) -> None:
        """The validation loss (nats per example, likelihood weighting) at ``step``."""
        if not math.isfinite(loss):
            self._fail(step, f"non-finite validation loss {loss}")
        too_high = self._too_high(loss, "validation loss")
        if too_high:
            self._fail(step, too_high, loss_rule=True)

    def _too_high(self, loss: float, what: str) -> str | None:
        """What to say when ``loss`` is above ``max_loss_ratio`` x the reference (guard on)."""
        if not (self.enabled and self.reference and loss / self.reference > self.max_ratio):
            return None
        return (f"{what} {loss:.4g} nats per example is {loss / self.reference:.3g}x the reference "
                f"{self.reference:.4g} (the larger of the uniform model's and the untrained network's loss; "
                f"train.max_loss_ratio {self.max_ratio:g})")

    def state_problem(self, state: Any, losses: Callable[[], dict[str, float]]) -> tuple[str, bool] | None:
        """``(what is wrong, whether it is the loss rule)`` for a diverged ``state``, else None:
        a NaN or inf in it, or (guard on) a loss of ``losses()`` (nats per example of the
        parameters and of their EMA on a fixed validation batch) above ``max_loss_ratio`` x the
        reference. A step's training loss is that of the state before it, so only these judge
        the state itself."""
        if not all_finite(state):
            return "the parameters, EMA or optimizer moments hold NaN or inf", False
        for name, loss in losses().items():
            if not math.isfinite(loss):
                return f"non-finite loss of the {name} on a validation batch ({loss})", False
            too_high = self._too_high(loss, f"the loss of the {name} on a validation batch")
            if too_high:
                return too_high, True
        return None

    def check_state(self, state: Any, step: int, losses: Callable[[], dict[str, float]]) -> None:
        """Run before each save of ``state`` (the state after ``step`` updates): DivergenceError
        if :meth:`state_problem` finds one."""
        problem = self.state_problem(state, losses)
        if problem is not None:
            self._fail(step, problem[0], loss_rule=problem[1])
