"""Bidirectional transformer denoiser for masked (absorbing) discrete diffusion.

The network maps a partially masked sequence ``z_BxL`` (token ids in
``[0, V]``, id ``V`` being the MASK / absorbing token) to log-probabilities
over the ``V`` real tokens at every position, ``logprobs_BxLxV``.  The mask
class is never predicted, so the output already lives on the simplex the
reverse process needs (``x_0 | z_t``).

Architecture (pre-LN, non-causal):

* token embedding ``(V + 1) x D``;
* ``num_layers`` blocks of
  ``x += Dropout(OutProj(Attn(RoPE(q), RoPE(k), v)))`` with ``q, k, v`` from a
  bias-free ``Dense(3D)`` of ``LN(x)``, and
  ``x += Dropout(Dense(D)(GELU_tanh(Dense(mlp_ratio * D)(LN(x)))))``;
* attention computed head-major (``[B, H, L, K]`` straight from the ``qkv``
  kernel, RoPE on that layout, out-projection from ``[B, H, L, K]``): the same
  function and parameters as the token-major layout first written
  (benchmarks/plain_transformer.py; tests/test_transformer.py compares them),
  fewer layout copies;
* the dense layers run on token-flattened ``[B*L, D]`` activations, with the
  gradients of LayerNorm (:func:`layer_norm`) and of the matmuls (:func:`linear`)
  written out: the same function and parameters as ``nn.LayerNorm`` / ``nn.Dense``,
  a faster backward on XLA:CPU (no broadcast LayerNorm scales materialised, the
  kernel gradient computed in the orientation the matmul library runs fastest;
  benchmarks/train_throughput.py, RESULTS.md);
* ``attention='dot_product'`` computes the same attention with
  ``jax.nn.dot_product_attention`` (token-major ``[B, L, H, K]``, its layout; same
  parameters; tests/test_transformer.py compares it with the einsum path);
* final ``LN`` and ``Dense(V)`` head with zero-initialised kernel and bias, so
  at initialisation every output equals ``-log V`` exactly (the uniform
  distribution over real tokens).

Sources:

* RADD -- Ou et al., "Your Absorbing Discrete Diffusion Secretly Models the
  Conditional Distributions of Clean Data", arXiv:2406.03736.  §3
  (Theorem 1) shows the concrete score of absorbing diffusion factorises into
  a time-independent conditional distribution of clean data times an analytic
  function of t, which motivates the time-free network (their "DDiT without
  time" backbone: SEDD's DiT-style transformer with rotary embeddings and a
  zero-initialised output layer, time conditioning removed).
* MD4 -- Shi et al., "Simplified and Generalized Masked Diffusion for Discrete
  Data", arXiv:2406.04329: time-conditioned transformer with a sinusoidal
  embedding of ``1000 * t``.
* RoPE -- Su et al., "RoFormer: Enhanced Transformer with Rotary Position
  Embedding", arXiv:2104.09864 (2021); the "rotate-half" pairing
  (dimension ``i`` paired with ``i + K/2``) as in GPT-NeoX / RADD's DDiT.
* adaLN -- Peebles & Xie, "Scalable Diffusion Models with Transformers"
  (DiT), arXiv:2212.09748: time-dependent scale/shift of LayerNorm outputs.

Dtype policy: parameters are float32.  Matmuls (embedding lookup excluded)
run in ``Transformer.dtype`` (float32, bfloat16 or float16; a run's config allows float16
only on request: :func:`infodiff.tasks.make_transformer`).  The residual stream,
every LayerNorm, the attention softmax, RoPE's sin/cos, the whole time
conditioning path and the final ``log_softmax`` are float32.  The output is
always float32.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Transformer",
    "apply_rope",
    "layer_norm",
    "softmax",
    "linear",
    "timestep_embedding",
    "count_params",
    "flops_per_token",
    "ATTENTIONS",
    "DTYPES",
    "block_causal_mask",
]

# Transformer.attention: the einsum path (the reference, query-blocked for large scores) or
# jax.nn.dot_product_attention (implementation=None: jax 0.10 runs its XLA version).
ATTENTIONS = ("einsum", "dot_product")
# Transformer.dtype: the matmul compute dtypes accepted.
DTYPES = ("float32", "bfloat16", "float16")

# PyTorch / RADD default LayerNorm epsilon.
_LN_EPS = 1e-5
# Number of sinusoidal features of the time embedding (DiT's
# ``frequency_embedding_size``).
_TIME_FREQ_DIM = 256
# MD4 embeds ``1000 * t`` so that the sinusoid frequencies (designed for
# integer DDPM step indices in [0, 1000)) resolve t in [0, 1].
_TIME_SCALE = 1000.0


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def apply_rope(x_BxLxHxK: jax.Array, positions_L: jax.Array,
               base: float = 10000.0, seq_axis: int = -3) -> jax.Array:
    """Applies rotary position embeddings (RoPE) with rotate-half pairing.

    Feature ``i`` is paired with feature ``i + K/2`` (``i < K/2``) and the pair
    is rotated by angle ``pos * base**(-2i/K)``:

        out = x * cos(theta) + rotate_half(x) * sin(theta),
        rotate_half([x1, x2]) = [-x2, x1].

    Hence ``<apply_rope(q, i), apply_rope(k, j)>`` depends on the positions
    only through ``j - i`` (Su et al. 2021, §3.4).

    Args:
      x_BxLxHxK: queries or keys, shape ``[..., L, H, K]`` (any leading batch
        dims), or ``[..., H, L, K]`` (head-major) with ``seq_axis=-2``; ``K``
        even, any float dtype.
      positions_L: positions of the ``L`` entries, shape ``[L]``, integer or
        float (units: token index); a numpy array makes the sin/cos tables
        trace-time constants.
      base: wavelength base (10000 as in RoPE / RADD).
      seq_axis: the axis of ``L``: -3 (token-major) or -2 (head-major).

    Returns:
      Rotated array, same shape and dtype as ``x_BxLxHxK``.  The rotation is
      computed in float32 and cast back.

    Raises:
      ValueError: if the last axis is odd, ``seq_axis`` is not -3 or -2, or
        ``positions_L`` does not have shape ``[L]``.
    """
    K = x_BxLxHxK.shape[-1]
    if K % 2:
        raise ValueError(f"RoPE needs an even head dim, got shape {x_BxLxHxK.shape}")
    if seq_axis not in (-3, -2):
        raise ValueError(f"seq_axis must be -3 ([..., L, H, K]) or -2 ([..., H, L, K]); got {seq_axis}")
    if x_BxLxHxK.ndim < 3 or positions_L.shape != (x_BxLxHxK.shape[seq_axis],):
        raise ValueError(
            f"positions shape {positions_L.shape} does not match x shape "
            f"{x_BxLxHxK.shape} (expected [..., L, H, K] or [..., H, L, K] and [L])")
    half = K // 2
    # Positions given as a numpy array (the transformer's own arange) give constant tables,
    # computed once at trace time instead of in every layer of every call.
    xp = np if isinstance(positions_L, np.ndarray) else jnp
    inv_freq_K2 = base ** (-xp.arange(half, dtype=xp.float32) * 2.0 / K)
    theta_LxK2 = positions_L.astype(xp.float32)[:, None] * inv_freq_K2[None, :]
    theta_LxK = xp.concatenate([theta_LxK2, theta_LxK2], axis=-1)
    cos_LxK, sin_LxK = xp.cos(theta_LxK).astype(np.float32), xp.sin(theta_LxK).astype(np.float32)
    if seq_axis == -3:
        cos_LxK, sin_LxK = cos_LxK[:, None, :], sin_LxK[:, None, :]
    x = x_BxLxHxK.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]
    rot = jnp.concatenate([-x2, x1], axis=-1)
    out = x * cos_LxK + rot * sin_LxK
    return out.astype(x_BxLxHxK.dtype)


def timestep_embedding(t_B: jax.Array, dim: int = _TIME_FREQ_DIM,
                       max_period: float = 10000.0) -> jax.Array:
    """Sinusoidal embedding of ``1000 * t`` (MD4 / DiT convention).

    Args:
      t_B: diffusion times in ``[0, 1]``, shape ``[B]``.
      dim: embedding dimension (even).
      max_period: longest wavelength, in units of ``1000 * t``.

    Returns:
      ``[cos(1000 t f_i), sin(1000 t f_i)]`` with
      ``f_i = max_period**(-i / (dim/2))``; shape ``[B, dim]``, float32.
    """
    half = dim // 2
    freqs_H = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args_BxH = (_TIME_SCALE * t_B.astype(jnp.float32))[:, None] * freqs_H[None, :]
    return jnp.concatenate([jnp.cos(args_BxH), jnp.sin(args_BxH)], axis=-1)


@jax.custom_vjp
def layer_norm(x_NxD: jax.Array, scale_D: jax.Array, bias_D: jax.Array) -> jax.Array:
    """LayerNorm over the last axis, ``(x - mean) / sqrt(var + 1e-5) * scale + bias``
    (Ba et al. 2016, arXiv:1607.06450; the function of ``flax.linen.LayerNorm`` with
    epsilon 1e-5), with its gradient written out (:func:`_layer_norm_bwd`) so that XLA:CPU
    does not materialise ``scale`` broadcast to ``x``'s shape for the backward pass.

    Args: ``x_NxD`` float32 ``[..., D]`` (any leading axes); ``scale_D``, ``bias_D`` float32
    ``[D]``. Returns float32, the shape of ``x_NxD``. The variance is the two-pass
    ``mean((x - mean)^2)``."""
    return _layer_norm_fwd(x_NxD, scale_D, bias_D)[0]


def _layer_norm_fwd(x_NxD, scale_D, bias_D):
    mean_Nx1 = x_NxD.mean(-1, keepdims=True)
    xc_NxD = x_NxD - mean_Nx1
    rstd_Nx1 = jax.lax.rsqrt((xc_NxD * xc_NxD).mean(-1, keepdims=True) + _LN_EPS)
    xhat_NxD = xc_NxD * rstd_Nx1
    return xhat_NxD * scale_D + bias_D, (xhat_NxD, rstd_Nx1, scale_D)


def _layer_norm_bwd(residuals, g_NxD):
    """dx = rstd * (g' - mean(g') - xhat * mean(g' xhat)), g' = g * scale;
    dscale = sum(g * xhat), dbias = sum(g) over the leading axes."""
    xhat_NxD, rstd_Nx1, scale_D = residuals
    leading = tuple(range(g_NxD.ndim - 1))
    gs_NxD = g_NxD * scale_D
    dx_NxD = rstd_Nx1 * (gs_NxD - gs_NxD.mean(-1, keepdims=True)
                         - xhat_NxD * (gs_NxD * xhat_NxD).mean(-1, keepdims=True))
    return dx_NxD, (g_NxD * xhat_NxD).sum(leading), g_NxD.sum(leading)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@jax.custom_vjp
def linear(x_NxI: jax.Array, w_IxO: jax.Array) -> jax.Array:
    """``x @ w`` for token-flattened activations ``x_NxI`` ``[N, I]`` and a kernel ``w_IxO``
    ``[I, O]`` (same dtype; result ``[N, O]`` in it), with the gradient written out: the
    kernel's gradient ``x^T g`` is computed as ``(g^T x)^T`` when ``I > O``, an
    ``[O, I]`` product transposed (behind ``lax.optimization_barrier``, which keeps XLA from
    folding the transpose back). XLA:CPU's matmul runs ``x^T g`` about 2x faster with the
    smaller output dimension first ([4096, 512]^T [4096, 128]: 51 vs 89 GFLOP/s on one
    core, ``python benchmarks/kernel_gradient_orientation.py``); the values are the same
    products summed over ``N``."""
    return x_NxI @ w_IxO


def _linear_fwd(x_NxI, w_IxO):
    return x_NxI @ w_IxO, (x_NxI, w_IxO)


def _linear_bwd(residuals, g_NxO):
    x_NxI, w_IxO = residuals
    I, O = w_IxO.shape
    if I > O:
        dw_IxO = jax.lax.optimization_barrier(g_NxO.T @ x_NxI).T
    else:
        dw_IxO = x_NxI.T @ g_NxO
    return g_NxO @ w_IxO.T, dw_IxO


linear.defvjp(_linear_fwd, _linear_bwd)


# --------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------


class _Norm(nn.Module):
    """float32 LayerNorm, optionally modulated by a conditioning vector.

    ``y = LN(x)`` or, with ``c_BxC`` given (adaLN, DiT),
    ``y = LN(x) * (1 + scale(c)) + shift(c)`` where ``[shift, scale]`` is a
    zero-initialised ``Dense(2D)`` of ``silu(c)``: at initialisation the
    modulation is the identity.
    """

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, c_BxC: Optional[jax.Array]) -> jax.Array:
        D = x_BxLxD.shape[-1]
        y_BxLxD = _LayerNorm(name="ln")(x_BxLxD.astype(jnp.float32))
        if c_BxC is None:
            return y_BxLxD
        mod_Bx2D = nn.Dense(2 * D, dtype=jnp.float32, kernel_init=nn.initializers.zeros,
                            bias_init=nn.initializers.zeros, name="adaln_mod")(nn.silu(c_BxC))
        shift_BxD, scale_BxD = jnp.split(mod_Bx2D, 2, axis=-1)
        if c_BxC.ndim == 3:  # per-token conditioning [B, L, C]: per-token modulation
            return y_BxLxD * (1.0 + scale_BxD) + shift_BxD
        return y_BxLxD * (1.0 + scale_BxD[:, None, :]) + shift_BxD[:, None, :]


class _LayerNorm(nn.Module):
    """:func:`layer_norm` with the parameters of ``nn.LayerNorm`` (``scale`` ones, ``bias``
    zeros, float32 ``[D]``), so checkpoints and initial values are those of that layer."""

    @nn.compact
    def __call__(self, x_NxD: jax.Array) -> jax.Array:
        D = x_NxD.shape[-1]
        scale_D = self.param("scale", nn.initializers.ones, (D,), jnp.float32)
        bias_D = self.param("bias", nn.initializers.zeros, (D,), jnp.float32)
        return layer_norm(x_NxD, scale_D, bias_D)


class _Dense(nn.Module):
    """:func:`linear` (plus bias unless ``use_bias=False``) on ``[N, I]`` activations, with the
    parameters of ``nn.Dense(features, use_bias=...)`` (``kernel`` ``[I, O]`` lecun-normal, or
    zeros with ``zero_init``; ``bias`` zeros; float32), so checkpoints and initial values are
    those of that layer; computed in ``dtype`` (the bias added in it, as ``nn.Dense``)."""

    features: int
    dtype: Any
    zero_init: bool = False
    use_bias: bool = True

    @nn.compact
    def __call__(self, x_NxI: jax.Array) -> jax.Array:
        init = nn.initializers.zeros if self.zero_init else nn.initializers.lecun_normal()
        kernel_IxO = self.param("kernel", init, (x_NxI.shape[-1], self.features), jnp.float32)
        y_NxO = linear(x_NxI.astype(self.dtype), kernel_IxO.astype(self.dtype))
        if not self.use_bias:
            return y_NxO
        return y_NxO + self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32).astype(self.dtype)


@jax.custom_vjp
def softmax(scores_NxL: jax.Array) -> jax.Array:
    """``jax.nn.softmax`` over the last axis, with its gradient written out from the output
    alone: ``ds = p * (g - sum(g * p))`` (:func:`_softmax_bwd`). jax's own keeps the
    unnormalised exponentials and the row sums for the backward pass, and XLA:CPU wrote the
    inverse row sums out broadcast to the scores' shape ``[B, H, L, L]`` in every layer; this
    one keeps ``p``, which the attention's value product needs anyway
    (``python benchmarks/attention_layouts.py``; RESULTS.md). Args: float ``[..., L]``.
    Returns: the same shape and dtype."""
    return jax.nn.softmax(scores_NxL, axis=-1)


def _softmax_fwd(scores_NxL):
    p_NxL = jax.nn.softmax(scores_NxL, axis=-1)
    return p_NxL, p_NxL


def _softmax_bwd(p_NxL, g_NxL):
    return (p_NxL * (g_NxL - jnp.sum(g_NxL * p_NxL, axis=-1, keepdims=True)),)


softmax.defvjp(_softmax_fwd, _softmax_bwd)


def _attend_dense(q_BxHxQxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxK: jax.Array,
                  dtype: Any, token_major_out: bool = False, allowed_QxL: Any = None) -> jax.Array:
    K = q_BxHxQxK.shape[-1]
    scores_BxHxQxL = jnp.einsum("bhqk,bhsk->bhqs", q_BxHxQxK, k_BxHxLxK,
                                preferred_element_type=jnp.float32) / math.sqrt(K)
    if allowed_QxL is not None:  # block-causal attention: a key a query may not see gets weight 0
        scores_BxHxQxL = jnp.where(allowed_QxL, scores_BxHxQxL, _MASKED_SCORE)
    attn_BxHxQxL = softmax(scores_BxHxQxL)
    # The product head-major, then one transpose: XLA:CPU ran "bhqs,bhsk->bqhk" as a dot with
    # a [B, H, K, Q] output and a copy, about 1.3x slower (forward, B 8, L 256;
    # benchmarks/attention_layouts.py).
    o_BxHxQxK = jnp.einsum("bhqs,bhsk->bhqk", attn_BxHxQxL.astype(dtype), v_BxHxLxK)
    return jnp.swapaxes(o_BxHxQxK, 1, 2) if token_major_out else o_BxHxQxK


# Query blocks of large attention: when a layer's float32 scores [B, H, L, L] would take at least
# ATTENTION_BLOCK_MIN_BYTES, they are computed ATTENTION_QUERY_BLOCK query rows at a time and
# recomputed in the backward pass (jax.checkpoint), so the training step keeps q, k, v per layer
# instead of every layer's softmax (at L 512, B 64: 268 MB per layer plus their gradient
# temporaries; the step's XLA temporaries fall from 5.4 to 2.1 GB). Smaller attention runs dense
# (no recomputation cost). The values are the dense ones: each query row's softmax reads only
# that row.
ATTENTION_QUERY_BLOCK = 128
ATTENTION_BLOCK_MIN_BYTES = 64 << 20


def _attend(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxK: jax.Array,
            dtype: Any, query_block: int | None = None, token_major_out: bool = False,
            allowed_LxL: np.ndarray | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(K)) v from head-major q, k, v; scores and softmax in float32.
    Returns ``[B, H, L, K]``, or ``[B, L, H, K]`` with ``token_major_out`` (the layout the
    out-projection reads). Large attention (scores of at least ATTENTION_BLOCK_MIN_BYTES, L a
    multiple of ``query_block`` and longer) runs by query blocks, rematerialised.
    ``allowed_LxL`` (bool, query x key; None: every key): the keys each query attends to."""
    B, H, L, K = q_BxHxLxK.shape
    query_block = ATTENTION_QUERY_BLOCK if query_block is None else query_block
    if (not query_block or L <= query_block or L % query_block
            or 4 * B * H * L * L < ATTENTION_BLOCK_MIN_BYTES):
        return _attend_dense(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, dtype, token_major_out, allowed_LxL)
    n = L // query_block
    q_NxBxHxCxK = jnp.moveaxis(q_BxHxLxK.reshape(B, H, n, query_block, K), 2, 0)
    if allowed_LxL is None:
        block = jax.checkpoint(lambda q: _attend_dense(q, k_BxHxLxK, v_BxHxLxK, dtype))
        o_NxBxHxCxK = jax.lax.map(block, q_NxBxHxCxK)
    else:
        allowed_NxCxL = jnp.asarray(allowed_LxL).reshape(n, query_block, L)
        block = jax.checkpoint(lambda qa: _attend_dense(qa[0], k_BxHxLxK, v_BxHxLxK, dtype, allowed_QxL=qa[1]))
        o_NxBxHxCxK = jax.lax.map(block, (q_NxBxHxCxK, allowed_NxCxL))
    o_BxHxLxK = jnp.moveaxis(o_NxBxHxCxK, 0, 2).reshape(B, H, L, K)
    return jnp.swapaxes(o_BxHxLxK, 1, 2) if token_major_out else o_BxHxLxK


def _attend_dot_product(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, v_BxLxHxK: jax.Array,
                        allowed_LxL: np.ndarray | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(K)) v, token-major, by ``jax.nn.dot_product_attention``
    (``implementation=None``: jax chooses; scores and softmax in float32). Same dtype in and
    out, shape ``[B, L, H, K]``. ``allowed_LxL``: as :func:`_attend`."""
    mask = None if allowed_LxL is None else jnp.asarray(allowed_LxL)[None, None]
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask=mask, implementation=None)


# A score no query attends to: exp of it minus a row's max is 0 in float32 (every query sees
# at least its own position, so a row is never all masked).
_MASKED_SCORE = -1e30


def block_causal_mask(seq_len: int, block_size: int, two_copy: bool = False) -> np.ndarray:
    """Block diffusion's attention mask (BD3-LM, Arriola et al., arXiv 2503.09573, §3.2), bool
    query x key. One copy (``[L, L]``): position i in block b = i // block_size sees the keys
    of blocks <= b (the clean prefix and its own block; later blocks unseen). Two copies
    (``[2L, 2L]``, the noisy sequence then the clean one, BD3-LM's vectorised training
    layout): a noisy query of block b sees the noisy keys of block b and the clean keys of
    blocks < b; a clean query of block b sees the clean keys of blocks <= b; no clean query
    sees a noisy key. So the noisy copy's output at block b equals the one-copy output for
    the input (clean blocks < b, the noisy block b, anything after)."""
    blk = np.arange(seq_len) // int(block_size)
    same, before, upto = (blk[None, :] == blk[:, None], blk[None, :] < blk[:, None],
                          blk[None, :] <= blk[:, None])
    if not two_copy:
        return upto
    none = np.zeros_like(same)
    return np.block([[same, before], [none, upto]])


class _Block(nn.Module):
    """Pre-LN transformer block: full self-attention with RoPE, then GELU MLP."""

    num_heads: int
    mlp_ratio: int
    dropout: float
    dtype: Any
    attention: str = "einsum"

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, c_BxC: Optional[jax.Array],
                 train: bool, allowed_LxL: np.ndarray | None = None,
                 pos_L: np.ndarray | None = None) -> jax.Array:
        B, L, D = x_BxLxD.shape
        H = self.num_heads
        K = D // H

        # --- attention: one [B*L, 3D] projection (linear), read head-major [B, H, L, K]
        # (einsum) or token-major [B, L, H, K] (dot_product, jax.nn.dot_product_attention's
        # layout) ---
        N = B * L
        h_NxD = _Norm(name="norm_attn")(x_BxLxD, c_BxC).reshape(N, D)
        qkv_BxLx3xHxK = _Dense(3 * D, dtype=self.dtype, use_bias=False, name="qkv")(h_NxD).reshape(B, L, 3, H, K)
        if pos_L is None:
            pos_L = np.arange(L)  # numpy: RoPE's tables are trace-time constants
        if self.attention == "dot_product":
            q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (qkv_BxLx3xHxK[:, :, i] for i in range(3))
            q_BxLxHxK = apply_rope(q_BxLxHxK, pos_L, seq_axis=-3)
            k_BxLxHxK = apply_rope(k_BxLxHxK, pos_L, seq_axis=-3)
            o_BxLxHxK = _attend_dot_product(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, allowed_LxL)
        else:
            q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = jnp.transpose(qkv_BxLx3xHxK, (2, 0, 3, 1, 4))
            q_BxHxLxK = apply_rope(q_BxHxLxK, pos_L, seq_axis=-2)
            k_BxHxLxK = apply_rope(k_BxHxLxK, pos_L, seq_axis=-2)
            o_BxLxHxK = _attend(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, self.dtype, token_major_out=True,
                                allowed_LxL=allowed_LxL)
        o_BxLxD = _Dense(D, dtype=self.dtype, use_bias=False, name="attn_out")(
            o_BxLxHxK.reshape(N, D)).reshape(B, L, D)
        if self.dropout > 0.0:
            o_BxLxD = nn.Dropout(self.dropout, name="drop_attn")(o_BxLxD, deterministic=not train)
        x_BxLxD = x_BxLxD + o_BxLxD.astype(jnp.float32)

        # --- MLP ---
        h_NxD = _Norm(name="norm_mlp")(x_BxLxD, c_BxC).reshape(N, D)
        h_NxF = _Dense(self.mlp_ratio * D, dtype=self.dtype, name="mlp_in")(h_NxD)
        h_NxF = nn.gelu(h_NxF, approximate=True)
        h_BxLxD = _Dense(D, dtype=self.dtype, name="mlp_out")(h_NxF).reshape(B, L, D)
        if self.dropout > 0.0:
            h_BxLxD = nn.Dropout(self.dropout, name="drop_mlp")(h_BxLxD, deterministic=not train)
        return x_BxLxD + h_BxLxD.astype(jnp.float32)


class Transformer(nn.Module):
    """Bidirectional transformer denoiser ``z_t -> log p(x_0 | z_t)``.

    Modelled on RADD's "DDiT without time" (arXiv:2406.03736) and, with
    ``time_conditioning=True``, MD4's time-conditioned transformer
    (arXiv:2406.04329).  See the module docstring for the architecture and
    dtype policy.

    Time conditioning (``time_conditioning=True``): ``c = MLP(sin/cos(1000 t))``
    (``Dense(D) -> SiLU -> Dense(D)`` on a 256-dim sinusoidal embedding), and
    *every* LayerNorm (two per block plus the final one) is adaLN-modulated:
    ``LN(x) * (1 + scale(c)) + shift(c)`` with a zero-initialised per-norm
    ``Dense(2D)`` of ``silu(c)``.  No adaLN-Zero gates are used, so the two
    variants have identical residual paths and at initialisation the
    time-conditioned network computes exactly the time-free function.  The
    conditioning path runs in float32 (it is per sequence, not per token).

    Attributes:
      vocab_size: ``V``, number of real tokens.  Inputs are ids in ``[0, V]``;
        id ``V`` is MASK.  Out-of-range ids are not checked (they cannot be
        at trace time) and produce NaN embeddings (``jnp.take`` fill mode).
      seq_len: maximum sequence length ``L``; shorter inputs are accepted.
      num_layers: number of transformer blocks.
      num_heads: attention heads; ``width`` must be divisible by it and the
        head dim ``width // num_heads`` must be even (RoPE).
      width: model dimension ``D``.
      mlp_ratio: MLP hidden size is ``mlp_ratio * D``.
      dropout: dropout rate after the attention output projection and after
        the MLP, active only when ``train=True`` (rng collection
        ``'dropout'``).
      time_conditioning: if False (RADD-style), ``t_B`` is ignored entirely.
      dtype: compute dtype for matmuls, one of :data:`DTYPES` (a name or a jnp dtype, e.g.
        ``jnp.bfloat16``).  Parameters, LayerNorm, softmax and the output stay float32.
      attention: one of :data:`ATTENTIONS`: ``'einsum'`` (default, the reference; query
        blocks for large scores) or ``'dot_product'`` (``jax.nn.dot_product_attention``,
        ``implementation=None``).  The same function and parameters either way.
      output: ``'log_softmax'`` (default: normalised log-probabilities, the mean /
        x0-prediction) or ``'logits'`` (the raw float32 head output, e.g. SEDD's direct
        log-score parameterisation, :mod:`infodiff.processes.score_entropy`).
      block_size: 0 (default): bidirectional attention. ``L' > 0``: block diffusion's
        block-causal attention (:func:`block_causal_mask`): position i sees only the blocks
        up to its own, so the output at block b reads the (clean) blocks before it and the
        (noised) block b and never the later blocks (:mod:`infodiff.processes.block`).

    Raises:
      ValueError: at construction, ``attention`` not in :data:`ATTENTIONS` or ``dtype`` not
        in :data:`DTYPES` (e.g. ``'int8'``, ``float64``).
    """

    vocab_size: int
    seq_len: int
    num_layers: int = 4
    num_heads: int = 4
    width: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0
    time_conditioning: bool = False
    dtype: Any = jnp.float32
    output: str = "log_softmax"
    attention: str = "einsum"
    block_size: int = 0

    def __post_init__(self):
        """Refuses, at construction, an unknown ``attention`` or ``dtype`` (ValueError, one
        line naming the value)."""
        if self.attention not in ATTENTIONS:
            raise ValueError(f"Transformer attention={self.attention!r}; choose from {ATTENTIONS}")
        try:
            name = jnp.dtype(self.dtype).name
        except TypeError:
            name = None
        if name not in DTYPES:
            raise ValueError(f"Transformer dtype={self.dtype!r} is not a compute dtype; choose from {DTYPES}")
        super().__post_init__()

    @nn.compact
    def __call__(self, z_BxL: jax.Array, t_B: Optional[jax.Array] = None, *,
                 train: bool = False, x0_BxL: Optional[jax.Array] = None) -> jax.Array:
        """Computes log-probabilities of the clean tokens.

        Args:
          z_BxL: noisy token ids, shape ``[B, L]`` with ``L <= seq_len``,
            integer dtype, values in ``[0, V]`` (``V`` = MASK).
          t_B: diffusion times in ``[0, 1]``, shape ``[B]``, or one per token
            ``[B, L]`` (e.g. 0 at a clean prompt: each token's adaLN modulation then
            comes from its own time; the same parameters). Required iff
            ``time_conditioning``; otherwise ignored (may be None).
          train: enables dropout (needs ``rngs={'dropout': key}``).
          x0_BxL: with ``block_size`` > 0 only: the clean sequence, for BD3-LM's two-copy
            layout (the input is ``[z, x0]``, 2L tokens, both at positions 0..L-1, with the
            two-copy mask of :func:`block_causal_mask`): the output at block b of ``z`` is then
            the one-copy output for (x0's blocks < b, z's block b), every block in one pass.
            Only the ``z`` copy's ``L`` outputs are returned. ``t_B`` must then be ``[B]`` or None.

        Returns:
          ``logprobs_BxLxV``: float32, shape ``[B, L, V]``, a ``log_softmax``
          over the ``V`` real tokens (the MASK class is never predicted).
          At initialisation every entry is exactly ``-log V``.

        Raises:
          ValueError: ``z_BxL`` is not 2-D or ``L > seq_len`` (message names
            the shape); ``time_conditioning`` and ``t_B`` is None or its
            shape is not ``(B,)`` or ``(B, L)``; ``width`` not divisible by ``num_heads``
            or odd head dim.
          TypeError: ``z_BxL`` does not have an integer dtype (message names
            the dtype).
        """
        if z_BxL.ndim != 2 or z_BxL.shape[1] > self.seq_len:
            raise ValueError(
                f"z_BxL must have shape [B, L] with L <= seq_len={self.seq_len}, "
                f"got shape {tuple(z_BxL.shape)}")
        if not jnp.issubdtype(z_BxL.dtype, jnp.integer):
            raise TypeError(f"z_BxL must have an integer dtype, got dtype {z_BxL.dtype}")
        if self.width % self.num_heads or (self.width // self.num_heads) % 2:
            raise ValueError(
                f"width={self.width} must be divisible by num_heads={self.num_heads} "
                f"with an even head dim (RoPE)")
        B = z_BxL.shape[0]
        D = self.width

        c_BxD = None
        if self.time_conditioning:
            if t_B is None:
                raise ValueError("time_conditioning=True requires t_B of shape "
                                 f"({B},), got None")
            t_B = jnp.asarray(t_B)
            if t_B.shape == z_BxL.shape:  # one time per token [B, L]: per-token adaLN
                temb_BxF = timestep_embedding(t_B.reshape(-1)).reshape(B, z_BxL.shape[1], -1)
            elif t_B.shape != (B,):
                raise ValueError(f"t_B must have shape ({B},) or {tuple(z_BxL.shape)} (one per token), "
                                 f"got shape {tuple(t_B.shape)}")
            else:
                temb_BxF = timestep_embedding(t_B)
            c_BxD = nn.Dense(D, dtype=jnp.float32, name="time_mlp_in")(temb_BxF)
            c_BxD = nn.silu(c_BxD)
            c_BxD = nn.Dense(D, dtype=jnp.float32, name="time_mlp_out")(c_BxD)

        L = z_BxL.shape[1]
        allowed, pos = None, None
        if x0_BxL is not None:
            if not self.block_size or x0_BxL.shape != z_BxL.shape or (c_BxD is not None and c_BxD.ndim != 2):
                raise ValueError("x0_BxL (the two-copy layout) needs block_size > 0, the shape of z_BxL "
                                 f"{tuple(z_BxL.shape)} and t_B of shape ({B},); got {tuple(x0_BxL.shape)}")
            z_BxL = jnp.concatenate([z_BxL, x0_BxL.astype(z_BxL.dtype)], axis=1)
            allowed, pos = block_causal_mask(L, self.block_size, two_copy=True), np.tile(np.arange(L), 2)
        elif self.block_size:
            allowed = block_causal_mask(L, self.block_size)
        x_BxLxD = nn.Embed(self.vocab_size + 1, D, dtype=jnp.float32, name="embed")(z_BxL)
        for i in range(self.num_layers):
            x_BxLxD = _Block(num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
                             dropout=self.dropout, dtype=self.dtype, attention=self.attention,
                             name=f"block_{i}")(x_BxLxD, c_BxD, train, allowed, pos)
        x_BxLxD = x_BxLxD[:, :L]
        h_NxD = _Norm(name="norm_final")(x_BxLxD, c_BxD).reshape(B * L, D)
        logits_BxLxV = _Dense(self.vocab_size, dtype=self.dtype, zero_init=True,
                              name="head")(h_NxD).reshape(B, L, self.vocab_size)
        if self.output == "logits":
            return logits_BxLxV.astype(jnp.float32)
        if self.output != "log_softmax":
            raise ValueError(f"output must be 'log_softmax' or 'logits'; got {self.output!r}")
        return jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)


# --------------------------------------------------------------------------
# Accounting
# --------------------------------------------------------------------------


def count_params(params: Any) -> int:
    """Total number of scalar entries in a parameter pytree (int)."""
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))


def _abstract_params(model: Transformer) -> Any:
    z = jax.ShapeDtypeStruct((1, model.seq_len), jnp.int32)
    t = jax.ShapeDtypeStruct((1,), jnp.float32)
    return jax.eval_shape(model.init, jax.random.key(0), z, t)["params"]


def flops_per_token(model: Transformer) -> float:
    """Approximate forward+backward training FLOPs per token.

    ``6 * N + 12 * num_layers * width * seq_len`` (Kaplan et al. 2020,
    arXiv:2001.08361, Table 1; backward = 2x forward):

    * ``N`` = non-embedding parameters, i.e. all parameters except the
      ``(V+1) x D`` token embedding (a lookup, not a matmul) and except the
      time-conditioning parameters (``time_mlp_*``, ``adaln_mod``), which are
      applied once per sequence rather than once per token.  The output head
      is included.  Each such parameter costs 2 FLOPs forward (multiply-add),
      i.e. 6 forward+backward.
    * attention ``QK^T`` and ``AV``: ``2 * 2 * L * D`` forward FLOPs per token
      per layer, i.e. ``12 * num_layers * D * L`` forward+backward, with
      ``L = seq_len`` (full, non-causal attention).

    Elementwise ops (LayerNorm, GELU, softmax, RoPE) are ignored.
    """
    params = _abstract_params(model)
    n = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        names = [getattr(p, "key", str(p)) for p in path]
        if names[0] == "embed" or names[0].startswith("time_mlp") or "adaln_mod" in names:
            continue
        n += leaf.size
    return float(6 * n + 12 * model.num_layers * model.width * model.seq_len)
