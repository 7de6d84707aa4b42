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
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "TabularOracle",
    "MarkovOracle",
    "load_oracle",
    "random_tabular",
    "random_markov",
    "validate_tokens",
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


def validate_tokens(x, vocab_size: int, name: str = "x", seq_len: int | None = None) -> np.ndarray:
    """Check a token array: integer dtype, 2-D, ids in [0, vocab_size). Returns int32 numpy.

    Raises TypeError (non-integer dtype) or ValueError (wrong rank/length, id out of range),
    naming the offending value and its position.
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integer token ids; got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape [batch, length]; got shape {arr.shape}")
    if arr.shape[1] < 1:
        raise ValueError(f"{name} has zero-length sequences: shape {arr.shape}")
    if seq_len is not None and arr.shape[1] != seq_len:
        raise ValueError(f"{name} must have length {seq_len}; got shape {arr.shape}")
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        b, l = np.argwhere(bad)[0]
        raise ValueError(
            f"{name}[{b}, {l}] = {arr[b, l]} is outside the vocabulary [0, {vocab_size})"
        )
    return arr.astype(np.int32)


def _check_alphabet(alphabet: str) -> str:
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty string; got {alphabet!r}")
    dup = [c for c in set(alphabet) if alphabet.count(c) > 1]
    if dup:
        raise ValueError(f"alphabet {alphabet!r} repeats the symbol {sorted(dup)[0]!r}")
    return alphabet


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


class MarkovOracle(_Oracle):
    """Exact conditionals of a stationary k-th order Markov chain over V symbols.

    Args:
      trans_SxV: float [V^k, V] transition probabilities P(next = v | context s), where the
        context index is the base-V number of the last k symbols (oldest most significant).
      alphabet: V symbols.
      seq_len: optional default length (for sampling and checks).
    The initial context is drawn from the stationary law of the context chain (computed by
    power iteration in float64), so every window of the chain has the same law.
    """

    def __init__(self, trans_SxV, alphabet: str, seq_len: int | None = None):
        self.alphabet = _check_alphabet(alphabet)
        V = self.vocab_size = len(alphabet)
        P = np.asarray(trans_SxV, np.float64)
        S = P.shape[0]
        k = round(math.log(S, V)) if S > 1 else 0
        if P.ndim != 2 or P.shape[1] != V or V**k != S or k < 1:
            raise ValueError(f"transition table must have shape [V^k, V] with k >= 1; got {P.shape}, V={V}")
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


def load_oracle(kind: str, path, alphabet: str | None = None, seq_len: int | None = None):
    """Build an oracle from a JSON file: kind 'tabular' or 'markov'."""
    if kind == "tabular":
        return TabularOracle.from_json(path, alphabet=alphabet)
    if kind == "markov":
        return MarkovOracle.from_json(path, alphabet=alphabet, seq_len=seq_len)
    raise ValueError(f"unknown oracle kind {kind!r}; expected 'tabular' or 'markov'")


def random_tabular(
    rng: np.random.Generator, alphabet: str, seq_len: int, num_seqs: int, temperature: float = 0.5
) -> TabularOracle:
    """num_seqs distinct random sequences with probabilities softmax(u / temperature), u ~ U[0,1).

    The I-MDCE paper's DNA-128 toy (arXiv 2510.24088 §5.1) is alphabet 'ACGT', seq_len 8,
    num_seqs 128, temperature 0.5.
    """
    V = len(alphabet)
    if num_seqs > V**seq_len:
        raise ValueError(f"cannot draw {num_seqs} distinct sequences from {V}^{seq_len}")
    idx = rng.choice(V**seq_len, size=num_seqs, replace=False)
    seqs = np.stack([(idx // V ** (seq_len - 1 - j)) % V for j in range(seq_len)], 1)
    u = rng.random(num_seqs) / temperature
    p = np.exp(u - u.max())
    return TabularOracle(seqs, p / p.sum(), alphabet)


def random_markov(
    rng: np.random.Generator, alphabet: str, order: int, temperature: float = 0.5,
    seq_len: int | None = None,
) -> MarkovOracle:
    """Random k-th order chain: each context's row is softmax(u / temperature), u ~ U[0,1)^V
    (the procedure the I-MDCE paper states for its 4th-order toy)."""
    V = len(alphabet)
    u = rng.random((V**order, V)) / temperature
    P = np.exp(u - u.max(1, keepdims=True))
    return MarkovOracle(P / P.sum(1, keepdims=True), alphabet, seq_len=seq_len)
