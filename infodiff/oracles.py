"""Exact denoisers for distributions whose likelihood is known.

An oracle is a denoiser ``oracle(z_BxL, t_B) -> logprobs_BxLxV`` that returns the exact
conditionals c*(z)_{i,v} = p(x_i = v | unmasked part of z) (arXiv 2510.24088 Thm 3.5: the
minimiser of the denoising cross-entropy), plus exact ``log_prob`` (log p(x)) and
``cond_log_prob`` (log p(x[target] | x[context])). With an oracle, every masked-diffusion
likelihood estimator must reproduce the exact NLL up to Monte Carlo error; that is how this
project tests its estimators.

Two families:
  * TabularOracle: an enumerable distribution over sequences of length L, read from a JSON
    object {sequence: probability}; conditionals by summing the table.
  * MarkovOracle: a stationary k-th order Markov chain read from a JSON object
    {context: {symbol: probability}}; conditionals for any mask pattern by forward-backward
    over the V^k contexts (a hidden Markov model whose state is the last k symbols). The
    chain starts from its stationary context law, so a prompt sets the initial context of a
    response exactly: log p(y | x) = sum_j log P(y_j | previous k symbols).

The MASK id is vocab_size (= len(alphabet)); t is ignored (the exact conditionals are
time-free, RADD arXiv 2406.03736 Thm 1).

Both families also give the exact SEDD score ratios (concrete scores, arXiv 2310.16834 Eq. 4)
s*[b, i, v] = p_lam(z with z_i := v) / p_lam(z) of the noised law under the 'absorb' and
'uniform' graphs (docs/discrete_diffusion.md §1.2-1.3, §3.1, §5.1), at noise level
lam = 1 - exp(-sigma_bar):
  * ``log_score(z, lam, graph)``: float32 jax, jit-compatible (graph static);
  * ``log_score_np(z, lam, graph)``: float64 numpy reference (validates its inputs);
  * ``log_noised_marginal(z, lam, graph)``: float64 log p_lam(z).
Uniform ratios come from the leave-one-out posterior P(x_i = u | z_{-i}) (tabular: log-sum-exp
over the support; Markov: log-space forward-backward with soft emissions K_lam(z_j | u)).
Exact zeros are returned as ``LOG_ZERO`` (log of the smallest normal float32), never -inf.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import math
import os
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.validation import MAX_TABLE_BYTES, check_memory, validate_tokens

__all__ = [
    "TabularOracle",
    "MarkovOracle",
    "load_oracle",
    "random_tabular",
    "random_markov",
    "markov_oracle_bytes",
    "LOG_ZERO",
    "SEDD_GRAPHS",
]

_SUM_TOL = 1e-6


def _read_json_object(path_or_obj, what: str) -> Mapping:
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


def _check_prob(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: probability must be a number; got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: probability must be finite and >= 0; got {value!r}")
    return v


def _check_alphabet(alphabet: str) -> str:
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty string; got {alphabet!r}")
    dup = [c for c in set(alphabet) if alphabet.count(c) > 1]
    if dup:
        raise ValueError(f"alphabet {alphabet!r} repeats the symbol {sorted(dup)[0]!r}")
    return alphabet


# ---------------------------------------------------------------------------------------------
# SEDD score ratios: shared helpers (numpy float64 reference and jax.numpy float32, via `xp`)
# ---------------------------------------------------------------------------------------------
SEDD_GRAPHS = ("absorb", "uniform")

# log of the smallest normal float32 (about -87.34): the value returned for log s* = log 0
# (absorb at unmasked positions, absorb at lam = 1, symbols of probability 0), and the floor
# applied to every returned log-ratio, so that exp() gives ~1e-38 (not inf) and 0 * log s* = 0
# (not NaN) inside jitted sums. Same value in the float32 and the float64 versions.
LOG_ZERO = float(np.log(np.finfo(np.float32).tiny))


def _check_sedd_graph(graph) -> str:
    if graph not in SEDD_GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; choose from {SEDD_GRAPHS}")
    return graph


def _lse(xp, a, axis: int, keepdims: bool = False):
    """log-sum-exp along one axis; all -inf -> -inf (no NaN); NaN propagates."""
    m = a.max(axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)
    out = xp.log(xp.exp(a - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else out.squeeze(axis)


def _normalize_log(xp, lq_BxLxV, V: int):
    """Normalise log-weights over the last axis; rows with no mass (an impossible z) -> uniform."""
    n = _lse(xp, lq_BxLxV, axis=-1, keepdims=True)
    return xp.where(xp.isfinite(n), lq_BxLxV - xp.where(xp.isfinite(n), n, 0.0), -math.log(V))


def _rel_log_emission(xp, z_BxL, lam_B, V: int, graph: str):
    """log K_lam(z_j | u) up to a factor free of u: [B, L, V] (posterior weights only).

    uniform: 0 if u = z_j else D = log(lam / V) - log(1 - lam + lam / V) = log lam - log(V - (V-1) lam)
    (exactly 0 at lam = 1); absorb: 0 if z_j = u or z_j = MASK, else -inf.
    """
    match = z_BxL[:, :, None] == xp.arange(V)[None, None, :]
    if graph == "uniform":
        D_B = xp.log(lam_B) - xp.log(V - (V - 1) * lam_B)
        return xp.where(match, xp.zeros_like(D_B)[:, None, None], D_B[:, None, None])
    ok = match | (z_BxL == V)[:, :, None]
    return xp.where(ok, 0.0, -xp.inf)


def _full_log_emission(xp, z_BxL, lam_B, V: int, graph: str):
    """log K_lam(z_j | u), [B, L, V] (docs/discrete_diffusion.md §1.2-1.3): the per-token kernel with its constants."""
    lam = lam_B[:, None, None]
    match = z_BxL[:, :, None] == xp.arange(V)[None, None, :]
    if graph == "uniform":
        return xp.where(match, xp.log1p(-lam * ((V - 1) / V)), xp.log(lam) - math.log(V))
    masked = (z_BxL == V)[:, :, None]
    return xp.where(masked, xp.log(lam), xp.where(match, xp.log1p(-lam), -xp.inf))


def _log_ratio_from_loo(xp, lq_BxLxV, z_BxL, lam_B, V: int, graph: str):
    """log s*[b, i, v] from the leave-one-out posterior q_i(u) = P(x_i = u | z_{-i}).

    uniform: s*_v = sum_u q(u) K(v|u) / sum_u q(u) K(z_i|u), and with K(v|u) = (1-lam) 1[v=u] + lam/V
      log s*_v = h(v) - h(z_i),  h(u) = logaddexp(log(1 - lam) + log q(u), log(lam / V)).
    absorb (docs/discrete_diffusion.md §5.1): masked i: log a + log q(v), a = (1 - lam) / lam; unmasked i: LOG_ZERO.
    Every entry is floored at LOG_ZERO.
    """
    lam = lam_B[:, None, None]
    log1m = xp.log1p(-lam)
    if graph == "uniform":
        h = xp.logaddexp(log1m + lq_BxLxV, xp.log(lam) - math.log(V))
        out = h - xp.take_along_axis(h, z_BxL[:, :, None], axis=-1)
    else:
        out = xp.where((z_BxL == V)[:, :, None], (log1m - xp.log(lam)) + lq_BxLxV, LOG_ZERO)
    return xp.maximum(out, LOG_ZERO)


def _check_sedd_inputs(z_BxL, lam_B, V: int, graph: str, lam_min_open: bool):
    """Validate (z, lam) for the float64 SEDD functions; returns int32 [B, L], float64 [B]."""
    _check_sedd_graph(graph)
    z = validate_tokens(z_BxL, V + 1 if graph == "absorb" else V, name="z")
    lam = np.asarray(lam_B, np.float64)
    if lam.ndim == 0:
        lam = np.full(z.shape[0], float(lam))
    if lam.shape != (z.shape[0],):
        raise ValueError(f"lam must have shape ({z.shape[0]},) (one noise level per row of z); got {lam.shape}")
    lo_ok = (lam > 0) if lam_min_open else (lam >= 0)
    bad = ~(np.isfinite(lam) & lo_ok & (lam <= 1))
    if bad.any():
        b = int(np.argmax(bad))
        rng = "(0, 1]" if lam_min_open else "[0, 1]"
        raise ValueError(f"lam[{b}] = {float(lam[b])!r} is outside {rng}")
    return z, lam


class _Oracle:
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
          lam_B: float [B] (or a scalar) noise levels in (0, 1]; may be traced.
          graph: 'absorb' or 'uniform' (a static Python string).
        Returns: float32 jax array [B, L, V] (log-ratios, nats). Jit-compatible (numerically
          stable in log space: tabular by log-sum-exp over the support, Markov by a log-space
          forward-backward under lax.scan). Inputs are not checked under jit: lam outside
          (0, 1], or an absorb z whose unmasked tokens have probability 0 (then the posterior is
          replaced by a uniform one), give meaningless values. Use log_score_np to validate.
        Raises: ValueError for an unknown graph (or a tabular z of the wrong length).
        """
        _check_sedd_graph(graph)
        z = jnp.asarray(z_BxL, jnp.int32)
        if z.ndim != 2:
            raise ValueError(f"z must have shape [batch, length]; got shape {z.shape}")
        lam = jnp.broadcast_to(jnp.asarray(lam_B, jnp.float32), z.shape[:1])
        lq = self._loo_log_posterior(jnp, z, lam, graph)
        return _log_ratio_from_loo(jnp, lq, z, lam, self.vocab_size, graph)

    def log_score_np(self, z_BxL, lam_B, graph: str) -> np.ndarray:
        """Float64 numpy reference of :meth:`log_score` (same formulas, same LOG_ZERO floor).

        Returns float64 [B, L, V] log-ratios (nats). Raises ValueError for an unknown graph,
        z not 2-D or with ids outside [0, V] (absorb) / [0, V) (uniform), lam outside (0, 1]
        or of the wrong shape, or (absorb) a row of z whose unmasked tokens have probability
        0 under p0 (the ratio is then undefined); TypeError for non-integer z.
        """
        z, lam = _check_sedd_inputs(z_BxL, lam_B, self.vocab_size, graph, lam_min_open=True)
        self._check_sedd_length(z)
        if graph == "absorb":
            impossible = ~np.isfinite(self.log_marginal(z))
            if impossible.any():
                b = int(np.argmax(impossible))
                raise ValueError(
                    f"z[{b}] has probability 0 under the absorbing process (its unmasked tokens "
                    "are impossible under p0); the score ratio is undefined"
                )
        with np.errstate(divide="ignore"):
            lq = self._loo_log_posterior(np, z, lam, graph)
            return _log_ratio_from_loo(np, lq, z, lam, self.vocab_size, graph)

    def log_noised_marginal(self, z_BxL, lam_B, graph: str) -> np.ndarray:
        """log p_lam(z) = log sum_x p0(x) prod_i K_lam(z_i | x_i) in nats per sequence, float64 [B].

        -inf where p_lam(z) = 0 (absorb only). Sums to 1 over all z in [0, V]^L (absorb) or
        [0, V)^L (uniform). Tabular: log-sum-exp over the support; Markov: log-space forward
        algorithm over contexts. Source: docs/discrete_diffusion.md §1.2-1.3.
        Raises ValueError for an unknown graph, bad z (as log_score_np) or lam outside [0, 1].
        """
        z, lam = _check_sedd_inputs(z_BxL, lam_B, self.vocab_size, graph, lam_min_open=False)
        self._check_sedd_length(z)
        with np.errstate(divide="ignore"):
            le_BxLxV = _full_log_emission(np, z, lam, self.vocab_size, graph)
            return self._log_noised_marginal_from_emission(le_BxLxV)

    def _check_sedd_length(self, z_BxL) -> None:
        """Tabular oracles need len = seq_len; Markov chains take any length."""

    def _loo_log_posterior(self, xp, z_BxL, lam_B, graph):
        """Normalised log P(x_i = u | z_{-i}) under the noised law, [B, L, V]."""
        raise NotImplementedError

    def _log_noised_marginal_from_emission(self, le_BxLxV) -> np.ndarray:
        raise NotImplementedError


class TabularOracle(_Oracle):
    """Exact conditionals of an enumerable distribution over length-L sequences.

    Args:
      seqs_KxL: int [K, L] distinct support sequences, ids in [0, V).
      probs_K: float [K], non-negative, summing to 1 (within 1e-6; renormalised in float64).
      alphabet: string of V symbols (for encode/decode).
    Raises ValueError on duplicate sequences, bad probabilities or ids outside [0, V).
    """

    def __init__(self, seqs_KxL, probs_K, alphabet: str):
        self.alphabet = _check_alphabet(alphabet)
        self.vocab_size = len(alphabet)
        seqs = validate_tokens(seqs_KxL, self.vocab_size, name="support sequences")
        probs = np.asarray(probs_K, np.float64)
        if probs.shape != (seqs.shape[0],):
            raise ValueError(f"probs must have shape ({seqs.shape[0]},); got {probs.shape}")
        if not np.all(np.isfinite(probs)) or (probs < 0).any():
            raise ValueError(f"probabilities must be finite and >= 0; got min {probs.min()}")
        total = probs.sum()
        if abs(total - 1.0) > _SUM_TOL:
            raise ValueError(f"probabilities sum to {total!r}, not 1 (tolerance {_SUM_TOL})")
        if len({tuple(r) for r in seqs}) != len(seqs):
            raise ValueError("support sequences are not distinct")
        keep = probs > 0
        self.seqs = seqs[keep]
        self.probs = probs[keep] / probs[keep].sum()
        self.seq_len = seqs.shape[1]
        self._index = {tuple(r): k for k, r in enumerate(self.seqs)}
        self._logp_K = jnp.asarray(np.log(self.probs), jnp.float32)
        self._seqs_KxL = jnp.asarray(self.seqs)
        self._onehot_KxLxV = jax.nn.one_hot(self._seqs_KxL, self.vocab_size, dtype=jnp.float32)

    @classmethod
    def from_json(cls, path_or_obj, alphabet: str | None = None) -> "TabularOracle":
        """Read {sequence: probability}. The alphabet defaults to the sorted symbols used.

        Raises FileNotFoundError (missing file), ValueError (empty file, invalid JSON, keys of
        different lengths or empty, symbols outside `alphabet`, probabilities not numbers,
        negative, or not summing to 1 -- the message names the offending key/value/sum).
        """
        table = _read_json_object(path_or_obj, "tabular distribution")
        keys = list(table)
        for k in keys:
            if not isinstance(k, str) or not k:
                raise ValueError(f"tabular distribution: malformed key {k!r} (need a non-empty string)")
        lengths = {len(k) for k in keys}
        if len(lengths) > 1:
            L0 = len(keys[0])
            bad = next(k for k in keys if len(k) != L0)
            raise ValueError(
                f"tabular distribution: malformed key {bad!r}: length {len(bad)} differs from "
                f"length {L0} of {keys[0]!r}"
            )
        probs = [_check_prob(table[k], f"tabular distribution[{k!r}]") for k in keys]
        total = math.fsum(probs)
        if abs(total - 1.0) > _SUM_TOL:
            raise ValueError(
                f"tabular distribution: probabilities sum to {total!r}, not 1 (tolerance {_SUM_TOL})"
            )
        if alphabet is None:
            alphabet = "".join(sorted(set("".join(keys))))
        _check_alphabet(alphabet)
        obj = cls.__new__(cls)
        obj.alphabet = alphabet
        obj.vocab_size = len(alphabet)
        seqs = _Oracle.encode(obj, keys)
        return cls(seqs, probs, alphabet)

    def to_json(self) -> dict:
        return {s: float(p) for s, p in zip(self.decode(self.seqs), self.probs)}

    def __call__(self, z_BxL, t_B=None):
        """Exact c*(z): float32 [B, L, V] log-probabilities (t ignored).

        Positions with no compatible support sequence (impossible under the table) get a
        uniform distribution rather than NaN.
        """
        z = jnp.asarray(z_BxL, jnp.int32)
        compat_BxK = jnp.all(
            (z[:, None, :] == self._seqs_KxL[None]) | (z[:, None, :] == self.mask_id), axis=-1
        )
        logw_BxK = jnp.where(compat_BxK, self._logp_K[None], -jnp.inf)
        m_B = jnp.max(logw_BxK, axis=-1, keepdims=True)
        w_BxK = jnp.exp(logw_BxK - jnp.where(jnp.isfinite(m_B), m_B, 0.0))
        post_BxLxV = jnp.einsum("bk,klv->blv", w_BxK, self._onehot_KxLxV)
        post_BxLxV = post_BxLxV / jnp.sum(post_BxLxV, axis=-1, keepdims=True)
        post_BxLxV = jnp.where(jnp.isfinite(post_BxLxV), post_BxLxV, 1.0 / self.vocab_size)
        return jnp.log(post_BxLxV)

    def exact_conditionals(self, z_BxL) -> np.ndarray:
        """Exact p(x_i = v | unmasked part of z), float64 numpy [B, L, V]."""
        z = np.asarray(z_BxL)
        compat = np.all((z[:, None, :] == self.seqs[None]) | (z[:, None, :] == self.mask_id), -1)
        w = compat * self.probs[None]
        onehot = np.eye(self.vocab_size)[self.seqs]
        post = np.einsum("bk,klv->blv", w, onehot)
        return post / post.sum(-1, keepdims=True)

    def log_marginal(self, z_BxL) -> np.ndarray:
        """log P(unmasked part of z) in nats, float64 [B] (-inf if incompatible)."""
        z = np.asarray(z_BxL)
        compat = np.all((z[:, None, :] == self.seqs[None]) | (z[:, None, :] == self.mask_id), -1)
        with np.errstate(divide="ignore"):
            return np.log(compat.astype(np.float64) @ self.probs)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n i.i.d. sequences, int32 [n, L]."""
        return self.seqs[rng.choice(len(self.probs), size=n, p=self.probs)]

    def sample_response(self, rng: np.random.Generator, prompt_BxP) -> np.ndarray:
        """Draw y ~ p(y | prompt) for each prompt (prefix of length P), int32 [B, L - P].

        Raises ValueError if a prompt has probability 0 under the table.
        """
        prompt = np.asarray(prompt_BxP)
        P = prompt.shape[1]
        out = []
        for b, row in enumerate(prompt):
            match = np.all(self.seqs[:, :P] == row[None], axis=1)
            if not match.any():
                raise ValueError(f"prompt {b} has probability 0 under the table")
            p = self.probs * match
            out.append(self.seqs[rng.choice(len(p), p=p / p.sum()), P:])
        return np.asarray(out, np.int32)

    def entropy(self) -> float:
        """H(X) in nats."""
        return float(-np.sum(self.probs * np.log(self.probs)))

    # ---- SEDD score ratios (see _Oracle.log_score) ----
    def _check_sedd_length(self, z_BxL) -> None:
        if z_BxL.shape[1] != self.seq_len:
            raise ValueError(f"z must have length {self.seq_len}; got shape {tuple(z_BxL.shape)}")

    def _loo_log_posterior(self, xp, z_BxL, lam_B, graph):
        """log q[b, i, u] = log P(x_i = u | z_{-i}): log-sum-exp over the K support sequences.

        Posterior weight of sequence k without position i: log p_k + n_ki * D, where n_ki is
        the (integer) number of positions j != i at which z_j is a real token other than
        x_kj and D = log K(mismatch) - log K(match) (-inf for absorb): no cancellation.
        """
        V = self.vocab_size
        self._check_sedd_length(z_BxL)
        if xp is np:
            seqs, logp = self.seqs, np.log(self.probs)
            onehot = np.eye(V, dtype=bool)[self.seqs]
        else:
            seqs, logp = self._seqs_KxL, self._logp_K
            onehot = self._onehot_KxLxV > 0
        zz = z_BxL[:, None, :]
        mis_BxKxL = (zz != seqs[None]) & (zz != V)
        n_loo = mis_BxKxL.sum(axis=-1, keepdims=True) - mis_BxKxL.astype(np.int32)
        if graph == "uniform":
            D_B = xp.log(lam_B) - xp.log(V - (V - 1) * lam_B)
            pen = xp.where(n_loo > 0, n_loo * D_B[:, None, None], 0.0)
        else:
            pen = xp.where(n_loo > 0, -xp.inf, 0.0)
        logw_BxKxL = logp[None, :, None] + pen
        a = xp.where(onehot[None], logw_BxKxL[..., None], -xp.inf)  # [B, K, L, V]
        return _normalize_log(xp, _lse(xp, a, axis=1), V)

    def _log_noised_marginal_from_emission(self, le_BxLxV) -> np.ndarray:
        L = self.seq_len
        g_BxKxL = le_BxLxV[:, np.arange(L)[None, :], self.seqs]
        return _lse(np, np.log(self.probs)[None] + g_BxKxL.sum(axis=-1), axis=1)


class MarkovOracle(_Oracle):
    """Exact conditionals of a stationary k-th order Markov chain over V symbols.

    Args:
      trans_SxV: float [V^k, V] transition probabilities P(next = v | context s), where the
        context index is the base-V number of the last k symbols (oldest most significant).
      alphabet: V symbols.
      seq_len: optional default length (for sampling and checks).
    The initial context is drawn from the stationary law of the context chain (computed by
    power iteration in float64), so every window of the chain has the same law.
    max_bytes: refuse (ValueError naming the size) a chain whose tables would need more memory
      (:func:`markov_oracle_bytes`); None disables the check.
    """

    variable_length = True  # any sequence length (seq_len is only a default)

    def __init__(self, trans_SxV, alphabet: str, seq_len: int | None = None,
                 max_bytes: int | None = MAX_TABLE_BYTES):
        self.alphabet = _check_alphabet(alphabet)
        V = self.vocab_size = len(alphabet)
        P = np.asarray(trans_SxV, np.float64)
        S = P.shape[0]
        k = round(math.log(S, V)) if S > 1 else 0
        if P.ndim != 2 or P.shape[1] != V or V**k != S or k < 1:
            raise ValueError(f"transition table must have shape [V^k, V] with k >= 1; got {P.shape}, V={V}")
        check_memory(markov_oracle_bytes(V, k), f"a {V}-symbol order-{k} Markov oracle", max_bytes,
                     "use a smaller alphabet or order")
        if not np.all(np.isfinite(P)) or (P < 0).any():
            raise ValueError("transition probabilities must be finite and >= 0")
        rows = P.sum(1)
        if np.any(np.abs(rows - 1) > _SUM_TOL):
            s = int(np.argmax(np.abs(rows - 1)))
            raise ValueError(f"transition row of context {self._ctx_str(s, k)!r} sums to {float(rows[s])!r}, not 1")
        self.order = k
        self.trans = P / rows[:, None]
        self.seq_len = seq_len
        self.stationary = self._stationary()
        self._P = jnp.asarray(self.trans, jnp.float32)
        self._pi = jnp.asarray(self.stationary, jnp.float32)

    def _ctx_str(self, s, k):
        digits = []
        for _ in range(k):
            digits.append(self.alphabet[s % self.vocab_size])
            s //= self.vocab_size
        return "".join(reversed(digits))

    def _stationary(self) -> np.ndarray:
        """Stationary law of the context chain: solve pi (T - I) = 0, sum pi = 1 (float64).

        A linear solve (not power iteration) so that periodic chains are handled. Raises
        ValueError if the law is not unique (a reducible chain with several closed classes).
        """
        V, k = self.vocab_size, self.order
        S = V**k
        T = np.zeros((S, S))
        for s in range(S):
            for v in range(V):
                T[s, (s * V + v) % S] += self.trans[s, v]
        A = np.vstack([T.T - np.eye(S), np.ones((1, S))])
        b = np.zeros(S + 1)
        b[-1] = 1.0
        pi, _, rank, _ = np.linalg.lstsq(A, b, rcond=None)
        if rank < S:
            raise ValueError(
                "the Markov chain has no unique stationary law (it is reducible); the oracle "
                "needs one to define p(x) without a prompt"
            )
        if np.any(pi < -1e-9) or np.abs(pi @ T - pi).max() > 1e-9:
            raise ValueError("could not solve for the stationary law of the Markov chain")
        pi = np.maximum(pi, 0.0)
        return pi / pi.sum()

    @classmethod
    def from_json(cls, path_or_obj, alphabet: str | None = None, seq_len: int | None = None):
        """Read {context: {symbol: probability}} (every context of length k, all V^k present).

        Raises FileNotFoundError / ValueError naming the offending context, symbol or sum.
        """
        table = _read_json_object(path_or_obj, "Markov table")
        ctxs = list(table)
        for c in ctxs:
            if not isinstance(c, str) or not c:
                raise ValueError(f"Markov table: malformed context key {c!r}")
            if not isinstance(table[c], Mapping) or not table[c]:
                raise ValueError(f"Markov table: row of context {c!r} must be a non-empty object")
        ks = {len(c) for c in ctxs}
        if len(ks) > 1:
            k0 = len(ctxs[0])
            bad = next(c for c in ctxs if len(c) != k0)
            raise ValueError(f"Markov table: malformed context key {bad!r}: length {len(bad)} != {k0}")
        k = ks.pop()
        if alphabet is None:
            syms = set("".join(ctxs))
            for row in table.values():
                syms |= set("".join(row))
            alphabet = "".join(sorted(syms))
        V = len(_check_alphabet(alphabet))
        index = {c: i for i, c in enumerate(alphabet)}
        P = np.zeros((V**k, V))
        seen = set()
        for c, row in table.items():
            for ch in c:
                if ch not in index:
                    raise ValueError(f"Markov table: context {c!r} has symbol {ch!r} outside alphabet {alphabet!r}")
            s = 0
            for ch in c:
                s = s * V + index[ch]
            seen.add(s)
            for sym, p in row.items():
                if not isinstance(sym, str) or sym not in index or len(sym) != 1:
                    raise ValueError(f"Markov table: context {c!r}: malformed symbol key {sym!r}")
                P[s, index[sym]] = _check_prob(p, f"Markov table[{c!r}][{sym!r}]")
            total = float(P[s].sum())
            if abs(total - 1) > _SUM_TOL:
                raise ValueError(f"Markov table: row of context {c!r} sums to {total!r}, not 1")
        if len(seen) != V**k:
            missing = next(
                "".join(t) for t in itertools.product(alphabet, repeat=k)
                if sum(index[ch] * V ** (k - 1 - i) for i, ch in enumerate(t)) not in seen
            )
            raise ValueError(f"Markov table: context {missing!r} is missing ({len(seen)} of {V**k} present)")
        return cls(P, alphabet, seq_len=seq_len)

    def to_json(self) -> dict:
        V, k = self.vocab_size, self.order
        return {
            self._ctx_str(s, k): {self.alphabet[v]: float(self.trans[s, v]) for v in range(V)}
            for s in range(V**k)
        }

    # Forward-backward over contexts. One step function serves numpy (float64 truth, Python
    # loop) and jax.numpy (the jitted denoiser, lax.scan).
    def _fb_parts(self, xp, P):
        V, k = self.vocab_size, self.order
        S, R = V**k, V ** (k - 1)
        P_cRv = P.reshape(V, R, V)  # context s = c * R + r  (c = oldest symbol)
        mask_id = self.mask_id

        def emit(z_B):  # [B, V]: 1 where the symbol is compatible with z (or z is MASK)
            onehot = (z_B[:, None] == xp.arange(V)[None, :]).astype(P.dtype)
            return xp.where((z_B == mask_id)[:, None], xp.ones_like(onehot), onehot)

        def fwd(f_BxS, z_B):
            B = f_BxS.shape[0]
            g = (f_BxS.reshape(B, V, R, 1) * P_cRv[None]).sum(axis=1) * emit(z_B)[:, None, :]
            f = g.reshape(B, S)
            norm = f.sum(axis=1)
            return f / xp.where(norm > 0, norm, 1.0)[:, None], xp.log(norm)

        def bwd(b_BxS, z_B):
            B = b_BxS.shape[0]
            h = b_BxS.reshape(B, R, V) * emit(z_B)[:, None, :]
            bp = (P_cRv[None] * h[:, None, :, :]).sum(axis=-1).reshape(B, S)
            return bp / xp.maximum(bp.max(axis=1, keepdims=True), 1e-30)

        def marginal(f_BxS, b_BxS):
            B = f_BxS.shape[0]
            post = (f_BxS * b_BxS).reshape(B, R, V).sum(axis=1)
            return post / post.sum(axis=1, keepdims=True)

        return fwd, bwd, marginal

    def exact_conditionals(self, z_BxL) -> np.ndarray:
        """Exact p(x_i = v | unmasked part of z), float64 numpy [B, L, V]."""
        z = np.asarray(z_BxL)
        fwd, bwd, marginal = self._fb_parts(np, self.trans)
        B, L = z.shape
        f = np.broadcast_to(self.stationary, (B, len(self.stationary)))
        fs = []
        for j in range(L):
            f, _ = fwd(f, z[:, j])
            fs.append(f)
        b = np.ones_like(f)
        post = [None] * L
        for j in range(L - 1, -1, -1):
            post[j] = marginal(fs[j], b)
            b = bwd(b, z[:, j])
        return np.stack(post, axis=1)

    def __call__(self, z_BxL, t_B=None):
        """Exact c*(z) by forward-backward: float32 [B, L, V] log-probabilities (t ignored)."""
        z_LxB = jnp.asarray(z_BxL, jnp.int32).T
        fwd, bwd, marginal = self._fb_parts(jnp, self._P)
        B = z_LxB.shape[1]
        f0 = jnp.broadcast_to(self._pi, (B, self._pi.shape[0]))
        _, fs = jax.lax.scan(lambda f, zj: (fwd(f, zj)[0],) * 2, f0, z_LxB)

        def back(b, inp):
            f_j, z_j = inp
            return bwd(b, z_j), marginal(f_j, b)

        _, post_LxBxV = jax.lax.scan(back, jnp.ones_like(f0), (fs, z_LxB), reverse=True)
        return jnp.log(jnp.transpose(post_LxBxV, (1, 0, 2)))

    def log_marginal(self, z_BxL) -> np.ndarray:
        """log P(unmasked part of z) in nats, float64 [B] (forward algorithm in float64)."""
        z = np.asarray(z_BxL)
        fwd, _, _ = self._fb_parts(np, self.trans)
        f = np.broadcast_to(self.stationary, (z.shape[0], len(self.stationary)))
        total = np.zeros(z.shape[0])
        with np.errstate(divide="ignore"):
            for j in range(z.shape[1]):
                f, log_norm = fwd(f, z[:, j])
                total = total + log_norm
        return total

    def sample(self, rng: np.random.Generator, n: int, length: int | None = None) -> np.ndarray:
        """n stationary sequences, int32 [n, length]."""
        L = length or self.seq_len
        if not L:
            raise ValueError("sample() needs a length")
        s = rng.choice(self.vocab_size**self.order, size=n, p=self.stationary)
        return self._run_chain(rng, s, L)

    def sample_response(self, rng: np.random.Generator, prompt_BxP, length: int) -> np.ndarray:
        """y ~ p(y | prompt): continue each prompt by `length` symbols, int32 [B, length].

        The context after the prompt is drawn from its exact posterior (forward filtering
        from the stationary start), so prompts shorter than the order are handled too.
        """
        prompt = validate_tokens(prompt_BxP, self.vocab_size, name="prompt")
        fwd, _, _ = self._fb_parts(np, self.trans)
        f = np.broadcast_to(self.stationary, (len(prompt), len(self.stationary)))
        for j in range(prompt.shape[1]):
            f, _ = fwd(f, prompt[:, j])
        cum = np.cumsum(f, axis=1)
        u = rng.random(len(prompt)) * cum[:, -1]
        s = np.minimum((u[:, None] > cum).sum(1), cum.shape[1] - 1)
        return self._run_chain(rng, s, length)

    def _run_chain(self, rng, s, L):
        V, S = self.vocab_size, self.vocab_size**self.order
        n = len(s)
        out = np.zeros((n, L), np.int32)
        cum = np.cumsum(self.trans, axis=1)
        for j in range(L):
            u = rng.random(n)
            v = np.minimum((u[:, None] > cum[s]).sum(1), V - 1)
            out[:, j] = v
            s = (s * V + v) % S
        return out

    # ---- SEDD score ratios (see _Oracle.log_score) ----
    # Log-space forward-backward over contexts with soft emissions e_j(u) = log K_lam(z_j | u):
    # a hidden Markov model whose hidden symbols are the clean tokens. Log space (not rescaled
    # linear messages) because with zeros in the transition table and lam ~ 1e-6 the ratios of
    # messages between states exceed the float32 range after a few steps.
    def _log_fb_parts(self, xp, logP):
        V, k = self.vocab_size, self.order
        S, R = V**k, V ** (k - 1)
        lP_cRv = logP.reshape(V, R, V)  # context s = c * R + r (c = oldest symbol)

        def predict(lf_BxS):  # log P(state_{j-1}, z_<j) (normalised) -> log P(state_j | z_<j)
            B = lf_BxS.shape[0]
            return _lse(xp, lf_BxS.reshape(B, V, R, 1) + lP_cRv[None], axis=1).reshape(B, S)

        def update(lg_BxS, le_BxV):  # add the emission of z_j, normalise; returns log-normaliser
            B = lg_BxS.shape[0]
            lf = (lg_BxS.reshape(B, R, V) + le_BxV[:, None, :]).reshape(B, S)
            c_B = _lse(xp, lf, axis=1)
            return lf - xp.where(xp.isfinite(c_B), c_B, 0.0)[:, None], c_B

        def bwd(lb_BxS, le_BxV):  # log P(z_>j | state_j) -> log P(z_>=j | state_{j-1}) (max-shifted)
            B = lb_BxS.shape[0]
            h = lb_BxS.reshape(B, R, V) + le_BxV[:, None, :]
            bp = _lse(xp, lP_cRv[None] + h[:, None, :, :], axis=-1).reshape(B, S)
            m = bp.max(axis=1, keepdims=True)
            return bp - xp.where(xp.isfinite(m), m, 0.0)

        def loo(lg_BxS, lb_BxS):  # unnormalised log P(x_j = v | z_{-j}) [B, V]
            B = lg_BxS.shape[0]
            return _lse(xp, (lg_BxS + lb_BxS).reshape(B, R, V), axis=1)

        return predict, update, bwd, loo

    @functools.cached_property
    def _log_tables_f32(self):
        # numpy float32 (not jax arrays: a cached jax array created inside a trace would leak).
        with np.errstate(divide="ignore"):
            return np.log(self.trans).astype(np.float32), np.log(self.stationary).astype(np.float32)

    def _log_tables_f64(self):
        with np.errstate(divide="ignore"):
            return np.log(self.trans), np.log(self.stationary)

    def _loo_log_posterior(self, xp, z_BxL, lam_B, graph):
        V = self.vocab_size
        le_BxLxV = _rel_log_emission(xp, z_BxL, lam_B, V, graph)
        B, L = z_BxL.shape
        if xp is np:
            logP, logpi = self._log_tables_f64()
            predict, update, bwd, loo = self._log_fb_parts(np, logP)
            lf = np.broadcast_to(logpi, (B, len(logpi)))
            lgs = []
            for j in range(L):
                lg = predict(lf)
                lf, _ = update(lg, le_BxLxV[:, j])
                lgs.append(lg)
            lb = np.zeros_like(lf)
            lq = [None] * L
            for j in range(L - 1, -1, -1):
                lq[j] = loo(lgs[j], lb)
                lb = bwd(lb, le_BxLxV[:, j])
            return _normalize_log(np, np.stack(lq, axis=1), V)
        logP, logpi = self._log_tables_f32
        predict, update, bwd, loo = self._log_fb_parts(jnp, logP)
        le_LxBxV = jnp.transpose(le_BxLxV, (1, 0, 2))
        lf0 = jnp.broadcast_to(logpi, (B, logpi.shape[0]))

        def fstep(lf, le_j):
            lg = predict(lf)
            return update(lg, le_j)[0], lg

        _, lg_LxBxS = jax.lax.scan(fstep, lf0, le_LxBxV)

        def bstep(lb, inp):
            lg_j, le_j = inp
            return bwd(lb, le_j), loo(lg_j, lb)

        _, lq_LxBxV = jax.lax.scan(bstep, jnp.zeros_like(lf0), (lg_LxBxS, le_LxBxV), reverse=True)
        return _normalize_log(jnp, jnp.transpose(lq_LxBxV, (1, 0, 2)), V)

    def _log_noised_marginal_from_emission(self, le_BxLxV) -> np.ndarray:
        logP, logpi = self._log_tables_f64()
        predict, update, _, _ = self._log_fb_parts(np, logP)
        B, L, _ = le_BxLxV.shape
        lf = np.broadcast_to(logpi, (B, len(logpi)))
        total = np.zeros(B)
        for j in range(L):
            lf, c = update(predict(lf), le_BxLxV[:, j])
            total = total + c
        return total


def load_oracle(kind: str, path, alphabet: str | None = None, seq_len: int | None = None):
    """Build an oracle from a JSON file: kind 'tabular' or 'markov'."""
    if kind == "tabular":
        return TabularOracle.from_json(path, alphabet=alphabet)
    if kind == "markov":
        return MarkovOracle.from_json(path, alphabet=alphabet, seq_len=seq_len)
    raise ValueError(f"unknown oracle kind {kind!r}; expected 'tabular' or 'markov'")


def markov_oracle_bytes(vocab_size: int, order: int) -> int:
    """Bytes a ``vocab_size``-symbol order-``order`` :class:`MarkovOracle` needs, about: the
    V^k x V transition table and its copies (float64 and float32), and the dense V^k x V^k
    system of its stationary law (three float64 copies in the solve)."""
    S = int(vocab_size) ** int(order)
    return 8 * (5 * S * int(vocab_size) + 3 * (S + 1) * S)


def random_tabular(
    rng: np.random.Generator, alphabet: str, seq_len: int, num_seqs: int, temperature: float = 0.5,
    max_bytes: int | None = MAX_TABLE_BYTES,
) -> TabularOracle:
    """num_seqs distinct random sequences with probabilities softmax(u / temperature), u ~ U[0,1).

    The I-MDCE paper's DNA-128 toy (arXiv 2510.24088 §5.1) is alphabet 'ACGT', seq_len 8,
    num_seqs 128, temperature 0.5. Raises ValueError for an empty or repeating alphabet,
    seq_len or num_seqs < 1, or more memory than ``max_bytes`` (drawing distinct sequences
    permutes all V^L of them).
    """
    _check_alphabet(alphabet)
    for name, v in (("seq_len", seq_len), ("num_seqs", num_seqs)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"random_tabular: {name} must be an integer >= 1; got {v!r}")
    V = len(alphabet)
    check_memory(8 * V**seq_len, f"drawing {num_seqs} distinct sequences from {V}^{seq_len}", max_bytes,
                 "use a smaller alphabet or seq_len")
    if num_seqs > V**seq_len:
        raise ValueError(f"cannot draw {num_seqs} distinct sequences from {V}^{seq_len}")
    idx = rng.choice(V**seq_len, size=num_seqs, replace=False)
    seqs = np.stack([(idx // V ** (seq_len - 1 - j)) % V for j in range(seq_len)], 1)
    u = rng.random(num_seqs) / temperature
    p = np.exp(u - u.max())
    return TabularOracle(seqs, p / p.sum(), alphabet)


def random_markov(
    rng: np.random.Generator, alphabet: str, order: int, temperature: float = 0.5,
    seq_len: int | None = None, max_bytes: int | None = MAX_TABLE_BYTES,
) -> MarkovOracle:
    """Random k-th order chain: each context's row is softmax(u / temperature), u ~ U[0,1)^V
    (the procedure the I-MDCE paper states for its 4th-order toy).

    Raises ValueError, before allocating anything, for an empty or repeating alphabet, fewer
    than 2 symbols, an order that is not an integer >= 1, a temperature <= 0, or a chain needing
    more memory than ``max_bytes`` (:func:`markov_oracle_bytes`; e.g. 62 symbols at order 4)."""
    _check_alphabet(alphabet)
    V = len(alphabet)
    if V < 2:
        raise ValueError(f"random_markov: alphabet {alphabet!r} has {V} symbol; a Markov chain needs at least 2")
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 1:
        raise ValueError(f"random_markov: order must be an integer >= 1; got {order!r}")
    if not float(temperature) > 0:
        raise ValueError(f"random_markov: temperature must be > 0; got {temperature!r}")
    check_memory(markov_oracle_bytes(V, int(order)), f"a {V}-symbol order-{int(order)} Markov oracle", max_bytes,
                 "use a smaller alphabet or order")
    u = rng.random((V**order, V)) / temperature
    P = np.exp(u - u.max(1, keepdims=True))
    return MarkovOracle(P / P.sum(1, keepdims=True), alphabet, seq_len=seq_len, max_bytes=max_bytes)
