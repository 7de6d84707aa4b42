"""Released discrete diffusion language models (SEDD, MDLM, LLaDA ...) loaded natively in JAX.

:func:`load` reads a local checkpoint directory (``config.json`` + weights, docs/pretrained.md)
into a :class:`~infodiff.pretrained.base.Loaded`. Architectures are modules of this package
that declare ``KINDS``, ``detect(config)`` and ``load(directory, config, kind, dtype)``; they are
found automatically (:func:`architectures`), so a new port is one new module.
"""
from __future__ import annotations

import importlib
import pathlib
import pkgutil

import jax
import jax.numpy as jnp

from infodiff.pretrained import safetensors_io
from infodiff.pretrained.base import Loaded, PretrainedError

__all__ = ["load", "detect_kind", "architectures", "is_checkpoint_dir", "shard", "SHARDING_RULES", "Loaded",
           "PretrainedError"]

_NOT_ARCHITECTURES = {"base", "safetensors_io", "tokenizer", "export", "run"}


def architectures() -> dict:
    """kind name -> the module porting it, for every module of this package with ``KINDS``."""
    kinds = {}
    for info in pkgutil.iter_modules([str(pathlib.Path(__file__).parent)]):
        if info.name in _NOT_ARCHITECTURES or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for kind in getattr(module, "KINDS", ()):
            kinds[kind] = module
    return kinds


def is_checkpoint_dir(path) -> bool:
    """Whether directory ``path`` holds released weights (model.safetensors, its index, or a PyTorch
    file) rather than an infodiff training run (whose checkpoints are orbax folders)."""
    p = pathlib.Path(path)
    return p.is_dir() and ((p / safetensors_io.SINGLE).is_file() or (p / safetensors_io.INDEX).is_file()
                           or any(f.suffix in safetensors_io.TORCH_SUFFIXES for f in p.iterdir() if f.is_file()))


def detect_kind(config: dict, path="") -> str:
    """The kind a ``config.json`` dict describes. Raises PretrainedError when no port knows it."""
    archs = architectures()
    found = {m.detect(config) for m in set(archs.values())} - {None}
    if len(found) != 1:
        keys = ", ".join(sorted(config)[:6])
        raise PretrainedError(f"config.json in {str(path)!r} is not a checkpoint infodiff can read (keys: {keys}); "
                              f"known kinds: {', '.join(sorted(archs))}" if not found else
                              f"config.json in {str(path)!r} matches several kinds {sorted(found)}: pass kind=")
    return found.pop()


# Which released weights are split along the mesh's 'fsdp' axis, in the rule format of
# infodiff.parallel.FSDP_RULES (first match wins; "largest": the leaf's largest axis the fsdp size
# divides): every weight matrix and embedding (the ports' names vary: q_proj, attn_qkv.weight, wte,
# lm_head ...), while norms' scales and biases stay whole on every device, as in training.
SHARDING_RULES = (
    (r"(norm|ln_f|bias)", None),
    (r".*", "largest"),
)


def shard(loaded: Loaded, mesh) -> Loaded:
    """``loaded`` with its parameters placed over ``mesh`` (a :func:`infodiff.parallel.make_mesh`
    mesh): split along 'fsdp' by :data:`SHARDING_RULES` (an exported infodiff run: the training
    code's :data:`infodiff.parallel.FSDP_RULES`), replicated over 'data'. The jitted network then
    runs on the sharded weights (XLA gathers them per layer): the same function, so the same
    numbers up to float rounding."""
    from jax.sharding import NamedSharding, PartitionSpec

    from infodiff import parallel

    rules = parallel.FSDP_RULES if loaded.kind == "infodiff" else SHARDING_RULES
    specs = parallel.param_specs(loaded.params, mesh, rules)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    return loaded._replace(params=jax.device_put(loaded.params, shardings))


def load(path, kind: str | None = None, dtype=jnp.float32, mesh=None) -> Loaded:
    """The released network in directory ``path`` (kind detected from config.json; ``kind``
    overrides but must agree with it), weights as ``dtype``, sharded over ``mesh`` if given
    (:func:`shard`). Raises PretrainedError (one line): wrong directory, unknown or other kind,
    tensors that do not match the config."""
    directory = pathlib.Path(path)
    config = safetensors_io.read_config(directory)
    archs = architectures()
    if kind is not None and kind not in archs:
        raise PretrainedError(f"kind={kind!r} is not known; choose from {', '.join(sorted(archs))}")
    detected = detect_kind(config, directory)
    if kind is not None and kind != detected:
        raise PretrainedError(f"{str(directory)!r} holds a {detected} checkpoint (config.json), not {kind}: "
                              f"drop kind= or give a {kind} checkpoint")
    loaded = archs[detected].load(directory, config, detected, dtype)
    return loaded if mesh is None else shard(loaded, mesh)
