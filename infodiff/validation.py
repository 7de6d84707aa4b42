"""Input validation shared by processes, oracles, data and the training loop.

Each function refuses bad input up front with one message naming the value and its position,
and returns the input as a numpy array of a fixed dtype (or, for :func:`as_key`, a key).

The checks of the Monte Carlo drivers (:mod:`infodiff.likelihood`) live here too, so that the
drivers only call them: :func:`as_key` (an integer seed where a key is expected),
:func:`check_batch` (empty batches), :func:`check_seq_len` (data vs the denoiser's length),
:func:`check_normalised` (a masked denoiser's log-probabilities sum to 1), and
:func:`check_memory` (refuse a table before allocating it).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["validate_tokens", "validate_token_stream", "validate_counts", "validate_rates", "raise_first",
           "as_key", "check_batch", "check_seq_len", "check_normalised", "check_memory", "format_bytes",
           "MAX_TABLE_BYTES", "NORMALISATION_TOL", "check_num_samples", "check_budget", "MAX_PER_ITEM"]

# Default ceiling for tables an oracle would allocate (bytes): refused above it, before allocating.
MAX_TABLE_BYTES = 4 * 2**30
# |logsumexp_v log p(v)| above this (nats) on the first batch: the denoiser is not normalised.
NORMALISATION_TOL = 1e-3
# Upper bound on a Monte Carlo budget per item (samples, orders, adaptive caps, choice rounds): above
# it a run costs days of forward passes and GiB of per-sample values per item (:func:`check_budget`).
MAX_PER_ITEM = 1 << 20
PASS_SECONDS = 1e-3  # the time of one forward pass used to state a budget's cost (a small network)


def check_num_samples(value, name: str = "num_samples") -> int:
    """``int(value)`` where ``value`` is an integer >= 2 (Monte Carlo samples: a standard error
    needs two) and at most :data:`MAX_PER_ITEM` (:func:`check_budget`); ValueError naming ``name``
    (e.g. 'config.eval.num_samples') and the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise ValueError(f"{name}={value!r} must be an integer >= 2 to report a standard error")
    return check_budget(int(value), name)


def _duration(seconds: float) -> str:
    for unit, s in (("years", 3.15576e7), ("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= s:
            return f"{seconds / s:.3g} {unit}"
    return f"{seconds:.3g} s"


def check_budget(value: int, name: str, passes_each: int = 1) -> int:
    """``value`` (a Monte Carlo budget per item: samples, orders, a cap) if at most
    :data:`MAX_PER_ITEM`; else ValueError, before any work, in one line with what it implies: its
    forward passes per item (``value * passes_each``; the time at :data:`PASS_SECONDS` each) and
    the memory of its per-sample float64 values per item."""
    if value > MAX_PER_ITEM:
        passes = float(value) * passes_each
        raise ValueError(f"{name}={value} is above the bound {MAX_PER_ITEM} per item: it implies {passes:.3g} forward "
                         f"passes per item (about {_duration(passes * PASS_SECONDS)} at {PASS_SECONDS * 1e3:g} ms each) "
                         f"and {format_bytes(8 * value)} of per-sample values per item; use at most {MAX_PER_ITEM} "
                         "(a standard error shrinks as 1/sqrt of it)")
    return int(value)


def raise_first(bad: np.ndarray, a: np.ndarray, name: str, what: str) -> None:
    """Raise ValueError naming the first entry where ``bad`` holds: 'x[1, 1] = -2 is negative'."""
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}{list(idx)} = {a[idx]} {what}")


def validate_tokens(x, vocab_size: int, name: str = "x", seq_len: int | None = None) -> np.ndarray:
    """Check a token array: integer dtype, 2-D [batch, length], ids in [0, vocab_size).

    Returns int32 numpy. Raises TypeError (non-integer dtype) or ValueError (wrong rank or
    length, id out of range), naming the offending value and its position.
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


def validate_token_stream(tokens, vocab_size: int, name: str = "tokens") -> None:
    """Raise ValueError naming the offending value if any token is outside [0, vocab_size)."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids; got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        pos = int(np.flatnonzero(arr.reshape(-1) == bad)[0])
        raise ValueError(
            f"{name} contains token id {bad} (first at flat index {pos}) outside "
            f"[0, {vocab_size}) = [0, config.data.vocab_size); the MASK id {vocab_size} and other "
            f"values must not appear in data"
        )


def validate_counts(x, name: str = "x") -> np.ndarray:
    """Check that ``x`` holds non-negative integer counts (any shape; ints or integer-valued
    floats). Returns int64 numpy. Raises ValueError naming the first offending entry: NaN / inf,
    negative, non-integer (e.g. "x[3, 1] = -2 is negative")."""
    a = np.asarray(x)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"{name} must be numeric counts; got dtype {a.dtype}")
    if np.issubdtype(a.dtype, np.floating):
        raise_first(~np.isfinite(a), a, name, "is not finite")
    raise_first(a < 0, a, name, "is negative")
    if np.issubdtype(a.dtype, np.floating):
        raise_first(a != np.floor(a), a, name, "is not an integer count")
    return a.astype(np.int64)


def validate_rates(x, name: str = "x") -> np.ndarray:
    """Scaled data for the Poisson channel: finite and >= 0. Returns float64 numpy; ValueError
    naming the first bad entry otherwise."""
    a = np.asarray(x, dtype=np.float64)
    raise_first(~np.isfinite(a), a, name, "is not finite")
    raise_first(a < 0, a, name, "is negative (a Poisson rate must be >= 0)")
    return a


def as_key(key, name: str = "key"):
    """A JAX PRNG key: ``key`` itself (a typed key, or a legacy raw uint32[2] key), or
    ``jax.random.key(key)`` for an integer seed. TypeError naming the value otherwise."""
    import jax

    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        return jax.random.key(int(key))
    if isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    arr = np.asarray(key) if isinstance(key, (np.ndarray, jax.Array)) else None
    if arr is not None and arr.dtype == np.uint32 and arr.shape == (2,):
        return key
    raise TypeError(f"{name} must be a JAX PRNG key (jax.random.key(seed)) or an integer seed; "
                    f"got {type(key).__name__} {key!r:.60}")


def check_batch(x, name: str = "x") -> None:
    """Raise ValueError if ``x`` (array-like, batch first) holds no items: shape [0, ...]."""
    shape = np.shape(x)
    if len(shape) >= 1 and shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (shape {tuple(shape)}): give at least one item")


def check_seq_len(x, denoiser, name: str = "x") -> None:
    """Raise ValueError if ``x`` [B, L] does not have the length ``denoiser.seq_len`` a fixed-length
    denoiser (e.g. a tabular oracle) is defined on. Denoisers without ``seq_len``, or with
    ``variable_length = True`` (Markov chains), take any length."""
    L = getattr(denoiser, "seq_len", None)
    if L is None or getattr(denoiser, "variable_length", False) or np.ndim(x) != 2:
        return
    got = int(np.shape(x)[1])
    if got != int(L):
        raise ValueError(f"{name} has sequences of length {got} but the denoiser "
                         f"({type(denoiser).__name__}) is defined on sequences of length {int(L)}: "
                         f"give data of length {int(L)} or a denoiser for length {got}")


def check_normalised(apply_fn, params, x_BxL, target_BxL, vocab_size: int, rows: int = 4,
                     tol: float = NORMALISATION_TOL) -> None:
    """A masked denoiser's output must be log-probabilities: one call on the first ``rows`` rows of
    ``x`` with every target position masked (MASK id = ``vocab_size``, t = 1), and
    ``logsumexp`` over the V tokens must be 0 within ``tol`` nats at every masked position.

    Raises ValueError naming the worst position and its logsumexp (a denoiser returning logits,
    or log-probabilities shifted by a constant, would give silently wrong likelihoods). Outputs
    of another shape, or non-finite ones, are left to the driver's own checks."""
    import jax
    import jax.numpy as jnp

    x = np.asarray(x_BxL)[:rows]
    tgt = np.asarray(target_BxL, bool)[:rows]
    if x.size == 0 or not tgt.any():
        return
    z = np.where(tgt, vocab_size, x).astype(np.int32)
    # jitted: one compilation, not one per primitive of an eager call (45 for the default
    # transformer, 1.5 s more on one CPU core)
    out = jax.jit(apply_fn)(params, jnp.asarray(z), jnp.ones((x.shape[0],), jnp.float32))
    out = np.asarray(out, np.float64)
    if out.shape != x.shape + (vocab_size,):
        return
    m = out.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        lse = (m + np.log(np.exp(out - np.where(np.isfinite(m), m, 0.0)).sum(-1, keepdims=True)))[..., 0]
    dev = np.where(tgt & np.isfinite(lse), np.abs(lse), 0.0)
    if dev.max() > tol:
        b, l = (int(i) for i in np.unravel_index(int(np.argmax(dev)), dev.shape))
        raise ValueError(
            f"the denoiser's output is not normalised: logsumexp over the {vocab_size} tokens is "
            f"{lse[b, l]:+.4g} (must be 0) at masked position [{b}, {l}] of the first batch, so its "
            "likelihoods would be wrong; return log-probabilities (e.g. jax.nn.log_softmax of the "
            "logits), or pass check_normalised=False if this is intended")


def format_bytes(n: float) -> str:
    """'7.3 GB'-style size (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB", "EB"):
        if abs(n) < 1000 or unit == "EB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000.0
    return f"{n:.3g} EB"


def check_memory(nbytes: float, what: str, max_bytes: float | None = MAX_TABLE_BYTES,
                 hint: str = "") -> None:
    """Raise ValueError before allocating: ``what`` would take ``nbytes``
    (more than ``max_bytes``; None disables the check). The message gives both sizes."""
    if max_bytes is None or not math.isfinite(float(max_bytes)):
        return
    if nbytes > max_bytes:
        raise ValueError(f"{what} would take about {format_bytes(nbytes)} of memory, more than the "
                         f"limit of {format_bytes(max_bytes)} (max_bytes){'; ' + hint if hint else ''}")
