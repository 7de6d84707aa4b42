"""Score-entropy discrete diffusion (SEDD): absorbing and uniform graphs, DSE, I-MDSE, samplers.

Conventions (shared/specs/masked_and_score_entropy.md §§1-5, 8.1; SEDD arXiv 2310.16834;
I-MDSE arXiv 2510.24088 Thm 3.2):

* Tokens evolve independently under a token generator ``sigma(t) Q``. The **noise level**
  ``lam = 1 - exp(-sigma_bar(t))`` in [0, 1] is the coordinate every function here uses:
  - ``absorb``: a real token stays with probability ``1 - lam`` and becomes MASK (id V) with
    probability ``lam``; forward rate (per unit sigma_bar) 1 from every real token into MASK.
  - ``uniform`` (SEDD's released-code convention, Q = (1 1^T - V I) / V): with probability
    ``lam`` the token is resampled uniformly over the V real tokens (possibly itself), so
    ``K_lam(y | x) = (1 - lam) 1[y = x] + lam / V``; forward rate ``1 / V`` from every y != x
    into x. (The SEDD paper's Q = 1 1^T - V I is the same process with sigma_bar / V.)
* A **score model** is ``log_score_fn(z_BxL int32, lam_B float32) -> log s [B, L, V]`` with
  ``s[b, i, v] ~ p_lam(z with z_i := v) / p_lam(z)`` for the V real tokens. Entries at
  ``v = z_i`` are ignored (the ratio is 1); for ``absorb`` only masked positions are used.
  Trained networks condition on ``lam`` (not t), so estimators do not need the schedule.
* ``score_entropy`` is the DSE per unit sigma_bar (the rate sigma(t) factored out):
  ``l_DSE(t) = sigma(t) * score_entropy``, and per unit lam it is ``score_entropy / (1 - lam)``
  because ``d sigma_bar = d lam / (1 - lam)``.

Every term is computed as ``r * phi(s / r)`` with ``phi(u) = u - 1 - log u >= 0`` (equal to
``s - r log s + K(r)``, ``K(a) = a (log a - 1)``), in float32 from log-space inputs, so the loss
is non-negative by construction and zero at the exact score.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.processes import masked

GRAPHS = ("absorb", "uniform")
LAMBDA_SAMPLING = ("uniform", "importance", "defensive")
# Lowest per-sample variance measured with exact scores (RESULTS.md, "I-MDSE with exact scores").
DEFAULT_LAMBDA_SAMPLING = {"absorb": "defensive", "uniform": "importance"}
DEFENSIVE_MIX = 0.1

LogScoreFn = Callable[[jax.Array, jax.Array], jax.Array]

__all__ = [
    "GRAPHS",
    "LAMBDA_SAMPLING",
    "check_graph",
    "transition_probs",
    "corrupt",
    "sample_limit",
    "log_a",
    "absorb_log_score_from_mean",
    "absorb_mean_from_log_score",
    "uniform_log_score_from_mean",
    "score_entropy",
    "dce_absorb",
    "prior_kl_uniform",
    "sample_lambda",
    "euler_step",
    "tweedie_step",
    "sample",
    "ScoreFromParams",
    "OracleScore",
]


def check_graph(graph: str) -> str:
    """Return ``graph`` if it is 'absorb' or 'uniform'; raise ValueError naming it otherwise."""
    if graph not in GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; choose from {GRAPHS}")
    return graph


# ---------------------------------------------------------------------------------------------
# Forward process
# ---------------------------------------------------------------------------------------------
LAM_ONE = float(np.float32(1.0) - np.float32(2.0**-24))  # largest float32 below 1
LAM_ZERO = 1e-30


def clip_lam(lam):
    """lam clipped to [1e-30, 1 - 2^-24] (float32). In float32, 1 - exp(-sigma_bar) rounds to 1
    for sigma_bar > ~17 (the geometric schedule reaches 20); the clip keeps a(lam) > 0 finite
    there (a < 6e-8, a change far below float32 resolution of the loss)."""
    return jnp.clip(jnp.asarray(lam, jnp.float32), LAM_ZERO, LAM_ONE)


def log_a(lam):
    """log a(lam) = log((1 - lam) / lam) = -log(expm1(sigma_bar)): the absorbing score scale
    (spec §1.5, §5.1). float32, finite: lam is clipped by :func:`clip_lam`."""
    lam = clip_lam(lam)
    return jnp.log1p(-lam) - jnp.log(lam)


def transition_probs(graph: str, x_BxL: jax.Array, lam_B: jax.Array, vocab_size: int) -> jax.Array:
    """Closed-form kernel ``exp(sigma_bar Q)`` applied to one-hot x: p_{lam|0}(. | x) per token.

    Returns float32 [B, L, V + 1] for 'absorb' (last column = MASK) and [B, L, V] for
    'uniform'. Source: spec §1.2-1.3.
    """
    check_graph(graph)
    lam = jnp.asarray(lam_B, jnp.float32)[:, None, None]
    onehot = jax.nn.one_hot(x_BxL, vocab_size + (graph == "absorb"), dtype=jnp.float32)
    if graph == "absorb":
        mask = jax.nn.one_hot(jnp.full_like(x_BxL, vocab_size), vocab_size + 1, dtype=jnp.float32)
        return (1.0 - lam) * onehot + lam * mask
    return (1.0 - lam) * onehot + lam / vocab_size


def corrupt(graph: str, key: jax.Array, x_BxL: jax.Array, lam_B: jax.Array, vocab_size: int,
            target_BxL: jax.Array | None = None) -> jax.Array:
    """Sample z ~ p_{lam|0}(. | x) token by token (int32 [B, L]).

    absorb: MASK (id V) with probability lam; uniform: with probability lam a uniform draw
    over the V real tokens. Positions where ``target_BxL`` is False are left clean (the prompt
    of a conditional likelihood). Source: spec §1.2-1.3.
    """
    check_graph(graph)
    k1, k2 = jax.random.split(key)
    hit = jax.random.uniform(k1, x_BxL.shape) < jnp.asarray(lam_B, jnp.float32)[:, None]
    if target_BxL is not None:
        hit = hit & target_BxL
    if graph == "absorb":
        new = jnp.full_like(x_BxL, vocab_size)
    else:
        new = jax.random.randint(k2, x_BxL.shape, 0, vocab_size, dtype=x_BxL.dtype)
    return jnp.where(hit, new, x_BxL).astype(jnp.int32)


def sample_limit(graph: str, key: jax.Array, num_samples: int, seq_len: int, vocab_size: int) -> jax.Array:
    """A draw from the stationary law pi: all-MASK (absorb) or uniform tokens (uniform). int32."""
    check_graph(graph)
    if graph == "absorb":
        return jnp.full((num_samples, seq_len), vocab_size, jnp.int32)
    return jax.random.randint(key, (num_samples, seq_len), 0, vocab_size, dtype=jnp.int32)


# ---------------------------------------------------------------------------------------------
# Parameterisations (spec §5.2)
# ---------------------------------------------------------------------------------------------
def absorb_log_score_from_mean(log_c_BxLxV: jax.Array, lam_B: jax.Array) -> jax.Array:
    """RADD / MD4 Prop. 1: log s = log c + log a(lam), a = (1 - lam) / lam = 1 / expm1(sigma_bar).

    ``c`` is the (time-free) conditional p0(x_i = v | unmasked z) at masked positions (the mean
    or x0-prediction parameterisation); an unnormalised ``c`` (SEDD's "scale by sigma" head)
    converts the same way. float32 [B, L, V]. Source: arXiv 2406.03736 (RADD) Eq. 5; spec §5.
    """
    return log_c_BxLxV.astype(jnp.float32) + log_a(lam_B)[:, None, None]


def absorb_mean_from_log_score(log_s_BxLxV: jax.Array, lam_B: jax.Array) -> jax.Array:
    """Inverse of :func:`absorb_log_score_from_mean`: log c = log s - log a(lam). float32."""
    return log_s_BxLxV.astype(jnp.float32) - log_a(lam_B)[:, None, None]


def uniform_log_score_from_mean(log_p0_BxLxV: jax.Array, z_BxL: jax.Array, lam_B: jax.Array) -> jax.Array:
    """Uniform graph: exact scores from the x0-posterior p(x0_i = u | z) ("mean" parameterisation).

    With K the uniform kernel, ``s_v = sum_u P(u | z) K(v | u) / K(z_i | u)``, which simplifies
    (ours, re-derived from spec §1.3) to
    ``s_v = V a P_v + P_z / (1 + V a) + (1 - P_z)`` for v != z_i (``a = (1 - lam) / lam``,
    ``P_z = P(x0_i = z_i | z)``) and ``s_{z_i} = 1``. With the exact posterior it is the exact
    score. Computed by log-sum-exp; float32 [B, L, V].
    """
    lp = log_p0_BxLxV.astype(jnp.float32)
    V = lp.shape[-1]
    la = log_a(lam_B)[:, None, None]
    log_va = la + math.log(V)
    onehot = jax.nn.one_hot(z_BxL, V, dtype=bool)
    lp_z = jnp.sum(jnp.where(onehot, lp, 0.0), axis=-1, keepdims=True)
    # log(1 - P_z) as logsumexp over u != z_i (no cancellation when P_z -> 1).
    log_rest = jax.nn.logsumexp(jnp.where(onehot, -jnp.inf, lp), axis=-1, keepdims=True)
    terms = jnp.stack(
        [log_va + lp, jnp.broadcast_to(lp_z - jnp.logaddexp(0.0, log_va), lp.shape),
         jnp.broadcast_to(log_rest, lp.shape)], axis=0)
    log_s = jax.nn.logsumexp(terms, axis=0)
    return jnp.where(onehot, 0.0, log_s)


# ---------------------------------------------------------------------------------------------
# Denoising score entropy
# ---------------------------------------------------------------------------------------------
def _r_phi(log_s, log_r):
    """r * phi(s / r) = s - r log s + K(r) >= 0 from logs (float32)."""
    d = log_s - log_r
    return jnp.exp(log_r) * jnp.maximum(jnp.expm1(d) - d, 0.0)


def score_entropy(graph: str, log_score_BxLxV: jax.Array, x0_BxL: jax.Array, z_BxL: jax.Array,
                  lam_B: jax.Array, target_BxL: jax.Array | None = None) -> jax.Array:
    """Denoising score entropy per unit sigma_bar, summed over positions: float32 [B] (nats).

    ``sum_i sum_{y != z_i} q(y -> z_i) [s_y - r_y log s_y + K(r_y)]`` with
    ``r_y = p_{lam|0}(y | x0_i) / p_{lam|0}(z_i | x0_i)`` and q the rate per unit sigma_bar
    (absorb: 1 into MASK; uniform: 1/V). Multiply by sigma(t) for SEDD's l_DSE (Eq. 3), or by
    1 / (1 - lam) for the density in lam. Non-negative, zero iff s = r at every contributing
    entry, hence zero in expectation only at the exact score (spec §3.1).

    absorb: only masked positions contribute, ``a [phi(c_x0) + sum_{v != x0} c_v]`` with
    ``c = s / a``; for a normalised c this is ``a (-log c_x0)`` (Lemma 3.3: DSE = sigma a DCE).
    uniform (closed form, as SEDD's code): if z_i = x0_i, r = 1 / (1 + V a) for every y != z_i;
    otherwise r = 1 + V a at y = x0_i and 1 elsewhere; all scaled by 1/V.

    Args:
      log_score_BxLxV: float [B, L, V] log-scores (any float dtype; computed in float32).
      x0_BxL, z_BxL: int [B, L] clean and noised tokens (z may be MASK = V for absorb).
      lam_B: float [B] noise levels in (0, 1).
      target_BxL: optional bool [B, L]; positions outside it contribute nothing.
    Source: SEDD arXiv 2310.16834 Eq. 3 / code; spec §3.1.
    """
    check_graph(graph)
    ls = log_score_BxLxV.astype(jnp.float32)
    V = ls.shape[-1]
    la = log_a(lam_B)[:, None, None]  # [B, 1, 1]
    x0_oh = jax.nn.one_hot(x0_BxL, V, dtype=bool)
    if graph == "absorb":
        # c = s / a; per masked position a * (phi(c_x0) + sum_{v != x0} c_v).
        log_c = ls - la
        c = jnp.exp(log_c)
        lc_x0 = jnp.sum(jnp.where(x0_oh, log_c, 0.0), axis=-1)
        others = jnp.sum(jnp.where(x0_oh, 0.0, c), axis=-1)
        per_pos = jnp.exp(la[..., 0]) * (jnp.maximum(jnp.expm1(lc_x0) - lc_x0, 0.0) + others)
        active = z_BxL == V
    else:
        log_va1 = jnp.logaddexp(0.0, la + math.log(V))  # log(1 + V a)
        z_oh = jax.nn.one_hot(z_BxL, V, dtype=bool)
        same = (z_BxL == x0_BxL)[..., None]
        log_r = jnp.where(same, -log_va1, jnp.where(x0_oh, log_va1, 0.0))
        terms = jnp.where(z_oh, 0.0, _r_phi(ls, log_r))
        per_pos = jnp.sum(terms, axis=-1) / V
        active = jnp.ones(z_BxL.shape, bool)
    if target_BxL is not None:
        active = active & target_BxL
    return jnp.sum(jnp.where(active, per_pos, 0.0), axis=-1)


def dce_absorb(log_c_BxLxV: jax.Array, x0_BxL: jax.Array, z_BxL: jax.Array) -> jax.Array:
    """Denoising cross-entropy ``sum_{i masked} -log c_{i, x0_i}``: float32 [B] nats (spec §3.2)."""
    return masked.masked_cross_entropy(log_c_BxLxV.astype(jnp.float32), x0_BxL,
                                       z_BxL == log_c_BxLxV.shape[-1])


def prior_kl_uniform(lam_max: float, vocab_size: int, num_positions: int) -> float:
    """KL(p_{lam_max|0}(. | x0) || uniform) for ``num_positions`` tokens, nats (float, exact).

    Per token: e log(V e) + (V - 1) b log(V b), b = lam / V, e = 1 - lam + b. Independent
    of x0. 0 at lam_max = 1. Source: spec §1.3 / I-MDSE Eq. 11 with pi uniform.
    """
    lam = float(lam_max)
    V = int(vocab_size)
    b = lam / V
    e = 1.0 - lam + b
    kl = e * math.log(V * e)
    if b > 0:
        kl += (V - 1) * b * math.log(V * b)
    return float(num_positions) * max(kl, 0.0)


# ---------------------------------------------------------------------------------------------
# Noise-level sampling for the I-MDSE integral
# ---------------------------------------------------------------------------------------------
def sample_lambda(key: jax.Array, shape, lam_max: float, method: str = "importance"):
    """Draw noise levels on (0, lam_max] with their importance weights 1 / q(lam).

    'uniform': lam = lam_max u (weight lam_max). 'importance': lam = lam_max u^2, density
    q(lam) = 1 / (2 sqrt(lam lam_max)), weight 2 lam_max u. 'defensive' (Hesterberg's defensive
    mixture): 'uniform' with probability 0.9 and 'importance' with 0.1, weight 1 / q of the
    mixture density. The integrand near lam = 0 behaves like (1/lam) x Bernoulli(~L lam) (a
    single noised token with weight 1/lam), whose second moment diverges logarithmically under
    'uniform' (as lambda-DCE, spec §6.2); under 'importance' and 'defensive' it is finite.
    Measured per-sample SD with exact scores (RESULTS.md): 'defensive' is within a few % of
    'uniform' for the absorbing graph; 'importance' is lowest for the uniform graph on long
    sequences. u in (0, 1] so lam > 0. Returns (lam, weight), float32 ``shape``.
    """
    if method not in LAMBDA_SAMPLING:
        raise ValueError(f"unknown lambda sampling {method!r}; choose from {LAMBDA_SAMPLING}")
    k_u, k_pick = jax.random.split(key)
    u = 1.0 - jax.random.uniform(k_u, shape, jnp.float32)  # (0, 1]
    if method == "uniform":
        return lam_max * u, jnp.full(shape, lam_max, jnp.float32)
    if method == "importance":
        return lam_max * u * u, 2.0 * lam_max * u
    eps = DEFENSIVE_MIX
    pick = jax.random.uniform(k_pick, shape, jnp.float32) < eps
    lam = lam_max * jnp.where(pick, u * u, u)
    q = (1.0 - eps) / lam_max + eps / (2.0 * jnp.sqrt(lam * lam_max))
    return lam, 1.0 / q


# ---------------------------------------------------------------------------------------------
# Samplers (spec §8.1)
# ---------------------------------------------------------------------------------------------
def _log_clip(p):
    return jnp.log(jnp.maximum(p, 0.0))


def euler_step(graph: str, key: jax.Array, z_BxL: jax.Array, log_s_BxLxV: jax.Array,
               d_sigma_bar_B: jax.Array) -> jax.Array:
    """One Euler step of the reverse CTMC over ``d_sigma_bar = sigma(t) dt`` (spec §8.1).

    Per position, y != z_i is drawn with probability d_sigma_bar * q(y -> z_i) * s_y and z_i
    is kept with the rest (clipped at 0). absorb: only MASK positions move (rate s_v into v);
    uniform: rate s_y / V. Categorical draws use the exact-tail sampler
    (:func:`masked.sample_categorical`). int32 [B, L].
    """
    check_graph(graph)
    ls = log_s_BxLxV.astype(jnp.float32)
    B, L, V = ls.shape
    ds = jnp.asarray(d_sigma_bar_B, jnp.float32)[:, None, None]
    rate_log = ls + jnp.log(ds) - (math.log(V) if graph == "uniform" else 0.0)
    if graph == "absorb":
        stay = 1.0 - jnp.sum(jnp.exp(rate_log), axis=-1, keepdims=True)
        logp = jnp.concatenate([rate_log, _log_clip(stay)], axis=-1)  # [B, L, V + 1]
        new = masked.sample_categorical(key, logp.reshape(B * L, V + 1)).reshape(B, L)
        return jnp.where(z_BxL == V, new, z_BxL).astype(jnp.int32)
    z_oh = jax.nn.one_hot(z_BxL, V, dtype=bool)
    move = jnp.where(z_oh, 0.0, jnp.exp(rate_log))
    stay = 1.0 - jnp.sum(move, axis=-1, keepdims=True)
    logp = jnp.where(z_oh, _log_clip(stay), rate_log)
    return masked.sample_categorical(key, logp.reshape(B * L, V)).reshape(B, L)


def tweedie_step(graph: str, key: jax.Array, z_BxL: jax.Array, log_s_BxLxV: jax.Array,
                 d_sigma_bar_B: jax.Array, final: bool = False) -> jax.Array:
    """One Tweedie tau-leaping ("analytic") step over ``d_sigma_bar`` (spec §8.1).

    ``p(y | z_i) ∝ [exp(-Δσ Q) s]_y [exp(Δσ Q)]_{z_i, y}``:
    absorb at MASK: real v with ``s_v expm1(Δσ)``, MASK with ``1 - expm1(Δσ) sum_v s_v``
    (clipped at 0); with the exact score this is the exact posterior (unmask probability
    (lam_t - lam_s) / lam_t). ``final=True`` drops the MASK column (the last denoising step).
    uniform: staggered score ``e^{Δσ} s_y + (1 - e^{Δσ}) mean(s)`` times ``K_Δσ(z_i | y)``.
    int32 [B, L]. Source: SEDD arXiv 2310.16834 §4.2 and code ("analytic" predictor).
    """
    check_graph(graph)
    ls = log_s_BxLxV.astype(jnp.float32)
    B, L, V = ls.shape
    ds = jnp.asarray(d_sigma_bar_B, jnp.float32)[:, None, None]
    if graph == "absorb":
        log_em1 = jnp.log(jnp.expm1(ds))
        unmask = ls + log_em1
        if final:
            logp = jnp.concatenate([ls, jnp.full((B, L, 1), -jnp.inf)], axis=-1)
        else:
            stay = 1.0 - jnp.sum(jnp.exp(unmask), axis=-1, keepdims=True)
            logp = jnp.concatenate([unmask, _log_clip(stay)], axis=-1)
        new = masked.sample_categorical(key, logp.reshape(B * L, V + 1)).reshape(B, L)
        return jnp.where(z_BxL == V, new, z_BxL).astype(jnp.int32)
    z_oh = jax.nn.one_hot(z_BxL, V, dtype=bool)
    s = jnp.exp(jnp.where(z_oh, 0.0, ls))
    stag = jnp.exp(ds) * s - jnp.expm1(ds) * jnp.mean(s, axis=-1, keepdims=True)
    k_back = jnp.where(z_oh, jnp.exp(-ds), 0.0) - jnp.expm1(-ds) / V  # K_Δσ(z_i | y)
    logp = _log_clip(stag) + jnp.log(k_back)
    return masked.sample_categorical(key, logp.reshape(B * L, V)).reshape(B, L)


@functools.partial(jax.jit, static_argnames=("log_score_fn", "graph", "num_samples", "seq_len",
                                             "vocab_size", "num_steps", "method", "lam_max", "lam_min"))
def _sample(log_score_fn, graph, key, num_samples, seq_len, vocab_size, num_steps, method,
            lam_max, lam_min, prompt_BxP=None):
    k0, key = jax.random.split(key)
    z = sample_limit(graph, k0, num_samples, seq_len, vocab_size)
    P = 0 if prompt_BxP is None else prompt_BxP.shape[1]
    if P:
        z = z.at[:, :P].set(prompt_BxP.astype(jnp.int32))
    # Uniform grid in lam from lam_max down to lam_min (= uniform in t for loglinear).
    # lam = 1 is clipped to 1 - 2^-24 for both the score and sigma_bar, consistently: the
    # absorbing Tweedie unmask probability s_v expm1(Δσ) = c_v (lam_t - lam_s) / lam_t then
    # stays exact (the score's a(lam) and expm1(Δσ) use the same clipped lam).
    lams = clip_lam(jnp.linspace(lam_max, lam_min, num_steps + 1))
    sbar = -jnp.log1p(-lams)  # sigma_bar at each grid point
    step = euler_step if method == "euler" else tweedie_step

    def scores(z, lam):
        ls = log_score_fn(z, lam)
        if ls.shape != (num_samples, seq_len, vocab_size):
            raise ValueError(f"the score model returned shape {ls.shape}, expected "
                             f"{(num_samples, seq_len, vocab_size)} (vocab_size={vocab_size} mismatch?)")
        return ls

    def body(i, z):
        lam_t = jnp.full((num_samples,), lams[i])
        ds = jnp.full((num_samples,), sbar[i] - sbar[i + 1])
        ls = scores(z, lam_t)
        znew = step(graph, jax.random.fold_in(key, i), z, ls, ds)
        return znew.at[:, :P].set(z[:, :P]) if P else znew

    z = jax.lax.fori_loop(0, num_steps, body, z)
    # Final denoising step from lam_min to 0 (Tweedie with Δσ = sigma_bar(lam_min)).
    lam_t = jnp.full((num_samples,), lams[-1])
    ls = scores(z, lam_t)
    znew = tweedie_step(graph, jax.random.fold_in(key, num_steps), z, ls,
                        jnp.full((num_samples,), sbar[-1]), final=True)
    return znew.at[:, :P].set(z[:, :P]) if P else znew


def sample(log_score_fn: LogScoreFn, graph: str, key: jax.Array, num_samples: int, seq_len: int,
           vocab_size: int, num_steps: int, method: str = "tweedie", lam_max: float = 1.0,
           lam_min: float = 1e-5, prompt_BxP=None) -> jax.Array:
    """Generate sequences by simulating the reverse CTMC: int32 [num_samples, seq_len].

    Starts from the limit law (all-MASK / uniform tokens) at lam_max, takes ``num_steps``
    Euler or Tweedie ("analytic") steps on a grid uniform in lam down to ``lam_min``, then a
    final Tweedie denoising step to lam = 0 (absorb: MASK column dropped, so no MASK remains).
    ``log_score_fn`` must be hashable (a network wrapper or an oracle's bound method); it is
    a static argument of the compiled loop. An optional prompt [B, P] is held fixed at the
    first P positions. Raises ValueError for an unknown graph or method, num_steps < 1 or
    lam_min outside (0, lam_max). Source: spec §8.1.
    """
    check_graph(graph)
    _check_model_graph(log_score_fn, graph)
    if method not in ("euler", "tweedie"):
        raise ValueError(f"unknown sampler {method!r}; choose 'euler' or 'tweedie'")
    if int(num_steps) < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    if not 0.0 < float(lam_min) < float(lam_max) <= 1.0:
        raise ValueError(f"need 0 < lam_min < lam_max <= 1; got lam_min={lam_min}, lam_max={lam_max}")
    return _sample(log_score_fn, graph, key, int(num_samples), int(seq_len), int(vocab_size),
                   int(num_steps), method, float(lam_max), float(lam_min), prompt_BxP)


def _check_model_graph(score_model, graph: str) -> None:
    """Raise ValueError if a score model that declares its graph (``.graph``) has another one."""
    own = getattr(score_model, "graph", None)
    if own is not None and own != graph:
        raise ValueError(f"the score model is for the {own!r} graph but graph={graph!r} was requested")


@dataclasses.dataclass(frozen=True)
class ScoreFromParams:
    """Adapter ``(z, lam) -> log s`` from a parameterised ``apply(params, z, lam)`` (hash by id)."""

    apply: Callable
    params: object

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    def __call__(self, z_BxL, lam_B):
        return self.apply(self.params, z_BxL, lam_B)


@dataclasses.dataclass(frozen=True)
class OracleScore:
    """The exact score of an oracle (:mod:`infodiff.oracles`) as a score model ``(z, lam) -> log s``.

    ``oracle.log_score(z_BxL, lam_B, graph)`` gives exact log-ratios p_lam(z^{i->v}) / p_lam(z)
    (tabular: enumeration; Markov, uniform graph: forward-backward of the noised hidden Markov
    model; absorb: a times the masked conditionals). Equal (and hashed alike) for the same oracle
    object and graph, so repeated wrappers reuse compiled programs (a static jit argument).
    """

    oracle: object
    graph: str

    def __post_init__(self):
        check_graph(self.graph)

    @property
    def vocab_size(self) -> int:
        return int(self.oracle.vocab_size)

    def __call__(self, z_BxL, lam_B):
        return self.oracle.log_score(z_BxL, lam_B, self.graph)
