"""LLaDA (Nie et al. 2025, "Large Language Diffusion Models", arXiv 2502.09992) in JAX, loading the
released checkpoints (GSAI-ML/LLaDA-8B-Base, -Instruct, LLaDA-1.5) as they are published.

The network is the hub's ``modeling_llada.py`` (``LLaDAModelLM`` with ``block_type: llama``), a
LLaMA-style transformer with BIDIRECTIONAL attention and no time input:

    h = wte[x]                                             (x sqrt(d_model) if input_emb_norm)
    per block:  h += attn_out(attention(rope(q), rope(k), v))   q, k, v = *_proj(RMSNorm(h))
                h += ff_out(silu(ff_proj(u)) * up_proj(u))      u = RMSNorm(h)
    logits = ff_out(RMSNorm(h))                            (wte^T if weight_tying; / sqrt(d_model)
                                                             if scale_logits)

- RMSNorm: ``w * (x / sqrt(mean(x^2) + eps))`` computed in float32, cast back before the weight;
  eps = ``rms_norm_eps``.
- Rotary: head dim ``hd = d_model / n_heads``, ``inv_freq = rope_theta^(-arange(0, hd, 2)/hd)``,
  tables ``cat(freqs, freqs)``, the GPT-NeoX "rotate half" layout (first half / second half),
  applied to q and k in float32 (``rope_full_precision``), positions 0..L-1.
- Attention: softmax(q k^T / sqrt(hd)) v over all positions, no mask; ``n_kv_heads < n_heads``
  repeats each key/value head for ``n_heads / n_kv_heads`` consecutive query heads.
- Output: logits over ``embedding_size`` ids (126464 for the 8B models) including the mask id
  (126336); the model's raw logit on the mask id is returned as it is. The masked-diffusion
  denoiser (:func:`logprobs`) sets it to -inf before the log-softmax (:mod:`infodiff.external`).

Checkpoint layout: ``config.json`` + ``model.safetensors.index.json`` and its shards (BF16), tensor
names ``model.transformer.{wte, ln_f, ff_out}.weight`` and ``model.transformer.blocks.N.{attn_norm,
ff_norm, q_proj, k_proj, v_proj, attn_out, ff_proj, up_proj, ff_out}.weight`` with PyTorch's
[out, in] Linear layout (kept as is: the matmuls contract the last axis). Every name and shape is
checked against config.json before anything runs. Options the published configs leave off and
this port does not implement (ALiBi, q/k LayerNorm, biases, other block or norm types) are
refused with one line naming the key.
"""
from __future__ import annotations

import functools
import math
import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.pretrained import safetensors_io
from infodiff.pretrained.base import Loaded, PretrainedError

__all__ = ["KINDS", "detect", "load", "Arch", "parse_config", "expected_shapes", "forward", "rms_norm",
           "rotary", "attention", "linear", "gather_params", "logprobs", "config_int", "config_bool",
           "config_float", "compute_dtype"]

KINDS = ("llada",)
PREFIX = "model.transformer."
BLOCK_TENSORS = ("attn_norm", "ff_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")

# Defaults of ``ModelConfig`` in the hub's configuration_llada.py: ``LLaDAConfig`` fills every key
# config.json omits with them.
DEFAULTS = {
    "d_model": 768, "n_heads": 12, "n_kv_heads": None, "n_layers": 12, "mlp_ratio": 4, "mlp_hidden_size": None,
    "activation_type": "swiglu", "block_type": "sequential", "block_group_size": 1, "alibi": False, "rope": False,
    "rope_full_precision": True, "multi_query_attention": None, "attention_layer_norm": False,
    "input_emb_norm": False, "layer_norm_type": "default", "layer_norm_with_affine": True, "rms_norm_eps": 1e-5,
    "max_sequence_length": 1024, "rope_theta": 10000.0, "include_qkv_bias": False, "include_bias": False,
    "bias_for_layer_norm": None, "scale_logits": False, "vocab_size": 50257, "embedding_size": 50304,
    "weight_tying": True, "mask_token_id": 50256,
}
# Keys whose value this port requires (the published LLaDA configs' values), and why.
REQUIRED = {
    "block_type": ("llama", "the LLaMA-style block of the released models"),
    "activation_type": ("silu", "silu(ff_proj) * up_proj, as the released models"),
    "layer_norm_type": ("rms", "RMSNorm, as the released models"),
    "rope": (True, "rotary positions, as the released models"),
    "alibi": (False, "ALiBi is not implemented"),
    "attention_layer_norm": (False, "q/k LayerNorm is not implemented"),
    "block_group_size": (1, "grouped blocks name their tensors differently"),
    "layer_norm_with_affine": (True, "norms without weights are not implemented"),
    "include_bias": (False, "biases are not implemented"),
    "include_qkv_bias": (False, "biases are not implemented"),
}


class Arch(NamedTuple):
    """The sizes and options of one LLaDA network, from its config.json (:func:`parse_config`)."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    mlp_hidden_size: int
    vocab_size: int       # the tokenizer's ids (config ``vocab_size``)
    embedding_size: int   # rows of wte and width of the logits (>= vocab_size)
    mask_id: int
    max_seq_len: int
    rms_norm_eps: float
    rope_theta: float
    rope_full_precision: bool
    weight_tying: bool
    scale_logits: bool
    input_emb_norm: bool

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def detect(config: dict) -> str | None:
    """``"llada"`` for a LLaDA config.json (``model_type: llada`` or ``LLaDAModelLM`` in
    ``architectures``), else None."""
    if not isinstance(config, dict):
        return None
    archs = config.get("architectures") or []
    if config.get("model_type") == "llada" or (config.get("model_type") is None and "LLaDAModelLM" in archs):
        return "llada"
    return None


def config_int(cfg: dict, key: str, low: int = 1) -> int:
    """``cfg[key]``, an integer >= ``low``; PretrainedError naming the key otherwise."""
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise PretrainedError(f"config.json: {key}={v!r} must be an integer >= {low}")
    return v


def config_bool(cfg: dict, key: str) -> bool:
    """``cfg[key]``, true or false; PretrainedError naming the key otherwise."""
    if not isinstance(cfg[key], bool):
        raise PretrainedError(f"config.json: {key}={cfg[key]!r} must be true or false")
    return cfg[key]


def config_float(cfg: dict, key: str, positive: bool = True) -> float:
    """``cfg[key]``, a finite (positive) number; PretrainedError naming the key otherwise."""
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise PretrainedError(f"config.json: {key}={v!r} must be a {'positive ' if positive else ''}number")
    return float(v)


def _n_kv_heads(cfg: dict, n_heads: int) -> int:
    """``effective_n_kv_heads`` of configuration_llada.py: n_kv_heads, or 1 with multi-query
    attention, or n_heads."""
    kv, mqa = cfg["n_kv_heads"], cfg["multi_query_attention"]
    if kv is None:
        return 1 if mqa is True else n_heads
    kv = config_int(cfg, "n_kv_heads")
    if mqa is not None and kv != (1 if mqa else n_heads):
        raise PretrainedError(f"config.json: n_kv_heads={kv} contradicts multi_query_attention={mqa}: set one of them")
    return kv


def parse_config(config: dict) -> Arch:
    """The :class:`Arch` of a LLaDA config.json (missing keys take the defaults of the hub's
    configuration_llada.py). Raises PretrainedError (one line naming the key) for a value this
    port does not implement or an inconsistent size."""
    cfg = {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}
    for key, (want, why) in REQUIRED.items():
        if cfg[key] != want or type(cfg[key]) is not type(want):
            raise PretrainedError(f"config.json: {key}={cfg[key]!r} is not supported by the LLaDA port "
                                  f"(needs {want!r}: {why})")
    if cfg["bias_for_layer_norm"] not in (None, False):
        raise PretrainedError(f"config.json: bias_for_layer_norm={cfg['bias_for_layer_norm']!r} is not supported by "
                              "the LLaDA port (norm biases are not implemented)")
    d, nh = config_int(cfg, "d_model"), config_int(cfg, "n_heads")
    if d % nh:
        raise PretrainedError(f"config.json: d_model={d} is not a multiple of n_heads={nh}")
    if (d // nh) % 2:
        raise PretrainedError(f"config.json: head dimension d_model/n_heads={d // nh} must be even for rotary")
    kv = _n_kv_heads(cfg, nh)
    if nh % kv:
        raise PretrainedError(f"config.json: n_heads={nh} is not a multiple of n_kv_heads={kv}")
    hidden = (config_int(cfg, "mlp_hidden_size") if cfg["mlp_hidden_size"] is not None
              else config_int(cfg, "mlp_ratio") * d)
    vocab = config_int(cfg, "vocab_size", 2)
    emb = vocab if cfg["embedding_size"] is None else config_int(cfg, "embedding_size", 2)
    if emb < vocab:
        raise PretrainedError(f"config.json: embedding_size={emb} is below vocab_size={vocab}")
    mask = cfg["mask_token_id"]
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < emb:
        raise PretrainedError(f"config.json: mask_token_id={mask!r} must be an id in [0, {emb}) (LLaDA's is 126336)")
    return Arch(d_model=d, n_heads=nh, n_kv_heads=kv, n_layers=config_int(cfg, "n_layers"),
                mlp_hidden_size=hidden, vocab_size=vocab, embedding_size=emb, mask_id=mask,
                max_seq_len=config_int(cfg, "max_sequence_length"), rms_norm_eps=config_float(cfg, "rms_norm_eps"),
                rope_theta=config_float(cfg, "rope_theta"),
                rope_full_precision=config_bool(cfg, "rope_full_precision"),
                weight_tying=config_bool(cfg, "weight_tying"), scale_logits=config_bool(cfg, "scale_logits"),
                input_emb_norm=config_bool(cfg, "input_emb_norm"))


def expected_shapes(arch: Arch) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the published layout (PyTorch Linear weights [out, in])."""
    d, hd, h, E = arch.d_model, arch.head_dim, arch.mlp_hidden_size, arch.embedding_size
    block = {"attn_norm": (d,), "ff_norm": (d,), "q_proj": (d, d), "k_proj": (arch.n_kv_heads * hd, d),
             "v_proj": (arch.n_kv_heads * hd, d), "attn_out": (d, d), "ff_proj": (h, d), "up_proj": (h, d),
             "ff_out": (d, h)}
    out = {f"{PREFIX}wte.weight": (E, d), f"{PREFIX}ln_f.weight": (d,)}
    for i in range(arch.n_layers):
        out.update({f"{PREFIX}blocks.{i}.{n}.weight": s for n, s in block.items()})
    if not arch.weight_tying:
        out[f"{PREFIX}ff_out.weight"] = (E, d)
    return out


def compute_dtype(dtype) -> jnp.dtype:
    dt = jnp.dtype(jnp.float32 if dtype is None else dtype)
    if dt not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise PretrainedError(f"dtype={dtype!r} is not a compute dtype for LLaDA: use float32 or bfloat16")
    return dt


def gather_params(tensors: dict[str, np.ndarray], top: dict[str, str], per_layer: dict[str, str], n_layers: int,
                  dtype) -> dict[str, Any]:
    """A scanned pytree from checked tensors, cast to ``dtype``: ``{key: tensors[name]}`` for
    ``top`` and ``"layers": {key: stacked [n_layers, ...]}`` for ``per_layer`` (names with
    ``{i}`` for the layer). Consumes ``tensors`` (entries are removed as they are placed)."""
    dt = compute_dtype(dtype)

    def take(name):
        return jnp.asarray(tensors.pop(name), dt)

    params = {k: take(name) for k, name in top.items()}
    params["layers"] = {k: jnp.stack([take(name.format(i=i)) for i in range(n_layers)]) for k, name in per_layer.items()}
    return params


def to_params(tensors: dict[str, np.ndarray], arch: Arch, dtype) -> dict[str, Any]:
    """The checked tensors as this port's pytree, cast to ``dtype``: ``wte`` [E, D], ``ln_f`` [D],
    ``ff_out`` [E, D] (absent when tied) and ``layers``: each block tensor stacked over layers
    [n_layers, ...] (scanned). Consumes ``tensors``."""
    top = {"wte": f"{PREFIX}wte.weight", "ln_f": f"{PREFIX}ln_f.weight"}
    if not arch.weight_tying:
        top["ff_out"] = f"{PREFIX}ff_out.weight"
    return gather_params(tensors, top, {n: f"{PREFIX}blocks.{{i}}.{n}.weight" for n in BLOCK_TENSORS},
                         arch.n_layers, dtype)


def _precision(dtype):
    """float32 runs at full float32 matmul precision (no TF32 on GPUs): the parity tolerance."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def linear(x, w_OxI):
    """``x @ w.T`` for a PyTorch-layout weight [out, in]; the result in x's dtype."""
    return jnp.einsum("...i,oi->...o", x, w_OxI, precision=_precision(x.dtype)).astype(x.dtype)


def rms_norm(x, w, eps: float):
    """RMSNorm as LLaDA's ``RMSLayerNorm``: normalised in float32, cast back, times ``w``."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w * xf.astype(x.dtype)


def rotary_tables(seq_len: int, head_dim: int, theta: float):
    """float32 (sin, cos) [L, head_dim] of positions 0..L-1: ``cat(freqs, freqs)`` with
    ``freqs[p, i] = p * theta^(-2i/head_dim)`` (RoFormer, arXiv 2104.09864)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.sin(angles), jnp.cos(angles)


def rotary(x_BxLxHxD, sin_LxD, cos_LxD, full_precision: bool = True):
    """Rotary embedding in the GPT-NeoX "rotate half" layout: ``x cos + rotate_half(x) sin`` with
    ``rotate_half([x1, x2]) = [-x2, x1]`` over the two halves of the head dimension; computed in
    float32 when ``full_precision`` (LLaDA's ``rope_full_precision``), returned in x's dtype."""
    ct = jnp.float32 if full_precision else x_BxLxHxD.dtype
    x = x_BxLxHxD.astype(ct)
    sin, cos = sin_LxD.astype(ct)[:, None, :], cos_LxD.astype(ct)[:, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return (x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin).astype(x_BxLxHxD.dtype)


def attention(q_BxLxHxD, k_BxLxKxD, v_BxLxKxD):
    """Bidirectional scaled dot-product attention (no mask), K key/value heads each shared by
    H/K consecutive query heads; scores and softmax in float32, [B, L, H*D] in q's dtype."""
    B, L, H, D = q_BxLxHxD.shape
    K = k_BxLxKxD.shape[2]
    q = q_BxLxHxD.reshape(B, L, K, H // K, D)
    prec = _precision(q.dtype)
    s = jnp.einsum("bqkgd,bskd->bkgqs", q, k_BxLxKxD, precision=prec, preferred_element_type=jnp.float32)
    p = jax.nn.softmax(s / math.sqrt(D), axis=-1).astype(q.dtype)
    o = jnp.einsum("bkgqs,bskd->bqkgd", p, v_BxLxKxD, precision=prec, preferred_element_type=jnp.float32)
    return o.astype(q.dtype).reshape(B, L, H * D)


def block(arch: Arch, sin, cos, h_BxLxD, p):
    """One ``LLaDALlamaBlock`` (eval mode: dropout off)."""
    B, L, _ = h_BxLxD.shape
    hd = arch.head_dim
    x = rms_norm(h_BxLxD, p["attn_norm"], arch.rms_norm_eps)
    q = rotary(linear(x, p["q_proj"]).reshape(B, L, arch.n_heads, hd), sin, cos, arch.rope_full_precision)
    k = rotary(linear(x, p["k_proj"]).reshape(B, L, arch.n_kv_heads, hd), sin, cos, arch.rope_full_precision)
    v = linear(x, p["v_proj"]).reshape(B, L, arch.n_kv_heads, hd)
    h = h_BxLxD + linear(attention(q, k, v), p["attn_out"])
    u = rms_norm(h, p["ff_norm"], arch.rms_norm_eps)
    return h + linear(jax.nn.silu(linear(u, p["ff_proj"])) * linear(u, p["up_proj"]), p["ff_out"])


def forward(arch: Arch, params, x_BxL, sigma_B=None):
    """float32 logits [B, L, embedding_size] of int32 ids [B, L]; ``sigma_B`` is ignored (LLaDA
    has no time input). Computes in the dtype of ``params``."""
    del sigma_B
    x = jnp.asarray(x_BxL, jnp.int32)
    h = params["wte"][x]
    if arch.input_emb_norm:
        h = h * jnp.asarray(arch.d_model ** 0.5, h.dtype)
    sin, cos = rotary_tables(x.shape[1], arch.head_dim, arch.rope_theta)
    h, _ = jax.lax.scan(lambda c, p: (block(arch, sin, cos, c, p), None), h, params["layers"])
    h = rms_norm(h, params["ln_f"], arch.rms_norm_eps)
    logits = linear(h, params["wte"] if arch.weight_tying else params["ff_out"])
    if arch.scale_logits:
        logits = logits * jnp.asarray(1 / math.sqrt(arch.d_model), logits.dtype)
    return logits.astype(jnp.float32)


def logprobs(logits_BxLxV, mask_id: int):
    """The masked-diffusion denoiser of LLaDA's raw logits: the mask id's logit set to -inf, then
    log-softmax over the vocabulary (float32 [B, L, V]; the model never predicts the mask)."""
    logits = jnp.asarray(logits_BxLxV, jnp.float32)
    return jax.nn.log_softmax(logits.at[..., mask_id].set(-jnp.inf), axis=-1)


def load(directory: pathlib.Path, config: dict, kind: str, dtype) -> Loaded:
    """The LLaDA checkpoint in ``directory`` (config.json already read as ``config``) as a
    :class:`Loaded`: ``apply(params, x_BxL, sigma_B)`` -> float32 logits [B, L, embedding_size]
    (sigma ignored), params in ``dtype`` (None: float32; bfloat16 halves the memory).

    Raises PretrainedError (one line): an unsupported or inconsistent config value, unreadable or
    missing files, tensors whose names or shapes differ from what config.json implies."""
    if kind not in KINDS:
        raise PretrainedError(f"kind={kind!r} is not served by the LLaDA port (kinds: {', '.join(KINDS)})")
    arch = parse_config(config)
    dt = compute_dtype(dtype)
    tensors, source = safetensors_io.read_tensors(directory)
    safetensors_io.check_shapes(tensors, expected_shapes(arch), "LLaDA")
    stored = sorted({str(v.dtype) for v in tensors.values()})
    params = to_params(tensors, arch, dt)
    n_params = sum(int(np.prod(s)) for s in expected_shapes(arch).values())
    info = {"architecture": "LLaDAModelLM", "source": source, "stored_dtype": stored, "dtype": str(dt),
            "n_params": n_params, "arch": arch._asdict(),
            "mask_logit": "raw (the model's own logit on mask_id); llada.logprobs sets it to -inf (the denoiser)"}
    return Loaded(apply=jax.jit(functools.partial(forward, arch)), params=params, kind=kind,
                  vocab_size=arch.embedding_size, mask_id=arch.mask_id, max_seq_len=arch.max_seq_len,
                  output="logits", time_conditioned=False, info=info)
