"""Ctrl-C that is never lost.

Python runs a signal handler at the next bytecode of the main thread, which can be inside a
garbage-collection callback or a ``__del__`` (JAX installs such callbacks); a KeyboardInterrupt
raised there is printed as "Exception ignored" and dropped (jax-ml/jax issue 18246). The handler
installed by :func:`install` therefore also records the signal, and long loops (the Monte Carlo
driver) call :func:`raise_if_pending` between device calls, so the interrupt takes effect at the
next call at the latest.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["install", "raise_if_pending", "pending"]

_PENDING = False


def _handler(signum, frame):
    global _PENDING
    del signum, frame
    _PENDING = True
    raise KeyboardInterrupt


def install() -> None:
    """Make SIGINT set the pending flag and raise KeyboardInterrupt (main thread only; else a
    no-op). Installed by the command-line entry points (:func:`infodiff.cli.exit_on_user_error`)."""
    global _PENDING
    _PENDING = False
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _handler)


def pending() -> bool:
    """Whether a SIGINT arrived since :func:`install` and was not yet raised by
    :func:`raise_if_pending`."""
    return _PENDING


def raise_if_pending() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived (and clear the flag)."""
    global _PENDING
    if _PENDING:
        _PENDING = False
        raise KeyboardInterrupt
