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
import re
import sys
from typing import Callable

__all__ = ["EXIT_ERROR", "user_error_types", "one_line", "exit_on_user_error", "run", "config_flag_error"]

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


def config_flag_error(e: BaseException, argv: list[str]) -> str:
    """One line for an error raised while absl / ml_collections parse the flags: an unknown
    (e.g. misspelt) ``--config.*`` key names the flag and ml_collections' suggestion; a config
    file that raises gives its last error line; anything else is :func:`one_line` of it."""
    text = str(e).replace("\\'", "'")
    key = re.search(r"'(\w+)'", text)
    if isinstance(e, (AttributeError, KeyError)) and key:
        name = key.group(1)
        flag = next((a.split("=")[0] for a in argv if a.startswith("--config.")
                     and a.split("=")[0].split(".")[-1] == name), f"--config.*.{name}")
        hint = re.search(r'Did you mean "([^"]+)"', text)
        return (f"error: unknown config key {flag} ({name!r} is not in the config)"
                + (f"; did you mean {hint.group(1)!r}?" if hint else "; see the config file for its keys"))
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errs = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b:", ln)]
    if errs:
        return f"error: {errs[-1]}"
    return one_line(e)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing with every parse error as one line on stderr and exit status 1."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except Exception as e:
        if os.environ.get("INFODIFF_TRACEBACK"):
            raise
        print(config_flag_error(e, argv), file=sys.stderr, flush=True)
        sys.exit(EXIT_ERROR)


def run(main: Callable) -> None:
    """``absl.app.run`` of ``main`` with one-line user errors (:func:`exit_on_user_error`), also
    for errors raised while the flags are parsed (a misspelt ``--config.*`` key, a bad flag
    value, a config file that raises): one line, exit status 1."""
    from absl import app

    app.run(exit_on_user_error(main), flags_parser=_parse_flags)
