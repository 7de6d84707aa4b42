"""What the data sets share: split names and their aliases, the cache error, and the
manifest check of an on-disk cache (:mod:`infodiff.data.text`, :mod:`infodiff.data.counts`).

A cache directory holds ``{train,valid,test}.npy`` and ``manifest.json``, written last (the
commit marker) by :func:`write_manifest`; :func:`read_manifest` refuses a manifest whose header
differs from the one this version of infodiff writes.
"""

from __future__ import annotations

import json
import os

from infodiff.files import atomic_write_bytes

__all__ = ["SPLIT_NAMES", "SPLIT_ALIASES", "split_key", "CorpusCacheError", "default_cache_dir",
           "read_manifest", "write_manifest"]

SPLIT_NAMES = ("train", "valid", "test")
SPLIT_ALIASES = {"train": "train", "valid": "valid", "validation": "valid", "test": "test"}


def split_key(name) -> str:
    """The split of ``name``: 'train', 'valid' (alias 'validation') or 'test'; ValueError naming
    any other value."""
    key = SPLIT_ALIASES.get(name) if isinstance(name, str) else None
    if key is None:
        raise ValueError(f"unknown split {name!r}; expected one of 'train', 'valid', 'validation', 'test'")
    return key


class CorpusCacheError(RuntimeError):
    """The on-disk corpus cache is corrupt, stale or inconsistent with its manifest."""


def default_cache_dir() -> str:
    """Cache root: ``$INFODIFF_DATA`` if set (and non-empty), else ``~/.cache/infodiff``."""
    env = os.environ.get("INFODIFF_DATA")
    return os.path.abspath(os.path.expanduser(env if env else os.path.join("~", ".cache", "infodiff")))


def read_manifest(directory: str, header: dict, what: str, fix: str) -> dict:
    """The ``manifest.json`` of the cache ``directory``, checked against ``header`` (every key
    equal). ``what`` names the cache in messages ('corpus cache', 'count-data cache'), ``fix``
    says what to do. Raises CorpusCacheError (one line naming the file or the key)."""
    path = os.path.join(directory, "manifest.json")
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise CorpusCacheError(f"{what} manifest {path} is unreadable ({e}); {fix}") from e
    for key, want in header.items():
        if manifest.get(key) != want:
            raise CorpusCacheError(f"{what} {directory} was built with a different {key!r} "
                                   f"({manifest.get(key)!r}, this version of infodiff expects {want!r}); {fix}")
    return manifest


def write_manifest(directory: str, manifest: dict) -> None:
    """Write ``directory/manifest.json`` (sorted keys, indent 2) atomically: the commit marker,
    written after the split files."""
    atomic_write_bytes(os.path.join(directory, "manifest.json"),
                       (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8"))
