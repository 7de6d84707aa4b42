"""Ctrl-C that is never lost.

Python runs a signal handler at the next bytecode of the main thread, which can be inside a
garbage-collection callback or a ``__del__`` (JAX installs such callbacks); a KeyboardInterrupt
raised there is printed as "Exception ignored" and dropped (jax-ml/jax issue 18246). The handler
installed by :func:`installed` therefore also counts the signals, and long loops (the Monte Carlo
driver) take :func:`count` when they start and call :func:`raise_if_new` between device calls:
a SIGINT that arrived during the loop takes effect at the next call at the latest, while one
that came and was handled before the loop started is never raised again.

    n0 = interrupts.count()
    for call in calls:
        run(call)
        interrupts.raise_if_new(n0)
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["installed", "count", "raise_if_new"]

_COUNT = [0]


def _handler(signum, frame):
    del signum, frame
    _COUNT[0] += 1
    raise KeyboardInterrupt


@contextlib.contextmanager
def installed():
    """Within the block SIGINT counts itself and raises KeyboardInterrupt (main thread only;
    elsewhere a no-op); the previous handler is restored on exit. Used by the command-line
    entry points (:func:`infodiff.cli.exit_on_user_error`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def count() -> int:
    """SIGINTs received under :func:`installed` so far in this process."""
    return _COUNT[0]


def raise_if_new(since: int) -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived after :func:`count` returned ``since``."""
    if _COUNT[0] != since:
        raise KeyboardInterrupt
