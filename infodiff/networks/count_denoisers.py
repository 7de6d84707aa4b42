"""Denoisers for Poisson diffusion (ItDPDM): networks that estimate E[X | Z_gamma = z].

Contract (``docs/poisson.md`` §4.1, shared with the exact oracles in
``infodiff.count_oracles``): ``denoiser(z_BxD, alpha_B) -> xhat_BxD`` with

* ``z_BxD``: raw Poisson counts ``Z ~ Pois(gamma x)`` (float32 or int, >= 0), one row per example,
  coordinates flattened in C order from the data's event shape;
* ``alpha_B``: float32 log-SNR, ``gamma = exp(alpha)``;
* ``xhat_BxD``: float32 estimate of ``E[X | Z_gamma = z]`` in the *scaled* data space (data
  mapped to ``[low, high]``, default [1, 2], by ``infodiff.processes.poisson.CountScaling``),
  strictly positive.

Network input (docs/poisson.md §4.1): ``z~ = z / (1 + gamma)`` (``poisson.network_input``) divided by
``high`` (model-input normalisation to about [0, 1], the paper's best "Mn"), and a sinusoidal
embedding of ``alpha = log gamma`` (not gamma: it spans ~18 orders of magnitude).

Heads (``head=``):

``"categorical"`` (default; our choice, [inferred] not in the paper)
    The data live on a known lattice ``s_0 < ... < s_{K-1}`` (``CountScaling.lattice()``). The
    network outputs logits ``f_{d,k}`` and the head returns the posterior-mean form

        xhat_d = sum_k softmax_k( f_{d,k} + prior_logits_{d,k} + z_d log s_k - gamma s_k ) s_k,

    i.e. the network models the prior / context part of the posterior over lattice values and
    the *exact* per-coordinate Poisson log-likelihood ``log Pois(z_d; gamma s_k)`` (up to
    terms constant in k) is added analytically. With ``f = 0`` and ``prior_logits`` the true log
    marginal this is the exact posterior mean of a one-dimensional (or independent) pmf;
    generally it keeps ``xhat`` inside ``[s_0, s_{K-1}]`` and makes high-SNR outputs land
    exactly on the lattice, which removes the high-SNR sensitivity of the NLL (docs/poisson.md §3.4).
``"sigmoid"``
    ``low + (high - low) * sigmoid(f)`` (docs/poisson.md §4.1 option for [1, 2] data).
``"softplus"``
    ``softplus(f) + 1e-4`` (docs/poisson.md §4.1; third-party reimplementation).

Architectures (docs/poisson.md §4.2):

* :class:`CountMLP` — scalar / low-dimensional counts: the paper's synthetic "ConditionalMLP",
  3 layers of 64 units, LayerNorm, LeakyReLU(0.2), SNR embedding projected to 64 with SiLU.
* :class:`CountConvNet` — images ``[H, W]``: a small U-Net (two resolutions, residual blocks
  with GroupNorm, SiLU and FiLM SNR conditioning, skip connections). Far smaller than the
  paper's CIFAR U-Net (4 downsampling blocks, attention at 8x8); see configs for sizes.
* :class:`CountSeqConv` — piano rolls ``[P, T]``: pitches as channels, residual dilated 1-D
  convolutions over time with FiLM SNR conditioning.

:class:`CountDenoiser` binds a module and its parameters into the contract above with the
parameters passed explicitly in :meth:`CountDenoiser.apply_params` (jit-friendly).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "HEADS",
    "snr_embedding",
    "head_mean",
    "CountMLP",
    "CountConvNet",
    "CountSeqConv",
    "CountDenoiser",
    "make_count_model",
    "count_params",
]

HEADS = ("categorical", "sigmoid", "softplus")
_SOFTPLUS_EPS = 1e-4


def snr_embedding(alpha_B: jax.Array, dim: int, max_period: float = 200.0) -> jax.Array:
    """Sinusoidal embedding of the log-SNR: float32 ``[B, dim]``.

    ``[sin(alpha w_j), cos(alpha w_j)]_{j < dim/2}`` with ``w_j = 2 pi / (max_period^(j/(dim/2)))``
    — periods from 2 pi (j = 0) up to ``2 pi max_period``, so the range alpha in [-30, 40]
    (gamma in [1e-13, 2e17]) is embedded without aliasing by the slowest frequencies.

    Raises: ValueError if ``dim`` is not a positive even integer.
    """
    if dim < 2 or dim % 2:
        raise ValueError(f"snr_embedding: dim must be a positive even integer, got {dim}")
    half = dim // 2
    w = 1.0 / (max_period ** (jnp.arange(half, dtype=jnp.float32) / half))
    a = jnp.asarray(alpha_B, jnp.float32)[:, None] * w[None, :]
    return jnp.concatenate([jnp.sin(a), jnp.cos(a)], axis=-1)


def head_mean(out: jax.Array, z_BxD: jax.Array, alpha_B: jax.Array, head: str,
              lattice: Sequence[float], low: float, high: float,
              prior_logits_DxK: jax.Array | None = None) -> jax.Array:
    """Map raw network outputs to a positive estimate of E[X | Z] (scaled data space).

    Args:
      out: float32 ``[B, D, K]`` logits (``head='categorical'``, K = len(lattice)) or ``[B, D]``.
      z_BxD: raw counts (float32 ``[B, D]``).
      alpha_B: log-SNR float32 ``[B]``.
      head: one of ``HEADS`` (see the module docstring).
      lattice: the K scaled support values ``s_k > 0`` (categorical head).
      low, high: the scaled data range (sigmoid head).
      prior_logits_DxK: learned per-coordinate log-prior offsets (categorical head) or None.

    Returns:
      float32 ``[B, D]``, > 0 (categorical: in [s_0, s_{K-1}]; sigmoid: in (low, high)).

    Raises: ValueError for an unknown head.
    """
    if head == "categorical":
        s_K = jnp.asarray(np.asarray(lattice, np.float32))
        gamma_B = jnp.exp(jnp.asarray(alpha_B, jnp.float32))
        z = jnp.asarray(z_BxD, jnp.float32)
        # log Pois(z; gamma s_k) up to k-independent terms: z log s_k - gamma s_k.
        loglik_BxDxK = z[..., None] * jnp.log(s_K) - gamma_B[:, None, None] * s_K
        logits = out + loglik_BxDxK
        if prior_logits_DxK is not None:
            logits = logits + prior_logits_DxK[None]
        p = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        return jnp.clip(jnp.sum(p * s_K, axis=-1), s_K[0], s_K[-1])
    if head == "sigmoid":
        return low + (high - low) * jax.nn.sigmoid(out.astype(jnp.float32))
    if head == "softplus":
        return jax.nn.softplus(out.astype(jnp.float32)) + _SOFTPLUS_EPS
    raise ValueError(f"unknown denoiser head {head!r}; choose from {HEADS}")


def _input(z_BxD: jax.Array, alpha_B: jax.Array, high: float) -> jax.Array:
    """z / (1 + gamma) / high (docs/poisson.md §4.1 input, normalised to about [0, 1]); float32."""
    gamma = jnp.exp(jnp.asarray(alpha_B, jnp.float32))[:, None]
    return jnp.asarray(z_BxD, jnp.float32) / (1.0 + gamma) / high


class _HeadMixin:
    """Common attributes: lattice, head, data range."""

    def _out_features(self) -> int:
        return len(self.lattice) if self.head == "categorical" else 1

    def _prior(self, D: int):
        if self.head != "categorical":
            return None
        return self.param("prior_logits", nn.initializers.zeros, (D, len(self.lattice)), jnp.float32)


class CountMLP(nn.Module, _HeadMixin):
    """Paper's synthetic ConditionalMLP (docs/poisson.md §4.2) for ``D``-dimensional counts.

    ``__call__(z_BxD, alpha_B) -> xhat_BxD`` (contract in the module docstring).

    Attributes:
      dim: D.
      lattice: tuple of K scaled support values (categorical head).
      low, high: scaled data range.
      hidden: width (paper 64); num_layers: hidden layers (paper 3); emb_dim: SNR embedding.
      head: one of ``HEADS``.
    """

    dim: int
    lattice: tuple
    low: float = 1.0
    high: float = 2.0
    hidden: int = 64
    num_layers: int = 3
    emb_dim: int = 64
    head: str = "categorical"

    @nn.compact
    def __call__(self, z_BxD, alpha_B):
        B, D = z_BxD.shape
        x = _input(z_BxD, alpha_B, self.high)
        e = nn.silu(nn.Dense(self.hidden)(snr_embedding(alpha_B, self.emb_dim)))
        h = nn.Dense(self.hidden)(x)
        for _ in range(self.num_layers):
            h = h + nn.Dense(self.hidden)(e)
            h = nn.LayerNorm()(h)
            h = nn.leaky_relu(nn.Dense(self.hidden)(h), 0.2)
        K = self._out_features()
        out = nn.Dense(D * K, kernel_init=nn.initializers.zeros)(h)
        out = out.reshape(B, D, K) if self.head == "categorical" else out.reshape(B, D)
        return head_mean(out, z_BxD, alpha_B, self.head, self.lattice, self.low, self.high,
                         self._prior(D))


class _FiLMResBlock(nn.Module):
    """GroupNorm -> SiLU -> conv -> FiLM(emb) -> GroupNorm -> SiLU -> conv, plus a skip."""

    channels: int
    kernel: tuple
    dilation: int = 1

    @nn.compact
    def __call__(self, h, e):
        groups = min(8, self.channels)
        skip = h if h.shape[-1] == self.channels else nn.Dense(self.channels)(h)
        y = nn.silu(nn.GroupNorm(num_groups=min(groups, h.shape[-1]))(h))
        y = nn.Conv(self.channels, self.kernel, padding="SAME", kernel_dilation=self.dilation)(y)
        scale, shift = jnp.split(nn.Dense(2 * self.channels)(e), 2, axis=-1)
        bshape = (y.shape[0],) + (1,) * (y.ndim - 2) + (self.channels,)
        y = y * (1.0 + scale.reshape(bshape)) + shift.reshape(bshape)
        y = nn.silu(nn.GroupNorm(num_groups=groups)(y))
        y = nn.Conv(self.channels, self.kernel, padding="SAME", kernel_dilation=self.dilation)(y)
        return skip + y


class CountConvNet(nn.Module, _HeadMixin):
    """U-Net-lite for count images ``[H, W]`` (H, W even): ``(z_BxD, alpha_B) -> xhat_BxD``.

    Levels: full resolution (``channels``) -> 2x2 average-pool -> half resolution
    (``2 * channels``, ``num_blocks`` blocks) -> nearest upsample + skip concat -> full
    resolution -> per-pixel head. Each block is a residual 3x3 conv block with GroupNorm, SiLU
    and FiLM conditioning on the SNR embedding.

    Attributes: height, width, lattice, low, high, channels, num_blocks, emb_dim, head.
    """

    height: int
    width: int
    lattice: tuple
    low: float = 1.0
    high: float = 2.0
    channels: int = 32
    num_blocks: int = 2
    emb_dim: int = 64
    head: str = "categorical"

    @nn.compact
    def __call__(self, z_BxD, alpha_B):
        B, D = z_BxD.shape
        H, W = self.height, self.width
        if D != H * W:
            raise ValueError(f"CountConvNet: D={D} != height*width={H * W}")
        x = _input(z_BxD, alpha_B, self.high).reshape(B, H, W, 1)
        e = nn.Dense(4 * self.channels)(snr_embedding(alpha_B, self.emb_dim))
        e = nn.Dense(4 * self.channels)(nn.silu(e))
        c = self.channels
        h0 = nn.Conv(c, (3, 3), padding="SAME")(x)
        for _ in range(self.num_blocks):
            h0 = _FiLMResBlock(c, (3, 3))(h0, e)
        h1 = nn.avg_pool(h0, (2, 2), (2, 2)) if H % 2 == 0 and W % 2 == 0 else h0
        for _ in range(self.num_blocks):
            h1 = _FiLMResBlock(2 * c, (3, 3))(h1, e)
        if h1.shape[1] != H:
            h1 = jnp.repeat(jnp.repeat(h1, 2, axis=1), 2, axis=2)
        h = jnp.concatenate([h0, h1], axis=-1)
        for _ in range(self.num_blocks):
            h = _FiLMResBlock(c, (3, 3))(h, e)
        h = nn.silu(nn.GroupNorm(num_groups=min(8, c))(h))
        K = self._out_features()
        out = nn.Conv(K, (3, 3), padding="SAME", kernel_init=nn.initializers.zeros)(h)
        out = out.reshape(B, D, K) if self.head == "categorical" else out.reshape(B, D)
        return head_mean(out, z_BxD, alpha_B, self.head, self.lattice, self.low, self.high,
                         self._prior(D))


class CountSeqConv(nn.Module, _HeadMixin):
    """Piano-roll denoiser for ``[P, T]`` rolls: ``(z_BxD, alpha_B) -> xhat_BxD`` (D = P*T).

    The P pitch rows become channels of a length-T sequence; a dense pitch mixing layer, then
    ``num_blocks`` residual 1-D conv blocks over time (kernel 3, dilations 1, 2, 4, ... cycling),
    FiLM SNR conditioning, and a per-step head with P x K outputs.

    Attributes: pitches, steps, lattice, low, high, channels, num_blocks, emb_dim, head.
    """

    pitches: int
    steps: int
    lattice: tuple
    low: float = 1.0
    high: float = 2.0
    channels: int = 128
    num_blocks: int = 4
    emb_dim: int = 64
    head: str = "categorical"

    @nn.compact
    def __call__(self, z_BxD, alpha_B):
        B, D = z_BxD.shape
        P, T = self.pitches, self.steps
        if D != P * T:
            raise ValueError(f"CountSeqConv: D={D} != pitches*steps={P * T}")
        x = _input(z_BxD, alpha_B, self.high).reshape(B, P, T).transpose(0, 2, 1)  # [B, T, P]
        e = nn.Dense(2 * self.channels)(snr_embedding(alpha_B, self.emb_dim))
        e = nn.Dense(2 * self.channels)(nn.silu(e))
        h = nn.Dense(self.channels)(x)
        for i in range(self.num_blocks):
            h = _FiLMResBlock(self.channels, (3,), dilation=2 ** (i % 3))(h, e)
        h = nn.silu(nn.GroupNorm(num_groups=min(8, self.channels))(h))
        K = self._out_features()
        out = nn.Dense(P * K, kernel_init=nn.initializers.zeros)(h)  # [B, T, P*K]
        out = out.reshape(B, T, P, K).transpose(0, 2, 1, 3).reshape(B, D, K)
        if self.head != "categorical":
            out = out[..., 0]
        return head_mean(out, z_BxD, alpha_B, self.head, self.lattice, self.low, self.high,
                         self._prior(D))


@dataclasses.dataclass(frozen=True, eq=False)
class CountDenoiser:
    """``denoiser(z_BxD, alpha_B) -> xhat_BxD``: a count network bound to its parameters.

    Attributes:
      model: a :class:`CountMLP`, :class:`CountConvNet` or :class:`CountSeqConv`.
      params: its parameter pytree.

    Frozen and hashed by identity (usable as a static jit argument or closed over). Inside a
    jitted function prefer ``apply_params(params, ...)`` with ``params`` a traced argument.
    """

    model: nn.Module
    params: Any

    def __call__(self, z_BxD: jax.Array, alpha_B: jax.Array) -> jax.Array:
        """Raw counts ``[B, D]``, log-SNR ``[B]`` -> float32 ``[B, D]`` > 0 (scaled space)."""
        return self.apply_params(self.params, z_BxD, alpha_B)

    def apply_params(self, params: Any, z_BxD: jax.Array, alpha_B: jax.Array) -> jax.Array:
        """The same with explicit ``params``."""
        return self.model.apply({"params": params}, jnp.asarray(z_BxD, jnp.float32),
                                jnp.asarray(alpha_B, jnp.float32))


def make_count_model(arch: str, event_shape: Sequence[int], lattice: Sequence[float],
                     low: float = 1.0, high: float = 2.0, **kwargs: Any) -> nn.Module:
    """Build a count denoiser network.

    Args:
      arch: ``"mlp"`` (any event shape, flattened), ``"conv"`` (event shape ``(H, W)``) or
        ``"seqconv"`` (event shape ``(P, T)``).
      event_shape: shape of one example.
      lattice: the K scaled support values (``CountScaling.lattice()``), increasing, > 0.
      low, high: scaled data range.
      **kwargs: module attributes (hidden, num_layers, channels, num_blocks, emb_dim, head).

    Raises:
      ValueError: unknown arch / head, event shape of the wrong rank, bad lattice.
    """
    lat = tuple(float(v) for v in np.asarray(lattice, np.float64).reshape(-1))
    if not lat or any(v <= 0 for v in lat) or any(b <= a for a, b in zip(lat, lat[1:])):
        raise ValueError(f"lattice must be increasing and > 0; got {lat[:5]}...")
    head = kwargs.get("head", "categorical")
    if head not in HEADS:
        raise ValueError(f"unknown denoiser head {head!r}; choose from {HEADS}")
    shape = tuple(int(s) for s in event_shape)
    common = dict(lattice=lat, low=float(low), high=float(high), **kwargs)
    if arch == "mlp":
        return CountMLP(dim=int(np.prod(shape)), **common)
    if arch == "conv":
        if len(shape) != 2:
            raise ValueError(f"arch 'conv' needs an (H, W) event shape; got {shape}")
        return CountConvNet(height=shape[0], width=shape[1], **common)
    if arch == "seqconv":
        if len(shape) != 2:
            raise ValueError(f"arch 'seqconv' needs a (P, T) event shape; got {shape}")
        return CountSeqConv(pitches=shape[0], steps=shape[1], **common)
    raise ValueError(f"unknown count denoiser arch {arch!r}; choose 'mlp', 'conv' or 'seqconv'")


def count_params(params: Any) -> int:
    """Number of scalars in a parameter pytree."""
    return int(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)))
