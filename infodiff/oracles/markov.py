"""Markov oracles: a stationary k-th order Markov chain read from a JSON object
{context: {symbol: probability}}; conditionals for any mask pattern, and the SEDD scores, by
forward-backward over the V^k contexts (a hidden Markov model whose state is the last k
symbols). The chain starts from its stationary context law, so a prompt sets the initial
context of a response exactly: log p(y | x) = sum_j log P(y_j | previous k symbols)."""

from __future__ import annotations

import functools
import itertools
import math
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.oracles.base import (SUM_TOL, Oracle, check_alphabet, check_prob, lse, normalize_log,
                                   read_json_object)
from infodiff.validation import MAX_TABLE_BYTES, check_memory, validate_tokens

__all__ = ["MarkovOracle", "random_markov", "markov_oracle_bytes"]


class MarkovOracle(Oracle):
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
        self.alphabet = check_alphabet(alphabet)
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
        if np.any(np.abs(rows - 1) > SUM_TOL):
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
        table = read_json_object(path_or_obj, "Markov table")
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
        V = len(check_alphabet(alphabet))
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
                P[s, index[sym]] = check_prob(p, f"Markov table[{c!r}][{sym!r}]")
            total = float(P[s].sum())
            if abs(total - 1) > SUM_TOL:
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

    # ---- SEDD score ratios (see Oracle.log_score) ----
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
            return lse(xp, lf_BxS.reshape(B, V, R, 1) + lP_cRv[None], axis=1).reshape(B, S)

        def update(lg_BxS, le_BxV):  # add the emission of z_j, normalise; returns log-normaliser
            B = lg_BxS.shape[0]
            lf = (lg_BxS.reshape(B, R, V) + le_BxV[:, None, :]).reshape(B, S)
            c_B = lse(xp, lf, axis=1)
            return lf - xp.where(xp.isfinite(c_B), c_B, 0.0)[:, None], c_B

        def bwd(lb_BxS, le_BxV):  # log P(z_>j | state_j) -> log P(z_>=j | state_{j-1}) (max-shifted)
            B = lb_BxS.shape[0]
            h = lb_BxS.reshape(B, R, V) + le_BxV[:, None, :]
            bp = lse(xp, lP_cRv[None] + h[:, None, :, :], axis=-1).reshape(B, S)
            m = bp.max(axis=1, keepdims=True)
            return bp - xp.where(xp.isfinite(m), m, 0.0)

        def loo(lg_BxS, lb_BxS):  # unnormalised log P(x_j = v | z_{-j}) [B, V]
            B = lg_BxS.shape[0]
            return lse(xp, (lg_BxS + lb_BxS).reshape(B, R, V), axis=1)

        return predict, update, bwd, loo

    @functools.cached_property
    def _log_tables_f32(self):
        # numpy float32 (not jax arrays: a cached jax array created inside a trace would leak).
        with np.errstate(divide="ignore"):
            return np.log(self.trans).astype(np.float32), np.log(self.stationary).astype(np.float32)

    def _log_tables_f64(self):
        with np.errstate(divide="ignore"):
            return np.log(self.trans), np.log(self.stationary)

    def loo_log_posterior(self, xp, z_BxL, lam, graph):
        """Log-space forward-backward with the graph's relative emissions (lam [B] or [B, L])."""
        V = self.vocab_size
        le_BxLxV = graph.rel_log_emission(xp, z_BxL, lam, V)
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
            return normalize_log(np, np.stack(lq, axis=1), V)
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
        return normalize_log(jnp, jnp.transpose(lq_LxBxV, (1, 0, 2)), V)

    def log_noised_marginal_from_emission(self, le_BxLxV) -> np.ndarray:
        logP, logpi = self._log_tables_f64()
        predict, update, _, _ = self._log_fb_parts(np, logP)
        B, L, _ = le_BxLxV.shape
        lf = np.broadcast_to(logpi, (B, len(logpi)))
        total = np.zeros(B)
        for j in range(L):
            lf, c = update(predict(lf), le_BxLxV[:, j])
            total = total + c
        return total



def markov_oracle_bytes(vocab_size: int, order: int) -> int:
    """Bytes a ``vocab_size``-symbol order-``order`` :class:`MarkovOracle` needs, about: the
    V^k x V transition table and its copies (float64 and float32), and the dense V^k x V^k
    system of its stationary law (three float64 copies in the solve)."""
    S = int(vocab_size) ** int(order)
    return 8 * (5 * S * int(vocab_size) + 3 * (S + 1) * S)



def random_markov(
    rng: np.random.Generator, alphabet: str, order: int, temperature: float = 0.5,
    seq_len: int | None = None, max_bytes: int | None = MAX_TABLE_BYTES,
) -> MarkovOracle:
    """Random k-th order chain: each context's row is softmax(u / temperature), u ~ U[0,1)^V
    (the procedure the I-MDCE paper states for its 4th-order toy).

    Raises ValueError, before allocating anything, for an empty or repeating alphabet, fewer
    than 2 symbols, an order that is not an integer >= 1, a temperature <= 0, or a chain needing
    more memory than ``max_bytes`` (:func:`markov_oracle_bytes`; e.g. 62 symbols at order 4)."""
    check_alphabet(alphabet)
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
