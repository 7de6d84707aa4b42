"""Training: one loop (:func:`train`) for every task of :mod:`infodiff.tasks`.

* :mod:`~infodiff.training.state`: :class:`TrainState`, optimizer and learning-rate schedule,
  EMA decay, the data-parallel mesh, state initialisation.
* :mod:`~infodiff.training.checkpoint`: orbax checkpoints with checksums (every restore goes
  through :func:`restore_checkpoint`, which verifies them), config comparison on resume,
  ``metrics.jsonl``.
* :mod:`~infodiff.training.workdir`: the workdir lock (one writer), storage faults as one-line
  :class:`StorageError`, atomic writes.
* :mod:`~infodiff.training.loop`: the jitted train / eval steps and :func:`train`.
* :mod:`~infodiff.training.logs`: log lines that do not break the tqdm bar.

Typical use::

    task = tasks.make_task(config)           # what is trained (masked, SEDD, Poisson)
    result = training.train(task, workdir)   # resumable; SIGINT / SIGTERM save and return
    state, meta = training.load_checkpoint(workdir, task)
    denoiser = task.denoiser(state.ema_params)
"""

from infodiff.training.checkpoint import (
    CKPT_DIR,
    CORRUPT_DIR,
    RESUMABLE_KEYS,
    RESUMABLE_PREFIXES,
    CheckpointError,
    ConfigMismatchError,
    append_jsonl,
    check_resumable,
    checkpoint_manager,
    config_differences,
    config_json_dict,
    listed,
    load_checkpoint,
    load_meta,
    load_params,
    newest_verified,
    quarantine,
    read_metrics,
    restore_checkpoint,
    save_checkpoint,
    saved_config,
    seal_checkpoints,
    state_digest,
    truncate_metrics,
)
from infodiff.training.logs import log, quiet_library_logs, quiet_orbax_leftovers
from infodiff.training.loop import exit_status, make_eval_step, make_train_step, train
from infodiff.training.state import (
    TrainState,
    abstract_train_state,
    check_batch_divisible,
    count_params,
    ema_decay,
    init_train_state,
    make_lr_schedule,
    make_mesh,
    make_optimizer,
    step_key,
    warmup_warning,
)
from infodiff.training.workdir import StorageError, WorkdirLock, WorkdirLockedError

__all__ = [
    "CKPT_DIR",
    "CORRUPT_DIR",
    "RESUMABLE_KEYS",
    "RESUMABLE_PREFIXES",
    "CheckpointError",
    "ConfigMismatchError",
    "StorageError",
    "TrainState",
    "WorkdirLock",
    "WorkdirLockedError",
    "abstract_train_state",
    "append_jsonl",
    "check_batch_divisible",
    "check_resumable",
    "checkpoint_manager",
    "config_differences",
    "config_json_dict",
    "count_params",
    "exit_status",
    "ema_decay",
    "init_train_state",
    "listed",
    "load_checkpoint",
    "load_meta",
    "load_params",
    "log",
    "make_eval_step",
    "make_lr_schedule",
    "make_mesh",
    "make_optimizer",
    "make_train_step",
    "newest_verified",
    "quarantine",
    "quiet_library_logs",
    "quiet_orbax_leftovers",
    "read_metrics",
    "restore_checkpoint",
    "save_checkpoint",
    "saved_config",
    "seal_checkpoints",
    "state_digest",
    "step_key",
    "train",
    "truncate_metrics",
    "warmup_warning",
]
