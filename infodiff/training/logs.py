"""Log lines of the training loop: absl calls that do not interleave with a live tqdm bar."""

from __future__ import annotations

import logging as logging_std
import os
import sys
from typing import Callable

import jax
import tqdm
from absl import logging

__all__ = ["log", "quiet_library_logs", "quiet_orbax_leftovers"]


def log(fn: Callable, msg: str, *args) -> None:
    """``fn(msg, *args)`` (an absl log function) after clearing any live tqdm bar. In a
    multi-process run only process 0 logs below ERROR (the others would repeat its lines)."""
    if fn in (logging.info, logging.debug, logging.warning) and jax.process_index() != 0:
        return
    with tqdm.tqdm.external_write_mode():
        fn(msg, *args)


logging.ABSLLogger.register_frame_to_skip(__file__, "log")  # report the caller's line

_NOISY = ("/orbax/", "/jax/", "/jaxlib/", "/flax/", "/etils/", "/tensorstore/")
# orbax warnings that say nothing infodiff does not say itself: a reader beside a writer finds a
# checkpoint's metadata gone (deleted by keep_checkpoints, or not yet finalized); infodiff lists the
# checkpoints again and verifies each it reads (infodiff.training.checkpoint), naming a damaged one.
_DROPPED = ("Metadata file does not exist",)


class _QuietLibraries(logging_std.Filter):
    """Drop sub-WARNING absl records emitted from library code (orbax logs every save step) and
    orbax's warnings of :data:`_DROPPED`, and
    shorten the tracebacks library code attaches to its warnings and errors to one line (a
    failed save is reported once, as a one-line StorageError / CheckpointError, by infodiff)."""

    def filter(self, record: logging_std.LogRecord) -> bool:
        path = record.pathname.replace(os.sep, "/")
        if not any(s in path for s in _NOISY):
            return True
        if record.levelno < logging_std.WARNING:
            return False
        if record.levelno == logging_std.WARNING and str(record.msg).startswith(_DROPPED):
            return False
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            first = (str(e).strip().splitlines() or [""])[0][:300]
            record.msg, record.args = f"{record.getMessage()} ({type(e).__name__}: {first})", ()
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


class _OrbaxAsyncioLeftovers(logging_std.Filter):
    """Drop asyncio's "Task exception was never retrieved" for orbax tasks of a failed save or
    read (the failure itself is reported, once, by infodiff)."""

    def filter(self, record: logging_std.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        tb = getattr(exc, "__traceback__", None)
        while tb is not None:
            if "/orbax/" in tb.tb_frame.f_code.co_filename.replace(os.sep, "/"):
                return False
            tb = tb.tb_next
        return True


def _is_orbax_leftover(unraisable) -> bool:
    exc, obj = unraisable.exc_value, unraisable.object
    name = getattr(obj, "__qualname__", "") or getattr(getattr(obj, "cr_code", None), "co_name", "")
    return ((isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc))
            or "Encountered error while reading" in str(exc) or "_read_array" in str(name))


def quiet_orbax_leftovers() -> None:
    """Silence what orbax / TensorStore leave behind after a failed read or save: un-awaited
    coroutines and callbacks into a closed event loop, each printing a traceback when collected
    (screens of them, after the one-line error was already reported). Filters exactly those from
    ``sys.unraisablehook``; anything else still reaches the previous hook. Idempotent."""
    hook = sys.unraisablehook
    if getattr(hook, "_infodiff_filter", False):
        return

    def filtered(unraisable, _next=hook):
        if not _is_orbax_leftover(unraisable):
            _next(unraisable)

    filtered._infodiff_filter = True
    sys.unraisablehook = filtered


def quiet_library_logs() -> None:
    """Hide INFO chatter of orbax / jax / flax (absl and std logging); warnings and errors still
    show, their tracebacks shortened to one line; orbax's leftover tracebacks after a failed read
    or save are dropped (:func:`quiet_orbax_leftovers`)."""
    quiet_orbax_leftovers()
    logging_std.getLogger("absl").addFilter(_QuietLibraries())
    logging_std.getLogger("asyncio").addFilter(_OrbaxAsyncioLeftovers())
    for name in ("jax", "orbax", "flax", "etils"):  # libraries that use std logging
        logging_std.getLogger(name).setLevel(logging_std.WARNING)
