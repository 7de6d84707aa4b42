"""Checkpoints (orbax), config comparison on resume / evaluation, and ``metrics.jsonl``.

Workdir layout::

    <workdir>/config.json          the config of the latest (re)start
    <workdir>/metrics.jsonl        one JSON object per log / eval event
    <workdir>/checkpoints/<step>/  orbax: 'state' (TrainState), 'meta' (JSON: step, seed,
                                   data_position, config, data checksums, task extras)

Every read of a checkpoint goes through :func:`restore_checkpoint` (resume, evaluation,
experiments), so an unreadable checkpoint is always the same clear :class:`CheckpointError`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging
from jax.sharding import Mesh

from infodiff.training import state as state_lib
from infodiff.training.logs import log

__all__ = [
    "CKPT_DIR",
    "RESUMABLE_KEYS",
    "RESUMABLE_PREFIXES",
    "CheckpointError",
    "ConfigMismatchError",
    "config_json_dict",
    "config_differences",
    "check_resumable",
    "saved_config",
    "checkpoint_manager",
    "save_checkpoint",
    "restore_checkpoint",
    "load_checkpoint",
    "load_meta",
    "append_jsonl",
    "truncate_metrics",
]

CKPT_DIR = "checkpoints"
_ITEMS = ("state", "meta")

# Config keys that may differ between a checkpoint and the config that resumes it: they change
# how long the run is and how often it logs / evaluates / saves, not what it computes.
# (Caveat: train.num_steps sets the length of the cosine decay, so changing it changes the
# learning rate of every step after the warmup.)
RESUMABLE_KEYS = (
    "train.num_steps",
    "train.log_every",
    "train.eval_every",
    "train.eval_batches",
    "train.ckpt_every",
    "train.keep_checkpoints",
    "data.cache_dir",
    "experiment",
)
# Whole sections that never affect training: evaluation-only settings (evaluate.py) and the
# experiment sections (toy data sizes are also guarded by the data checksums in every checkpoint).
RESUMABLE_PREFIXES = ("eval.", "toy.", "variance.", "ood.")


class ConfigMismatchError(ValueError):
    """The config of a resumed (or evaluated) run differs from the run's in a non-resumable key."""


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read (truncated or corrupted files)."""

    def __init__(self, step, directory, steps, cause):
        older = sorted(x for x in steps if x < step)
        hint = (f"; older checkpoints: {older} (delete {os.path.join(directory, str(step))} to fall back "
                f"to step {older[-1]})" if older else "")
        super().__init__(f"checkpoint step {step} in {directory} cannot be read "
                         f"({type(cause).__name__}: {cause}){hint}")


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------
def _flatten(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_json_dict(config: ml_collections.ConfigDict) -> dict:
    """The config as the JSON dict stored in checkpoint metadata (sorted keys)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def config_differences(saved: Mapping, new: Mapping, ignore_new_keys: bool = False) -> list[str]:
    """Dotted keys whose values differ between two config dicts, excluding resumable keys.

    ``ignore_new_keys=True`` (evaluation of an existing run) skips keys that ``saved`` does not
    have at all: options added to the config files after the run was trained, which
    configs/saved_run.py fills in from the current defaults. Resuming training stays strict.
    """
    a, b = _flatten(saved), _flatten(new)
    diff = []
    for k in sorted(set(a) | set(b)):
        if k in RESUMABLE_KEYS or k.startswith(RESUMABLE_PREFIXES):
            continue
        if ignore_new_keys and k not in a:
            continue
        if a.get(k, "<missing>") != b.get(k, "<missing>"):
            diff.append(k)
    return diff


def check_resumable(saved_meta: Mapping, config_dict: Mapping, checksums: Mapping, where: str) -> None:
    """Raise ConfigMismatchError unless a run with ``config_dict`` on data with ``checksums`` may
    continue the checkpoint whose metadata is ``saved_meta`` (``where``: its path, for the message).

    Names the differing keys with both values (only ``RESUMABLE_KEYS`` and eval.* may change), or
    the differing data checksums.
    """
    diff = config_differences(saved_meta.get("config", {}), config_dict)
    if diff:
        old, new = _flatten(saved_meta["config"]), _flatten(config_dict)
        detail = "; ".join(f"{k}: checkpoint={old.get(k, '<missing>')!r} new={new.get(k, '<missing>')!r}"
                           for k in diff)
        raise ConfigMismatchError(
            f"cannot resume from {where}: the config differs in {diff} ({detail}). Only "
            f"{list(RESUMABLE_KEYS)} and eval.* may change on resume; use a new --workdir for a "
            f"different experiment"
        )
    saved_sums = saved_meta.get("data", {}).get("checksums")
    if saved_sums not in (None, dict(checksums)):
        raise ConfigMismatchError(
            f"cannot resume from {where}: the checkpoint was trained on data with checksums "
            f"{saved_sums}, the current data has {dict(checksums)}"
        )


def saved_config(workdir: str) -> dict:
    """The config (JSON dict) a run in `workdir` last (re)started with. FileNotFoundError if
    `workdir` is not a training run."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir!r} a training workdir?")
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------
def checkpoint_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
    """Writable manager of ``<workdir>/checkpoints`` keeping the ``keep`` latest steps (>= 1)."""
    options = ocp.CheckpointManagerOptions(max_to_keep=max(1, int(keep)), create=True)
    return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), CKPT_DIR), options=options,
                                 item_names=_ITEMS)


def save_checkpoint(mngr: ocp.CheckpointManager, state: state_lib.TrainState, meta: dict) -> bool:
    """Save ``state`` and ``meta`` (plus ``step`` and ``data_position`` = step) at ``state.step``
    (async). Returns False (nothing saved) if that step or a later one is already saved."""
    step = int(jax.device_get(state.step))
    if mngr.latest_step() is not None and mngr.latest_step() >= step:
        return False
    meta = dict(meta, step=step, data_position=step)
    saved = mngr.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        force=True,
    )
    if saved:
        log(logging.info, "checkpoint: saving step %d (async)", step)
    return saved


def restore_checkpoint(mngr: ocp.CheckpointManager, step: int,
                       abstract_state: state_lib.TrainState | None = None) -> tuple[Any, dict]:
    """Read checkpoint ``step``: ``(state, meta)``; ``state`` is None if ``abstract_state``
    (shapes, dtypes, shardings: :func:`state.abstract_train_state`) is not given.

    Raises:
      CheckpointError: the checkpoint's files cannot be read (names the step and older ones).
    """
    items = {"meta": ocp.args.JsonRestore()}
    if abstract_state is not None:
        items["state"] = ocp.args.StandardRestore(abstract_state)
    try:
        out = mngr.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax / tensorstore raise plain Exception for corrupt data
        raise CheckpointError(step, str(mngr.directory), mngr.all_steps(), e) from e
    return (out.state if abstract_state is not None else None), out.meta


def _read(workdir: str, step: int | None, abstract_fn) -> tuple[Any, dict]:
    directory = os.path.join(os.path.abspath(os.fspath(workdir)), CKPT_DIR)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoints in {os.fspath(workdir)!r} (expected {directory})")
    mngr = ocp.CheckpointManager(directory, item_names=_ITEMS,
                                 options=ocp.CheckpointManagerOptions(create=False))
    try:
        steps = mngr.all_steps()
        if not steps or (step is not None and step not in steps):
            raise FileNotFoundError(
                f"checkpoint step {step if step is not None else 'latest'} not found in {directory} "
                f"(available: {sorted(steps)})"
            )
        step = max(steps) if step is None else int(step)
        return restore_checkpoint(mngr, step, abstract_fn() if abstract_fn is not None else None)
    finally:
        mngr.close()


def load_checkpoint(workdir: str, task: Any, *, step: int | None = None,
                    mesh: Mesh | None = None) -> tuple[state_lib.TrainState, dict]:
    """Restore ``(state, meta)`` from ``<workdir>/checkpoints``.

    Args:
      workdir: the training workdir.
      task: the run's task (:func:`infodiff.tasks.make_task` of its config): gives the state's
        structure (``task.init_params``, ``task.config.optim``).
      step: which checkpoint (default: the latest).
      mesh: device mesh for the (replicated) state; default all local devices.

    Returns:
      state: :class:`TrainState` (``state.ema_params`` are the evaluation parameters).
      meta: dict with ``step``, ``data_position`` (= step), ``seed``, ``config`` (JSON dict),
        ``data`` (name and split checksums) and the task's extras (e.g. Poisson ``proposal``).

    Raises:
      FileNotFoundError: no checkpoint (or not that step) in ``workdir``.
      CheckpointError: the checkpoint's files cannot be read (names the step and older ones).
    """
    def abstract():
        m = state_lib.make_mesh() if mesh is None else mesh
        return state_lib.abstract_train_state(task.init_params, state_lib.make_optimizer(task.config), m)

    return _read(workdir, step, abstract)


def load_meta(workdir: str, step: int | None = None) -> dict:
    """The metadata of checkpoint ``step`` (default: the latest) of ``workdir`` (as
    :func:`load_checkpoint`, without the state; its ``config`` rebuilds the run's task)."""
    return _read(workdir, step, None)[1]


# ---------------------------------------------------------------------------------------------
# metrics.jsonl
# ---------------------------------------------------------------------------------------------
def append_jsonl(path: str, record: dict) -> None:
    """Append ``record`` as one JSON line (sorted keys) to ``path``."""
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def truncate_metrics(path: str, last_step: int) -> None:
    """Drop records after `last_step` (logged after the checkpoint a run resumes from, e.g.
    before a SIGKILL), so every step appears once in metrics.jsonl. Atomic rewrite."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            if int(json.loads(line).get("step", 0)) <= last_step:
                keep.append(line)
        except (ValueError, AttributeError):
            continue  # a torn last line from a crash
    if len(keep) != len(lines):
        with open(path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)
