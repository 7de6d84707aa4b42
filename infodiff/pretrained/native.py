"""An infodiff run exported as a checkpoint (``infodiff export``, :mod:`infodiff.pretrained.export`):
``config.json`` with ``model_type: "infodiff"``, the run's config and which parameters were
saved; ``model.safetensors`` with the network's parameters, one tensor per leaf named by its
path joined with '/'. Read back, it is the run's own network: ``load_pretrained`` builds the same
Run as :func:`infodiff.load_run` (its task, process and tokenizer), bit-identical parameters.
"""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from infodiff.pretrained import safetensors_io
from infodiff.pretrained.base import Loaded, PretrainedError

__all__ = ["KINDS", "MODEL_TYPE", "detect", "load", "flatten", "unflatten", "task_of"]

MODEL_TYPE = "infodiff"
KINDS = (MODEL_TYPE,)
SEP = "/"


def detect(config: dict) -> str | None:
    """'infodiff' for an exported run's config.json, else None."""
    return MODEL_TYPE if config.get("model_type") == MODEL_TYPE else None


def flatten(params, leaf_fn=np.asarray) -> dict:
    """A parameter pytree (nested dicts) -> {'a/b/kernel': leaf_fn(leaf)}."""
    return {SEP.join(str(getattr(k, "key", k)) for k in path): leaf_fn(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def unflatten(flat: dict) -> dict:
    """Inverse of :func:`flatten` (nested dicts of arrays)."""
    out: dict = {}
    for name, v in flat.items():
        node = out
        *parents, leaf = name.split(SEP)
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def task_of(config: dict):
    """The run's task from an exported config.json. Raises PretrainedError when it is not one."""
    from infodiff import tasks

    run_config = config.get("config")
    if not isinstance(run_config, dict):
        raise PretrainedError("config.json (model_type infodiff) lacks the run's config under 'config'")
    try:
        return tasks.make_task(ml_collections.ConfigDict(run_config))
    except (KeyError, ValueError, AttributeError) as e:
        raise PretrainedError(f"config.json (model_type infodiff): the run's config is not usable: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def load(directory: pathlib.Path, config: dict, kind: str, dtype=jnp.float32) -> Loaded:
    """The exported run's network; ``apply(params, x, s)`` is its denoiser with the library's
    noise input s (masked: the time t; SEDD: the noise level lam), the library's ids."""
    task = task_of(config)
    shapes = jax.eval_shape(task.init_params, jax.random.key(0))
    expected = flatten(shapes, lambda s: tuple(s.shape))
    tensors, source = safetensors_io.read_tensors(directory)
    safetensors_io.check_shapes(tensors, expected, "infodiff (exported run)")
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype), unflatten(tensors))  # float32: the saved bits
    den = task.denoiser(params)
    graph = getattr(den, "graph", None)  # a score model (SEDD) declares its graph
    return Loaded(apply=jax.jit(den.apply_params), params=params, kind=kind, vocab_size=int(task.vocab_size),
                  mask_id=-1 if graph == "uniform" else int(task.vocab_size), max_seq_len=int(task.seq_len),
                  output="logits" if graph is None else "log_score", time_conditioned=True,
                  info={"task": task, "weights": source, "params": config.get("params"),
                        "checkpoint_step": config.get("checkpoint_step")})
