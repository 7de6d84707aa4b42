"""The transformer denoiser as first written, in plain jax.numpy on its parameter dict.

The reference of tests/test_transformer.py (the library's layout may change for speed: head-major
attention, fused projections; its function may not) and the peer step of
benchmarks/train_throughput.py (the same FLOPs with no library layers). Token-major attention
([B, L, H, K]), RoPE with rotate-half pairing, float32 throughout (infodiff.networks.transformer
documents the architecture).
"""

import math

import jax
import jax.numpy as jnp

_LN_EPS = 1e-5


def _ln(p, x_BxLxD):
    mu = x_BxLxD.mean(-1, keepdims=True)
    var = ((x_BxLxD - mu) ** 2).mean(-1, keepdims=True)
    return (x_BxLxD - mu) / jnp.sqrt(var + _LN_EPS) * p["scale"] + p["bias"]


def _norm(p, x_BxLxD, c_BxD):
    y = _ln(p["ln"], x_BxLxD)
    if c_BxD is None:
        return y
    mod = jax.nn.silu(c_BxD) @ p["adaln_mod"]["kernel"] + p["adaln_mod"]["bias"]
    shift, scale = jnp.split(mod, 2, axis=-1)
    return y * (1.0 + scale[:, None, :]) + shift[:, None, :]


def _rope(x_BxLxHxK):
    L, K = x_BxLxHxK.shape[1], x_BxLxHxK.shape[-1]
    half = K // 2
    inv = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / K)
    th = jnp.arange(L, dtype=jnp.float32)[:, None] * inv[None, :]
    th = jnp.concatenate([th, th], -1)[:, None, :]
    rot = jnp.concatenate([-x_BxLxHxK[..., half:], x_BxLxHxK[..., :half]], -1)
    return x_BxLxHxK * jnp.cos(th) + rot * jnp.sin(th)


def _timestep(t_B, dim=256):
    half = dim // 2
    f = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    a = 1000.0 * t_B[:, None] * f[None, :]
    return jnp.concatenate([jnp.cos(a), jnp.sin(a)], -1)


def reference_forward(params, z_BxL, t_B, *, num_layers, num_heads, output="log_softmax"):
    """log-probabilities float32 [B, L, V] (or logits) of the transformer with ``params``."""
    c = None
    if "time_mlp_in" in params:
        c = _timestep(t_B) @ params["time_mlp_in"]["kernel"] + params["time_mlp_in"]["bias"]
        c = jax.nn.silu(c) @ params["time_mlp_out"]["kernel"] + params["time_mlp_out"]["bias"]
    x = params["embed"]["embedding"][z_BxL]
    B, L, D = x.shape
    H, K = num_heads, D // num_heads
    for i in range(num_layers):
        p = params[f"block_{i}"]
        h = _norm(p["norm_attn"], x, c)
        qkv = (h @ p["qkv"]["kernel"]).reshape(B, L, 3, H, K)
        q, k, v = _rope(qkv[:, :, 0]), _rope(qkv[:, :, 1]), qkv[:, :, 2]
        a = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(K), axis=-1)
        o = jnp.einsum("bhqs,bshk->bqhk", a, v).reshape(B, L, D)
        x = x + o @ p["attn_out"]["kernel"]
        h = _norm(p["norm_mlp"], x, c)
        h = jax.nn.gelu(h @ p["mlp_in"]["kernel"] + p["mlp_in"]["bias"], approximate=True)
        x = x + h @ p["mlp_out"]["kernel"] + p["mlp_out"]["bias"]
    h = _norm(params["norm_final"], x, c)
    logits = h @ params["head"]["kernel"] + params["head"]["bias"]
    return logits if output == "logits" else jax.nn.log_softmax(logits, -1)
