"""Atomic file writes, shared by the data caches (:mod:`infodiff.data`) and the workdir
(:mod:`infodiff.training.workdir`, which adds storage errors naming the path).

A write goes to a uniquely named temporary file ``.<name>.<pid>.<random hex>.tmp`` in the same
directory, is fsynced, then renamed over ``path`` (:func:`os.replace`): a reader sees the old
file or the new one, never a part. ``open(..., "xb")`` (rather than ``mkstemp``, which forces
mode 0600) keeps the user's umask, so a shared ``$INFODIFF_DATA`` stays readable by others.
"""

from __future__ import annotations

import os
from typing import BinaryIO, Callable

import numpy as np

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_save_npy"]


def atomic_write(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` with ``write(f)`` (a binary file) atomically. A failure leaves any previous
    ``path`` intact and no temporary file behind; raises what the write or the rename raised."""
    tmp = os.path.join(
        os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    )
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write the bytes ``data`` to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(data))


def atomic_save_npy(path: str, arr: np.ndarray) -> None:
    """Save ``arr`` as ``.npy`` (no pickles) to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda f: np.save(f, arr, allow_pickle=False))
