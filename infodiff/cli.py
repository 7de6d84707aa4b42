"""Command-line error handling shared by train.py, evaluate.py and run_experiment.py.

A user-facing failure (bad input, a config that does not fit, a corrupt checkpoint, a locked,
full or read-only workdir, a non-finite loss) is printed as one line on stderr::

    error: StorageError: cannot write /w/report.json: [Errno 30] Read-only file system (EROFS); ...

and the program exits with status 1, without a traceback. ``INFODIFF_TRACEBACK=1`` re-raises
instead (for debugging). Anything else (a bug) keeps its traceback.

This module imports nothing heavy: it is used before flags are parsed.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable

__all__ = ["EXIT_ERROR", "user_error_types", "one_line", "exit_on_user_error"]

EXIT_ERROR = 1


def user_error_types() -> tuple[type, ...]:
    """Exception types reported as one line: ValueError (bad values, ConfigMismatchError),
    OSError (missing files, StorageError), FloatingPointError, CheckpointError,
    WorkdirLockedError."""
    from infodiff.training.checkpoint import CheckpointError
    from infodiff.training.workdir import WorkdirLockedError

    return (ValueError, OSError, FloatingPointError, CheckpointError, WorkdirLockedError)


def one_line(e: BaseException) -> str:
    """``error: Type: message`` on one line (newlines of the message joined by ' | ')."""
    msg = " | ".join(part.strip() for part in str(e).strip().splitlines() if part.strip())
    return f"error: {type(e).__name__}: {msg}"


def _quiet_unraisable(unraisable) -> None:
    del unraisable


def exit_on_user_error(main: Callable) -> Callable:
    """Wrap an absl ``main(argv)``: user errors -> one line on stderr and ``sys.exit(1)``."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as e:
            if os.environ.get("INFODIFF_TRACEBACK") or not isinstance(e, user_error_types()):
                raise
            sys.stdout.flush()
            print(one_line(e), file=sys.stderr, flush=True)
            # A failed restore / save leaves orbax / TensorStore coroutines that complain ("Event
            # loop is closed") when collected at exit: the one line above is the whole report.
            sys.unraisablehook = _quiet_unraisable
            sys.exit(EXIT_ERROR)

    return wrapped
