"""``infodiff export --workdir W --out DIR``: an infodiff run as a checkpoint directory
(``config.json`` + ``model.safetensors``, :mod:`infodiff.pretrained.native`) that
:func:`infodiff.load_pretrained` reads back bit-identically (the same Run as ``load_run(W)``).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import ml_collections
import numpy as np

from infodiff.pretrained import native, safetensors_io
from infodiff.pretrained.base import PretrainedError

__all__ = ["export"]


def export(workdir: str, out: str, *, ema: bool | None = None) -> str:
    """Write the newest verified checkpoint of the run in ``workdir`` (EMA parameters unless
    ``ema`` is False; default the run's ``eval.use_ema``) to the new directory ``out``, atomically
    (a temporary directory renamed into place). Returns ``out``. Raises PretrainedError (one line)
    for an existing non-empty ``out``; FileNotFoundError for a workdir that is not a run."""
    from infodiff import tasks, training

    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise PretrainedError(f"--out {out!r} exists and is not an empty directory: give a new directory")
    if not os.path.isdir(workdir):
        raise FileNotFoundError(f"--workdir {workdir!r} does not exist (a training run's directory)")
    saved = training.saved_config(workdir)
    config = ml_collections.ConfigDict(saved)
    use_ema = bool(config.eval.get("use_ema", True)) if ema is None else bool(ema)
    task = tasks.make_task(config)
    params, meta = training.load_params(workdir, task, ema=use_ema)
    flat = native.flatten(params, lambda a: np.asarray(a))
    info = {"model_type": native.MODEL_TYPE, "config": saved, "params": "ema" if use_ema else "raw",
            "checkpoint_step": int(meta["step"]), "state_sha256": meta.get("state_sha256")}
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        safetensors_io.write_safetensors(flat, os.path.join(tmp, safetensors_io.SINGLE),
                                         metadata={"format": "infodiff"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(info, f, indent=1, sort_keys=True)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
