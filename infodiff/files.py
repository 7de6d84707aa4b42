"""Atomic file writes, shared by the data caches (:mod:`infodiff.data`) and the workdir
(:mod:`infodiff.training.workdir`, which adds storage errors naming the path).

A write goes to a uniquely named temporary file ``.<name>.<pid>.<random hex>.tmp`` in the same
directory, is fsynced, then renamed over ``path`` (:func:`os.replace`): a reader sees the old
file or the new one, never a part. ``open(..., "xb")`` (rather than ``mkstemp``, which forces
mode 0600) keeps the user's umask, so a shared ``$INFODIFF_DATA`` stays readable by others.

Several files that belong together (an evaluation's report.json, report.txt and rows.*) are
written as one unit by :func:`write_together`: a complete version directory, then one rename of
a link, so a reader sees every file of the old version or every file of the new one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import time
from typing import BinaryIO, Callable

import numpy as np

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_new", "atomic_save_npy", "write_together", "clean_leftovers", "UNIT_DIR",
           "UnitExistsError"]


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


def atomic_write_new(path: str, data: bytes) -> str:
    """Write ``data`` to a new file, atomically and never over another's: ``path``, or
    ``<stem>-2<ext>``, ``-3``, ... when a file of that name exists (two writers in the same second
    keep both files). The data is written and fsynced under a temporary name, then linked to the
    free name (:func:`os.link` fails if the name exists: the kernel's check). Returns the path
    written; raises what the write raised (no temporary file is left)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    stem, ext = os.path.splitext(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        for n in range(1, 10_000):
            name = path if n == 1 else f"{stem}-{n}{ext}"
            try:
                os.link(tmp, name)
                return name
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, f"no free name beside {path}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_save_npy(path: str, arr: np.ndarray) -> None:
    """Save ``arr`` as ``.npy`` (no pickles) to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda f: np.save(f, arr, allow_pickle=False))


# ---------------------------------------------------------------------------------------------
# Files that belong together as one unit
# ---------------------------------------------------------------------------------------------
# <out_dir>/.reports/<version>/   the files of one evaluation, written completely before use
# <out_dir>/.reports/current      symbolic link to the newest complete <version>: replacing it is
#                                 one rename, so a reader sees every file of the old version or
#                                 every file of the new one, never a mixture
# <out_dir>/<name>                symbolic link to .reports/current/<name> (report.json, report.txt,
#                                 rows.*): the paths users and scripts read stay the same
UNIT_DIR = ".reports"
CURRENT = "current"
KEPT = "kept-"  # .reports/kept-<version>/: an exclusive write that found the unit taken (never cleaned up)
_LINK_ERRNOS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}
_FOREIGN_AGE_S = 3600.0  # a leftover of a process on another host is removed after an hour


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"


def _owner_tag() -> str:
    return f"{_host()}-{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _abandoned(path: str, host: str, pid: int) -> bool:
    """A leftover of a writer that is gone: this host's dead process, or another host's after
    :data:`_FOREIGN_AGE_S` (its process cannot be checked from here)."""
    if host == _host():
        return pid != os.getpid() and not _pid_alive(pid)
    try:
        return time.time() - os.lstat(path).st_mtime > _FOREIGN_AGE_S
    except OSError:
        return False


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not supported by every file system
    finally:
        os.close(fd)


def _current(base: str) -> str | None:
    try:
        return os.readlink(os.path.join(base, CURRENT))
    except OSError:
        return None


_VERSION = re.compile(r"^(?:\.current-)?(?:\d{8}T\d{6}-)?(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]+(?:\.tmp)?$")
_OLD_TMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp$")  # atomic_write's temporary files
_LINK_TMP = re.compile(r"^\.(?P<name>.+)\.link-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]+\.tmp$")


def clean_leftovers(out_dir: str) -> list[str]:
    """Remove what killed writes left in ``out_dir``: temporary files of atomic writes
    (``.report.json.<pid>.<hex>.tmp``) and of links, and unfinished or superseded versions in
    ``.reports/`` of this process or of writers that are gone (a live writer's on this host are
    kept; another host's after :data:`_FOREIGN_AGE_S`). Never touches the version
    ``.reports/current`` names. Returns the removed paths; a failure to remove is ignored (the
    next write tries again)."""
    removed = []
    try:
        names = os.listdir(out_dir)
    except OSError:
        return removed
    for name in names:
        path, m, link = os.path.join(out_dir, name), _OLD_TMP.match(name), _LINK_TMP.match(name)
        if (m and _abandoned(path, _host(), int(m.group("pid")))) or \
                (link and _abandoned(path, link.group("host"), int(link.group("pid")))):
            _remove(path)
            removed.append(path)
    base = os.path.join(out_dir, UNIT_DIR)
    try:
        entries = os.listdir(base)
    except OSError:
        return removed
    current = _current(base)
    for name in entries:
        if name in (CURRENT, current) or name.startswith(KEPT):
            continue
        m = _VERSION.match(name)
        if not m:
            continue
        path, pid = os.path.join(base, name), int(m.group("pid"))
        own = m.group("host") == _host() and pid == os.getpid()
        if own or _abandoned(path, m.group("host"), pid):
            _remove(path)
            removed.append(path)
    return removed


class UnitExistsError(FileExistsError):
    """An exclusive :func:`write_together` found that another writer committed the unit first.
    ``str(e)`` is one line naming the folder, the other writer and where this write's files are
    kept (``kept``); ``hint`` (what to do) is appended."""

    def __init__(self, out_dir: str, holder: str, kept: str, hint: str = ""):
        self.out_dir, self.holder, self.kept = out_dir, holder, kept
        self._msg = (f"{out_dir}: {holder} committed its files there while this write was being prepared; "
                     f"they stay as they are, and this write's files are kept in {kept}/" + (f"; {hint}" if hint else ""))
        super().__init__(errno.EEXIST, self._msg)

    def with_hint(self, hint: str) -> "UnitExistsError":
        return UnitExistsError(self.out_dir, self.holder, self.kept, hint)

    def __str__(self) -> str:
        return self._msg


def _holder(version: str | None) -> str:
    """Who wrote ``version`` (its name holds the writer's host and pid), in words."""
    m = _VERSION.match(version or "")
    return f"pid {m.group('pid')} on {m.group('host')} ({version})" if m else f"another writer ({version})"


def _swap_exclusive(out_dir: str, base: str, version: str) -> None:
    """Point ``base/current`` at ``version`` only if no writer has: :func:`os.symlink` creates the
    link or fails with EEXIST, atomically (the kernel's check, not ours). When taken, the version
    is renamed ``base/kept-<version>`` (never cleaned up), links this write made that point at
    nothing are removed, and :class:`UnitExistsError` is raised."""
    try:
        os.symlink(version, os.path.join(base, CURRENT))
    except FileExistsError:
        kept = os.path.join(base, KEPT + version)
        os.rename(os.path.join(base, version), kept)
        _unlink_dangling(out_dir)
        raise UnitExistsError(out_dir, _holder(_current(base)), kept) from None
    _fsync_dir(base)


def _swap(base: str, version: str) -> None:
    """Point ``base/current`` at ``version`` (one rename)."""
    tmp = os.path.join(base, f".current-{_owner_tag()}-{os.urandom(4).hex()}.tmp")
    os.symlink(version, tmp)
    try:
        os.replace(tmp, os.path.join(base, CURRENT))
    except BaseException:
        _remove(tmp)
        raise
    _fsync_dir(base)


def _link_names(out_dir: str, names) -> None:
    """Make each ``out_dir/<name>`` the link ``.reports/current/<name>``, replacing a regular
    file of an older infodiff in one rename (:func:`_adopt` first makes it a version of its own).
    A link to a file the current version lacks dangles, as if absent, until a version with it
    becomes current."""
    for name in names:
        path, target = os.path.join(out_dir, name), os.path.join(UNIT_DIR, CURRENT, name)
        if os.path.islink(path) and os.readlink(path) == target:
            continue
        tmp = os.path.join(out_dir, f".{name}.link-{_owner_tag()}-{os.urandom(4).hex()}.tmp")
        os.symlink(target, tmp)
        try:
            os.replace(tmp, path)
        except BaseException:
            _remove(tmp)
            raise
    _fsync_dir(out_dir)


def _unlink_dangling(out_dir: str) -> None:
    """Remove the links into ``.reports/current/`` to files the current version lacks (e.g. a
    figure the newest evaluation could not draw)."""
    prefix = os.path.join(UNIT_DIR, CURRENT) + os.sep
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if os.path.islink(path) and os.readlink(path).startswith(prefix) and not os.path.exists(path):
            _remove(path)


def _new_version(base: str, files: dict) -> str:
    """Write ``files`` {name: bytes} into a new version directory under ``base`` (each file
    fsynced, then the directory); return its name. Removes it again if a write fails."""
    version = f"{time.strftime('%Y%m%dT%H%M%S')}-{_owner_tag()}-{os.urandom(4).hex()}"
    vdir = os.path.join(base, version)
    os.mkdir(vdir)
    try:
        for name, data in files.items():
            with open(os.path.join(vdir, name), "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        _fsync_dir(vdir)
    except BaseException:
        _remove(vdir)
        raise
    return version


def _adopt(out_dir: str, base: str, names) -> None:
    """Files written by an older infodiff (regular files ``out_dir/<name>``, not links) become a
    version of their own before the new one replaces them: what a reader sees is unchanged at
    every step (same bytes, first as files, then through the links)."""
    plain = [n for n in names if os.path.isfile(os.path.join(out_dir, n))
             and not os.path.islink(os.path.join(out_dir, n))]
    if not plain:
        return
    shown = {}
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if name in plain or (os.path.islink(path) and os.path.isfile(path)
                             and os.readlink(path) == os.path.join(UNIT_DIR, CURRENT, name)):
            with open(path, "rb") as f:
                shown[name] = f.read()
    _swap(base, _new_version(base, shown))
    _link_names(out_dir, plain)


def _write_plain(out_dir: str, files: dict, exclusive: bool = False) -> list[str]:
    """Each file atomically on its own (a file system without symbolic links). ``exclusive``:
    the first file is claimed first by creating it (``O_EXCL``: fails if another writer has)."""
    paths = []
    if exclusive:
        first = os.path.join(out_dir, next(iter(files)))
        try:
            with open(first, "xb"):
                pass
        except FileExistsError:
            raise UnitExistsError(out_dir, f"another writer ({first})", "(nowhere: not written)") from None
    for name, data in files.items():
        path = os.path.join(out_dir, name)
        atomic_write_bytes(path, data)
        paths.append(path)
    return paths


def write_together(out_dir: str, files: dict, exclusive: bool = False) -> list[str]:
    """Write ``files`` {name: bytes} into ``out_dir`` as one unit and return their paths
    (``out_dir/<name>``, in order): a new version directory ``out_dir/.reports/<version>/`` is
    written completely (fsync), then the link ``.reports/current`` is replaced by one pointing
    to it (one rename), and ``out_dir/<name>`` are links to ``.reports/current/<name>``. Killed at
    any moment, every ``out_dir/<name>`` shows the old version or every one shows the new.
    Leftovers of killed writes are removed first (:func:`clean_leftovers`), superseded versions
    after. Where the file system has no symbolic links each file is written atomically on its
    own (a warning says so).

    ``exclusive``: the unit is committed only if no writer has committed one in ``out_dir``
    (checked at the commit, atomically: :func:`_swap_exclusive`); otherwise this write's files
    are kept in ``.reports/kept-<version>/`` and :class:`UnitExistsError` is raised (a first
    file of an older infodiff, not a link, counts as committed; its other files are replaced).

    Raises OSError if out_dir is full, read-only or not writable (the caller names it:
    ``infodiff.training.workdir.storage_guard``); the files shown before stay as they were."""
    names = list(files)
    made = []  # directories this write creates (removed again if it fails before showing anything)
    d = os.path.abspath(out_dir)
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        made.append(d)
        d = os.path.dirname(d)
    os.makedirs(out_dir, exist_ok=True)
    clean_leftovers(out_dir)
    base = os.path.join(out_dir, UNIT_DIR)
    try:  # two writers may both find no .reports/: one makes it, the other uses it
        os.mkdir(base)
        made_base = True
    except FileExistsError:
        made_base = False
    try:
        version = _new_version(base, files)
    except BaseException:
        if made_base:
            shutil.rmtree(base, ignore_errors=True)  # as it was: nothing shown has changed
        for d in made:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise
    try:
        if exclusive:
            first = os.path.join(out_dir, names[0])  # another file of an older infodiff is replaced, not adopted
            if os.path.isfile(first) and not os.path.islink(first):
                kept = os.path.join(base, KEPT + version)
                os.rename(os.path.join(base, version), kept)
                raise UnitExistsError(out_dir, "an older infodiff (plain files)", kept)
            _link_names(out_dir, names)  # they dangle (absent) until the swap
            _swap_exclusive(out_dir, base, version)
        else:
            _adopt(out_dir, base, names)
            _link_names(out_dir, names)  # the new names dangle (absent) until the swap
            _swap(base, version)
    except UnitExistsError:
        raise
    except OSError as e:
        no_links = e.errno in _LINK_ERRNOS and _current(base) is None
        if _current(base) != version:
            _remove(os.path.join(base, version))
        if not no_links:
            raise
        if made_base:
            shutil.rmtree(base, ignore_errors=True)
        from absl import logging

        logging.warning("%s: no symbolic links on this file system (%s); the report's files are written "
                        "one by one, each atomically", out_dir, e)
        return _write_plain(out_dir, files, exclusive)
    _unlink_dangling(out_dir)
    clean_leftovers(out_dir)
    return [os.path.join(out_dir, n) for n in names]
