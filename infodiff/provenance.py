"""Provenance of a result file: what made it, so that a number in a paper can be traced back.

:func:`collect` builds the one ``provenance`` block written into every result file: evaluate's
``report.json`` (every mode; the per-row files ``rows.jsonl`` / ``rows.csv`` are written with it
as one unit in the same directory and listed in its ``files``), ``run_experiment``'s
``results.json``, and the metadata of every training checkpoint. Keys (docs/report.md):

* ``packages``: versions of :data:`PACKAGES` (None for one that is not installed) and infodiff;
* ``python``, ``host``, ``devices`` (``platform``, ``kind``, ``count``), ``processes``;
* ``checkpoint``: ``{"step", "state_sha256"}`` of the checkpoint evaluated (the SHA-256 of its
  state's arrays written at save, infodiff/training/checkpoint.py), or None;
* ``data``: the digest of the data (``{"name", "split", "sha256"}`` of a corpus split, the
  checksums the tasks compute; ``{"path", "sha256"}`` of an input file), or None;
* ``argv``: the command line as given (``sys.orig_argv``: the interpreter first);
* ``git``: ``{"revision", "dirty"}`` of the checkout the package was imported from, or the string
  ``'not a git checkout'`` (an installed package).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys

__all__ = ["PACKAGES", "NOT_A_CHECKOUT", "collect", "git_info", "package_versions", "checkpoint_info"]

# The distributions whose versions decide the numbers (requirements.txt pins them).
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy", "ml-collections")
NOT_A_CHECKOUT = "not a git checkout"


def git_info(path: str | None = None) -> dict | None:
    """``{"revision": commit sha, "dirty": uncommitted changes to tracked files}`` of the git
    checkout holding ``path`` (default: this package), or None (not a checkout, or no git)."""
    cwd = path or os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                            capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"revision": rev.stdout.strip(), "dirty": bool(st.stdout.strip()) if st.returncode == 0 else None}


def package_versions() -> dict:
    """``{distribution: version or None}`` of :data:`PACKAGES`, and ``infodiff`` (the package's
    ``__version__``: a checkout is not necessarily installed)."""
    import infodiff

    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["infodiff"] = infodiff.__version__
    return out


def checkpoint_info(meta: dict) -> dict:
    """``{"step", "state_sha256"}`` of a checkpoint's metadata (``training.load_params``)."""
    return {"step": int(meta["step"]), "state_sha256": meta.get("state_sha256")}


def collect(*, checkpoint: dict | None = None, data: dict | None = None) -> dict:
    """The ``provenance`` block (module docstring). Call after JAX's backend is up (it reads the
    devices)."""
    import jax

    devices = jax.devices()
    return {"packages": package_versions(), "python": platform.python_version(), "host": socket.gethostname(),
            "devices": {"platform": jax.default_backend(), "kind": devices[0].device_kind, "count": len(devices)},
            "processes": jax.process_count(), "checkpoint": checkpoint, "data": data, "argv": list(sys.orig_argv),
            "git": git_info() or NOT_A_CHECKOUT}
