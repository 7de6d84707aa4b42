"""Checkpoints (orbax), config comparison on resume / evaluation, and ``metrics.jsonl``.

Workdir layout::

    <workdir>/config.json          the config of the latest (re)start
    <workdir>/metrics.jsonl        one JSON object per log / eval event
    <workdir>/train.lock           held by the one writing process (:mod:`.workdir`)
    <workdir>/checkpoints/<step>/  orbax: 'state' (TrainState), 'meta' (JSON: step, seed,
                                   data_position, config, data checksums, task extras,
                                   state_sha256, meta_sha256), and infodiff_sha256.json
    <workdir>/checkpoints.corrupt/ checkpoints that failed verification on resume (kept)

Verification. Every checkpoint carries checksums written at save: ``meta.state_sha256``, the
SHA-256 of the state's arrays (:func:`state_digest`, computed from the arrays being saved, so
it is in the checkpoint from the moment orbax commits it), and ``meta.meta_sha256`` of the rest
of the metadata. Once the asynchronous save has finished, ``infodiff_sha256.json`` records the
SHA-256 of every file of the step directory (orbax has no checksums of its own). Restoring
checks all three; a checkpoint that fails is named and skipped, and the newest one that passes
is used (:func:`newest_verified`); nothing is deleted automatically (a writer moves failing
checkpoints newer than the one it resumes from into ``checkpoints.corrupt/``, so that its own
saves and ``keep_checkpoints`` never touch them).

Readers beside a writer. A reader (evaluation, :func:`load_checkpoint`) takes no lock and never
creates, moves or deletes anything; a training run writing the same workdir may delete the
checkpoints it listed (``keep_checkpoints``) while it reads them. A checkpoint whose directory
is gone after a failed read was deleted, not damaged: the reader lists again and retries
(:func:`_read`), and only a failure whose directory stays is reported as damage.

Every read of a checkpoint goes through :func:`restore_checkpoint` (resume, evaluation,
experiments, the Poisson evaluator), so a bad checkpoint is always the same one-line
:class:`CheckpointError` naming the file and the step, and a config that does not fit the
checkpoint is a :class:`ConfigMismatchError` saying so.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from typing import Any, Callable, Mapping

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.sharding import Mesh

from infodiff import config_rules, parallel
from infodiff.training import guard
from infodiff.training import state as state_lib
from infodiff.training import workdir as workdir_lib
from infodiff.training.logs import log, quiet_orbax_leftovers

__all__ = [
    "CKPT_DIR",
    "RESUMABLE_KEYS",
    "RESUMABLE_PREFIXES",
    "CORRUPT_DIR",
    "MANIFEST",
    "CheckpointError",
    "ConfigMismatchError",
    "state_digest",
    "listed",
    "seal_checkpoints",
    "newest_verified",
    "quarantine",
    "config_json_dict",
    "config_differences",
    "check_resumable",
    "saved_config",
    "checkpoint_manager",
    "save_checkpoint",
    "restore_checkpoint",
    "load_checkpoint",
    "load_params",
    "load_meta",
    "append_jsonl",
    "read_metrics",
    "truncate_metrics",
]

CKPT_DIR = "checkpoints"
CORRUPT_DIR = "checkpoints.corrupt"
MANIFEST = "infodiff_sha256.json"
_ITEMS = ("state", "meta")

# Config keys that may differ between a checkpoint and the config that resumes it: they change
# how long the run is, how often it logs / evaluates / saves and on which devices, not what it
# computes (the device layout changes only the rounding of reductions).
# train.num_steps and optim.decay_steps set the length of the cosine decay: a change is accepted
# only where it leaves the learning rate of every step taken and of the next one unchanged
# (state.schedule_change, checked by the training loop). optim.lr and optim.grad_clip may change
# to recover a diverged run; the loop announces the change (the run is then no longer what one
# uninterrupted command gives).
RESUMABLE_KEYS = (
    "train.num_steps",
    "optim.decay_steps",
    "optim.lr",
    "optim.grad_clip",
    "train.divergence_guard",
    "train.max_loss_ratio",
    "train.log_every",
    "train.eval_every",
    "train.eval_batches",
    "train.ckpt_every",
    "train.keep_checkpoints",
    "train.log_to",
    "train.mesh.data",   # the device layout: a run saved on one layout resumes on another
    "train.mesh.fsdp",
    "model.attention",   # einsum or jax.nn.dot_product_attention: the same function
    "model.allow_float16",  # an opt-in; model.dtype itself must match
    "data.cache_dir",
    "experiment",
)
# Whole sections that never affect training: evaluation-only settings (evaluate.py) and the
# experiment sections (toy data sizes are also guarded by the data checksums in every checkpoint).
RESUMABLE_PREFIXES = ("eval.", "toy.", "variance.", "ood.")


class ConfigMismatchError(ValueError):
    """The config of a resumed (or evaluated) run differs from the run's in a non-resumable key."""


class CheckpointError(RuntimeError):
    """A checkpoint exists but fails verification or cannot be read (corrupted, truncated or
    garbled files). One line naming the step and the file; ``step`` and ``path`` attributes."""

    def __init__(self, message: str, step: int | None = None, path: str | None = None):
        super().__init__(message)
        self.step, self.path = step, path


def _one_line(e: BaseException, limit: int = 240) -> str:
    """``Type: first line of the message`` (TensorStore messages run to many lines)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


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


SHOWN_DIFFERENCES = 4  # config keys a mismatch line names (all of them with --debug)


def listed(items: list[str], shown: int = SHOWN_DIFFERENCES) -> str:
    """``items`` joined by ', ' for a one-line error: the first ``shown`` and how many more, all of
    them under ``--debug`` (``INFODIFF_TRACEBACK`` set, infodiff/cli.py)."""
    if len(items) <= shown or os.environ.get("INFODIFF_TRACEBACK"):
        return ", ".join(items)
    return f"{', '.join(items[:shown])} and {len(items) - shown} more (--debug shows all)"


def check_resumable(saved_meta: Mapping, config_dict: Mapping, checksums: Mapping, where: str) -> None:
    """Raise ConfigMismatchError unless a run with ``config_dict`` on data with ``checksums`` may
    continue the checkpoint whose metadata is ``saved_meta`` (``where``: its path, for the message).

    Names the differing keys with both values (only ``RESUMABLE_KEYS`` and eval.* may change), or
    the differing data checksums.
    """
    diff = config_differences(saved_meta.get("config", {}), config_dict)
    if diff:
        old, new = _flatten(saved_meta["config"]), _flatten(config_dict)
        detail = listed([f"{k}: checkpoint={old.get(k, '<missing>')!r} new={new.get(k, '<missing>')!r}"
                         for k in diff], 2)
        raise ConfigMismatchError(
            f"cannot resume from {where}: the config differs in {len(diff)} key{'s' * (len(diff) != 1)} "
            f"({detail}). Only "
            "eval.* and training.RESUMABLE_KEYS (e.g. optim.lr) may change on resume; else use a new --workdir"
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
        saved = json.load(f)
    config_rules.check_run_config(saved, workdir)
    return saved


# ---------------------------------------------------------------------------------------------
# Checksums
# ---------------------------------------------------------------------------------------------
def state_digest(state: Any) -> str:
    """SHA-256 (hex) of a pytree of arrays: each leaf's path, dtype, shape and bytes, in tree
    order. Equal for bit-identical states; any flipped bit changes it, and it does not depend on
    how the arrays are sharded (in a multi-process run every process computes it from the
    gathered arrays: :func:`infodiff.parallel.to_host`)."""
    h = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(parallel.to_host(state))
    for path, leaf in leaves:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _meta_digest(meta: Mapping) -> str:
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _step_files(step_dir: str) -> list[str]:
    out = []
    for root, _, files in os.walk(step_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), step_dir)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def _step_dir(mngr: ocp.CheckpointManager, step: int) -> str:
    return os.path.join(str(mngr.directory), str(int(step)))


def seal_checkpoints(mngr: ocp.CheckpointManager) -> list[int]:
    """Wait for the manager's pending saves and write ``infodiff_sha256.json`` (SHA-256 of every
    file) into each step directory this process saved and has not sealed yet (process 0 only,
    once every process's files are committed). Returns the sealed steps. Raises StorageError if
    the storage refuses a write."""
    pending = getattr(mngr, "_infodiff_unsealed", set())
    with workdir_lib.storage_guard(str(mngr.directory), "save a checkpoint in"):
        mngr.wait_until_finished()
    if not parallel.is_primary():
        pending.clear()
        return []
    sealed = []
    for step in sorted(pending):
        d = _step_dir(mngr, step)
        if os.path.isdir(d) and not os.path.exists(os.path.join(d, MANIFEST)):
            files = {rel: _file_sha256(os.path.join(d, rel)) for rel in _step_files(d)}
            workdir_lib.atomic_write_text(os.path.join(d, MANIFEST), json.dumps(files, indent=1, sort_keys=True))
            sealed.append(step)
    pending.clear()
    return sealed


def _verify_files(step_dir: str, step: int) -> None:
    path = os.path.join(step_dir, MANIFEST)
    if not os.path.exists(path):
        return  # not sealed yet (killed right after the save) or older: meta / state digests still apply
    try:
        with open(path) as f:
            files = json.load(f)
        if not isinstance(files, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint step {step}: its checksum file {path} cannot be read "
                              f"({_one_line(e)})", step, path) from e
    for rel, digest in sorted(files.items()):
        p = os.path.join(step_dir, rel)
        try:
            ok = _file_sha256(p) == digest
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint step {step}: file {p} is missing", step, p) from None
        except OSError as e:
            raise CheckpointError(f"checkpoint step {step}: file {p} cannot be read ({_one_line(e)})",
                                  step, p) from e
        if not ok:
            raise CheckpointError(f"checkpoint step {step}: file {p} does not match the checksum "
                                  "written at save (corrupted or truncated)", step, p)


def _quiet_failed_read() -> None:
    """After a failed orbax read: filter its leftovers' tracebacks and collect them now."""
    quiet_orbax_leftovers()
    gc.collect()


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------
def checkpoint_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
    """Writable manager of ``<workdir>/checkpoints`` keeping the ``keep`` latest steps (>= 1).

    Only the holder of the workdir lock may create one: it removes the temporary directories of
    interrupted saves (orbax ``cleanup_tmp_directories``)."""
    directory = os.path.join(os.path.abspath(workdir), CKPT_DIR)
    options = ocp.CheckpointManagerOptions(max_to_keep=max(1, int(keep)), create=True,
                                           cleanup_tmp_directories=True)
    with workdir_lib.storage_guard(directory, "create"):
        mngr = ocp.CheckpointManager(directory, options=options, item_names=_ITEMS)
    mngr._infodiff_unsealed = set()  # steps saved by this manager whose files are not hashed yet
    return mngr


def save_checkpoint(mngr: ocp.CheckpointManager, state: state_lib.TrainState, meta: dict) -> bool:
    """Save ``state`` and ``meta`` (plus ``step``, ``data_position`` = step, ``state_sha256`` and
    ``meta_sha256``) at ``state.step`` (async; the previous save is sealed first, see
    :func:`seal_checkpoints`). Returns False (nothing saved) if that step or a later one is
    already saved.

    Raises StorageError (one line: the step directory and the errno) if the storage is full or
    read-only; the temporary directory of the failed save is removed by the caller
    (:func:`workdir.clean_tmp_checkpoints`) or by the next writer.
    """
    step = int(jax.device_get(state.step))
    seal_checkpoints(mngr)
    if mngr.latest_step() is not None and mngr.latest_step() >= step:
        return False
    meta = dict(meta, step=step, data_position=step, state_sha256=state_digest(state))
    meta["meta_sha256"] = _meta_digest(meta)
    with workdir_lib.storage_guard(_step_dir(mngr, step), "save a checkpoint to"):
        saved = mngr.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )
    if saved:
        getattr(mngr, "_infodiff_unsealed", set()).add(step)
        log(logging.info, "checkpoint: saving step %d (async)", step)
    return saved


# Config keys that decide the shapes / structure of the train state: compared with the
# checkpoint's config before its state is read (a read that fails leaves TensorStore noise).
_STRUCTURE_PREFIXES = ("model.", "process.", "data.seq_len", "data.vocab_size", "data.dim")


def _disagreement(meta: Mapping, config_dict: Mapping | None, prefixes: tuple = ()) -> str:
    if config_dict is None:
        return ""
    diff = config_differences(meta.get("config", {}), config_dict, ignore_new_keys=True)
    if prefixes:
        diff = [k for k in diff if k.startswith(prefixes)]
    if not diff:
        return ""
    old, new = _flatten(meta.get("config", {})), _flatten(config_dict)
    return listed([f"{k}: config={new.get(k, '<missing>')!r} checkpoint={old.get(k, '<missing>')!r}"
                   for k in diff], 2)


def restore_checkpoint(mngr: ocp.CheckpointManager, step: int,
                       abstract_state: state_lib.TrainState | None = None,
                       config_dict: Mapping | None = None) -> tuple[Any, dict]:
    """Read and verify checkpoint ``step``: ``(state, meta)``; ``state`` is None if
    ``abstract_state`` (shapes, dtypes, shardings: :func:`state.abstract_train_state`) is not
    given. ``config_dict`` (the JSON dict of the config that built ``abstract_state``) names the
    keys in which config and checkpoint disagree when the state does not fit.

    Checks, in order: the file checksums (``infodiff_sha256.json``, once sealed), that the
    metadata parses and matches ``meta_sha256``, that the state restores and matches
    ``state_sha256`` (checkpoints written before checksums existed skip what they lack), and
    that every float of the state is finite (a diverged state is never saved now; older runs
    may hold one).

    Raises:
      CheckpointError: one line naming the step and the file or part that failed.
      ConfigMismatchError: the state does not restore into ``abstract_state`` and ``config_dict``
        differs from the checkpoint's config (names the keys; the checkpoint itself is fine).
    """
    step = int(step)
    d = _step_dir(mngr, step)
    _verify_files(d, step)
    meta_path = os.path.join(d, "meta")
    try:
        meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    except Exception as e:  # orbax raises JSONDecodeError, ValueError, plain Exception, ...
        _quiet_failed_read()
        raise CheckpointError(f"checkpoint step {step}: its metadata {meta_path} cannot be read "
                              f"({_one_line(e)})", step, meta_path) from e
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint step {step}: its metadata {meta_path} is not a JSON object",
                              step, meta_path)
    if "meta_sha256" in meta and meta["meta_sha256"] != _meta_digest(meta):
        raise CheckpointError(f"checkpoint step {step}: its metadata {meta_path} does not match the "
                              "checksum written at save (corrupted)", step, meta_path)
    if abstract_state is None:
        return None, meta
    state_path = os.path.join(d, "state")
    detail = _disagreement(meta, config_dict, _STRUCTURE_PREFIXES)
    if detail:
        raise ConfigMismatchError(
            f"the config and checkpoint step {step} ({d}) disagree: {detail}. The checkpoint "
            "is not damaged: use its own config (--workdir W alone, W/config.json unedited)")
    try:
        state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))).state
    except Exception as e:
        _quiet_failed_read()
        detail = _disagreement(meta, config_dict)
        if detail:
            raise ConfigMismatchError(
                f"the config and checkpoint step {step} ({d}) disagree: {detail}. The checkpoint "
                "is not damaged: use its own config (--workdir W alone, W/config.json unedited)") from e
        raise CheckpointError(f"checkpoint step {step}: its state {state_path} cannot be read into the "
                              f"model the config builds ({_one_line(e)})", step, state_path) from e
    if "state_sha256" in meta and state_digest(state) != meta["state_sha256"]:
        raise CheckpointError(f"checkpoint step {step}: its state {state_path} does not match the "
                              "checksum written at save (corrupted data file)", step, state_path)
    if not guard.all_finite(state):
        raise CheckpointError(f"checkpoint step {step}: its state {state_path} holds NaN or inf (saved "
                              "by a diverged run before this check existed)", step, state_path)
    return state, meta


def newest_verified(mngr: ocp.CheckpointManager, abstract_state: Any = None,
                    config_dict: Mapping | None = None, steps: list[int] | None = None,
                    check_meta: Callable[[int, dict], None] | None = None
                    ) -> tuple[int | None, Any, dict | None, list[CheckpointError]]:
    """The newest checkpoint that passes :func:`restore_checkpoint`: ``(step, state, meta,
    failures)``, trying ``steps`` (default all) newest first; ``failures`` are the
    CheckpointErrors of the newer ones (each also logged as a warning). ``(None, None, None,
    failures)`` if none passes. ``check_meta(step, meta)`` runs before the state is read (e.g.
    :func:`check_resumable`); its errors, and ConfigMismatchError, propagate.

    A checkpoint whose directory is gone after its read failed was deleted while it was read
    (a live writer's ``keep_checkpoints``): it is not a failure (logged at info level)."""
    step, state, meta, failures, _ = _newest_verified(mngr, abstract_state, config_dict, steps, check_meta)
    for e in failures:
        log(logging.warning, "skipping a bad checkpoint: %s", e)
    return step, state, meta, failures


def _newest_verified(mngr, abstract_state=None, config_dict=None, steps=None, check_meta=None):
    """:func:`newest_verified` without logging the failures: ``(step, state, meta, failures,
    vanished)``; ``vanished`` are the steps whose directory disappeared after a failed read."""
    failures, vanished = [], []
    for step in sorted(mngr.all_steps() if steps is None else steps, reverse=True):
        try:
            _, meta = restore_checkpoint(mngr, step)
            if check_meta is not None:
                check_meta(step, meta)
            state = None
            if abstract_state is not None:
                state, meta = restore_checkpoint(mngr, step, abstract_state, config_dict)
            return step, state, meta, failures, vanished
        except CheckpointError as e:
            if os.path.isdir(_step_dir(mngr, step)):
                failures.append(e)
            else:
                vanished.append(step)
                log(logging.info, "checkpoint step %d was deleted while it was read (a live writer's "
                    "keep_checkpoints); not a failure", step)
    return None, None, None, failures, vanished


def quarantine(mngr: ocp.CheckpointManager, steps: list[int]) -> list[str]:
    """Move the step directories ``steps`` out of the manager's directory into
    ``<workdir>/checkpoints.corrupt/`` (kept for inspection, never deleted) so that new saves and
    ``keep_checkpoints`` never touch them; returns the new paths."""
    out = []
    base = os.path.join(os.path.dirname(str(mngr.directory)), CORRUPT_DIR)
    if not parallel.is_primary():  # process 0 moves them; the others see the result
        parallel.sync("infodiff_quarantine")
        mngr.reload()
        return [os.path.join(base, str(step)) for step in steps]
    for step in steps:
        src = _step_dir(mngr, step)
        dst = os.path.join(base, str(step))
        i = 1
        while os.path.exists(dst):
            dst, i = os.path.join(base, f"{step}.{i}"), i + 1
        with workdir_lib.storage_guard(dst, "move a bad checkpoint to"):
            os.makedirs(base, exist_ok=True)
            os.replace(src, dst)
        out.append(dst)
    parallel.sync("infodiff_quarantine")
    if out:
        mngr.reload()
    return out


# A reader beside a live writer (evaluate.py while train.py saves): the writer's keep_checkpoints
# may delete a listed checkpoint while it is read. The reader lists again and retries, at most
# this many times; a directory still there after a failed read is given this long to finish
# disappearing (a deletion is not atomic) before the failure counts as damage.
_READ_ATTEMPTS = 30
_DELETION_GRACE_S = 2.0


def _list_steps(directory: str) -> ocp.CheckpointManager:
    """A reader's manager of ``directory``, listed now: it never saves, so it never creates,
    deletes or moves anything (no ``max_to_keep``, no clean-up of temporary directories), and
    takes no lock. Retries a listing that raced with a deletion."""
    options = ocp.CheckpointManagerOptions(create=False)
    for attempt in range(5):
        try:
            return ocp.CheckpointManager(directory, item_names=_ITEMS, options=options)
        except (OSError, ValueError):
            if attempt == 4:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _present(mngr, steps: list[int], grace_s: float) -> set[int]:
    """Those of ``steps`` whose directory is still there after up to ``grace_s`` seconds (a
    deletion in progress, e.g. orbax's rmtree, leaves a half-empty directory for a while)."""
    deadline = time.monotonic() + grace_s
    while True:
        present = {s for s in steps if os.path.isdir(_step_dir(mngr, s))}
        if len(present) < len(set(steps)) or time.monotonic() >= deadline:
            return present
        time.sleep(0.05)


def _agree(step: int | None, vanished: int) -> tuple[bool, bool]:
    """``(every process found this same step, some process saw a deletion or another step)``;
    ``(step is not None, vanished > 0)`` in a single process. The same answer on every process
    (a gather: every process calls it once per attempt), so all retry or stop together."""
    if jax.process_count() == 1:
        return step is not None, vanished > 0
    from jax.experimental import multihost_utils

    mine = np.array([-1 if step is None else int(step), int(vanished)], np.int64)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), 2)
    same = bool(np.all(every[:, 0] == every[0, 0]))
    return same and every[0, 0] >= 0, bool(np.any(every[:, 1] > 0)) or not same


def _no_checkpoint_yet(workdir: str) -> str:
    """What to do about a workdir without a checkpoint: wait for the training run holding its
    ``train.lock`` (:func:`workdir.lock_holder`) to save its first one, or start training."""
    try:
        every = int(saved_config(workdir)["train"]["ckpt_every"])
    except (OSError, ValueError, KeyError, TypeError):
        every = None
    first = f"step {every} (train.ckpt_every)" if every else "its first checkpoint"
    owner = workdir_lib.lock_holder(workdir)
    if owner is not None:
        return (f"training is running there (pid {owner.get('pid', '?')} on host {owner.get('host', '?')} holds "
                f"{workdir_lib.LOCK_NAME}): evaluate again once it has saved {first}")
    return (f"no training is running there: start it (infodiff-train or train.py, same --workdir); first "
            f"checkpoint at {first}")


def _read(workdir: str, step: int | None, abstract_fn, config_dict=None) -> tuple[Any, dict]:
    """Read checkpoint ``step`` (default: the newest that passes verification) as a reader: no
    lock taken, nothing created, moved or deleted. A live writer may delete listed checkpoints
    meanwhile (``keep_checkpoints``): the reader lists again and retries (:data:`_READ_ATTEMPTS`),
    and a deleted checkpoint is never reported as a damaged one."""
    directory = os.path.join(os.path.abspath(os.fspath(workdir)), CKPT_DIR)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoints in {os.fspath(workdir)} yet; {_no_checkpoint_yet(workdir)}")
    abstract = None
    for attempt in range(_READ_ATTEMPTS):
        mngr = _list_steps(directory)
        try:
            steps = mngr.all_steps()
            if not steps and step is None:
                raise FileNotFoundError(f"no checkpoints in {os.fspath(workdir)} yet; {_no_checkpoint_yet(workdir)}")
            if not steps or (step is not None and step not in steps):
                raise FileNotFoundError(
                    f"checkpoint step {step if step is not None else 'latest'} not found in {directory} "
                    f"(available: {sorted(steps)})"
                )
            if abstract is None and abstract_fn is not None:
                abstract = abstract_fn()
            if step is not None:
                try:
                    return restore_checkpoint(mngr, int(step), abstract, config_dict)
                except CheckpointError:
                    if _present(mngr, [int(step)], _DELETION_GRACE_S):
                        raise
                    raise FileNotFoundError(
                        f"checkpoint step {step} in {directory} was deleted while it was read (a "
                        "training run writing there keeps only its newest train.keep_checkpoints): "
                        "evaluate the newest checkpoint (no step) or a copy of the workdir") from None
            found, state, meta, failures, vanished = _newest_verified(mngr, abstract, config_dict)
            if found is None and failures:  # damaged, or still being deleted?
                present = _present(mngr, [e.step for e in failures], _DELETION_GRACE_S)
                vanished += [e.step for e in failures if e.step not in present]
                failures = [e for e in failures if e.step in present]
            done, retry = _agree(found, len(vanished))
            if done:
                for e in failures:
                    log(logging.warning, "skipping a bad checkpoint: %s", e)
                if failures:
                    log(logging.warning, "using checkpoint step %d, the newest that passes verification "
                        "(%d newer skipped, not deleted)", found, len(failures))
                return state, meta
            if retry:
                log(logging.info, "checkpoints %s of %s were deleted while they were read (a live "
                    "writer): listing again (attempt %d)", sorted(vanished), directory, attempt + 1)
                continue
            for e in failures:
                log(logging.warning, "skipping a bad checkpoint: %s", e)
            raise CheckpointError(f"no checkpoint in {directory} passes verification: "
                                  + "; ".join(str(e) for e in failures), failures[0].step, directory)
        finally:
            mngr.close()
    raise CheckpointError(
        f"the checkpoints in {directory} were deleted faster than they could be read ({_READ_ATTEMPTS} "
        "attempts): a training run writing there keeps only its newest train.keep_checkpoints; "
        "evaluate when it has finished, raise train.keep_checkpoints or evaluate a copy of the "
        "workdir", None, directory)


def load_checkpoint(workdir: str, task: Any, *, step: int | None = None,
                    mesh: Mesh | None = None) -> tuple[state_lib.TrainState, dict]:
    """Restore ``(state, meta)`` from ``<workdir>/checkpoints``, verified (:func:`restore_checkpoint`).

    Args:
      workdir: the training workdir.
      task: the run's task (:func:`infodiff.tasks.make_task` of its config): gives the state's
        structure (``task.init_params``, ``task.config.optim``).
      step: which checkpoint (default: the newest that passes verification; newer ones that fail
        are named in a warning and skipped, never deleted).
      mesh: device mesh for the (replicated) state; default all local devices.

    Returns:
      state: :class:`TrainState` (``state.ema_params`` are the evaluation parameters).
      meta: dict with ``step``, ``data_position`` (= step), ``seed``, ``config`` (JSON dict),
        ``data`` (name and split checksums), ``state_sha256``, ``meta_sha256`` and the task's
        extras (e.g. Poisson ``proposal``).

    Raises:
      FileNotFoundError: no checkpoint (or not that step) in ``workdir``.
      CheckpointError: ``step`` (or, by default, every checkpoint) fails verification (one line
        naming the step and the file).
      ConfigMismatchError: the task's config builds a state that does not fit the checkpoint
        (names the keys in which they disagree).
    """
    def abstract():
        m = state_lib.make_mesh() if mesh is None else mesh
        return state_lib.abstract_train_state(task.init_params, state_lib.make_optimizer(task.config), m)

    return _read(workdir, step, abstract, config_json_dict(task.config))


def load_params(workdir: str, task: Any, *, ema: bool = True, step: int | None = None) -> tuple[Any, dict]:
    """The evaluation parameters of a run: ``(params, meta)``, ``state.ema_params`` (or
    ``state.params`` with ``ema=False``) of :func:`load_checkpoint`, whole on every device of
    every process. The checkpoint is read with the state split over all devices ('fsdp'), so a
    device holds a whole copy of the parameters but never of the optimizer state. Raises as
    :func:`load_checkpoint`."""
    split = state_lib.make_mesh(mesh_config={"data": 1, "fsdp": -1})
    state, meta = load_checkpoint(workdir, task, step=step, mesh=split)
    params = state.ema_params if ema else state.params
    whole = parallel.replicated(state_lib.make_mesh())
    return jax.device_put(params, jax.tree.map(lambda _: whole, params)), meta


def load_meta(workdir: str, step: int | None = None) -> dict:
    """The metadata of checkpoint ``step`` (default: the newest whose metadata passes
    verification) of ``workdir`` (as :func:`load_checkpoint`, without the state; its ``config``
    rebuilds the run's task)."""
    return _read(workdir, step, None)[1]


# ---------------------------------------------------------------------------------------------
# metrics.jsonl
# ---------------------------------------------------------------------------------------------
def append_jsonl(path: str, record: dict) -> None:
    """Append ``record`` as one JSON line (sorted keys) to ``path``. Raises StorageError (one
    line: the path and the errno) if the storage is full or read-only."""
    with workdir_lib.storage_guard(path):
        with open(path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


def read_metrics(path: str) -> list[dict]:
    """The records of a run's ``metrics.jsonl``, in file order: dicts ``{"step", "split"
    ('train' | 'valid'), "metrics", "wall_time", "time"}`` and, for a partial train window,
    ``"partial"``, ``"first_step"`` (written by :func:`infodiff.training.train`). Lines that
    are not a JSON object (a torn last line from a crash) are skipped. Raises
    FileNotFoundError if there is no such file."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                records.append(rec)
    return records


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
        workdir_lib.atomic_write_text(path, "".join(keep))
