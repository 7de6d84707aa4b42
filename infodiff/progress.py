"""Progress bars (tqdm) for training, experiments and long evaluations.

On a terminal (stderr is a tty) a bar with the count, rate, ETA and a postfix (loss, bits per
token); otherwise no bar (a log file or a pipe keeps the plain log lines). One bar per run: only
process 0 of a multi-process run draws one.

Some terminals report a size of 0 x 0 (``script``, an Emacs shell, some CI consoles): tqdm then
draws nothing at all (measured with tqdm 4.70: no output with 0 rows). :func:`bar` gives tqdm
the width and height of :func:`shutil.get_terminal_size` (80 x 24 when the terminal has none)
in that case, so the bar shows there too.

This module imports only the standard library and tqdm.
"""

from __future__ import annotations

import os
import shutil
import sys

import time

import tqdm

__all__ = ["bar", "on_terminal", "restart_clock"]


def on_terminal(stream=None) -> bool:
    """Whether ``stream`` (default stderr) is a terminal: where a bar is drawn."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _primary() -> bool:
    """Process 0 of a multi-process JAX run (true without one; jax is not imported here)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return True
    try:
        return jax.process_index() == 0
    except Exception:  # a backend not started yet: one process
        return True


def bar(total: int | None, desc: str, unit: str = "it", *, initial: int = 0, show: bool = True,
        **kwargs) -> tqdm.tqdm:
    """A tqdm bar on stderr: drawn only if ``show``, stderr is a terminal and this is process 0
    (else a disabled bar: every method is a no-op). ``total``: the count at 100 % (None: no
    ETA); ``desc``: the label before it; ``unit``: what one count is; ``initial``: where a
    resumed count starts (the rate and ETA count from it). Other keyword arguments go to tqdm."""
    disable = not (show and on_terminal() and _primary())
    opts = dict(mininterval=0.5, smoothing=0.1, dynamic_ncols=True)
    if not disable:
        size = _terminal_size()
        if size is not None:  # a terminal that reports 0 columns or rows: a fixed size
            opts.update(ncols=size[0], nrows=size[1], dynamic_ncols=False)
    opts.update(kwargs)
    return tqdm.tqdm(total=total, desc=desc, unit=unit, initial=initial, disable=disable, file=sys.stderr,
                     **opts)


def _terminal_size() -> tuple[int, int] | None:
    """(columns, rows) to give tqdm where stderr's terminal reports a 0 size, else None."""
    try:
        cols, rows = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        cols = rows = 0
    if cols > 0 and rows > 0:
        return None
    fallback = shutil.get_terminal_size((80, 24))  # $COLUMNS / $LINES, else 80 x 24
    return (cols or fallback.columns or 80), (rows or fallback.lines or 24)


def restart_clock(pbar: tqdm.tqdm, desc: str | None = None) -> None:
    """Count ``pbar``'s elapsed time, rate and ETA from now, keeping its count (after a
    compilation: its minutes are not the pace of the steps that follow); ``desc`` replaces the
    label."""
    now = time.time()  # tqdm's clock
    pbar.initial = pbar.last_print_n = pbar.n  # no reset(): it would draw the count 0 and a negative rate
    pbar.start_t = pbar.last_print_t = now
    if desc is not None:
        pbar.set_description_str(desc, refresh=False)
    pbar.refresh()
