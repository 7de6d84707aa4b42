"""Tabular oracles: an enumerable distribution over sequences of length L, read from a JSON
object {sequence: probability}; conditionals and the SEDD scores by summing the table."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.oracles.base import (SUM_TOL, Oracle, check_alphabet, check_prob, lse, normalize_log,
                                   read_json_object)
from infodiff.validation import MAX_TABLE_BYTES, check_memory, validate_tokens

__all__ = ["TabularOracle", "random_tabular"]


class TabularOracle(Oracle):
    """Exact conditionals of an enumerable distribution over length-L sequences.

    Args:
      seqs_KxL: int [K, L] distinct support sequences, ids in [0, V).
      probs_K: float [K], non-negative, summing to 1 (within 1e-6; renormalised in float64).
      alphabet: string of V symbols (for encode/decode).
    Raises ValueError on duplicate sequences, bad probabilities or ids outside [0, V).
    """

    def __init__(self, seqs_KxL, probs_K, alphabet: str):
        self.alphabet = check_alphabet(alphabet)
        self.vocab_size = len(alphabet)
        seqs = validate_tokens(seqs_KxL, self.vocab_size, name="support sequences")
        probs = np.asarray(probs_K, np.float64)
        if probs.shape != (seqs.shape[0],):
            raise ValueError(f"probs must have shape ({seqs.shape[0]},); got {probs.shape}")
        if not np.all(np.isfinite(probs)) or (probs < 0).any():
            raise ValueError(f"probabilities must be finite and >= 0; got min {probs.min()}")
        total = probs.sum()
        if abs(total - 1.0) > SUM_TOL:
            raise ValueError(f"probabilities sum to {total!r}, not 1 (tolerance {SUM_TOL})")
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
        table = read_json_object(path_or_obj, "tabular distribution")
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
        probs = [check_prob(table[k], f"tabular distribution[{k!r}]") for k in keys]
        total = math.fsum(probs)
        if abs(total - 1.0) > SUM_TOL:
            raise ValueError(
                f"tabular distribution: probabilities sum to {total!r}, not 1 (tolerance {SUM_TOL})"
            )
        if alphabet is None:
            alphabet = "".join(sorted(set("".join(keys))))
        check_alphabet(alphabet)
        obj = cls.__new__(cls)
        obj.alphabet = alphabet
        obj.vocab_size = len(alphabet)
        seqs = Oracle.encode(obj, keys)
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

    # ---- SEDD score ratios (see Oracle.log_score) ----
    def check_sedd_length(self, z_BxL) -> None:
        if z_BxL.shape[1] != self.seq_len:
            raise ValueError(f"z must have length {self.seq_len}; got shape {tuple(z_BxL.shape)}")

    def loo_log_posterior(self, xp, z_BxL, lam, graph):
        """log q[b, i, u] = log P(x_i = u | z_{-i}): log-sum-exp over the K support sequences.

        Posterior weight of sequence k without position i: log p_k + sum_{j != i} e_j(x_kj),
        e the graph's relative emission. With one noise level per row (lam [B]) this is
        ``graph.mismatch_log_weight`` of the integer count n_ki of positions j != i where z_j is
        a real token other than x_kj (no cancellation); per position (lam [B, L]) the finite
        emissions are summed and the -inf ones counted.
        """
        V = self.vocab_size
        self.check_sedd_length(z_BxL)
        if xp is np:
            seqs, logp = self.seqs, np.log(self.probs)
            onehot = np.eye(V, dtype=bool)[self.seqs]
        else:
            seqs, logp = self._seqs_KxL, self._logp_K
            onehot = self._onehot_KxLxV > 0
        zz = z_BxL[:, None, :]
        mis_BxKxL = (zz != seqs[None]) & (zz != V)
        n_loo = mis_BxKxL.sum(axis=-1, keepdims=True) - mis_BxKxL.astype(np.int32)
        if lam.ndim == 1:
            pen = graph.mismatch_log_weight(xp, n_loo, lam, V)
        else:
            e = graph.rel_log_emission(xp, z_BxL, lam, V)
            g_BxKxL = e[:, xp.arange(z_BxL.shape[1])[None, :], seqs]
            hard = g_BxKxL == -xp.inf
            g_fin = xp.where(hard, 0.0, g_BxKxL)
            n_hard = hard.sum(axis=-1, keepdims=True) - hard.astype(np.int32)
            pen = xp.where(n_hard > 0, -xp.inf, g_fin.sum(axis=-1, keepdims=True) - g_fin)
        logw_BxKxL = logp[None, :, None] + pen
        a = xp.where(onehot[None], logw_BxKxL[..., None], -xp.inf)  # [B, K, L, V]
        return normalize_log(xp, lse(xp, a, axis=1), V)

    def log_noised_marginal_from_emission(self, le_BxLxV) -> np.ndarray:
        L = self.seq_len
        g_BxKxL = le_BxLxV[:, np.arange(L)[None, :], self.seqs]
        return lse(np, np.log(self.probs)[None] + g_BxKxL.sum(axis=-1), axis=1)



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
    check_alphabet(alphabet)
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
