"""Read a released checkpoint's files: ``config.json`` and its tensors, checked before use.

Layouts read (what the hub's ``from_pretrained`` code writes):
  - ``model.safetensors`` (one file), or ``model.safetensors.index.json`` with its shards
    (``weight_map``: tensor name -> shard file), read with ``safetensors``' NumPy API (BF16
    tensors through its Flax API, kept as ``ml_dtypes.bfloat16`` NumPy arrays);
  - a PyTorch file (``.ckpt``, ``.pth``, ``.bin``) holding a state dict (or one under ``state_dict``
    / ``model``) only when ``torch`` is importable; a training checkpoint with an ``ema`` entry
    (SEDD's checkpoint.pth, MDLM's Lightning .ckpt) is refused rather than read without its EMA.

Every failure is a :class:`PretrainedError` with a one-line message naming the file or the first
few tensors; nothing is returned half-read. :func:`check_shapes` compares the tensors with the
names and shapes an architecture expects from its config (before anything runs).
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib

import numpy as np

from infodiff.pretrained.base import PretrainedError

__all__ = ["read_config", "read_tensors", "check_shapes", "write_safetensors", "TORCH_SUFFIXES"]

TORCH_SUFFIXES = (".ckpt", ".pth", ".bin", ".pt")
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHOW = 3  # names listed in a one-line error


def _directory(path) -> pathlib.Path:
    p = pathlib.Path(path)
    if not p.exists():
        raise PretrainedError(f"{str(p)!r} does not exist: give the directory holding config.json and the weights")
    if not p.is_dir():
        raise PretrainedError(f"{str(p)!r} is a file: give the directory holding config.json and the weights")
    return p


def read_config(path) -> dict:
    """``path/config.json`` as a dict. Raises PretrainedError for a missing or unreadable file."""
    d = _directory(path)
    f = d / "config.json"
    if not f.is_file():
        raise PretrainedError(f"{str(d)!r} has no config.json: is it a downloaded checkpoint directory "
                              f"(config.json + model.safetensors)?")
    try:
        config = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PretrainedError(f"{str(f)!r} is not readable JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise PretrainedError(f"{str(f)!r} holds a {type(config).__name__}, not a JSON object")
    return config


def _read_safetensors(file: pathlib.Path, names=None) -> dict[str, np.ndarray]:
    """The tensors of one .safetensors file (all, or ``names``) as NumPy arrays."""
    from safetensors import safe_open

    out = {}
    try:
        with safe_open(str(file), framework="np") as f:
            keys = list(f.keys()) if names is None else list(names)
            bf16 = []
            for k in keys:
                if k not in f.keys():
                    raise PretrainedError(f"{str(file)!r} lacks tensor {k!r} that its index maps to it")
                try:
                    out[k] = f.get_tensor(k)
                except (TypeError, KeyError, ValueError):
                    bf16.append(k)  # a dtype NumPy lacks (BF16): read through the Flax API below
        if bf16:
            with safe_open(str(file), framework="flax") as f:
                for k in bf16:
                    out[k] = np.asarray(f.get_tensor(k))
    except PretrainedError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for a bad file
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PretrainedError(f"{str(file)!r} is not a readable safetensors file (truncated or corrupt?): {msg}") from None
    return out


def _read_torch(file: pathlib.Path) -> dict[str, np.ndarray]:
    """A PyTorch checkpoint's state dict (``state_dict`` / ``model`` entry if nested) as NumPy."""
    try:  # optional: torch is no infodiff dependency (imported by name, so no static import of it)
        torch = importlib.import_module("torch")
    except ImportError:
        raise PretrainedError(f"{str(file)!r} is a PyTorch checkpoint and torch is not installed: pip install torch "
                              f"(CPU is enough), or convert it to model.safetensors") from None
    try:
        obj = torch.load(str(file), map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001
        raise PretrainedError(f"{str(file)!r} is not a readable PyTorch checkpoint: {str(e).splitlines()[0]}") from None
    if isinstance(obj, dict) and "ema" in obj:  # a training checkpoint: evaluation uses the EMA weights
        raise PretrainedError(f"{str(file)!r} is a training checkpoint with EMA weights ('ema' entry), which this "
                              f"reader does not apply: export the EMA weights to model.safetensors (the hub layout)")
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        raise PretrainedError(f"{str(file)!r} holds a {type(obj).__name__}, not a state dict")
    return {k: v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
            for k, v in obj.items() if hasattr(v, "detach")}


def read_tensors(path) -> tuple[dict[str, np.ndarray], str]:
    """All tensors of the checkpoint in directory ``path`` and the file(s) they came from.

    Order of preference: ``model.safetensors.index.json`` (sharded), ``model.safetensors``, a
    single PyTorch file. Raises PretrainedError: no weights, a shard missing, a truncated file,
    several PyTorch files (name one), torch missing for a PyTorch file.
    """
    d = _directory(path)
    index = d / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PretrainedError(f"{str(index)!r} is not a safetensors index (a JSON object with weight_map): "
                                  f"{type(e).__name__}") from None
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        missing = [s for s in shards if not (d / s).is_file()]
        if missing:
            raise PretrainedError(f"{str(d)!r} lacks shard(s) {', '.join(missing[:SHOW])} of {len(shards)} listed in "
                                  f"{INDEX}: download them all")
        out = {}
        for shard, names in sorted(shards.items()):
            out.update(_read_safetensors(d / shard, names))
        return out, INDEX
    if (d / SINGLE).is_file():
        return _read_safetensors(d / SINGLE), SINGLE
    torch_files = sorted(p.name for p in d.iterdir() if p.suffix in TORCH_SUFFIXES and p.is_file())
    if len(torch_files) == 1:
        return _read_torch(d / torch_files[0]), torch_files[0]
    if torch_files:
        raise PretrainedError(f"{str(d)!r} holds several PyTorch files ({', '.join(torch_files[:SHOW])}): "
                              f"keep the one to load in its own directory beside config.json")
    raise PretrainedError(f"{str(d)!r} has no weights: expected {SINGLE}, {INDEX} with its shards, or a PyTorch "
                          f"file ({'/'.join(TORCH_SUFFIXES)})")


def _listed(items) -> str:
    items = list(items)
    more = f" and {len(items) - SHOW} more" if len(items) > SHOW else ""
    return ", ".join(items[:SHOW]) + more


def check_shapes(tensors: dict, expected: dict, kind: str, optional=()) -> None:
    """Raise PretrainedError unless ``tensors`` holds exactly the ``expected`` names (name ->
    shape tuple; names in ``optional`` may be absent) with those shapes; the message names the
    first few missing, extra or mis-shaped tensors with their shapes."""
    missing = [f"{k} {tuple(s)}" for k, s in expected.items() if k not in tensors and k not in optional]
    extra = [f"{k} {tuple(np.shape(v))}" for k, v in tensors.items() if k not in expected]
    wrong = [f"{k} {tuple(np.shape(tensors[k]))} (config gives {tuple(s)})" for k, s in expected.items()
             if k in tensors and tuple(np.shape(tensors[k])) != tuple(s)]
    if missing or extra or wrong:
        parts = []
        if wrong:
            parts.append(f"shapes differ from config.json: {_listed(wrong)}")
        if missing:
            parts.append(f"missing: {_listed(missing)}")
        if extra:
            parts.append(f"unrecognised: {_listed(extra)}")
        raise PretrainedError(f"not a {kind} checkpoint matching its config.json ({len(tensors)} tensors read); "
                              + "; ".join(parts))


def write_safetensors(tensors: dict[str, np.ndarray], file, metadata: dict | None = None) -> None:
    """Write ``tensors`` to ``file`` atomically (a temporary file renamed into place)."""
    from safetensors.numpy import save_file

    file = str(file)
    tmp = f"{file}.tmp{os.getpid()}"
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=metadata)
    os.replace(tmp, file)
