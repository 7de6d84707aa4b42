"""The training loop: one loop for every task (masked, SEDD, Poisson), data parallel, resumable.

The task (:mod:`infodiff.tasks`) supplies the model, ``init_params``, the loss, the metrics,
the data stream, the fixed validation batches, the checkpoint metadata and its log lines; the
loop owns the optimizer, the EMA, checkpoints, signals, logging and validation cadence.

Determinism and resumption
--------------------------
* The data stream is a pure function of ``(config.seed, step)`` (``task.train_batch(step)``),
  so the data position saved with a checkpoint is simply the step.
* The randomness of step ``s`` (noise levels, masks, dropout) is ``fold_in(train_key, s)``.
* Therefore a run interrupted at any checkpoint and resumed produces bit-identical parameters to
  an uninterrupted run (tested in ``tests/test_training.py`` and the SEDD / Poisson tests).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from infodiff import parallel, progress, provenance
from infodiff.training import checkpoint as ckpt
from infodiff.training import guard as guard_lib
from infodiff.training import sinks as sinks_lib
from infodiff.training import state as state_lib
from infodiff.training import workdir as workdir_lib
from infodiff.training.logs import log

__all__ = ["make_train_step", "make_eval_step", "train", "exit_status"]


def exit_status(interrupted: str) -> int:
    """The exit status of a run that :func:`train` returned with ``interrupted`` set: 128 + the
    signal number for 'SIGINT' / 'SIGTERM' (what a scheduler reads as interrupted and may
    requeue), 1 for anything else."""
    signum = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}.get(str(interrupted))
    return 128 + int(signum) if signum is not None else 1


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------
def _gathered(params: Any, mesh: Mesh) -> Any:
    """``params`` whole on every device inside the step when the mesh splits them over 'fsdp'
    (one all-gather per step; the gradient is reduce-scattered back to the state's shards).
    Left to itself XLA's partitioner splits the matmuls along the kernels' fsdp axis instead and
    then reshards activations ("involuntary full rematerialization"): measured on 8 CPU devices,
    2 x 128, L 64, B 32, the gather cut the step's temporaries 17.9 -> 10.9 MiB and its time
    145 -> 105 ms at (4, 2), 251 -> 110 ms at (1, 8), the same loss."""
    if int(mesh.shape.get("fsdp", 1)) == 1:
        return params
    whole = parallel.replicated(mesh)
    return jax.lax.with_sharding_constraint(params, jax.tree.map(lambda _: whole, params))


def make_train_step(task: Any, optimizer: optax.GradientTransformation,
                    mesh: Mesh) -> Callable[[state_lib.TrainState, jax.Array, jax.Array], tuple]:
    """Jitted ``train_step(state, batch, key) -> (new_state, metrics)``.

    Args (of the returned function):
      state: :class:`TrainState` placed by :func:`infodiff.parallel.state_shardings` on
        ``mesh`` (donated: do not reuse it).
      batch: a global batch of ``task.train_batch`` ([B, ...], B a multiple of the mesh size),
        split by :func:`infodiff.parallel.batch_sharding`.
      key: PRNG key of this step (:func:`state.step_key`).

    One step: gradient of ``task.loss_fn(params, batch, key, train=True)[0]``, clip + AdamW
    update, EMA update with decay :func:`state.ema_decay` via ``optax.incremental_update``.

    Returns the new state (same shardings) and metrics (float32 scalars, replicated):
    ``task.metrics(loss_B)`` (``loss`` and
    ``bpc`` / ``bpd``), ``grad_norm`` (global norm before clipping), ``lr`` (the learning rate
    used by this update).
    """
    config = task.config
    schedule = state_lib.make_lr_schedule(config)
    decay = float(config.optim.ema_decay)
    repl, batch_sharding = parallel.replicated(mesh), parallel.batch_sharding(mesh)
    state_sharding = jax.tree.map(lambda x: x.sharding,
                                  state_lib.abstract_train_state(task.init_params, optimizer, mesh))

    def loss_fn(params, batch, key):
        return task.loss_fn(_gathered(params, mesh), batch, key, train=True)

    def step_fn(state: state_lib.TrainState, batch, key):
        (_, loss_B), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, key)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        d = state_lib.ema_decay(decay, state.step)
        ema = optax.incremental_update(params, state.ema_params, step_size=1.0 - d)
        metrics = task.metrics(loss_B)
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        new_state = state_lib.TrainState(step=state.step + 1, params=params, ema_params=ema,
                                         opt_state=opt_state)
        return new_state, metrics

    return jax.jit(step_fn, in_shardings=(state_sharding, batch_sharding, repl),
                   out_shardings=(state_sharding, repl), donate_argnums=(0,))


def make_eval_step(task: Any, mesh: Mesh) -> Callable[[Any, jax.Array, jax.Array], dict]:
    """Jitted ``eval_step(params, batch, key) -> task.metrics(loss_B)``: the task's validation
    loss (``task.loss_fn(..., train=False)``: no dropout; Poisson: likelihood weighting), one
    Monte Carlo draw per example, averaged over the batch. params placed as the train state's
    (:func:`infodiff.parallel.param_specs`), batch split over the mesh, metrics replicated."""
    repl = parallel.replicated(mesh)
    specs = parallel.param_specs(jax.eval_shape(task.init_params, jax.random.key(0)), mesh)
    params_sharding = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))

    def eval_fn(params, batch, key):
        return task.metrics(task.loss_fn(_gathered(params, mesh), batch, key, train=False)[1])

    return jax.jit(eval_fn, in_shardings=(params_sharding, parallel.batch_sharding(mesh), repl),
                   out_shardings=repl)


# ---------------------------------------------------------------------------------------------
# Pieces of the loop
# ---------------------------------------------------------------------------------------------
def _check_train_config(config, stop_at_step) -> tuple[int, int]:
    """``(num_steps, end_step)``; ValueError naming a bad ``train.*`` value."""
    tr = config.train
    num_steps = int(tr.num_steps)
    if num_steps < 0:
        raise ValueError(f"config.train.num_steps must be >= 0; got {num_steps}")
    for name in ("log_every", "eval_every", "ckpt_every"):
        if int(tr[name]) < 1:
            raise ValueError(f"config.train.{name} must be >= 1; got {tr[name]}")
    if not float(tr.get("max_loss_ratio", 10.0)) > 1.0:
        raise ValueError(f"config.train.max_loss_ratio must be > 1 (x the larger of the uniform model's and the "
                         f"untrained network's loss); got "
                         f"{tr.max_loss_ratio}")
    sinks_lib.check_available(sinks_lib.parse_log_to(tr.get("log_to", "jsonl")))
    return num_steps, (num_steps if stop_at_step is None else min(num_steps, int(stop_at_step)))


def _resume_or_init(task, mngr, abstract, optimizer, init_key, mesh, meta, workdir, diverged):
    """The newest verified checkpoint's state if ``mngr`` has checkpoints (after checking that
    its config and data may be continued: ConfigMismatchError otherwise), else a fresh state.

    Newer checkpoints that fail verification, or whose state ``diverged(state)`` (a reason or
    None: :meth:`guard.DivergenceGuard.state_problem`; only checkpoints written before that check
    existed can hold one), are named and moved to ``checkpoints.corrupt/`` (kept).
    CheckpointError if there are checkpoints and none passes (nothing is moved)."""
    if not mngr.all_steps():
        return state_lib.init_train_state(task.init_params, optimizer, init_key, mesh)

    def check(step, saved_meta):
        where = f"{workdir}/{ckpt.CKPT_DIR}/{step}"
        ckpt.check_resumable(saved_meta, meta["config"], meta["data"]["checksums"], where)
        _check_continuation(ml_collections.ConfigDict(saved_meta["config"]), task.config, step, workdir)

    failures, steps = [], None
    while True:
        step, state, saved, bad = ckpt.newest_verified(mngr, abstract, meta["config"], steps=steps, check_meta=check)
        failures += bad
        why = None if step is None else diverged(state)
        if why is None:
            break
        failures.append(ckpt.CheckpointError(f"checkpoint step {step} holds a diverged state: {why}", step,
                                             f"{mngr.directory}/{step}"))
        log(logging.warning, "skipping a bad checkpoint: %s", failures[-1])
        steps = [s for s in mngr.all_steps() if s < step]
    if step is None:
        raise ckpt.CheckpointError(
            f"no checkpoint in {mngr.directory} passes verification ({'; '.join(str(e) for e in failures)}); "
            "nothing was changed: restore a good copy or use a new --workdir", failures[0].step,
            str(mngr.directory))
    if failures:
        moved = ckpt.quarantine(mngr, [e.step for e in failures])
        log(logging.warning, "checkpoints %s failed verification and were moved to %s (kept, not "
            "deleted); resuming from step %d, the newest that passes", [e.step for e in failures],
            ", ".join(moved), step)
    log(logging.info, "resumed from checkpoint step %d in %s", int(state.step), workdir)
    old = ml_collections.ConfigDict(saved["config"]).optim
    for key in ("lr", "grad_clip"):
        if float(old[key]) != float(task.config.optim[key]):
            log(logging.warning, "config.optim.%s changed from %.7g (the checkpoint's) to %.7g: steps after %d "
                "use the new value, so this run is no longer what one uninterrupted command gives",
                key, float(old[key]), float(task.config.optim[key]), step)
    return state


def _check_continuation(saved: ml_collections.ConfigDict, config: ml_collections.ConfigDict, step: int,
                        workdir: str) -> None:
    """ConfigMismatchError (one line naming the choices) unless ``config`` may continue a run
    saved with ``saved`` at ``step``: not shorter than ``step``, the learning rate of every step
    taken and of the next one unchanged (:func:`state.schedule_change`; changing
    ``train.num_steps`` must not silently reshape the cosine decay), gradient clipping not
    switched on or off (that changes the optimizer state)."""
    num_steps, old_steps = int(config.train.num_steps), int(saved.train.num_steps)
    if num_steps < step:
        raise ckpt.ConfigMismatchError(
            f"{workdir} is already at step {step}, past config.train.num_steps={num_steps}: there is "
            f"nothing to train and nothing was changed; evaluate it (evaluate.py --workdir {workdir}), "
            f"continue it with --config.train.num_steps >= {step}, or use a new --workdir")
    why = state_lib.schedule_change(saved, config, step)
    if why:
        old_decay = int(saved.optim.get("decay_steps", 0) or 0)
        same = f"--config.train.num_steps={old_steps} --config.optim.decay_steps={old_decay}"
        extend = f"--config.train.num_steps={num_steps} --config.optim.decay_steps={state_lib.decay_length(saved)}"
        choices = [f"the saved run's values, {same}"]
        if num_steps != old_steps:
            choices.append(f"{num_steps} steps on the saved run's schedule, {extend} (after step "
                           f"{state_lib.decay_length(saved)} the rate stays at optim.lr x optim.min_lr_ratio; "
                           f"docs/guide.md \"Training longer\")")
        raise ckpt.ConfigMismatchError(
            f"cannot resume {workdir} at step {step} with config.train.num_steps={num_steps} and "
            f"config.optim.decay_steps={int(config.optim.get('decay_steps', 0) or 0)} (the saved run has "
            f"{old_steps} and {old_decay}): {why}. Choose: {', or '.join(choices)}, or a new --workdir")
    if (float(saved.optim.grad_clip) > 0) != (float(config.optim.grad_clip) > 0):
        raise ckpt.ConfigMismatchError(
            f"cannot resume {workdir}: config.optim.grad_clip={float(config.optim.grad_clip):g} switches "
            f"gradient clipping {'on' if float(config.optim.grad_clip) > 0 else 'off'} (the checkpoint's is "
            f"{float(saved.optim.grad_clip):g}), which changes the optimizer state; give a value "
            f"{'> 0' if float(saved.optim.grad_clip) > 0 else '<= 0'} or use a new --workdir")


def _newest_verified_step(mngr, abstract) -> int | None:
    """The newest checkpoint of ``mngr`` that passes verification (for error messages)."""
    try:
        ckpt.seal_checkpoints(mngr)
    except OSError:
        pass
    return ckpt.newest_verified(mngr, abstract)[0]


class _Window:
    """Train metrics of the steps since the last log line (device arrays until summarised).

    A window is *partial* when it does not cover the nominal steps ``(k * log_every,
    (k + 1) * log_every]`` (or up to ``num_steps``): it starts at a resumed step, or ends at an
    interruption. Its record in metrics.jsonl then carries ``"partial": true`` and
    ``"first_step"`` (its mean is over ``first_step .. step`` only)."""

    def __init__(self, step: int = 0):
        self.reset(step)

    def reset(self, step: int = 0):
        self.metrics, self.steps, self.t0, self.start = [], 0, time.time(), step
        self.checked = 0  # metrics[:checked] passed the divergence guard

    def check(self, guard: guard_lib.DivergenceGuard, step: int) -> None:
        """Run ``guard`` over the steps added since the last check (the last one is ``step``)."""
        guard.check_steps(self.metrics[self.checked:], step)
        self.checked = len(self.metrics)

    def extras(self, step: int, log_every: int, num_steps: int) -> dict:
        """``{"partial": True, "first_step": ...}`` for a partial window ending at ``step``, else {}."""
        nominal_start = ((step - 1) // log_every) * log_every
        boundary = step % log_every == 0 or step == num_steps
        if self.start == nominal_start and boundary:
            return {}
        return {"partial": True, "first_step": self.start + 1}

    def add(self, metrics):
        self.metrics.append(metrics)
        self.steps += 1

    def summarise(self, rate_name: str, items_per_step: int, step: int, num_steps: int) -> tuple[dict, float]:
        """Mean metrics (host floats) plus ``steps_per_s`` and ``rate_name`` (items / s), and the
        ETA in seconds (the steps are checked by the divergence guard first: :meth:`check`)."""
        host = jax.device_get(self.metrics)
        avg = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
        dt = max(time.time() - self.t0, 1e-9)
        avg["steps_per_s"] = self.steps / dt
        avg[rate_name] = self.steps * items_per_step / dt
        return avg, (num_steps - step) / max(avg["steps_per_s"], 1e-9)


class _StopFlag:
    """SIGINT/SIGTERM -> set a flag the loop polls (save and exit); a second SIGINT raises."""

    def __init__(self):
        self.signum = None
        self._old = {}

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def _handler(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        logging.warning("received %s: saving a checkpoint and stopping", signal.Signals(signum).name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def _reference_loss(task, eval_step, batch, init_key, eval_key, mesh) -> float | None:
    """The divergence guard's reference (nats per example): the larger of the uniform model's NLL
    and the untrained network's loss (``init_key``'s parameters) on ``batch``; None where the task's
    loss has no such bound (``task.loss_is_bounded``) or the guard is off. The parameters are made where the train state's live (one extra copy while
    this runs)."""
    if not task.loss_is_bounded or not bool(task.config.train.get("divergence_guard", True)):
        return None
    specs = parallel.param_specs(jax.eval_shape(task.init_params, init_key), mesh)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    params = jax.jit(task.init_params, out_shardings=shardings)(init_key)
    return max(float(task.uniform_nll), float(eval_step(params, batch, eval_key)["loss"]))


def _last_records(path: str, step: int) -> tuple[dict, dict]:
    """The train and validation metrics recorded in ``metrics.jsonl`` at ``step`` ({} if none)."""
    out = {"train": {}, "valid": {}}
    for r in ckpt.read_metrics(path) if os.path.exists(path) else []:
        if r.get("step") == step and r.get("split") in out:
            out[r["split"]] = r.get("metrics", {})
    return out["train"], out["valid"]


def _record(path: str, step: int, split: str, metrics: dict, t_start: float, sinks=None, **extra) -> None:
    """Append a record to metrics.jsonl and mirror its scalars to ``sinks`` (``config.train.log_to``)."""
    if not parallel.is_primary():
        return
    ckpt.append_jsonl(path, {"step": step, "split": split, "metrics": metrics,
                             "wall_time": time.time() - t_start, "time": time.time(), **extra})
    if sinks is not None:
        sinks.write(step, split, metrics)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------
def train(task: Any, workdir: str, *, stop_at_step: int | None = None, mesh: Mesh | None = None) -> dict:
    """Train (or resume) ``task``'s model and validate it on fixed batches.

    Args:
      task: a :class:`infodiff.tasks.Task` (``make_task(config)``); its ``config`` has the
        ``seed``, ``optim.*`` and ``train.*`` keys of ``configs/masked_text.py``.
      workdir: output directory (created); holds ``config.json``, ``metrics.jsonl`` and
        ``checkpoints/``. If it already has checkpoints, the latest is restored and training
        continues from its step (bit-identical to an uninterrupted run).
      stop_at_step: optional; stop (saving a checkpoint) once this step is reached even if
        ``train.num_steps`` is larger, as an interruption would (for tests and time-sliced jobs).
      mesh: optional device mesh (default: ``config.train.mesh`` over every device of every
        process, :func:`infodiff.parallel.make_mesh`).

    Per step ``s``: the global batch ``task.train_batch(s)`` (each process reads only its rows,
    :func:`infodiff.parallel.process_rows`), key ``fold_in(train_key, s)``; so the result does
    not depend on the number of processes and devices. Process 0 alone writes ``config.json``,
    ``metrics.jsonl`` and the checksum files and holds the lock; every process saves its shards
    of each checkpoint (orbax). Every
    ``train.log_every`` steps: the mean train metrics over the window, items/s and ETA are logged
    (absl, the task's line) and appended to ``metrics.jsonl`` as ``{"step", "split": "train",
    "metrics", "wall_time" (s since this call started), "time" (unix seconds)}``; every
    ``train.eval_every`` steps and at the end: validation on ``task.valid_batches()`` with the
    EMA parameters and fixed keys (``split: "valid"``). Checkpoints every ``train.ckpt_every``
    steps and at the end (async, ``train.keep_checkpoints`` kept). SIGINT / SIGTERM: save a
    checkpoint at the current step and return (``interrupted`` set; in a multi-process run a
    signal to any process stops every process at the next multiple of ``train.log_every``); a
    second SIGINT raises KeyboardInterrupt (a checkpoint is still saved). A run that ends inside the learning-rate
    warmup (``0 < train.num_steps <= optim.warmup_steps``) logs one warning at the start
    (:func:`state.warmup_warning`).

    Returns:
      dict: ``step`` (final step), ``train`` (last logged train metrics), ``valid`` (last
      validation metrics), ``num_params``, ``interrupted`` (signal name or None),
      ``wall_time`` (s), ``workdir``, and ``task.result_extras()`` (Poisson: ``proposal``).

    Raises:
      ValueError: empty ``workdir``; bad ``train.*`` values; batch size not a multiple of the
        device count; invalid data (``task.check_data``, names the value).
      ConfigMismatchError (a ValueError): resuming with a config that differs from the
        checkpoint's in a non-resumable key (names the keys; see ``RESUMABLE_KEYS``) or on
        different data.
      CheckpointError: there are checkpoints and none passes verification (a newer one that
        fails is named, moved to ``checkpoints.corrupt/`` and the newest good one resumed).
      WorkdirLockedError: another live process is writing ``workdir`` (names its host and pid).
      StorageError (an OSError): the workdir is full or read-only (one line: the path and the
        errno); temporary checkpoint directories of the failed save are removed.
      DivergenceError (a FloatingPointError): a non-finite loss or state, or (unless
        ``train.divergence_guard`` is False) a non-finite gradient norm or a loss above
        ``train.max_loss_ratio`` x the uniform model's (:mod:`.guard`); nothing from that state
        is saved; names the step and the newest good checkpoint.

    Concurrency: the run holds ``<workdir>/train.lock`` (:class:`workdir.WorkdirLock`) from
    before its first write to its return; a lock left by a killed run is taken over (logged).
    Metrics: a train record whose window was cut by a resume or an interruption has
    ``"partial": true`` and ``"first_step"`` (see :class:`_Window`).
    """
    if not workdir:
        raise ValueError("a workdir is required (train.py --workdir=DIR): where checkpoints and metrics go")
    workdir = os.path.abspath(os.fspath(workdir))
    t_start = time.time()
    config = task.config
    tr = config.train
    num_steps, end_step = _check_train_config(config, stop_at_step)
    parallel.check_same(config.to_json_best_effort(sort_keys=True) + workdir, "a config or --workdir")
    mesh = state_lib.make_mesh(mesh_config=tr.get("mesh")) if mesh is None else mesh
    state_lib.check_batch_divisible(int(tr.batch_size), mesh)

    # ---- data ----
    task.check_data()
    valid_batches = task.valid_batches()

    # ---- one writer per workdir ----
    primary = parallel.is_primary()
    lock = workdir_lib.WorkdirLock(workdir).acquire() if primary else None
    if lock is not None and lock.stale:
        log(logging.warning, "took over the stale lock %s of pid %s on host %s (that run ended without "
            "releasing it)", lock.path, lock.stale.get("pid"), lock.stale.get("host"))
    ckpt_dir = os.path.join(workdir, ckpt.CKPT_DIR)
    try:
        return _train_locked(task, workdir, ckpt_dir, t_start, num_steps, end_step, mesh, valid_batches)
    except workdir_lib.StorageError:
        removed = workdir_lib.clean_tmp_checkpoints(ckpt_dir)
        if removed:
            log(logging.warning, "removed the temporary directories of the failed save: %s", removed)
        raise
    finally:
        if lock is not None:
            lock.release()


def _train_locked(task, workdir, ckpt_dir, t_start, num_steps, end_step, mesh, valid_batches) -> dict:
    """:func:`train` after the checks, holding the workdir lock."""
    config = task.config
    tr = config.train
    log_every = int(tr.log_every)

    # ---- optimizer, steps, state ----
    optimizer = state_lib.make_optimizer(config)
    base = jax.random.key(int(config.seed))
    init_key, train_key, eval_key = (jax.random.fold_in(base, i) for i in range(3))
    abstract = state_lib.abstract_train_state(task.init_params, optimizer, mesh)
    num_params = state_lib.count_params(abstract.params)
    train_step = make_train_step(task, optimizer, mesh)
    eval_step = make_eval_step(task, mesh)
    batch_sharding = parallel.batch_sharding(mesh)
    primary = parallel.is_primary()

    batch_shape = (int(tr.batch_size),) + tuple(np.shape(valid_batches)[2:])  # [B, L] or [B, D]
    my_rows = parallel.process_rows(batch_sharding, batch_shape)  # read by this process only
    meta = {"seed": int(config.seed), "config": ckpt.config_json_dict(config), **task.meta()}
    meta["provenance"] = provenance.collect(data=meta.get("data"))  # what wrote the checkpoints

    # The first line within seconds: what follows (XLA compiles the steps) can take minutes.
    log(logging.info, "compiling the training and validation steps (XLA; minutes for a large model, "
        "seconds when the compilation cache holds them)")
    # ---- the divergence guard (guard.py) ----
    check_batch = parallel.global_batch(valid_batches[0][my_rows], batch_sharding, valid_batches[0].shape)
    reference = _reference_loss(task, eval_step, check_batch, init_key, eval_key, mesh)

    def losses_of(st) -> Callable[[], dict]:
        return lambda: {name: float(eval_step(p, check_batch, eval_key)["loss"])
                        for name, p in (("parameters", st.params), ("EMA parameters", st.ema_params))}

    # ---- resume ----
    mngr = ckpt.checkpoint_manager(workdir, int(tr.keep_checkpoints))
    guard = guard_lib.DivergenceGuard(config, reference, lambda: _newest_verified_step(mngr, abstract))
    finished_before = False
    try:
        resumed = bool(mngr.all_steps())
        state = _resume_or_init(task, mngr, abstract, optimizer, init_key, mesh, meta, workdir,
                                lambda st: (guard.state_problem(st, losses_of(st)) or (None,))[0])
        finished_before = resumed and int(jax.device_get(state.step)) == num_steps
    except BaseException:
        mngr.close()
        raise
    start_step = int(jax.device_get(state.step))
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    try:
        if primary:
            workdir_lib.atomic_write_text(os.path.join(workdir, "config.json"),
                                          config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
            ckpt.truncate_metrics(metrics_path, start_step)
        log_to = sinks_lib.parse_log_to(tr.get("log_to", "jsonl"))
        sinks = sinks_lib.MetricSinks(log_to, workdir, config, start_step) if primary and log_to != ("jsonl",) else None
    except BaseException:
        mngr.close()
        raise
    log(logging.info, *task.start_log(num_params, mesh, start_step, end_step))
    log(logging.info, "parallel: %s", parallel.describe(mesh, abstract.params))
    warmup_note = state_lib.warmup_warning(config)
    if warmup_note:
        log(logging.warning, "%s", warmup_note)

    def save(step: int) -> None:
        # Nothing diverged is saved, whatever the cadence: keep-k never deletes a good checkpoint for it.
        window.check(guard, step)
        guard.check_state(state, step, losses_of(state))
        ckpt.save_checkpoint(mngr, state, meta)

    def run_eval(step: int) -> dict:
        sums: dict = {}
        for i, batch in enumerate(valid_batches):
            batch = parallel.global_batch(batch[my_rows], batch_sharding, batch.shape)
            m = eval_step(state.ema_params, batch, jax.random.fold_in(eval_key, i))
            for k, v in jax.device_get(m).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        out = {k: v / len(valid_batches) for k, v in sums.items()}
        _record(metrics_path, step, "valid", out, t_start, sinks)
        log(logging.info, *task.valid_log(step, out))
        guard.check_valid(out["loss"], step)
        return out

    def log_window(step: int) -> dict:
        window.check(guard, step)
        avg, eta = window.summarise(task.rate_name, task.items_per_step, step, num_steps)
        log(logging.info, *task.train_log(step, num_steps, avg, eta))
        _record(metrics_path, step, "train", avg, t_start, sinks, **window.extras(step, log_every, num_steps))
        pbar.set_postfix(task.progress_postfix(avg), refresh=False)
        window.reset(step)
        return avg

    last_train: dict = {}
    last_valid: dict = {}
    interrupted = None
    window = _Window(start_step)
    prev_metrics = None
    step = start_step
    # A live bar with ETA, loss and bits per token on a terminal; none when stderr is redirected
    # (the log lines carry items/s and ETA too). "compiling" until the first step is dispatched.
    pbar = progress.bar(num_steps, "train (compiling)", "step", initial=start_step, mininterval=1.0)
    postfix_at = 0.0  # when the bar's loss was last refreshed
    several = jax.process_count() > 1

    def stop_signal(step: int) -> str | None:
        # One process stops at the step its signal arrives; several agree every log window (each
        # must save the same step), so a signal to any of them stops all at the next boundary.
        if not several:
            return stop.name
        return parallel.agreed_signal(stop.signum) if step % log_every == 0 else None

    try:
        with _StopFlag() as stop:
            try:
                while step < end_step:
                    interrupted = stop_signal(step)
                    if interrupted is not None:
                        break
                    # ---- step ----
                    batch = parallel.global_batch(task.train_batch(step, my_rows), batch_sharding, batch_shape)
                    state, metrics = train_step(state, batch, state_lib.step_key(train_key, step))
                    if step == start_step:  # compiled: the rate and ETA count from here
                        progress.restart_clock(pbar, "train")
                    if prev_metrics is not None:  # keep at most one step in flight
                        jax.block_until_ready(prev_metrics)
                        if not pbar.disable and time.time() - postfix_at > 1.0:  # the last finished step
                            pbar.set_postfix(task.progress_postfix(jax.device_get(prev_metrics)), refresh=False)
                            postfix_at = time.time()
                    prev_metrics = metrics
                    window.add(metrics)
                    step += 1
                    pbar.update(1)
                    # ---- log window ----
                    if step % log_every == 0 or step == end_step:
                        last_train = log_window(step)
                    # ---- eval ----
                    if step % int(tr.eval_every) == 0 and step < num_steps:
                        last_valid = run_eval(step)
                        window.t0 = time.time()
                    # ---- checkpoint (the last step's after its final validation, below) ----
                    if step % int(tr.ckpt_every) == 0 and step < end_step:
                        save(step)
                if interrupted is None:  # a signal during the last window (agreed by all processes)
                    interrupted = parallel.agreed_signal(stop.signum) if several else stop.name
                if interrupted is not None and window.steps:
                    last_train = log_window(step)  # the steps since the last record: partial
            except KeyboardInterrupt:  # ---- signals: a second Ctrl-C ----
                interrupted = "KeyboardInterrupt"
                log(logging.warning, "KeyboardInterrupt at step %d: saving a checkpoint", step)
                try:
                    save(step)
                    ckpt.seal_checkpoints(mngr)
                except Exception as e:  # e.g. interrupted while the state was donated, or diverged
                    log(logging.error, "could not save at the interrupt (%s); latest checkpoint: %s",
                        e, mngr.latest_step())
                raise
        if finished_before:  # a finished run rerun: nothing to do, nothing appended
            last_train, last_valid = _last_records(metrics_path, step)
            log(logging.info, "the run in %s is complete at step %d (config.train.num_steps); nothing to "
                "train: raise --config.train.num_steps to train longer", workdir, step)
        elif interrupted is None and step == num_steps:
            last_valid = run_eval(step)  # final validation (the in-loop one skips the last step), before the save
        save(step)
        ckpt.seal_checkpoints(mngr)
    finally:
        pbar.close()
        if sinks is not None:
            sinks.close()
        try:
            mngr.wait_until_finished()
        except Exception as e:  # a failed async save: reported by the error in flight, if any
            log(logging.error, "checkpoint save failed: %s", e)
        mngr.close()

    result = {
        "step": int(step),
        "train": last_train,
        "valid": last_valid,
        "num_params": int(num_params),
        "interrupted": interrupted,
        "wall_time": time.time() - t_start,
        "workdir": workdir,
        **task.result_extras(),
    }
    m = task.metric
    log(logging.info, "done at step %d (%s): %s", step, interrupted or "completed", json.dumps(
        {f"train_{m}": last_train.get(m), f"valid_{m}": last_valid.get(m)}))
    return result
