"""BD3-LM (block diffusion, Arriola et al. 2025, arXiv 2503.09573) in JAX, reading its released
weights as they are (kuleshov-group/bd3lm-owt-block_size{4,8,16} on the hub).

Network: the DiT of :mod:`infodiff.pretrained.dit` (MDLM's, same tensor names under ``backbone.``)
run on BD3-LM's two-copy input of 2L tokens, ``[x_t, x_0]`` (the noisy sequence, then the clean
one), each copy with its own rotary positions 0..L-1, under the block-diffusion attention mask
(:func:`block_diff_mask`, BD3-LM Sec. 3.2 / App. B, the official ``block_diff_mask``):

  - a noisy token attends to the noisy tokens of its own block (block diagonal) and to the clean
    tokens of the blocks before it (offset block-causal);
  - a clean token attends to the clean tokens of its block and the blocks before (block-causal).

The output is kept for the noisy copy (the first L positions) and goes through MDLM's SUBS
parametrisation (:func:`infodiff.pretrained.dit.mdlm_subs`: the mask logit at -1e6, log-softmax,
unmasked tokens carried over). Without ``time_conditioning`` (the released checkpoints) sigma is
replaced by zeros, as the hub's ``DITBackbone.forward`` does.

Raw output (``Loaded.apply(params, x_Bx2L, sigma_B)``): ``x_Bx2L`` is the published network's
input, the two copies concatenated; the output is float32 [B, L, V]. The library's masked
denoiser contract (``z_BxL``: the clean prefix, the scored block partly masked, later blocks
masked; :mod:`infodiff.processes.block`) is :func:`network_input`: both copies are z. Block b's
output reads only the noisy copy of block b and the clean copy of the blocks before it, so it is
exactly p(x^b | x^{<b}, the unmasked part of z^b), whatever the later blocks hold.

Checkpoint layout (config.json + model.safetensors, the hub's ``BD3LM`` model): ``model_type:
"bd3lm"``, ``block_size``, ``vocab_size``, ``model_length``, ``hidden_dim``, ``cond_dim``,
``n_blocks``, ``n_heads``, ``time_conditioning``, ``cross_attn`` (must be true: the two-copy
network), ``adaln`` (true), ``causal`` (false); tensors ``backbone.*`` as MDLM's plus the scalar
buffers ``sampling_eps_min`` / ``sampling_eps_max`` (read, not used for the likelihood).
"""
from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.pretrained import dit, safetensors_io
from infodiff.pretrained.base import Loaded, PretrainedError

__all__ = ["KINDS", "detect", "load", "block_diff_mask", "forward", "network_input", "arch_of"]

BD3LM = "bd3lm"
KINDS = (BD3LM,)
BLOCK_CAUSAL_CLEAN = True  # the clean copy attends block-causally (not only within its block)
ROTARY_PER_COPY = True  # each copy has rotary positions 0..L-1 (not 0..2L-1 over the concatenation)


def detect(config: dict) -> str | None:
    """'bd3lm' for the hub's BD3LM config (``model_type: bd3lm``), else None."""
    return BD3LM if config.get("model_type") == BD3LM else None


def arch_of(config: dict) -> tuple[dit.Arch, int]:
    """(the DiT's :class:`~infodiff.pretrained.dit.Arch`, the block size L') of a BD3-LM config.
    Raises PretrainedError (one line) for a missing key, a network that is not the two-copy
    bidirectional DiT with adaLN, or a block size not dividing ``model_length``."""
    get = lambda k: dit.config_value(config, k, BD3LM)  # noqa: E731
    for key, want in (("cross_attn", True), ("adaln", True), ("causal", False)):
        if bool(config.get(key, want)) != want:
            raise PretrainedError(f"config.json {key}={config[key]!r}: the bd3lm port reads the released "
                                  f"block-diffusion network ({key}={str(want).lower()})")
    V, L, bs = int(get("vocab_size")), int(get("model_length")), int(get("block_size"))
    if bs < 1 or L % bs:
        raise PretrainedError(f"config.json block_size={bs} does not divide model_length={L}")
    a = dit.Arch(BD3LM, V, int(get("hidden_dim")), int(get("cond_dim")), int(get("n_blocks")), int(get("n_heads")),
                 L, "backbone.", bool(config.get("time_conditioning", False)), False, "absorb", V - 1)
    if a.hidden % a.n_heads or (a.hidden // a.n_heads) % 2:
        raise PretrainedError(f"config.json: hidden_dim {a.hidden} is not n_heads={a.n_heads} times an even head width")
    return a, bs


def block_diff_mask(L: int, block_size: int) -> np.ndarray:
    """bool [2L, 2L] (query, key) over ``[x_t, x_0]``: block diagonal within each copy's blocks,
    noisy -> clean blocks strictly before, clean -> clean blocks up to its own (module docstring)."""
    idx = np.arange(2 * L)
    clean = idx >= L
    block = np.where(clean, idx - L, idx) // block_size
    bq, bk, cq, ck = block[:, None], block[None, :], clean[:, None], clean[None, :]
    diagonal = (bq == bk) & (cq == ck)
    offset_causal = (bq > bk) & ck & ~cq
    causal_clean = ((bq >= bk) if BLOCK_CAUSAL_CLEAN else (bq == bk)) & ck & cq
    return diagonal | offset_causal | causal_clean


def forward(a: dit.Arch, block_size: int, params, x_Bx2L, sigma_B):
    """Raw output float32 [B, L, V] (SUBS log-probabilities of the noisy copy) of the network at
    int32 ``x_Bx2L`` = [x_t, x_0] and float32 sigma_B (ignored without time conditioning)."""
    x = jnp.asarray(x_Bx2L, jnp.int32)
    if x.shape[1] != 2 * a.max_seq_len:
        raise ValueError(f"a bd3lm network takes [x_t, x_0] of 2 x {a.max_seq_len} tokens; got width {x.shape[1]}")
    L = a.max_seq_len
    sigma_B = jnp.broadcast_to(jnp.asarray(sigma_B, jnp.float32).reshape(-1), x.shape[:1])
    net_sigma = sigma_B if a.time_conditioned else jnp.zeros_like(sigma_B)
    out = dit.backbone(a, params, x, net_sigma, mask_LxL=block_diff_mask(L, block_size),
                       positions=np.arange(2 * L) % (L if ROTARY_PER_COPY else 2 * L))[:, :L]
    return dit.mdlm_subs(a, out, x[:, :L])


def network_input(z_BxL):
    """The two-copy input [z, z] of the masked denoiser contract (module docstring): int32 [B, 2L]."""
    z = jnp.asarray(z_BxL, jnp.int32)
    return jnp.concatenate([z, z], axis=1)


def load(directory: pathlib.Path, config: dict, kind: str, dtype=jnp.float32) -> Loaded:
    """A :class:`Loaded` BD3-LM from ``directory``; every tensor checked against the config's
    shapes first. Raises PretrainedError (one line) for a config or tensors that do not fit."""
    a, bs = arch_of(config)
    tensors, source = safetensors_io.read_tensors(directory)
    expected, optional = dit.expected_shapes(a)
    scalars = {"sampling_eps_min": (), "sampling_eps_max": ()}
    safetensors_io.check_shapes(tensors, {**expected, **scalars}, BD3LM, optional | set(scalars))
    dit.check_inv_freq(tensors, a)
    params = dit.params_of(tensors, a, dtype)
    apply = jax.jit(lambda params, x_Bx2L, sigma_B: forward(a, bs, params, x_Bx2L, sigma_B))
    info = {"graph": "absorb", "weights": source, "block_size": bs, "arch": dataclasses.asdict(a),
            "noise": {"type": "loglinear", "eps": 1e-3},
            "sampling_eps": [float(np.asarray(tensors[k])) for k in scalars if k in tensors]}
    return Loaded(apply=apply, params=params, kind=kind, vocab_size=a.vocab_size, mask_id=a.mask_id,
                  max_seq_len=a.max_seq_len, output="logits", time_conditioned=a.time_conditioned, info=info)
