"""The diffusion transformer (DiT) of SEDD, MDLM and duo in JAX, reading their released weights as they are.

Network (Lou et al. 2024, SEDD, arXiv 2310.16834, App. C; Sahoo et al. 2024, MDLM, arXiv
2406.07524, Sec. 4 and App. C; both after Peebles & Xie 2023, DiT):
  h = E[x]  (``vocab_embed.embedding`` [V, D]);  c = silu(MLP(sinusoid_256(sigma)))  [C]
  per block: (shift, scale, gate) x 2 = Linear(c) [6D];  LayerNorm without bias (eps 1e-5,
    float32); modulate(u) = u (1 + scale) + shift;  h += gate_a * W_o Attn(rotary(W_qkv mod(LN(h))));
    h += gate_m * MLP(mod(LN(h))) with MLP = Linear(D, 4D) -> GELU(tanh) -> Linear(4D, D);
  out = Linear(mod(LN(h)))  (a final adaLN with shift and scale only).
Rotary (Su et al. 2021): inv_freq = 10000^(-2i/d), cos/sin of [freqs, freqs], the "rotate half"
layout (GPT-NeoX), on q and k only (v is not rotated); attention is bidirectional, scale 1/sqrt(d).

Raw outputs (``Loaded.apply``):
  - SEDD (``kind='sedd'``, graph absorb or uniform): log-scores; with ``scale_by_sigma`` the output
    less log(e^sigma - 1) + log(V - 1); then the entry of the input token is set to 0.
  - MDLM (``kind='mdlm'``): the SUBS parametrisation (MDLM Sec. 3.2.3): the mask logit gets
    ``SUBS_NEG`` (-1e6, as the reference code) added, log-softmax over the vocabulary, and every
    unmasked position carries its token (log-prob 0, the others ``SUBS_NEG``). Without time
    conditioning sigma is replaced by zeros before the network.
  - duo (``kind='duo'``, uniform-state diffusion, Sahoo et al. 2025, arXiv 2506.10892): the
    mean parametrisation, log-softmax of the output over all V tokens (duo's
    ``DUO_BASE._process_model_output``); always time-conditioned, sigma = -log(alpha_t).

Checkpoint layouts (config.json + model.safetensors): SEDD's hub layout (the training config as
a dict: ``tokens``, ``graph.type``, ``noise``, ``model.{hidden_size, cond_dim, length, n_blocks,
n_heads, scale_by_sigma}``; tensors named as the modules above), MDLM's (``model_type: "mdlm"``,
``vocab_size``, ``model_length``, ``hidden_dim``, ``cond_dim``, ``n_blocks``, ``n_heads``,
``time_conditioning``; tensors under ``backbone.``), duo's (``model_type: "duo"``, the MDLM
fields without ``time_conditioning`` and with ``causal: false``; the same ``backbone.`` tensors:
duo's hub model wraps the same DiT as ``backbone``). The module-level constants below are the
details a port can get wrong; the parity tests change each one and check that parity fails.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.pretrained import safetensors_io
from infodiff.pretrained.base import Loaded, PretrainedError

__all__ = ["KINDS", "detect", "load", "Arch", "arch_of", "expected_shapes", "forward"]

SEDD, MDLM, DUO = "sedd", "mdlm", "duo"  # checkpoint kinds (the released code bases), not process names
KINDS = (SEDD, MDLM, DUO)
LN_EPS = 1e-5  # torch.nn.functional.layer_norm's default, used by both reference networks
ROTARY_BASE = 10_000.0
FREQ_EMBED = 256  # width of the sinusoidal time embedding
MAX_PERIOD = 10_000.0
SUBS_NEG = -1e6  # MDLM's "neg_infinity" for the mask logit and the unmasked positions
ROTATE_V = False  # the reference tables make v's rotation the identity
ZERO_INPUT_SCORE = True  # SEDD sets the log-score of the input token to 0
MLP_RATIO = 4


@dataclasses.dataclass(frozen=True)
class Arch:
    """The DiT's sizes and its output head. ``prefix`` is the tensors' name prefix."""

    kind: str
    vocab_size: int
    hidden: int
    cond_dim: int
    n_blocks: int
    n_heads: int
    max_seq_len: int
    prefix: str
    time_conditioned: bool
    scale_by_sigma: bool
    graph: str  # 'absorb' | 'uniform'
    mask_id: int  # -1 without a mask token


def detect(config: dict) -> str | None:
    """'mdlm' / 'duo' for MDLM's / duo's hub config (``model_type: mdlm`` / ``duo``), 'sedd' for
    SEDD's (a training config with ``tokens``, ``graph`` and ``model``), else None."""
    if config.get("model_type") in (MDLM, DUO):
        return config["model_type"]
    if all(k in config for k in ("tokens", "graph", "model")) and isinstance(config.get("model"), dict):
        return SEDD
    return None


def config_value(config: dict, path: str, kind: str):
    """``config[a][b]...`` for the dotted ``path``; PretrainedError (one line) naming it if absent."""
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise PretrainedError(f"config.json lacks {path!r}, which a {kind} checkpoint's config has")
        node = node[part]
    return node


def arch_of(config: dict, kind: str) -> Arch:
    """The :class:`Arch` a ``config.json`` dict describes. Raises PretrainedError for a missing key
    or an unsupported value (graph, head count not dividing the width)."""
    if kind == SEDD:
        graph = str(config_value(config, "graph.type", kind))
        if graph not in ("absorb", "uniform"):
            raise PretrainedError(f"config.json graph.type={graph!r}: the SEDD port knows 'absorb' and 'uniform'")
        tokens = int(config_value(config, "tokens", kind))
        absorb = graph == "absorb"
        m = lambda k: config_value(config, f"model.{k}", kind)  # noqa: E731
        scale = bool(m("scale_by_sigma"))
        if scale and not absorb:
            raise PretrainedError("config.json model.scale_by_sigma=true with graph.type='uniform': SEDD defines "
                                  "scale_by_sigma for the absorbing graph only")
        a = Arch(kind, tokens + absorb, int(m("hidden_size")), int(m("cond_dim")), int(m("n_blocks")),
                 int(m("n_heads")), int(m("length")), "", True, scale, graph, tokens if absorb else -1)
    elif kind == MDLM:
        V = int(config_value(config, "vocab_size", kind))
        a = Arch(kind, V, int(config_value(config, "hidden_dim", kind)), int(config_value(config, "cond_dim", kind)),
                 int(config_value(config, "n_blocks", kind)), int(config_value(config, "n_heads", kind)),
                 int(config_value(config, "model_length", kind)), "backbone.", bool(config.get("time_conditioning", False)),
                 False, "absorb", V - 1)
    elif kind == DUO:
        if config.get("causal", False):
            raise PretrainedError("config.json causal=true: a causal (autoregressive) duo backbone is not a diffusion "
                                  "model; the duo port reads the bidirectional DiT")
        a = Arch(kind, int(config_value(config, "vocab_size", kind)), int(config_value(config, "hidden_dim", kind)),
                 int(config_value(config, "cond_dim", kind)), int(config_value(config, "n_blocks", kind)),
                 int(config_value(config, "n_heads", kind)), int(config_value(config, "model_length", kind)), "backbone.", True,
                 False, "uniform", -1)
    else:
        raise PretrainedError(f"kind={kind!r} is not a DiT kind; choose from {KINDS}")
    if a.hidden % a.n_heads or (a.hidden // a.n_heads) % 2:
        raise PretrainedError(f"config.json: hidden size {a.hidden} is not n_heads={a.n_heads} times an even head width")
    return a


BLOCK_SHAPES = {  # name inside blocks.N -> shape in terms of (D, C)
    "norm1.weight": lambda D, C: (D,),
    "attn_qkv.weight": lambda D, C: (3 * D, D),
    "attn_out.weight": lambda D, C: (D, D),
    "norm2.weight": lambda D, C: (D,),
    "mlp.0.weight": lambda D, C: (MLP_RATIO * D, D),
    "mlp.0.bias": lambda D, C: (MLP_RATIO * D,),
    "mlp.2.weight": lambda D, C: (D, MLP_RATIO * D),
    "mlp.2.bias": lambda D, C: (D,),
    "adaLN_modulation.weight": lambda D, C: (6 * D, C),
    "adaLN_modulation.bias": lambda D, C: (6 * D,),
}


def expected_shapes(a: Arch) -> tuple[dict, set]:
    """(tensor name -> shape, the optional names) of a checkpoint of architecture ``a``."""
    D, C, V, p = a.hidden, a.cond_dim, a.vocab_size, a.prefix
    shapes = {
        f"{p}vocab_embed.embedding": (V, D),
        f"{p}sigma_map.mlp.0.weight": (C, FREQ_EMBED), f"{p}sigma_map.mlp.0.bias": (C,),
        f"{p}sigma_map.mlp.2.weight": (C, C), f"{p}sigma_map.mlp.2.bias": (C,),
        f"{p}rotary_emb.inv_freq": (D // a.n_heads // 2,),
        f"{p}output_layer.norm_final.weight": (D,),
        f"{p}output_layer.linear.weight": (V, D), f"{p}output_layer.linear.bias": (V,),
        f"{p}output_layer.adaLN_modulation.weight": (2 * D, C),
        f"{p}output_layer.adaLN_modulation.bias": (2 * D,),
    }
    for i in range(a.n_blocks):
        for name, shape in BLOCK_SHAPES.items():
            shapes[f"{p}blocks.{i}.{name}"] = shape(D, C)
    return shapes, {f"{p}rotary_emb.inv_freq"}  # a persistent buffer; recomputed here


def inv_freq(head_dim: int) -> np.ndarray:
    """Rotary frequencies 1 / base^(2i/d), i < d/2 (float32 [d/2])."""
    return (1.0 / ROTARY_BASE ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)).astype(np.float32)


def params_of(tensors: dict, a: Arch, dtype) -> dict:
    """Checkpoint tensors (checked names) -> the pytree :func:`forward` reads: blocks stacked on a
    leading [n_blocks] axis, torch Linear weights kept as [out, in]."""
    p = a.prefix

    def arr(name):
        return jnp.asarray(np.asarray(tensors[p + name]), dtype)

    blocks = {name: jnp.stack([arr(f"blocks.{i}.{name}") for i in range(a.n_blocks)]) for name in BLOCK_SHAPES}
    top = {k[len(p):]: arr(k[len(p):]) for k in expected_shapes(a)[0]
           if not k.startswith(f"{p}blocks.") and k != f"{p}rotary_emb.inv_freq"}
    return {"blocks": blocks, **top}


def _linear(x, w, b=None):
    y = x @ w.T.astype(x.dtype)
    return y if b is None else y + b.astype(x.dtype)


def layer_norm(x, weight):
    """LayerNorm without bias, computed in float32 (eps ``LN_EPS``), times ``weight``."""
    x = x.astype(jnp.float32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + LN_EPS) * weight.astype(jnp.float32)


def timestep_embedding(sigma_B, dim: int = FREQ_EMBED):
    """Sinusoidal embedding [B, dim] of sigma: cos then sin of sigma * MAX_PERIOD^(-i/half)."""
    half = dim // 2
    freqs = jnp.exp(-math.log(MAX_PERIOD) * jnp.arange(half, dtype=jnp.float32) / half)
    args = sigma_B.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def rotate_half(x):
    """GPT-NeoX rotary layout: (x1, x2) -> (-x2, x1) over the two halves of the head width."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def rotary_tables(L: int, head_dim: int, positions=None):
    """cos, sin [L, head_dim] of positions (default 0..L-1; BD3-LM's two copies: each its own
    0..L/2-1) times [freqs, freqs] (float32)."""
    pos = np.arange(L) if positions is None else np.asarray(positions)
    freqs = pos.astype(np.float32)[:, None] * inv_freq(head_dim)[None]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return jnp.asarray(np.cos(emb)), jnp.asarray(np.sin(emb))


def _modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


def _attention(q, k, v, mask_LxL=None):
    """Softmax attention; q, k, v [B, L, H, d] -> [B, L, H*d] (softmax in float32); bidirectional,
    or where bool ``mask_LxL`` [query, key] allows (BD3-LM's block-diffusion mask)."""
    d = q.shape[-1]
    s = jnp.einsum("blhd,bmhd->bhlm", q, k).astype(jnp.float32) / math.sqrt(d)
    if mask_LxL is not None:
        s = jnp.where(jnp.asarray(mask_LxL)[None, None], s, -jnp.inf)
    w = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    o = jnp.einsum("bhlm,bmhd->blhd", w, v)
    return o.reshape(o.shape[:2] + (-1,))


def _block(a: Arch, h, c, cos, sin, bp, mask_LxL=None):
    """One adaLN DiT block on h [B, L, D] (the compute dtype) with condition c [B, C]."""
    dt = h.dtype
    mod = _linear(c, bp["adaLN_modulation.weight"], bp["adaLN_modulation.bias"])
    shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = jnp.split(mod, 6, axis=-1)
    u = _modulate(layer_norm(h, bp["norm1.weight"]), shift_a, scale_a).astype(dt)
    B, L, D = h.shape
    qkv = _linear(u, bp["attn_qkv.weight"]).reshape(B, L, 3, a.n_heads, D // a.n_heads)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    cs, sn = cos[None, :, None, :], sin[None, :, None, :]

    def rot(t):
        return (t.astype(jnp.float32) * cs + rotate_half(t.astype(jnp.float32)) * sn).astype(dt)

    q, k = rot(q), rot(k)
    if ROTATE_V:
        v = rot(v)
    h = h + gate_a[:, None].astype(dt) * _linear(_attention(q, k, v, mask_LxL), bp["attn_out.weight"])
    u = _modulate(layer_norm(h, bp["norm2.weight"]), shift_m, scale_m).astype(dt)
    m = _linear(jax.nn.gelu(_linear(u, bp["mlp.0.weight"], bp["mlp.0.bias"]), approximate=True),
                bp["mlp.2.weight"], bp["mlp.2.bias"])
    return h + gate_m[:, None].astype(dt) * m


def backbone(a: Arch, params, x_BxL, sigma_B, mask_LxL=None, positions=None):
    """The DiT's output layer values (float32 [B, L, V]) before any parametrisation; ``mask_LxL``
    and ``positions`` (rotary) as :func:`_attention` and :func:`rotary_tables` (default:
    bidirectional, 0..L-1)."""
    dt = params["vocab_embed.embedding"].dtype
    h = params["vocab_embed.embedding"][x_BxL]
    t = timestep_embedding(sigma_B)
    c = _linear(jax.nn.silu(_linear(t.astype(dt), params["sigma_map.mlp.0.weight"], params["sigma_map.mlp.0.bias"])),
                params["sigma_map.mlp.2.weight"], params["sigma_map.mlp.2.bias"])
    c = jax.nn.silu(c)
    cos, sin = rotary_tables(x_BxL.shape[1], a.hidden // a.n_heads, positions)

    def step(h, bp):
        return _block(a, h, c, cos, sin, bp, mask_LxL), None

    h, _ = jax.lax.scan(step, h, params["blocks"])
    shift, scale = jnp.split(_linear(c, params["output_layer.adaLN_modulation.weight"],
                                     params["output_layer.adaLN_modulation.bias"]), 2, axis=-1)
    u = _modulate(layer_norm(h, params["output_layer.norm_final.weight"]), shift, scale).astype(dt)
    return _linear(u, params["output_layer.linear.weight"], params["output_layer.linear.bias"]).astype(jnp.float32)


def sedd_log_score(a: Arch, out_BxLxV, x_BxL, sigma_B):
    """SEDD's head: ``scale_by_sigma`` (out - log(e^sigma - 1) - log(V - 1), expm1 below 0.5) and the
    input token's log-score set to 0."""
    if a.scale_by_sigma:
        s = sigma_B.astype(jnp.float32)
        esigm1 = jnp.where(s < 0.5, jnp.expm1(s), jnp.exp(s) - 1)
        out_BxLxV = out_BxLxV - jnp.log(esigm1)[:, None, None] - np.float32(math.log(out_BxLxV.shape[-1] - 1))
    if ZERO_INPUT_SCORE:
        hit = jax.nn.one_hot(x_BxL, out_BxLxV.shape[-1], dtype=bool)
        out_BxLxV = jnp.where(hit, 0.0, out_BxLxV)
    return out_BxLxV


def mdlm_subs(a: Arch, logits_BxLxV, x_BxL):
    """MDLM's SUBS parametrisation: log-probabilities with the mask at ``SUBS_NEG`` and unmasked
    positions carried over (log-prob 0 on their token, ``SUBS_NEG`` elsewhere)."""
    V = logits_BxLxV.shape[-1]
    logits = logits_BxLxV.at[..., a.mask_id].add(SUBS_NEG)
    logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    carried = jnp.where(jax.nn.one_hot(x_BxL, V, dtype=bool), 0.0, SUBS_NEG)
    return jnp.where((x_BxL != a.mask_id)[..., None], carried, logp)


def duo_mean(logits_BxLxV):
    """duo's mean parametrisation: log x_theta = log-softmax of the output over all V tokens."""
    return jax.nn.log_softmax(logits_BxLxV, axis=-1)


def forward(a: Arch, params, x_BxL, sigma_B):
    """Raw output float32 [B, L, V] of ``a``'s network (module docstring) at int32 ids x_BxL and
    float32 noise levels sigma_B (total noise; ignored without time conditioning)."""
    x_BxL = jnp.asarray(x_BxL, jnp.int32)
    sigma_B = jnp.broadcast_to(jnp.asarray(sigma_B, jnp.float32).reshape(-1), x_BxL.shape[:1])
    net_sigma = sigma_B if a.time_conditioned else jnp.zeros_like(sigma_B)
    out = backbone(a, params, x_BxL, net_sigma)
    if a.kind == SEDD:
        return sedd_log_score(a, out, x_BxL, sigma_B)
    if a.kind == DUO:
        return duo_mean(out)
    return mdlm_subs(a, out, x_BxL)


def check_inv_freq(tensors: dict, a: Arch) -> None:
    """PretrainedError unless the stored rotary buffer (if any) is 1 / ROTARY_BASE^(2i/d)."""
    inv = a.prefix + "rotary_emb.inv_freq"
    if inv in tensors and not np.allclose(np.asarray(tensors[inv], np.float32), inv_freq(a.hidden // a.n_heads),
                                          rtol=1e-6, atol=0):
        raise PretrainedError(f"{inv} differs from 1/{ROTARY_BASE:g}^(2i/d): a rotary base this port does not know")


def load(directory: pathlib.Path, config: dict, kind: str, dtype=jnp.float32) -> Loaded:
    """A :class:`Loaded` DiT (SEDD, MDLM or duo) from ``directory``; every tensor checked against the
    config's shapes first. Raises PretrainedError (one line) for a config or tensors that do not fit."""
    a = arch_of(config, kind)
    tensors, source = safetensors_io.read_tensors(directory)
    expected, optional = expected_shapes(a)
    safetensors_io.check_shapes(tensors, expected, f"{kind} ({a.graph})" if kind == SEDD else kind, optional)
    check_inv_freq(tensors, a)
    params = params_of(tensors, a, dtype)
    apply = jax.jit(lambda params, x_BxL, sigma_B: forward(a, params, x_BxL, sigma_B))
    info = {"graph": a.graph, "weights": source, "scale_by_sigma": a.scale_by_sigma, "arch": dataclasses.asdict(a)}
    if kind == SEDD:
        info["noise"] = dict(config.get("noise", {"type": "loglinear"}))
    else:  # MDLM's and duo's log-linear schedule, alpha_t = 1 - (1 - eps) t
        info["noise"] = {"type": "loglinear", "eps": 1e-3}
    if kind == DUO:
        info["process"] = "uniform_state"
    return Loaded(apply=apply, params=params, kind=kind, vocab_size=a.vocab_size, mask_id=a.mask_id,
                  max_seq_len=a.max_seq_len, output="log_score" if kind == SEDD else "logits",
                  time_conditioned=a.time_conditioned, info=info)
