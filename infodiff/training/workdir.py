"""The workdir as shared storage: one writer at a time, storage faults as one-line errors.

* :class:`WorkdirLock`: ``<workdir>/train.lock``, an exclusive ``fcntl.flock`` held for the
  whole run, with the owner's host, pid and start time written into the file. The kernel
  releases a flock when its process dies (even by SIGKILL), so a lock file left by a dead run
  is *stale*: the next writer takes it over and says so. A second live writer is refused with
  :class:`WorkdirLockedError` naming the holder.
* :class:`StorageError` (an ``OSError``): a write that failed because the storage is full,
  read-only or not permitted, as one line naming the path and the errno
  (``cannot write /w/metrics.jsonl: [Errno 28] No space left on device (ENOSPC)``).
  :func:`storage_guard` converts such failures, including ones orbax / TensorStore report as
  other exception types with the errno text in the message.
* :func:`atomic_write_text`: temporary file in the same directory, fsync, rename.
* :func:`clean_tmp_checkpoints`: removes orbax's ``*.orbax-checkpoint-tmp*`` directories of
  interrupted saves (only ever called by the lock holder).
"""

from __future__ import annotations

import contextlib
import errno as errno_lib
import fcntl
import json
import os
import re
import shutil
import socket
import time

from infodiff import files

__all__ = ["LOCK_NAME", "STORAGE_ERRNOS", "StorageError", "WorkdirLockedError", "WorkdirLock",
           "storage_error", "storage_guard", "atomic_write_text", "atomic_write_bytes", "clean_tmp_checkpoints",
           "TMP_MARKER", "lock_holder"]

LOCK_NAME = "train.lock"
TMP_MARKER = ".orbax-checkpoint-tmp"
# errnos that mean "this storage cannot take the write", not a bug: full, quota, read-only,
# permission, I/O error, a file over the size limit (ulimit -f, or the file system's).
STORAGE_ERRNOS = {errno_lib.ENOSPC, errno_lib.EDQUOT, errno_lib.EROFS, errno_lib.EACCES,
                  errno_lib.EPERM, errno_lib.EIO, errno_lib.EFBIG}
_TEXT_ERRNOS = {os.strerror(e): e for e in STORAGE_ERRNOS}
_HINT = {
    errno_lib.ENOSPC: "free space on that filesystem or use another --workdir",
    errno_lib.EDQUOT: "free space within your quota or use another --workdir",
    errno_lib.EROFS: "the filesystem is read-only: use a writable --workdir",
    errno_lib.EACCES: "no permission to write there: use a writable --workdir",
    errno_lib.EPERM: "no permission to write there: use a writable --workdir",
    errno_lib.EIO: "the storage reported an I/O error: check the device",
    errno_lib.EFBIG: "a file would exceed the size limit (ulimit -f, or the file system's): raise it or use "
                     "another --workdir",
}


class StorageError(OSError):
    """A write failed because of the storage (full, read-only, no permission, I/O error).

    ``str(e)`` is one line naming the path and the errno; ``e.errno`` and ``e.filename`` are set.
    """

    def __init__(self, errno: int, path: str, what: str = "write", note: str = ""):
        name = errno_lib.errorcode.get(errno, str(errno))
        msg = f"cannot {what} {path}: [Errno {errno}] {os.strerror(errno)} ({name}); {_HINT.get(errno, '')}"
        msg = f"{msg.rstrip('; ')}; {note}" if note else msg
        super().__init__(errno, msg.rstrip("; "))
        self.filename = path
        self._msg = msg.rstrip("; ")

    def __str__(self) -> str:
        return self._msg


class WorkdirLockedError(RuntimeError):
    """Another live process holds the workdir's lock (the message names its host and pid)."""


def _storage_errno(exc: BaseException) -> int | None:
    """The storage errno behind ``exc`` (its cause / context chain, or errno text in a
    TensorStore / orbax message), else None."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return e.errno
        text = str(e)
        for s, code in _TEXT_ERRNOS.items():
            if s in text:
                return code
        m = re.search(r"\[Errno (\d+)\]", text)
        if m and int(m.group(1)) in STORAGE_ERRNOS:
            return int(m.group(1))
        e = e.__cause__ or e.__context__
    return None


def storage_error(exc: BaseException, path: str, what: str = "write") -> StorageError | None:
    """A :class:`StorageError` for ``path`` if ``exc`` is a storage fault, else None."""
    if isinstance(exc, StorageError):
        return exc
    code = _storage_errno(exc)
    return None if code is None else StorageError(code, os.fspath(path), what)


@contextlib.contextmanager
def storage_guard(path: str, what: str = "write"):
    """Re-raise a storage fault inside the block as a one-line :class:`StorageError` for
    ``path``; other exceptions pass unchanged."""
    try:
        yield
    except Exception as e:
        err = storage_error(e, path, what)
        if err is None or err is e:
            raise
        raise err from e


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write_bytes`), UTF-8 whatever the
    locale (an ASCII locale made the report's ``±`` fail at the last step of an evaluation). A
    failure leaves any previous ``path`` intact and no temporary file behind.

    Raises StorageError (full / read-only / no permission, naming ``path``) or OSError.
    """
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: :func:`infodiff.files.atomic_write_bytes` (a
    uniquely named temporary file in the same directory, fsync, rename; the umask's
    permissions, not mkstemp's 0600), with a full, read-only or forbidden storage reported as
    StorageError naming ``path``. A failure leaves any previous ``path`` intact and no
    temporary file behind. Raises StorageError or OSError."""
    path = os.fspath(path)
    with storage_guard(path):
        files.atomic_write_bytes(path, data)


def clean_tmp_checkpoints(directory: str) -> list[str]:
    """Remove orbax's temporary directories (``*.orbax-checkpoint-tmp*``: saves that never
    finished) directly under ``directory``; return the removed paths. Only the lock holder may
    call this (a live writer's save in progress looks the same)."""
    removed = []
    if not os.path.isdir(directory):
        return removed
    for name in sorted(os.listdir(directory)):
        if TMP_MARKER in name:
            p = os.path.join(directory, name)
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
            removed.append(p)
    return removed


def lock_holder(workdir: str) -> dict | None:
    """The record ``{"host", "pid", "since"}`` of the live process holding ``<workdir>/train.lock``
    (a training run writing the workdir: :class:`WorkdirLock`), or None when no process holds it
    (none, finished, killed, or no lock file). Reads only: creates and locks nothing."""
    path = os.path.join(os.fspath(workdir), LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return WorkdirLock._owner(os.pread(fd, 4096, 0).decode("utf-8", "replace")) or {}
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class WorkdirLock:
    """Exclusive lock of a workdir for one writing process (context manager).

    ``acquire()`` creates the workdir if needed, takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
    ``<workdir>/train.lock`` and writes ``{"host", "pid", "since"}`` into it. ``stale`` is the
    previous owner's record when the file still named one whose lock had died with it (a
    crashed or killed run), else None. ``release()`` empties the file and unlocks (the file is
    kept: removing lock files races with the next writer).

    Raises:
      WorkdirLockedError: another live process holds the lock (names its host and pid).
      StorageError: the workdir cannot be written (read-only, full, no permission).
    """

    def __init__(self, workdir: str):
        self.workdir = os.path.abspath(os.fspath(workdir))
        self.path = os.path.join(self.workdir, LOCK_NAME)
        self.stale: dict | None = None
        self._fd: int | None = None

    @staticmethod
    def _owner(text: str) -> dict | None:
        try:
            d = json.loads(text)
            return d if isinstance(d, dict) and "pid" in d else None
        except ValueError:
            return None

    def acquire(self) -> "WorkdirLock":
        with storage_guard(self.path):
            os.makedirs(self.workdir, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = self._owner(os.pread(fd, 4096, 0).decode("utf-8", "replace")) or {}
            os.close(fd)
            since = owner.get("since")
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
            raise WorkdirLockedError(
                f"{self.workdir} is in use: pid {owner.get('pid', '?')} on host "
                f"{owner.get('host', '?')} (since {since}) holds {self.path}; wait for it to finish "
                f"or use another --workdir") from None
        try:
            self.stale = self._owner(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
            record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "since": time.time()}).encode()
            with storage_guard(self.path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, record, 0)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> "WorkdirLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False
