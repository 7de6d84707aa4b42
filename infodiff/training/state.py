"""Train state, optimizer, learning-rate schedule, EMA and the data-parallel mesh.

Generic over what is trained: a task supplies ``init_params(key) -> params`` and everything
here works on the resulting pytree. Setup as MD4 (Shi et al., arXiv 2406.04329, §6): AdamW
with linear warmup then cosine decay, global-norm gradient clipping, and an exponential moving
average (EMA) of the parameters used for evaluation.

Parallelism (:mod:`infodiff.parallel`): a ``('data', 'fsdp')`` mesh over every device of every
process; batches are split over both axes, parameters, EMA and optimizer state along ``'fsdp'``
(replicated when it has size 1); XLA inserts the collectives. One device is the same code path
with a 1 x 1 mesh.
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from infodiff import parallel

__all__ = [
    "TrainState",
    "make_lr_schedule",
    "decay_length",
    "schedule_change",
    "warmup_warning",
    "make_optimizer",
    "ema_decay",
    "make_mesh",
    "check_batch_divisible",
    "init_train_state",
    "abstract_train_state",
    "step_key",
    "count_params",
]

InitParams = Callable[[jax.Array], Any]


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training (a pytree; checkpointed as one item).

    Attributes:
      step: int32 scalar, number of optimizer updates applied so far.
      params: model parameters (float32 pytree).
      ema_params: exponential moving average of ``params`` (same structure), used for eval.
      opt_state: optax state of :func:`make_optimizer`.
    """

    step: jax.Array
    params: Any
    ema_params: Any
    opt_state: Any


def make_lr_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """Learning rate as a function of the step (0-based): float32 scalar.

    Linear warmup from 0 to ``optim.lr`` over ``optim.warmup_steps`` steps, then
    ``optim.decay = 'cosine'``: cosine decay to ``optim.lr * optim.min_lr_ratio`` at step
    :func:`decay_length` (``train.num_steps`` unless ``optim.decay_steps`` is set), constant
    after it (``optax.warmup_cosine_decay_schedule``; if the run is shorter than the warmup the
    cosine part is never reached), or ``'constant'``: ``optim.lr`` after warmup.

    Raises:
      ValueError: unknown decay, negative warmup or decay_steps, lr <= 0.
    """
    o = config.optim
    lr, warmup = float(o.lr), int(o.warmup_steps)
    if not lr > 0:
        raise ValueError(f"config.optim.lr must be > 0; got {lr}")
    if warmup < 0:
        raise ValueError(f"config.optim.warmup_steps must be >= 0; got {warmup}")
    if o.decay == "cosine":
        # optax requires decay_steps > warmup_steps; a run that ends inside the warmup never
        # sees the cosine part, so its length is irrelevant there.
        decay_steps = max(decay_length(config), warmup + 1)
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=lr,
            warmup_steps=warmup,
            decay_steps=decay_steps,
            end_value=lr * float(o.min_lr_ratio),
        )
    if o.decay == "constant":
        if warmup == 0:
            return optax.constant_schedule(lr)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup]
        )
    raise ValueError(f"config.optim.decay={o.decay!r}; choose 'cosine' or 'constant'")


def decay_length(config: ml_collections.ConfigDict) -> int:
    """The step at which the cosine decay ends: ``optim.decay_steps`` if > 0, else
    ``train.num_steps``. ValueError if ``optim.decay_steps < 0``."""
    n = int(config.optim.get("decay_steps", 0) or 0)
    if n < 0:
        raise ValueError(f"config.optim.decay_steps must be >= 0 (0: train.num_steps); got {n}")
    return n if n > 0 else int(config.train.num_steps)


def schedule_change(saved: ml_collections.ConfigDict, new: ml_collections.ConfigDict, step: int) -> str:
    """Why resuming a run saved with config ``saved`` at ``step`` with config ``new`` would
    change the learning rate of the steps already taken or of the next one, at ``saved``'s
    ``optim.lr`` (a changed ``optim.lr`` is a separate, announced choice); "" if it would not
    (then the resumed run equals an uninterrupted run with ``new``)."""
    new = ml_collections.ConfigDict(new.to_dict())
    new.optim.lr = float(saved.optim.lr)
    steps = np.arange(int(step) + 1)
    old_lr, new_lr = np.asarray(make_lr_schedule(saved)(steps)), np.asarray(make_lr_schedule(new)(steps))
    bad = np.flatnonzero(old_lr != new_lr)
    if not bad.size:
        return ""
    s = int(bad[0])
    return (f"the learning rate of step {s} would change from {old_lr[s]:.4g} to {new_lr[s]:.4g} "
            f"(the cosine decay ends at step {decay_length(saved)} in the saved run, at step "
            f"{decay_length(new)} now)")


def warmup_warning(config: ml_collections.ConfigDict) -> str | None:
    """The warning for a run that ends inside the learning-rate warmup, else None.

    The update of step ``s`` (0-based) uses the rate :func:`make_lr_schedule` gives at ``s``, so
    with ``0 < train.num_steps <= optim.warmup_steps`` the last update (``s = num_steps - 1``)
    is still below ``optim.lr``: the line names both values, the peak rate actually reached and
    what to change. None when ``num_steps > warmup_steps`` (the schedule reaches ``optim.lr``)
    or ``num_steps == 0``. Raises the ValueError of :func:`make_lr_schedule` for a bad
    ``optim.*`` value.
    """
    num_steps, warmup = int(config.train.num_steps), int(config.optim.warmup_steps)
    if not 0 < num_steps <= warmup:
        return None
    peak = float(make_lr_schedule(config)(num_steps - 1))
    return (f"config.train.num_steps={num_steps} ends inside the {warmup}-step warmup "
            f"(config.optim.warmup_steps): the learning rate never reaches config.optim.lr="
            f"{float(config.optim.lr):g} (it peaks at {peak:.3g}, at the last step); lower "
            f"config.optim.warmup_steps or train longer")


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """``clip_by_global_norm(optim.grad_clip) -> adamw(schedule, b1, b2, eps, weight_decay)``.

    Weight decay (decoupled, AdamW) applies only to parameters with ndim >= 2 (kernels and the
    embedding), not to biases and LayerNorm scales. ``grad_clip <= 0`` disables clipping.
    The schedule is :func:`make_lr_schedule`.
    """
    o = config.optim
    parts = []
    if float(o.grad_clip) > 0:
        parts.append(optax.clip_by_global_norm(float(o.grad_clip)))
    parts.append(
        optax.adamw(
            learning_rate=make_lr_schedule(config),
            b1=float(o.b1),
            b2=float(o.b2),
            eps=float(o.eps),
            weight_decay=float(o.weight_decay),
            mask=lambda params: jax.tree.map(lambda x: x.ndim >= 2, params),
        )
    )
    return optax.chain(*parts)


def ema_decay(decay: float, step: jax.Array) -> jax.Array:
    """Warm-started EMA decay at ``step`` (int32 scalar): float32 ``min(decay, (1+s)/(10+s))``.

    As ``tf.train.ExponentialMovingAverage`` with ``num_updates``: keeps the average from being
    dominated by the initialisation in short runs; equals ``decay`` after ~10 / (1 - decay) steps.
    """
    s = step.astype(jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + s) / (10.0 + s))


def make_mesh(devices: Any = None, mesh_config: Any = None) -> Mesh:
    """The ``('data', 'fsdp')`` mesh (:func:`infodiff.parallel.make_mesh`) over ``devices``
    (default: every device of every process); ``mesh_config`` is ``config.train.mesh`` (default
    all on 'data')."""
    return parallel.make_mesh(mesh_config, devices)


def check_batch_divisible(batch_size: int, mesh: Mesh) -> None:
    """Raise ValueError unless ``batch_size`` is a positive multiple of the mesh size."""
    n = mesh.devices.size
    if batch_size < 1 or batch_size % n:
        raise ValueError(
            f"batch size {batch_size} must be a positive multiple of the number of devices "
            f"({n}: {[d.platform + ':' + str(d.id) for d in mesh.devices.flat]}) for data "
            f"parallelism; change config.train.batch_size"
        )


def init_train_state(init_params: InitParams, optimizer: optax.GradientTransformation,
                     key: jax.Array, mesh: Mesh | None = None) -> TrainState:
    """Fresh :class:`TrainState` at step 0 (``ema_params = params``), placed on ``mesh`` by
    :func:`infodiff.parallel.state_shardings` (replicated unless the mesh has an 'fsdp' axis
    of size > 1).

    ``init_params(key) -> params`` (a task's). Computed under ``jax.jit`` (op-by-op
    initialisation is several times slower to run), each device computing only its shards.
    """

    def init(key):
        params = init_params(key)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            ema_params=jax.tree.map(jnp.copy, params),
            opt_state=optimizer.init(params),
        )

    out_shardings = None
    if mesh is not None:
        out_shardings = parallel.state_shardings(jax.eval_shape(init, key), optimizer, mesh)
    return jax.jit(init, out_shardings=out_shardings)(key)


def abstract_train_state(init_params: InitParams, optimizer: optax.GradientTransformation,
                         mesh: Mesh) -> TrainState:
    """Shapes, dtypes and shardings (:func:`infodiff.parallel.state_shardings`) of the train
    state on ``mesh``, without computing it."""
    shapes = jax.eval_shape(lambda k: init_train_state(init_params, optimizer, k), jax.random.key(0))
    shardings = parallel.state_shardings(shapes, optimizer, mesh)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)


def step_key(train_key: jax.Array, step: int) -> jax.Array:
    """The PRNG key of training step ``step``: ``fold_in(train_key, step)``."""
    return jax.random.fold_in(train_key, step)


def count_params(params: Any) -> int:
    """Total number of scalar entries in a parameter pytree (int)."""
    return int(sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)))
