"""Score-entropy discrete diffusion (SEDD): absorbing and uniform graphs, DSE, I-MDSE, samplers.

Conventions (docs/discrete_diffusion.md §§1-5, 8.1; SEDD arXiv 2310.16834;
I-MDSE arXiv 2510.24088 Thm 3.2):

* Tokens evolve independently under a token generator ``sigma(t) Q``. The **noise level**
  ``lam = 1 - exp(-sigma_bar(t))`` in [0, 1] is the coordinate every function here uses:
  - ``absorb``: a real token stays with probability ``1 - lam`` and becomes MASK (id V) with
    probability ``lam``; forward rate (per unit sigma_bar) 1 from every real token into MASK.
  - ``uniform`` (SEDD's released-code convention, Q = (1 1^T - V I) / V): with probability
    ``lam`` the token is resampled uniformly over the V real tokens (possibly itself), so
    ``K_lam(y | x) = (1 - lam) 1[y = x] + lam / V``; forward rate ``1 / V`` from every y != x
    into x. (The SEDD paper's Q = 1 1^T - V I is the same process with sigma_bar / V.)
* A **score model** is ``log_score_fn(z_BxL int32, lam float32) -> log s [B, L, V]`` with
  ``s[b, i, v] ~ p_lam(z with z_i := v) / p_lam(z)`` for the V real tokens; lam is one noise
  level per sequence [B] or one per position [B, L] (0 at a clean position such as a prompt,
  1 at pure noise such as a pad: under the uniform graph a clean token looks like a noised one). Entries at
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

from infodiff.processes import base
from infodiff.processes import masked

GRAPHS = ("absorb", "uniform")
LAMBDA_SAMPLING = ("uniform", "importance", "defensive")
# Lowest per-sample variance measured with exact scores (RESULTS.md, "I-MDSE with exact scores").
DEFAULT_LAMBDA_SAMPLING = {"absorb": "defensive", "uniform": "importance"}
DEFENSIVE_MIX = 0.1

LogScoreFn = Callable[[jax.Array, jax.Array], jax.Array]

__all__ = [
    "GRAPHS",
    "LOG_ZERO",
    "per_token",
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
# log of the smallest normal float32 (about -87.34): the value the exact scores use for log 0
# (absorb at unmasked positions, absorb at lam = 1, symbols of probability 0) and the floor of
# every exact log-ratio, so that exp() gives ~1e-38 (not inf) and 0 * log s = 0 (not NaN)
# inside jitted sums. Same value in float32 and float64.
LOG_ZERO = float(np.log(np.finfo(np.float32).tiny))


def per_token(lam):
    """Noise levels shaped to broadcast against [B, L, V]: lam [B] -> [B, 1, 1] (one level per
    sequence), lam [B, L] -> [B, L, 1] (one level per position). numpy or jax arrays."""
    return lam[:, None, None] if lam.ndim == 1 else lam[:, :, None]


def clip_lam(lam):
    """lam clipped to [1e-30, 1 - 2^-24] (float32). In float32, 1 - exp(-sigma_bar) rounds to 1
    for sigma_bar > ~17 (the geometric schedule reaches 20); the clip keeps a(lam) > 0 finite
    there (a < 6e-8, a change far below float32 resolution of the loss)."""
    return jnp.clip(jnp.asarray(lam, jnp.float32), LAM_ZERO, LAM_ONE)


def log_a(lam):
    """log a(lam) = log((1 - lam) / lam) = -log(expm1(sigma_bar)): the absorbing score scale
    (docs/discrete_diffusion.md §1.5, §5.1). float32, finite: lam is clipped by :func:`clip_lam`."""
    lam = clip_lam(lam)
    return jnp.log1p(-lam) - jnp.log(lam)


def transition_probs(graph, x_BxL: jax.Array, lam_B: jax.Array, vocab_size: int) -> jax.Array:
    """Closed-form kernel ``exp(sigma_bar Q)`` applied to one-hot x: p_{lam|0}(. | x) per token.

    Returns float32 [B, L, V + 1] for 'absorb' (last column = MASK) and [B, L, V] for
    'uniform'. Source: docs/discrete_diffusion.md §1.2-1.3.
    """
    return get_graph(graph).transition_probs(x_BxL, lam_B, vocab_size)


def corrupt(graph, key: jax.Array, x_BxL: jax.Array, lam_B: jax.Array, vocab_size: int,
            target_BxL: jax.Array | None = None) -> jax.Array:
    """Sample z ~ p_{lam|0}(. | x) token by token (int32 [B, L]).

    absorb: MASK (id V) with probability lam; uniform: with probability lam a uniform draw
    over the V real tokens. Positions where ``target_BxL`` is False are left clean (the prompt
    of a conditional likelihood). The draw itself (:meth:`Graph.draw_corruption`) does not look
    at x. Source: docs/discrete_diffusion.md §1.2-1.3.
    """
    g = get_graph(graph)
    hit, new = g.draw_corruption(key, x_BxL.shape, lam_B, vocab_size, target_BxL, dtype=x_BxL.dtype)
    return apply_corruption(x_BxL, hit, new)


def apply_corruption(x_BxL: jax.Array, hit_BxL: jax.Array, new_BxL: jax.Array) -> jax.Array:
    """z = new where hit, else x (int32 [B, L])."""
    return jnp.where(hit_BxL, new_BxL, x_BxL).astype(jnp.int32)


def sample_limit(graph, key: jax.Array, num_samples: int, seq_len: int, vocab_size: int) -> jax.Array:
    """A draw from the stationary law pi: all-MASK (absorb) or uniform tokens (uniform). int32."""
    return get_graph(graph).sample_limit(key, num_samples, seq_len, vocab_size)


# ---------------------------------------------------------------------------------------------
# Parameterisations (docs/discrete_diffusion.md §5.2)
# ---------------------------------------------------------------------------------------------
def absorb_log_score_from_mean(log_c_BxLxV: jax.Array, lam_B: jax.Array) -> jax.Array:
    """RADD / MD4 Prop. 1: log s = log c + log a(lam), a = (1 - lam) / lam = 1 / expm1(sigma_bar).

    ``c`` is the (time-free) conditional p0(x_i = v | unmasked z) at masked positions (the mean
    or x0-prediction parameterisation); an unnormalised ``c`` (SEDD's "scale by sigma" head)
    converts the same way. float32 [B, L, V]. Source: arXiv 2406.03736 (RADD) Eq. 5; docs/discrete_diffusion.md §5.
    """
    return log_c_BxLxV.astype(jnp.float32) + per_token(log_a(lam_B))


def absorb_mean_from_log_score(log_s_BxLxV: jax.Array, lam_B: jax.Array) -> jax.Array:
    """Inverse of :func:`absorb_log_score_from_mean`: log c = log s - log a(lam). float32."""
    return log_s_BxLxV.astype(jnp.float32) - per_token(log_a(lam_B))


def uniform_log_score_from_mean(log_p0_BxLxV: jax.Array, z_BxL: jax.Array, lam_B: jax.Array) -> jax.Array:
    """Uniform graph: exact scores from the x0-posterior p(x0_i = u | z) ("mean" parameterisation).

    With K the uniform kernel, ``s_v = sum_u P(u | z) K(v | u) / K(z_i | u)``, which simplifies
    (ours, re-derived from docs/discrete_diffusion.md §1.3) to
    ``s_v = V a P_v + P_z / (1 + V a) + (1 - P_z)`` for v != z_i (``a = (1 - lam) / lam``,
    ``P_z = P(x0_i = z_i | z)``) and ``s_{z_i} = 1``. With the exact posterior it is the exact
    score. lam_B [B] or per position [B, L]. Computed by log-sum-exp; float32 [B, L, V].
    """
    lp = log_p0_BxLxV.astype(jnp.float32)
    V = lp.shape[-1]
    la = per_token(log_a(lam_B))
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


def score_entropy(graph, log_score_BxLxV: jax.Array, x0_BxL: jax.Array, z_BxL: jax.Array,
                  lam_B: jax.Array, target_BxL: jax.Array | None = None) -> jax.Array:
    """Denoising score entropy per unit sigma_bar, summed over positions: float32 [B] (nats).

    ``sum_i sum_{y != z_i} q(y -> z_i) [s_y - r_y log s_y + K(r_y)]`` with
    ``r_y = p_{lam|0}(y | x0_i) / p_{lam|0}(z_i | x0_i)`` and q the rate per unit sigma_bar
    (absorb: 1 into MASK; uniform: 1/V). Multiply by sigma(t) for SEDD's l_DSE (Eq. 3), or by
    1 / (1 - lam) for the density in lam. Non-negative, zero iff s = r at every contributing
    entry, hence zero in expectation only at the exact score (docs/discrete_diffusion.md §3.1).
    The graph's own formula is :meth:`AbsorbGraph.score_entropy` / :meth:`UniformGraph.score_entropy`.

    Args:
      log_score_BxLxV: float [B, L, V] log-scores (any float dtype; computed in float32).
      x0_BxL, z_BxL: int [B, L] clean and noised tokens (z may be MASK = V for absorb).
      lam_B: float [B] noise levels in (0, 1).
      target_BxL: optional bool [B, L]; positions outside it contribute nothing.
    Source: SEDD arXiv 2310.16834 Eq. 3 / code; docs/discrete_diffusion.md §3.1.
    """
    return get_graph(graph).score_entropy(log_score_BxLxV, x0_BxL, z_BxL, lam_B, target_BxL)


def dce_absorb(log_c_BxLxV: jax.Array, x0_BxL: jax.Array, z_BxL: jax.Array) -> jax.Array:
    """Denoising cross-entropy ``sum_{i masked} -log c_{i, x0_i}``: float32 [B] nats (docs/discrete_diffusion.md §3.2)."""
    return masked.masked_cross_entropy(log_c_BxLxV.astype(jnp.float32), x0_BxL,
                                       z_BxL == log_c_BxLxV.shape[-1])


def prior_kl_uniform(lam_max: float, vocab_size: int, num_positions: int) -> float:
    """KL(p_{lam_max|0}(. | x0) || uniform) for ``num_positions`` tokens, nats (float, exact).

    Per token: e log(V e) + (V - 1) b log(V b), b = lam / V, e = 1 - lam + b. Independent
    of x0. 0 at lam_max = 1. Source: docs/discrete_diffusion.md §1.3 / I-MDSE Eq. 11 with pi uniform.
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
    'uniform' (as lambda-DCE, docs/discrete_diffusion.md §6.2); under 'importance' and 'defensive' it is finite.
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
# Samplers (docs/discrete_diffusion.md §8.1)
# ---------------------------------------------------------------------------------------------
def _log_clip(p):
    return jnp.log(jnp.maximum(p, 0.0))


# ---------------------------------------------------------------------------------------------
# Graphs: each one's kernel, corruption, limit law, DSE and reverse steps
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AbsorbGraph:
    """Absorbing graph: a real token becomes MASK (id V) at rate 1 per unit sigma_bar, so it
    survives with probability 1 - lam (docs/discrete_diffusion.md §1.2)."""

    name: str = dataclasses.field(default="absorb", init=False)
    has_mask: bool = dataclasses.field(default=True, init=False)
    # A clean position is visible in z itself (it is not MASK): the score model needs one noise
    # level per sequence only.
    needs_position_lam: bool = dataclasses.field(default=False, init=False)

    def transition_probs(self, x_BxL, lam_B, vocab_size):
        """float32 [B, L, V + 1], last column MASK."""
        lam = jnp.asarray(lam_B, jnp.float32)[:, None, None]
        onehot = jax.nn.one_hot(x_BxL, vocab_size + 1, dtype=jnp.float32)
        mask = jax.nn.one_hot(jnp.full_like(x_BxL, vocab_size), vocab_size + 1, dtype=jnp.float32)
        return (1.0 - lam) * onehot + lam * mask

    def draw_corruption(self, key, shape, lam_B, vocab_size, target_BxL=None, dtype=jnp.int32):
        """(hit_BxL bool, new_BxL): which positions are noised and what they become (MASK).
        Independent of the clean tokens, so coupled estimates can share it."""
        k1, _ = jax.random.split(key)
        hit = jax.random.uniform(k1, shape) < jnp.asarray(lam_B, jnp.float32)[:, None]
        if target_BxL is not None:
            hit = hit & target_BxL
        return hit, jnp.full(shape, vocab_size, dtype)

    def sample_limit(self, key, num_samples, seq_len, vocab_size):
        del key
        return jnp.full((num_samples, seq_len), vocab_size, jnp.int32)

    # ---- exact maths for the oracles (numpy float64 or jax float32 via ``xp``) ----
    def num_states(self, vocab_size: int) -> int:
        """Token ids a noised sequence may hold: the V real tokens and MASK (id V)."""
        return vocab_size + 1

    def log_emission(self, xp, z_BxL, lam, vocab_size: int):
        """log K_lam(z_j | u): [B, L, V] over clean tokens u (docs/discrete_diffusion.md §1.2).
        lam [B] or per position [B, L]; MASK has log lam, the same token log(1 - lam)."""
        V = vocab_size
        lam = per_token(lam)
        match = z_BxL[:, :, None] == xp.arange(V)[None, None, :]
        masked_ = (z_BxL == V)[:, :, None]
        return xp.where(masked_, xp.log(lam), xp.where(match, xp.log1p(-lam), -xp.inf))

    def rel_log_emission(self, xp, z_BxL, lam, vocab_size: int):
        """log K_lam(z_j | u) up to a factor free of u, [B, L, V] (posterior weights only):
        0 if z_j = u or z_j = MASK, else -inf (lam does not enter)."""
        V = vocab_size
        match = z_BxL[:, :, None] == xp.arange(V)[None, None, :]
        ok = match | (z_BxL == V)[:, :, None]
        return xp.where(ok, 0.0, -xp.inf)

    def mismatch_log_weight(self, xp, n_BxKxL, lam_B, vocab_size: int):
        """log prod K(z_j | x_j) / K(x_j | x_j) over ``n`` real tokens z_j != x_j at one noise
        level per row (lam_B [B]): -inf if n > 0 (a real token never turns into another)."""
        return xp.where(n_BxKxL > 0, -xp.inf, 0.0)

    def log_score_from_posterior(self, xp, lq_BxLxV, z_BxL, lam, vocab_size: int):
        """Exact log-scores from the leave-one-out posterior q_i(u) = P(x_i = u | z_{-i}):
        at a masked position log a + log q(v), a = (1 - lam) / lam (docs/discrete_diffusion.md
        §5.1); LOG_ZERO at an unmasked one. lam [B] or [B, L]; floored at LOG_ZERO; [B, L, V]."""
        lam = per_token(lam)
        log1m = xp.log1p(-lam)
        out = xp.where((z_BxL == vocab_size)[:, :, None], (log1m - xp.log(lam)) + lq_BxLxV, LOG_ZERO)
        return xp.maximum(out, LOG_ZERO)

    def score_entropy(self, log_score_BxLxV, x0_BxL, z_BxL, lam_B, target_BxL=None):
        """Only masked positions contribute, ``a [phi(c_x0) + sum_{v != x0} c_v]`` with
        ``c = s / a``; for a normalised c this is ``a (-log c_x0)`` (Lemma 3.3: DSE = sigma a DCE)."""
        ls = log_score_BxLxV.astype(jnp.float32)
        V = ls.shape[-1]
        la = log_a(lam_B)[:, None, None]  # [B, 1, 1]
        x0_oh = jax.nn.one_hot(x0_BxL, V, dtype=bool)
        log_c = ls - la
        c = jnp.exp(log_c)
        lc_x0 = jnp.sum(jnp.where(x0_oh, log_c, 0.0), axis=-1)
        others = jnp.sum(jnp.where(x0_oh, 0.0, c), axis=-1)
        per_pos = jnp.exp(la[..., 0]) * (jnp.maximum(jnp.expm1(lc_x0) - lc_x0, 0.0) + others)
        active = z_BxL == V
        if target_BxL is not None:
            active = active & target_BxL
        return jnp.sum(jnp.where(active, per_pos, 0.0), axis=-1)

    def prior_kl(self, lam_max, vocab_size, num_positions):
        """None: the absorbing prior KL depends on the model (see ScoreEntropyProcess.exact_terms)."""
        return None

    def euler_step(self, key, z_BxL, log_s_BxLxV, d_sigma_bar_B):
        """Only MASK positions move, to v at rate s_v (clipped stay probability)."""
        ls = log_s_BxLxV.astype(jnp.float32)
        B, L, V = ls.shape
        ds = jnp.asarray(d_sigma_bar_B, jnp.float32)[:, None, None]
        rate_log = ls + jnp.log(ds)
        stay = 1.0 - jnp.sum(jnp.exp(rate_log), axis=-1, keepdims=True)
        logp = jnp.concatenate([rate_log, _log_clip(stay)], axis=-1)  # [B, L, V + 1]
        new = masked.sample_categorical(key, logp.reshape(B * L, V + 1)).reshape(B, L)
        return jnp.where(z_BxL == V, new, z_BxL).astype(jnp.int32)

    def tweedie_step(self, key, z_BxL, log_s_BxLxV, d_sigma_bar_B, final=False):
        """At MASK: real v with ``s_v expm1(Δσ)``, MASK with ``1 - expm1(Δσ) sum_v s_v``
        (clipped at 0); exact posterior for the exact score. ``final`` drops the MASK column."""
        ls = log_s_BxLxV.astype(jnp.float32)
        B, L, V = ls.shape
        ds = jnp.asarray(d_sigma_bar_B, jnp.float32)[:, None, None]
        log_em1 = jnp.log(jnp.expm1(ds))
        unmask = ls + log_em1
        if final:
            logp = jnp.concatenate([ls, jnp.full((B, L, 1), -jnp.inf)], axis=-1)
        else:
            stay = 1.0 - jnp.sum(jnp.exp(unmask), axis=-1, keepdims=True)
            logp = jnp.concatenate([unmask, _log_clip(stay)], axis=-1)
        new = masked.sample_categorical(key, logp.reshape(B * L, V + 1)).reshape(B, L)
        return jnp.where(z_BxL == V, new, z_BxL).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class UniformGraph:
    """Uniform graph (SEDD's code convention Q = (1 1^T - V I) / V): with probability lam a
    token is resampled uniformly over the V real tokens (docs/discrete_diffusion.md §1.3)."""

    name: str = dataclasses.field(default="uniform", init=False)
    has_mask: bool = dataclasses.field(default=False, init=False)
    # A clean token looks like a noised one: a score model must be told which positions are
    # clean (lam = 0 there: a prompt) or pure noise (lam = 1: a pad).
    needs_position_lam: bool = dataclasses.field(default=True, init=False)

    def transition_probs(self, x_BxL, lam_B, vocab_size):
        """float32 [B, L, V]: (1 - lam) 1[y = x] + lam / V."""
        lam = jnp.asarray(lam_B, jnp.float32)[:, None, None]
        onehot = jax.nn.one_hot(x_BxL, vocab_size, dtype=jnp.float32)
        return (1.0 - lam) * onehot + lam / vocab_size

    def draw_corruption(self, key, shape, lam_B, vocab_size, target_BxL=None, dtype=jnp.int32):
        """(hit_BxL bool, new_BxL uniform tokens); independent of the clean tokens."""
        k1, k2 = jax.random.split(key)
        hit = jax.random.uniform(k1, shape) < jnp.asarray(lam_B, jnp.float32)[:, None]
        if target_BxL is not None:
            hit = hit & target_BxL
        return hit, jax.random.randint(k2, shape, 0, vocab_size, dtype=dtype)

    def sample_limit(self, key, num_samples, seq_len, vocab_size):
        return jax.random.randint(key, (num_samples, seq_len), 0, vocab_size, dtype=jnp.int32)

    # ---- exact maths for the oracles (numpy float64 or jax float32 via ``xp``) ----
    def num_states(self, vocab_size: int) -> int:
        """Token ids a noised sequence may hold: the V real tokens."""
        return vocab_size

    def log_emission(self, xp, z_BxL, lam, vocab_size: int):
        """log K_lam(z_j | u): [B, L, V] over clean tokens u (docs/discrete_diffusion.md §1.3):
        log(1 - lam (V - 1) / V) if z_j = u, log(lam / V) otherwise. lam [B] or [B, L]."""
        V = vocab_size
        lam = per_token(lam)
        match = z_BxL[:, :, None] == xp.arange(V)[None, None, :]
        return xp.where(match, xp.log1p(-lam * ((V - 1) / V)), xp.log(lam) - math.log(V))

    def log_mismatch(self, xp, lam, vocab_size: int):
        """D = log K(z != u) - log K(z = u) = log lam - log(V - (V - 1) lam), the shape of lam
        (exactly 0 at lam = 1, -inf at lam = 0)."""
        return xp.log(lam) - xp.log(vocab_size - (vocab_size - 1) * lam)

    def rel_log_emission(self, xp, z_BxL, lam, vocab_size: int):
        """log K_lam(z_j | u) up to a factor free of u, [B, L, V]: 0 if u = z_j else D
        (:meth:`log_mismatch`). lam [B] or per position [B, L]."""
        V = vocab_size
        match = z_BxL[:, :, None] == xp.arange(V)[None, None, :]
        D = per_token(self.log_mismatch(xp, lam, V))
        return xp.where(match, xp.zeros_like(D), D)

    def mismatch_log_weight(self, xp, n_BxKxL, lam_B, vocab_size: int):
        """log prod K(z_j | x_j) / K(x_j | x_j) over ``n`` real tokens z_j != x_j at one noise
        level per row (lam_B [B]): n D, an integer count times D (no cancellation)."""
        D_B = self.log_mismatch(xp, lam_B, vocab_size)
        return xp.where(n_BxKxL > 0, n_BxKxL * D_B[:, None, None], 0.0)

    def log_score_from_posterior(self, xp, lq_BxLxV, z_BxL, lam, vocab_size: int):
        """Exact log-scores from the leave-one-out posterior q_i(u) = P(x_i = u | z_{-i}):
        s_v = sum_u q(u) K(v|u) / sum_u q(u) K(z_i|u), i.e. log s_v = h(v) - h(z_i) with
        h(u) = logaddexp(log(1 - lam) + log q(u), log(lam / V)) (exactly 0 at v = z_i; at
        lam = 0, a clean position, the ratio q(v) / q(z_i)). lam [B] or [B, L]; floored at
        LOG_ZERO; [B, L, V]. Source: docs/discrete_diffusion.md §1.3, §5."""
        lam = per_token(lam)
        h = xp.logaddexp(xp.log1p(-lam) + lq_BxLxV, xp.log(lam) - math.log(vocab_size))
        out = h - xp.take_along_axis(h, z_BxL[:, :, None], axis=-1)
        return xp.maximum(out, LOG_ZERO)

    def score_entropy(self, log_score_BxLxV, x0_BxL, z_BxL, lam_B, target_BxL=None):
        """Closed form (as SEDD's code): if z_i = x0_i, r = 1 / (1 + V a) for every y != z_i;
        otherwise r = 1 + V a at y = x0_i and 1 elsewhere; all scaled by the rate 1/V."""
        ls = log_score_BxLxV.astype(jnp.float32)
        V = ls.shape[-1]
        la = log_a(lam_B)[:, None, None]  # [B, 1, 1]
        x0_oh = jax.nn.one_hot(x0_BxL, V, dtype=bool)
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

    def prior_kl(self, lam_max, vocab_size, num_positions):
        """KL(p_{lam_max|0} || uniform) for ``num_positions`` tokens (:func:`prior_kl_uniform`)."""
        return prior_kl_uniform(lam_max, vocab_size, num_positions)

    def euler_step(self, key, z_BxL, log_s_BxLxV, d_sigma_bar_B):
        """y != z_i with probability d_sigma_bar s_y / V, z_i kept with the rest."""
        ls = log_s_BxLxV.astype(jnp.float32)
        B, L, V = ls.shape
        ds = jnp.asarray(d_sigma_bar_B, jnp.float32)[:, None, None]
        rate_log = ls + jnp.log(ds) - math.log(V)
        z_oh = jax.nn.one_hot(z_BxL, V, dtype=bool)
        move = jnp.where(z_oh, 0.0, jnp.exp(rate_log))
        stay = 1.0 - jnp.sum(move, axis=-1, keepdims=True)
        logp = jnp.where(z_oh, _log_clip(stay), rate_log)
        return masked.sample_categorical(key, logp.reshape(B * L, V)).reshape(B, L)

    def tweedie_step(self, key, z_BxL, log_s_BxLxV, d_sigma_bar_B, final=False):
        """Staggered score ``e^{Δσ} s_y + (1 - e^{Δσ}) mean(s)`` times ``K_Δσ(z_i | y)``."""
        del final
        ls = log_s_BxLxV.astype(jnp.float32)
        B, L, V = ls.shape
        ds = jnp.asarray(d_sigma_bar_B, jnp.float32)[:, None, None]
        z_oh = jax.nn.one_hot(z_BxL, V, dtype=bool)
        s = jnp.exp(jnp.where(z_oh, 0.0, ls))
        stag = jnp.exp(ds) * s - jnp.expm1(ds) * jnp.mean(s, axis=-1, keepdims=True)
        k_back = jnp.where(z_oh, jnp.exp(-ds), 0.0) - jnp.expm1(-ds) / V  # K_Δσ(z_i | y)
        logp = _log_clip(stag) + jnp.log(k_back)
        return masked.sample_categorical(key, logp.reshape(B * L, V)).reshape(B, L)


ABSORB = AbsorbGraph()
UNIFORM = UniformGraph()
_GRAPHS = {"absorb": ABSORB, "uniform": UNIFORM}
Graph = AbsorbGraph | UniformGraph


def get_graph(graph) -> Graph:
    """The graph object for 'absorb' / 'uniform' (or a graph object itself). ValueError otherwise."""
    if isinstance(graph, (AbsorbGraph, UniformGraph)):
        return graph
    return _GRAPHS[check_graph(graph)]


# ---------------------------------------------------------------------------------------------
# The process: I-MDSE integrand (estimation) and SEDD's DSE loss (training) in one function
# ---------------------------------------------------------------------------------------------
NOISE_LAWS = ("time",) + LAMBDA_SAMPLING


@dataclasses.dataclass(frozen=True)
class SENoise:
    """Noise of one Monte Carlo sample per row: ``lam_R`` (clipped), ``weight_R`` and
    ``denom_R`` (the integrand is ``weight * DSE / denom``), ``hit_RxL`` / ``new_RxL`` (which
    positions are noised and to what), and ``scored_RxL`` (None, or with a clean-prefix
    training law the positions that are noised and scored; the rest is a clean context).
    Independent of the clean tokens."""

    lam: jax.Array
    weight: jax.Array
    denom: jax.Array
    hit: jax.Array
    new: jax.Array
    scored: jax.Array | None = None


jax.tree_util.register_dataclass(SENoise, data_fields=["lam", "weight", "denom", "hit", "new", "scored"],
                                 meta_fields=[])

CLEAN_PREFIX_KEY = 0xC1EA  # fold_in constant of the clean-prefix draw (the other draws unchanged)


@dataclasses.dataclass(frozen=True)
class ScoreEntropyProcess(base.Process):
    """Score-entropy discrete diffusion as a :class:`infodiff.processes.base.Process`.

    The integrand is ``weight * score_entropy(graph, log_s(z, lam), x, z, lam) / denom``:

    * ``noise_law='time'`` (training; SEDD arXiv 2310.16834 Eq. 3): t ~ U[0, 1) (antithetic
      across the batch if ``antithetic``), lam = lambda(t) clipped to [1e-7, 1 - 2^-24],
      weight sigma(t), denom 1 -- an unbiased estimate of the DSE time integral
      (``schedule`` required);
    * ``noise_law`` in ``LAMBDA_SAMPLING`` (estimation; I-MDSE, arXiv 2510.24088 Thm 3.2):
      lam ~ q on (0, lam_max] by :func:`sample_lambda`, weight 1 / q(lam), denom 1 - lam, i.e.
      ``int_0^{lam_max} DSE / (1 - lam) d lam`` (docs/discrete_diffusion.md §4.1, §6).

    ``clean_prefix_prob`` (training, default 0 = SEDD's objective): the probability that a
    row keeps a clean prefix (:meth:`clean_prefix`), so that a network learns scores with a
    clean prompt (for conditionals under the uniform graph).

    ``exact_terms`` gives the prior KL at lam_max (``prior``): uniform graph closed form; absorb
    ``(1 - lam_max) sum_i -log c(x_i | all targets masked)`` with the model's own prior (one
    extra pass per sequence). A score model is ``(z_BxL int32, lam_B float32) -> log s [B, L, V]``.
    """

    graph: Graph
    vocab_size: int
    noise_law: str = "defensive"
    lam_max: float = 1.0
    schedule: object = None
    antithetic: bool = True
    clean_prefix_prob: float = 0.0
    chunk_order: str = "samples"
    row_wise: bool = True  # each row's value reads only its own row (the driver may slice a call)
    denoiser_inputs: str = "(z_BxL int32, lam_B float32) -> log-scores [B, L, V]"

    def __post_init__(self):
        object.__setattr__(self, "graph", get_graph(self.graph))
        if self.noise_law not in NOISE_LAWS:
            raise ValueError(f"unknown lambda_sampling {self.noise_law!r}; choose from {LAMBDA_SAMPLING}")
        if self.noise_law == "time" and self.schedule is None:
            raise ValueError("noise_law='time' (training) needs a schedule")
        if not 0.0 < float(self.lam_max) <= 1.0:
            raise ValueError(f"lam_max must be in (0, 1]; got {self.lam_max}")
        if not 0.0 <= float(self.clean_prefix_prob) <= 1.0:
            raise ValueError(f"clean_prefix_prob must be in [0, 1]; got {self.clean_prefix_prob}")

    @property
    def estimator(self) -> str:
        return f"imdse_{self.graph.name}:{self.noise_law}"

    @property
    def infinite_variance(self) -> bool:
        """'uniform' lam sampling (SEDD's t ~ U): log-divergent variance (docs §6.2)."""
        return self.noise_law == "uniform"

    @property
    def min_samples(self) -> int:
        """Fewest samples with a calibrated SE in tests/test_calibration.py: the per-sample values
        are heavy-tailed (excess kurtosis ~1 absorb, 30-60 uniform graph), so the sample SE is
        too small below this (absorb 128; uniform graph 512)."""
        return 512 if self.graph.name == "uniform" else 128

    @property
    def pad_id(self) -> int | None:
        """Pads hold id V: MASK under the absorbing graph, pure noise (lam = 1) under the uniform
        graph (:meth:`integrand`); either way the estimate is the marginal likelihood of the rest."""
        return self.vocab_size

    def draw_noise(self, key, target_RxL, sample_R=None) -> SENoise:
        del sample_R
        R = target_RxL.shape[0]
        k_a, k_z = jax.random.split(key)
        if self.noise_law == "time":
            sched = self.schedule
            if self.antithetic:
                u0 = jax.random.uniform(k_a, ())
                t = jnp.mod(u0 + jnp.arange(R, dtype=jnp.float32) / R, 1.0)
            else:
                t = jax.random.uniform(k_a, (R,))
            lam = jnp.clip(sched.mask_prob(t), 1e-7, LAM_ONE)
            weight, denom = sched.sigma(t), jnp.ones((R,), jnp.float32)
        else:
            lam, weight = sample_lambda(k_a, (R,), self.lam_max, self.noise_law)
            lam = clip_lam(lam)  # u = 1 with lam_max = 1 would give 1 / (1 - lam) = inf
            denom = 1.0 - lam
        scored = None
        if self.clean_prefix_prob > 0:
            scored = target_RxL & ~self.clean_prefix(jax.random.fold_in(key, CLEAN_PREFIX_KEY), target_RxL.shape)
            target_RxL = scored
        hit, new = self.graph.draw_corruption(k_z, target_RxL.shape, lam, self.vocab_size, target_RxL)
        return SENoise(lam, weight, denom, hit, new, scored)

    def clean_prefix(self, key, shape):
        """bool [R, L]: with probability ``clean_prefix_prob`` a row keeps a clean prefix of
        P ~ U{1, ..., L - 1} positions (a prompt the model sees at lam = 0; not scored), else
        none. Training a uniform-graph network this way teaches it the conditional scores that
        ``imdse_conditional_nll`` asks for."""
        R, L = shape
        k_on, k_len = jax.random.split(key)
        on = jax.random.uniform(k_on, (R,)) < self.clean_prefix_prob
        length = jax.random.randint(k_len, (R,), 1, max(L, 2))
        return jnp.arange(L)[None, :] < jnp.where(on, length, 0)[:, None]

    def integrand(self, apply_fn, params, x_RxL, noise: SENoise, target_RxL=None):
        V = self.vocab_size
        if noise.scored is not None:  # a clean-prefix training draw: the prefix is context
            target_RxL = noise.scored if target_RxL is None else target_RxL & noise.scored
        pad = None
        if self.graph.needs_position_lam:  # a pad (id V, never a target) is pure noise: lam = 1
            pad = x_RxL == V
            z = apply_corruption(x_RxL, noise.hit | pad, noise.new)
        else:  # absorb: a pad is MASK (id V), which the model reads as masked
            z = apply_corruption(x_RxL, noise.hit, noise.new)
        log_s = self.scores(apply_fn, params, z, noise.lam, target_RxL, pad)
        if log_s.shape != (x_RxL.shape[0], x_RxL.shape[1], V):
            raise ValueError(f"the score model returned shape {log_s.shape}, expected "
                             f"{(x_RxL.shape[0], x_RxL.shape[1], V)} (vocab_size={V} mismatch?)")
        ent = self.graph.score_entropy(log_s, x_RxL, z, noise.lam, target_RxL)
        return noise.weight * ent / noise.denom

    def scores(self, apply_fn, params, z_RxL, lam_R, target_RxL=None, pad_RxL=None):
        """The score model's log-scores [R, L, V] at z: ``apply_fn(params, z, lam_R)`` with one
        noise level per row, except for a graph whose clean tokens look like noised ones (the
        uniform graph: ``needs_position_lam``) in a call where some position is not a target:
        then one level per position, lam_R on the targets, 1 at the pads (``pad_RxL``, bool,
        pure noise: the marginal likelihood of the rest) and 0 elsewhere (a clean prompt).
        A call whose positions are all targets runs the per-row program (the same numbers as a
        model that knows only lam_R)."""
        if not self.graph.needs_position_lam or target_RxL is None:
            return apply_fn(params, z_RxL, lam_R)
        off = jnp.zeros(z_RxL.shape, jnp.float32) if pad_RxL is None else pad_RxL.astype(jnp.float32)
        lam_RxL = jnp.where(target_RxL, lam_R[:, None], off)
        return jax.lax.cond(jnp.all(target_RxL), lambda: apply_fn(params, z_RxL, lam_R),
                            lambda: apply_fn(params, z_RxL, lam_RxL))

    def exact_terms(self, apply_fn, params, x_BxL, target_BxL, batch_size) -> dict:
        B = x_BxL.shape[0]
        prior = np.zeros(B, np.float64)
        if float(self.lam_max) < 1.0:
            if self.graph.name == "uniform":
                prior[:] = [self.graph.prior_kl(self.lam_max, self.vocab_size, int(n))
                            for n in np.asarray(target_BxL).sum(axis=1)]
            else:
                n = min(B, int(batch_size))
                for b0 in range(0, B, n):  # fixed shape (last chunk padded): one compilation
                    rows = np.arange(b0, b0 + n) % B
                    vals = absorb_prior(apply_fn, params, self.vocab_size, float(self.lam_max),
                                        jnp.asarray(x_BxL[rows]), jnp.asarray(target_BxL[rows]))
                    prior[b0:b0 + n] = np.asarray(vals, np.float64)[: min(n, B - b0)]
        return {"prior": prior}

    def passes_per_sample(self, target_BxL) -> int:
        return 1

    def extra_passes(self) -> int:
        """Passes per sequence outside the Monte Carlo samples (the absorbing prior)."""
        return 1 if (self.graph.name == "absorb" and float(self.lam_max) < 1.0) else 0

    def validate(self, x):
        from infodiff.validation import validate_tokens

        return validate_tokens(x, self.vocab_size)

    def check_target(self, target_BxL) -> None:
        """Any target: positions outside it stay clean and reach the score model at lam = 0
        where the graph needs it (:meth:`scores`)."""


@functools.partial(jax.jit, static_argnames=("apply_fn", "vocab_size", "lam_max"))
def absorb_prior(apply_fn, params, vocab_size, lam_max, x_BxL, target_BxL):
    """float32 [B]: (1 - lam_max) * sum_{target} -log c(x_i | targets masked), c normalised
    (the absorbing graph's prior KL with the model's own prior at T)."""
    z = jnp.where(target_BxL, vocab_size, x_BxL).astype(jnp.int32)
    lam = jnp.full((x_BxL.shape[0],), lam_max, jnp.float32)
    log_c = absorb_mean_from_log_score(apply_fn(params, z, lam), lam)
    log_c = jax.nn.log_softmax(log_c, axis=-1)
    ce = -jnp.take_along_axis(log_c, x_BxL[..., None], axis=-1)[..., 0]
    return (1.0 - lam_max) * jnp.sum(jnp.where(target_BxL, ce, 0.0), axis=-1)


def euler_step(graph, key: jax.Array, z_BxL: jax.Array, log_s_BxLxV: jax.Array,
               d_sigma_bar_B: jax.Array) -> jax.Array:
    """One Euler step of the reverse CTMC over ``d_sigma_bar = sigma(t) dt``
    (docs/discrete_diffusion.md §8.1). int32 [B, L]; see :meth:`AbsorbGraph.euler_step`."""
    return get_graph(graph).euler_step(key, z_BxL, log_s_BxLxV, d_sigma_bar_B)


def tweedie_step(graph, key: jax.Array, z_BxL: jax.Array, log_s_BxLxV: jax.Array,
                 d_sigma_bar_B: jax.Array, final: bool = False) -> jax.Array:
    """One Tweedie tau-leaping ("analytic") step over ``d_sigma_bar``
    (docs/discrete_diffusion.md §8.1). int32 [B, L]; see :meth:`AbsorbGraph.tweedie_step`."""
    return get_graph(graph).tweedie_step(key, z_BxL, log_s_BxLxV, d_sigma_bar_B, final)


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
    lam_min outside (0, lam_max). Source: docs/discrete_diffusion.md §8.1.
    """
    check_graph(graph)
    check_model_graph(log_score_fn, graph)
    if method not in ("euler", "tweedie"):
        raise ValueError(f"unknown sampler {method!r}; choose 'euler' or 'tweedie'")
    if int(num_steps) < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    if not 0.0 < float(lam_min) < float(lam_max) <= 1.0:
        raise ValueError(f"need 0 < lam_min < lam_max <= 1; got lam_min={lam_min}, lam_max={lam_max}")
    return _sample(log_score_fn, graph, key, int(num_samples), int(seq_len), int(vocab_size),
                   int(num_steps), method, float(lam_max), float(lam_min), prompt_BxP)


def check_model_graph(score_model, graph: str) -> None:
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


# ---------------------------------------------------------------------------------------------
# Network output -> log-scores (the score parameterisation of a trained SEDD network)
# ---------------------------------------------------------------------------------------------
SCORE_PARAMS = ("direct", "mean")


def check_score_param(score_param: str) -> str:
    """Return ``score_param`` if it is one of ``SCORE_PARAMS``; ValueError naming it otherwise."""
    if score_param not in SCORE_PARAMS:
        raise ValueError(f"config.process.score_param={score_param!r}; choose from {SCORE_PARAMS}")
    return score_param


def log_score_from_output(graph: str, score_param: str, out_BxLxV: jax.Array, z_BxL: jax.Array,
                          lam_B: jax.Array) -> jax.Array:
    """Network output [B, L, V] -> SEDD log-scores [B, L, V] (float32).

    ``direct`` (SEDD): absorb ``log s = logits - log V + log a(lam)`` (SEDD's "scale by sigma",
    with -log V instead of -log(V - 1) so that a zero-initialised head gives sum_v c_v = 1);
    uniform ``log s = logits`` (entry z_i unused). ``mean`` (x0-prediction, normalised):
    absorb ``log s = log_softmax + log a(lam)`` (RADD); uniform the exact posterior-to-score map
    :func:`uniform_log_score_from_mean`. ``z_BxL`` int ids, ``lam_B`` float32 noise levels,
    [B] or per position [B, L].
    Source: docs/discrete_diffusion.md §5.2.
    """
    V = out_BxLxV.shape[-1]
    if graph == "absorb":
        log_c = out_BxLxV - math.log(V) if score_param == "direct" else out_BxLxV
        return absorb_log_score_from_mean(log_c, lam_B)
    if score_param == "direct":
        return out_BxLxV.astype(jnp.float32)
    return uniform_log_score_from_mean(out_BxLxV, z_BxL, lam_B)


__all__ += ["SCORE_PARAMS", "check_score_param", "log_score_from_output"]
