"""What every released-model port returns: ``Loaded``, the network with its weights and facts.

Each architecture module under ``infodiff/pretrained/`` (``dit.py``, ``llada.py`` ...) declares
``KINDS`` (the kind names it serves), ``detect(config) -> kind | None`` (reads a checkpoint's
``config.json`` dict) and ``load(directory, config, kind, dtype) -> Loaded``; the registry in
``infodiff/pretrained/__init__.py`` discovers them.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Loaded(NamedTuple):
    """A released network in JAX with its weights, as its source computes it.

    apply: ``apply(params, x_BxL int32, sigma_B float32) -> float32 _BxLxV``, the source network's
      raw output (logits, or log-scores for SEDD), so a port can be checked against its source.
    params: pytree of jnp arrays in the dtype asked for.
    kind: the architecture/kind name (``sedd``, ``mdlm``, ``llada`` ...).
    vocab_size: V, the width of the output (mask token included where there is one).
    mask_id: the absorbing (mask) token id; -1 where the process has none (uniform graph).
    max_seq_len: the longest sequence the network was built for (rotary/positions), in tokens.
    output: ``'logits'`` (mean parametrisation, MDLM/LLaDA) or ``'log_score'`` (SEDD).
    time_conditioned: whether ``apply`` reads ``sigma_B`` at all.
    info: anything else (graph, noise schedule parameters, tokenizer path ...).
    """

    apply: Callable
    params: Any
    kind: str
    vocab_size: int
    mask_id: int
    max_seq_len: int
    output: str
    time_conditioned: bool
    info: dict


class PretrainedError(ValueError):
    """A checkpoint that cannot be loaded as asked; its message is one line for the user."""
