"""Log lines of the training loop: absl calls that do not interleave with a live tqdm bar."""

from __future__ import annotations

import logging as logging_std
import os
from typing import Callable

import tqdm
from absl import logging

__all__ = ["log", "quiet_library_logs"]


def log(fn: Callable, msg: str, *args) -> None:
    """``fn(msg, *args)`` (an absl log function) after clearing any live tqdm bar."""
    with tqdm.tqdm.external_write_mode():
        fn(msg, *args)


logging.ABSLLogger.register_frame_to_skip(__file__, "log")  # report the caller's line

_NOISY = ("/orbax/", "/jax/", "/jaxlib/", "/flax/", "/etils/", "/tensorstore/")


class _QuietLibraries(logging_std.Filter):
    """Drop sub-WARNING absl records emitted from library code (orbax logs every save step)."""

    def filter(self, record: logging_std.LogRecord) -> bool:
        if record.levelno >= logging_std.WARNING:
            return True
        path = record.pathname.replace(os.sep, "/")
        return not any(s in path for s in _NOISY)


def quiet_library_logs() -> None:
    """Hide INFO chatter of orbax / jax / flax (absl and std logging); warnings still show."""
    logging_std.getLogger("absl").addFilter(_QuietLibraries())
    for name in ("jax", "orbax", "flax", "etils"):  # libraries that use std logging
        logging_std.getLogger(name).setLevel(logging_std.WARNING)
