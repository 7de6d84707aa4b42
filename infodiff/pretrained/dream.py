"""Dream (Ye et al. 2025, "Dream 7B: Diffusion Large Language Models", arXiv 2508.15487) in JAX,
loading the released checkpoints (Dream-org/Dream-v0-Base-7B, -Instruct-7B) as published.

The network is the hub's ``modeling_dream.py`` (``DreamModel``): the Qwen2 transformer it was
initialised from, with BIDIRECTIONAL attention and no time input:

    h = embed_tokens[x]
    per layer:  h += o_proj(attention(rope(q), rope(k), v))   q, k, v = *_proj(RMSNorm(h)) + bias
                h += down_proj(silu(gate_proj(u)) * up_proj(u))   u = RMSNorm(h)
    logits = lm_head(RMSNorm(h))

RMSNorm, attention (grouped key/value heads) and the "rotate half" rotary as in
:mod:`infodiff.pretrained.llada`, except that Dream casts the float32 rotary tables to the compute
dtype before rotating (``rotary(..., full_precision=False)``). Rotary theta ``rope_theta`` (1e6 for
the 7B models), eps ``rms_norm_eps`` (1e-6).

**The logits are shifted.** Dream keeps the autoregressive model's head: the raw logits at
position i predict the token at position i + 1. ``Loaded.apply`` returns them raw (so a port can be
checked against its source); :func:`denoiser_logits` aligns them as Dream's own evaluation does
(``cat([logits[:, :1], logits[:, :-1]])``): position i reads the raw logits of i - 1, and position 0
reads its own raw logits, which predict token 1, so position 0 must never be masked (Dream's
sequences start with a visible BOS token): score Dream conditionally on a first token.

Checkpoint layout: ``config.json`` + sharded BF16 safetensors with names ``model.embed_tokens``,
``model.layers.N.{input_layernorm, post_attention_layernorm}.weight``,
``model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}``, ``model.layers.N.self_attn.o_proj.weight``,
``model.layers.N.mlp.{gate,up,down}_proj.weight``, ``model.norm.weight``, ``lm_head.weight``.
"""
from __future__ import annotations

import functools
import pathlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.pretrained import llada, safetensors_io
from infodiff.pretrained.base import Loaded, PretrainedError

__all__ = ["KINDS", "detect", "load", "DreamArch", "parse_config", "expected_shapes", "forward", "denoiser_logits", "logprobs"]

KINDS = ("dream",)
# Defaults of DreamConfig in the hub's configuration_dream.py (keys config.json may omit).
DEFAULTS = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "rope_theta": 10000.0, "rope_scaling": None, "use_sliding_window": False, "mask_token_id": 151666}
LAYER = {"input_layernorm": "input_layernorm.weight", "post_attention_layernorm": "post_attention_layernorm.weight",
         "q_proj": "self_attn.q_proj.weight", "q_bias": "self_attn.q_proj.bias",
         "k_proj": "self_attn.k_proj.weight", "k_bias": "self_attn.k_proj.bias",
         "v_proj": "self_attn.v_proj.weight", "v_bias": "self_attn.v_proj.bias",
         "o_proj": "self_attn.o_proj.weight", "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight",
         "down_proj": "mlp.down_proj.weight"}


class DreamArch(NamedTuple):
    """Sizes and options of one Dream network, from its config.json (:func:`parse_config`)."""

    hidden_size: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    intermediate_size: int
    vocab_size: int
    mask_id: int
    max_seq_len: int
    rms_norm_eps: float
    rope_theta: float
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads


def detect(config: dict) -> str | None:
    """``"dream"`` for a Dream config.json (``model_type: Dream`` or ``DreamModel`` in
    ``architectures``), else None."""
    if not isinstance(config, dict):
        return None
    mt = config.get("model_type")
    if mt == "Dream" or (mt is None and "DreamModel" in (config.get("architectures") or [])):
        return "dream"
    return None


def parse_config(config: dict) -> DreamArch:
    """The :class:`DreamArch` of a Dream config.json (missing keys take DreamConfig's defaults).
    Raises PretrainedError (one line naming the key) for an unsupported or inconsistent value."""
    cfg = {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}
    for key, want in (("hidden_act", "silu"), ("rope_scaling", None), ("use_sliding_window", False)):
        if cfg[key] != want:
            raise PretrainedError(f"config.json: {key}={cfg[key]!r} is not supported by the Dream port (needs {want!r})")
    d, nh = llada.config_int(cfg, "hidden_size"), llada.config_int(cfg, "num_attention_heads")
    kv = llada.config_int(cfg, "num_key_value_heads")
    if d % nh or (d // nh) % 2:
        raise PretrainedError(f"config.json: hidden_size={d} must be num_attention_heads={nh} x an even head dimension")
    if nh % kv:
        raise PretrainedError(f"config.json: num_attention_heads={nh} is not a multiple of num_key_value_heads={kv}")
    V = llada.config_int(cfg, "vocab_size", 2)
    mask = cfg["mask_token_id"]
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < V:
        raise PretrainedError(f"config.json: mask_token_id={mask!r} must be an id in [0, {V}) (Dream's is 151666)")
    return DreamArch(hidden_size=d, n_heads=nh, n_kv_heads=kv, n_layers=llada.config_int(cfg, "num_hidden_layers"),
                     intermediate_size=llada.config_int(cfg, "intermediate_size"), vocab_size=V, mask_id=mask,
                     max_seq_len=llada.config_int(cfg, "max_position_embeddings"),
                     rms_norm_eps=llada.config_float(cfg, "rms_norm_eps"), rope_theta=llada.config_float(cfg, "rope_theta"),
                     tied=llada.config_bool(cfg, "tie_word_embeddings"))


def expected_shapes(arch: DreamArch) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the published layout (PyTorch Linear weights [out, in])."""
    d, kvd, h = arch.hidden_size, arch.n_kv_heads * arch.head_dim, arch.intermediate_size
    shapes = {"input_layernorm": (d,), "post_attention_layernorm": (d,), "q_proj": (d, d), "q_bias": (d,),
              "k_proj": (kvd, d), "k_bias": (kvd,), "v_proj": (kvd, d), "v_bias": (kvd,), "o_proj": (d, d),
              "gate_proj": (h, d), "up_proj": (h, d), "down_proj": (d, h)}
    out = {"model.embed_tokens.weight": (arch.vocab_size, d), "model.norm.weight": (d,)}
    for i in range(arch.n_layers):
        out.update({f"model.layers.{i}.{LAYER[k]}": s for k, s in shapes.items()})
    if not arch.tied:
        out["lm_head.weight"] = (arch.vocab_size, d)
    return out


def layer(arch: DreamArch, sin, cos, h_BxLxD, p):
    """One ``DreamDecoderLayer`` (eval mode)."""
    B, L, _ = h_BxLxD.shape
    hd = arch.head_dim
    x = llada.rms_norm(h_BxLxD, p["input_layernorm"], arch.rms_norm_eps)

    def proj(name, heads):
        return (llada.linear(x, p[f"{name}_proj"]) + p[f"{name}_bias"]).reshape(B, L, heads, hd)

    q = llada.rotary(proj("q", arch.n_heads), sin, cos, full_precision=False)
    k = llada.rotary(proj("k", arch.n_kv_heads), sin, cos, full_precision=False)
    h = h_BxLxD + llada.linear(llada.attention(q, k, proj("v", arch.n_kv_heads)), p["o_proj"])
    u = llada.rms_norm(h, p["post_attention_layernorm"], arch.rms_norm_eps)
    return h + llada.linear(jax.nn.silu(llada.linear(u, p["gate_proj"])) * llada.linear(u, p["up_proj"]),
                            p["down_proj"])


def forward(arch: DreamArch, params, x_BxL, sigma_B=None):
    """float32 RAW logits [B, L, vocab_size] of int32 ids [B, L] (position i predicts token
    i + 1; :func:`denoiser_logits`); ``sigma_B`` is ignored. Computes in the dtype of params."""
    del sigma_B
    x = jnp.asarray(x_BxL, jnp.int32)
    h = params["embed"][x]
    sin, cos = llada.rotary_tables(x.shape[1], arch.head_dim, arch.rope_theta)
    h, _ = jax.lax.scan(lambda c, p: (layer(arch, sin, cos, c, p), None), h, params["layers"])
    h = llada.rms_norm(h, params["norm"], arch.rms_norm_eps)
    return llada.linear(h, params["embed"] if arch.tied else params["lm_head"]).astype(jnp.float32)


def denoiser_logits(raw_BxLxV):
    """Dream's raw logits aligned to the positions they predict, as its evaluation does:
    ``out[:, i] = raw[:, i - 1]`` for i >= 1 and ``out[:, 0] = raw[:, 0]`` (position 0, a BOS
    token in Dream's data, must stay visible: its entry is not a prediction of it)."""
    return jnp.concatenate([raw_BxLxV[:, :1], raw_BxLxV[:, :-1]], axis=1)


def logprobs(raw_BxLxV, mask_id: int):
    """The masked-diffusion denoiser of Dream's raw logits: aligned (:func:`denoiser_logits`),
    the mask id's logit at -inf, log-softmax (float32 [B, L, V]); position 0 must stay visible."""
    return llada.logprobs(denoiser_logits(raw_BxLxV), mask_id)


def load(directory: pathlib.Path, config: dict, kind: str, dtype) -> Loaded:
    """The Dream checkpoint in ``directory`` as a :class:`Loaded`: ``apply(params, x_BxL,
    sigma_B)`` -> float32 RAW logits [B, L, vocab_size] (shifted: :func:`denoiser_logits`), params
    in ``dtype`` (None: float32). Raises PretrainedError (one line) as :func:`llada.load`."""
    if kind not in KINDS:
        raise PretrainedError(f"kind={kind!r} is not served by the Dream port (kinds: {', '.join(KINDS)})")
    arch = parse_config(config)
    dt = llada.compute_dtype(dtype)
    tensors, source = safetensors_io.read_tensors(directory)
    safetensors_io.check_shapes(tensors, expected_shapes(arch), "Dream")
    stored = sorted({str(v.dtype) for v in tensors.values()})
    top = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight"}
    if not arch.tied:
        top["lm_head"] = "lm_head.weight"
    params = llada.gather_params(tensors, top, {k: f"model.layers.{{i}}.{n}" for k, n in LAYER.items()},
                                 arch.n_layers, dt)
    n_params = sum(int(np.prod(s)) for s in expected_shapes(arch).values())
    info = {"architecture": "DreamModel", "source": source, "stored_dtype": stored, "dtype": str(dt),
            "n_params": n_params, "arch": arch._asdict(), "logits_shift": 1,
            "mask_logit": "raw; position i's logits predict token i + 1 (dream.logprobs aligns them, mask at -inf)"}
    return Loaded(apply=jax.jit(functools.partial(forward, arch)), params=params, kind=kind,
                  vocab_size=arch.vocab_size, mask_id=arch.mask_id, max_seq_len=arch.max_seq_len,
                  output="logits", time_conditioned=False, info=info)
