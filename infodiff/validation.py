"""Input validation shared by processes, oracles, data and the training loop.

Each function refuses bad input up front with one message naming the value and its position,
and returns the input as a numpy array of a fixed dtype.
"""

from __future__ import annotations

import numpy as np

__all__ = ["validate_tokens", "validate_token_stream", "validate_counts", "validate_rates", "raise_first"]


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
