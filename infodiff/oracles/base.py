"""The oracle base: exact likelihoods, and the exact SEDD scores of the noised law.

Every oracle is a denoiser ``oracle(z_BxL, t_B) -> logprobs_BxLxV`` with the exact conditionals
c*(z)_{i,v} = p(x_i = v | unmasked part of z) (MASK id = vocab_size), with exact ``log_prob``
and ``cond_log_prob``, and with the exact SEDD score ratios of the noised law
p_lam(z) = sum_x p0(x) prod_i K_lam(z_i | x_i) under a graph of
:mod:`infodiff.processes.score_entropy` (its kernel, emissions and posterior-to-score map live
on the graph; an oracle contributes only the leave-one-out posterior of its p0). The noise
level may be one per sequence (lam [B]) or one per position (lam [B, L]: 0 at a clean prompt
position, 1 at a pad). Exact zeros are returned as ``LOG_ZERO``, never -inf.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Mapping

import jax.numpy as jnp
import numpy as np

from infodiff.processes.score_entropy import GRAPHS as SEDD_GRAPHS, LOG_ZERO, get_graph
from infodiff.validation import validate_tokens

__all__ = ["Oracle", "SEDD_GRAPHS", "LOG_ZERO", "SUM_TOL", "read_json_object", "check_prob",
           "check_alphabet", "lse", "normalize_log", "check_sedd_inputs"]

SUM_TOL = 1e-6


def read_json_object(path_or_obj, what: str) -> Mapping:
    """Load a JSON object from a path (or pass a mapping through), refusing duplicate keys."""
    if isinstance(path_or_obj, Mapping):
        return path_or_obj
    path = os.fspath(path_or_obj)
    if not path:
        raise ValueError(f"{what}: no file given (config.data.path is empty)")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what}: file not found: {path!r}")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{what}: file is empty: {path!r}")

    def no_dups(pairs):
        counts = collections.Counter(k for k, _ in pairs)
        dups = [k for k, c in counts.items() if c > 1]
        if dups:
            raise ValueError(f"{what}: duplicate key {dups[0]!r} in {path!r}")
        return dict(pairs)

    with open(path) as f:
        try:
            obj = json.load(f, object_pairs_hook=no_dups)
        except json.JSONDecodeError as e:
            raise ValueError(f"{what}: {path!r} is not valid JSON: {e}") from None
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{what}: {path!r} must hold a non-empty JSON object")
    return obj


def check_prob(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: probability must be a number; got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: probability must be finite and >= 0; got {value!r}")
    return v


def check_alphabet(alphabet: str) -> str:
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty string; got {alphabet!r}")
    dup = [c for c in set(alphabet) if alphabet.count(c) > 1]
    if dup:
        raise ValueError(f"alphabet {alphabet!r} repeats the symbol {sorted(dup)[0]!r}")
    return alphabet


def lse(xp, a, axis: int, keepdims: bool = False):
    """log-sum-exp along one axis; all -inf -> -inf (no NaN); NaN propagates."""
    m = a.max(axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)
    out = xp.log(xp.exp(a - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else out.squeeze(axis)


def normalize_log(xp, lq_BxLxV, V: int):
    """Normalise log-weights over the last axis; rows with no mass (an impossible z) -> uniform."""
    n = lse(xp, lq_BxLxV, axis=-1, keepdims=True)
    return xp.where(xp.isfinite(n), lq_BxLxV - xp.where(xp.isfinite(n), n, 0.0), -math.log(V))


def check_sedd_inputs(z_BxL, lam, V: int, graph, lam_min_open: bool):
    """Validate (z, lam) for the float64 SEDD functions; returns (graph object, int32 [B, L] z,
    float64 lam [B] or [B, L]). lam: a scalar, one level per row [B] in (0, 1] ([0, 1] if not
    ``lam_min_open``) or one per position [B, L] in [0, 1] (0 = a clean position).
    Raises ValueError naming an unknown graph, a bad shape or the first bad value."""
    g = get_graph(graph)
    z = validate_tokens(z_BxL, g.num_states(V), name="z")
    lam = np.asarray(lam, np.float64)
    if lam.ndim == 0:
        lam = np.full(z.shape[0], float(lam))
    if lam.shape not in ((z.shape[0],), z.shape):
        raise ValueError(f"lam must have shape ({z.shape[0]},) (one noise level per row of z) or {z.shape} "
                         f"(one per position); got {lam.shape}")
    lo_ok = (lam > 0) if (lam_min_open and lam.ndim == 1) else (lam >= 0)
    bad = ~(np.isfinite(lam) & lo_ok & (lam <= 1))
    if bad.any():
        b = np.unravel_index(int(np.argmax(bad)), lam.shape)
        rng = "(0, 1]" if (lam_min_open and lam.ndim == 1) else "[0, 1]"
        raise ValueError(f"lam[{', '.join(map(str, b))}] = {float(lam[b])!r} is outside {rng}")
    return g, z, lam


class Oracle:
    """Base of the tabular and Markov oracles: encoding, exact conditional log-likelihoods and
    the exact SEDD scores (a subclass gives ``log_marginal``, ``loo_log_posterior`` and
    ``log_noised_marginal_from_emission``)."""

    alphabet: str
    vocab_size: int
    seq_len: int | None

    @property
    def mask_id(self) -> int:
        return self.vocab_size

    def encode(self, seqs) -> np.ndarray:
        """Strings over the alphabet -> int32 [N, L]. Raises ValueError naming a bad symbol."""
        index = {c: i for i, c in enumerate(self.alphabet)}
        out = []
        for s in seqs:
            row = []
            for j, c in enumerate(s):
                if c not in index:
                    raise ValueError(
                        f"symbol {c!r} at position {j} of {s!r} is not in the alphabet {self.alphabet!r}"
                    )
                row.append(index[c])
            out.append(row)
        if len({len(r) for r in out}) > 1:
            raise ValueError("sequences to encode have different lengths")
        return np.asarray(out, np.int32)

    def decode(self, x) -> list[str]:
        return ["".join(self.alphabet[int(v)] for v in row) for row in np.asarray(x)]

    def cond_log_prob(self, x_BxL, target_BxL) -> np.ndarray:
        """Exact log p(x[target] | x[not target]) in nats, float64 [B]."""
        x = validate_tokens(x_BxL, self.vocab_size)
        target = np.broadcast_to(np.asarray(target_BxL, bool), x.shape)
        z = np.where(target, self.mask_id, x)
        return self.log_marginal(x) - self.log_marginal(z)

    def log_prob(self, x_BxL) -> np.ndarray:
        """Exact log p(x) in nats per sequence, float64 [B]."""
        return self.log_marginal(validate_tokens(x_BxL, self.vocab_size))

    def log_marginal(self, z_BxL) -> np.ndarray:
        raise NotImplementedError

    # Make oracles usable as static jit arguments (hash by identity).
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    # ---- SEDD score ratios (score-entropy discrete diffusion, absorb and uniform graphs) ----
    def log_score(self, z_BxL, lam_B, graph: str):
        """Exact log score ratios log s*[b, i, v] = log p_lam(z with z_i := v) - log p_lam(z).

        The noised law is p_lam(z) = sum_x p0(x) prod_i K_lam(z_i | x_i) with independent tokens
        (docs/discrete_diffusion.md §1.2-1.3; lam = 1 - exp(-sigma_bar)):
          * 'absorb': a token stays w.p. 1 - lam, becomes MASK (id V) w.p. lam. At a masked
            position s*[i, v] = a * p0(x_i = v | unmasked part of z), a = (1 - lam) / lam (docs/discrete_diffusion.md
            §5.1, RADD arXiv 2406.03736 Eq. 5). At an unmasked position the absorbing graph has
            no edge to another real token; the entry is returned as LOG_ZERO (below).
          * 'uniform' (SEDD released-code convention): K_lam(y | x) = (1 - lam) 1[y = x] + lam / V.
            Computed from the leave-one-out posterior q_i(u) = P(x_i = u | z_{-i}) as
            s*[i, v] = ((1 - lam) q_i(v) + lam / V) / ((1 - lam) q_i(z_i) + lam / V); the entry
            v = z_i is exactly 0.0 (ratio 1), and at lam = 1 every entry is exactly 0.0.
        The ratio is SEDD's concrete score (Lou et al., arXiv 2310.16834, Eq. 4), the minimiser
        of the denoising score entropy (docs/discrete_diffusion.md §3.1, §4.1).

        Log-zero convention: every returned value is floored at LOG_ZERO = log(float32 tiny)
        ~= -87.34, and exact zeros (absorb: unmasked positions, lam = 1, symbols of probability
        0 given the unmasked tokens) are returned as LOG_ZERO, never -inf, so exp() is ~0 and
        weights multiplying it stay finite inside jitted sums. Callers should still restrict
        absorb terms to masked positions (the DSE does).

        Args:
          z_BxL: int [B, L] noised tokens; ids in [0, V] for 'absorb' (V = MASK), [0, V) for
            'uniform' (a MASK id under 'uniform' gives NaN). Tabular: L must equal seq_len.
          lam_B: float [B] (or a scalar) noise levels in (0, 1], or one per position [B, L] in
            [0, 1] (0: a clean position, e.g. a prompt; 1: pure noise, e.g. a pad); may be traced.
          graph: 'absorb' or 'uniform' (a static Python string) or a graph object.
        Returns: float32 jax array [B, L, V] (log-ratios, nats). Jit-compatible (numerically
          stable in log space: tabular by log-sum-exp over the support, Markov by a log-space
          forward-backward under lax.scan). Inputs are not checked under jit: lam outside
          (0, 1], or an absorb z whose unmasked tokens have probability 0 (then the posterior is
          replaced by a uniform one), give meaningless values. Use log_score_np to validate.
        Raises: ValueError for an unknown graph (or a tabular z of the wrong length).
        """
        g = get_graph(graph)
        z = jnp.asarray(z_BxL, jnp.int32)
        if z.ndim != 2:
            raise ValueError(f"z must have shape [batch, length]; got shape {z.shape}")
        lam = jnp.asarray(lam_B, jnp.float32)
        lam = jnp.broadcast_to(lam, z.shape if lam.ndim == 2 else z.shape[:1])
        lq = self.loo_log_posterior(jnp, z, lam, g)
        return g.log_score_from_posterior(jnp, lq, z, lam, self.vocab_size)

    def log_score_np(self, z_BxL, lam_B, graph: str) -> np.ndarray:
        """Float64 numpy reference of :meth:`log_score` (same formulas, same LOG_ZERO floor).

        Returns float64 [B, L, V] log-ratios (nats). Raises ValueError for an unknown graph,
        z not 2-D or with ids outside [0, V] (absorb) / [0, V) (uniform), lam outside (0, 1]
        or of the wrong shape, or (absorb) a row of z whose unmasked tokens have probability
        0 under p0 (the ratio is then undefined); TypeError for non-integer z.
        """
        g, z, lam = check_sedd_inputs(z_BxL, lam_B, self.vocab_size, graph, lam_min_open=True)
        self.check_sedd_length(z)
        if g.has_mask:
            impossible = ~np.isfinite(self.log_marginal(z))
            if impossible.any():
                b = int(np.argmax(impossible))
                raise ValueError(
                    f"z[{b}] has probability 0 under the absorbing process (its unmasked tokens "
                    "are impossible under p0); the score ratio is undefined"
                )
        with np.errstate(divide="ignore", invalid="ignore"):  # inf - inf at impossible entries, floored
            lq = self.loo_log_posterior(np, z, lam, g)
            return g.log_score_from_posterior(np, lq, z, lam, self.vocab_size)

    def log_noised_marginal(self, z_BxL, lam_B, graph: str) -> np.ndarray:
        """log p_lam(z) = log sum_x p0(x) prod_i K_lam(z_i | x_i) in nats per sequence, float64 [B].

        -inf where p_lam(z) = 0 (absorb only). Sums to 1 over all z in [0, V]^L (absorb) or
        [0, V)^L (uniform). Tabular: log-sum-exp over the support; Markov: log-space forward
        algorithm over contexts. Source: docs/discrete_diffusion.md §1.2-1.3.
        Raises ValueError for an unknown graph, bad z (as log_score_np) or lam outside [0, 1].
        """
        g, z, lam = check_sedd_inputs(z_BxL, lam_B, self.vocab_size, graph, lam_min_open=False)
        self.check_sedd_length(z)
        with np.errstate(divide="ignore"):
            return self.log_noised_marginal_from_emission(g.log_emission(np, z, lam, self.vocab_size))

    def check_sedd_length(self, z_BxL) -> None:
        """Tabular oracles need len = seq_len; Markov chains take any length."""

    def loo_log_posterior(self, xp, z_BxL, lam, graph):
        """Normalised log P(x_i = u | z_{-i}) under the noised law of ``graph`` (a graph object),
        [B, L, V]; lam [B] or [B, L]."""
        raise NotImplementedError

    def log_noised_marginal_from_emission(self, le_BxLxV) -> np.ndarray:
        """log sum_x p0(x) prod_j exp(le[b, j, x_j]), float64 [B]."""
        raise NotImplementedError

