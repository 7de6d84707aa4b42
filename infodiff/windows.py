"""Model-length windows of token rows, and user strings encoded to rows (docs/scoring.md).

The pieces :mod:`infodiff.scoring` (the ``Run``) and :mod:`infodiff.choices` both build on: a
document is cut into non-overlapping windows of L tokens; a response of R <= L tokens is one
window with the last L - R tokens of its context, a longer one pieces of L // 2 tokens each
given the L - L // 2 tokens before it (:mod:`infodiff.scoring`'s docstring); a row's estimate
is the sum of its windows' (:func:`sum_windows`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from infodiff import likelihood as lk
from infodiff.data.tokenizers import TEXT8, Tokenizer

__all__ = ["Windows", "document_windows", "first_piece", "response_windows", "sum_windows", "encode_rows",
           "check_nonempty", "prompt_contexts"]


@dataclasses.dataclass(frozen=True)
class Windows:
    """Model-length windows of a batch of rows: ``x_WxL`` int32 tokens (pads 0), ``target_WxL``
    bool (scored positions), ``pad_WxL`` bool (absent positions), ``row_W`` int (the row of each
    window)."""

    x_WxL: np.ndarray
    target_WxL: np.ndarray
    pad_WxL: np.ndarray
    row_W: np.ndarray
    context_R: np.ndarray | None = None


def _pack(rows, L) -> Windows:
    """rows: (row, context ids, scored ids) per window, len(context) + len(scored) <= L."""
    W = len(rows)
    x = np.zeros((W, L), np.int32)
    target = np.zeros((W, L), bool)
    pad = np.ones((W, L), bool)
    row = np.zeros(W, np.int64)
    for w, (r, ctx, y) in enumerate(rows):
        c, n = len(ctx), len(y)
        x[w, :c], x[w, c:c + n] = ctx, y
        pad[w, :c + n] = False
        target[w, c:c + n] = True
        row[w] = r
    return Windows(x, target, pad, row)


def document_windows(docs: list[np.ndarray], L: int) -> Windows:
    """Non-overlapping windows of L tokens of each document (the last one padded)."""
    rows = []
    for r, d in enumerate(docs):
        for i in range(0, len(d), L):
            rows.append((r, d[:0], d[i:i + L]))
    return _pack(rows, L)


def first_piece(R: int, L: int) -> int:
    """Tokens scored by a response's first window: R if R <= L, else L // 2."""
    return R if R <= L else L // 2


def response_windows(contexts: list[np.ndarray], responses: list[np.ndarray], L: int,
                     first_context: list[int] | None = None) -> Windows:
    """Windows scoring each response given its context (module docstring): one window of the
    last L - R context tokens and the response when R <= L, else pieces of L // 2 tokens each
    given the L - L // 2 tokens before it. ``first_context[r]`` caps the context of row r's first
    window (a ratio gives a and b the same prompt context). ``Windows.context_R``: the context
    tokens row r's first window sees."""
    rows, seen = [], []
    for r, (c, y) in enumerate(zip(contexts, responses)):
        full = np.concatenate([c, y])
        R = len(y)
        piece = first_piece(R, L)
        for i in range(0, R, piece):
            start = len(c) + i
            n = min(piece, R - i)
            k = L - n if i or first_context is None else min(L - n, int(first_context[r]))
            ctx = full[max(0, start - k):start]
            if i == 0:
                seen.append(len(ctx))
            rows.append((r, ctx, full[start:start + n]))
    win = _pack(rows, L)
    return dataclasses.replace(win, context_R=np.asarray(seen, np.int64))


def sum_windows(est: lk.Estimate, row_W: np.ndarray, num_rows: int) -> lk.Estimate:
    """The Estimate of each row as the sum of its windows' (independent) estimates: samples and
    exact terms summed per row. ``forward_passes`` stays per window; ``info['forward_passes_per_row']``
    and ``info['windows_per_row']`` give the rows' own counts."""
    S = est.samples.shape[1]
    samples = np.zeros((num_rows, S))
    np.add.at(samples, row_W, est.samples)
    exact = {}
    for k, v in est.exact.items():
        exact[k] = np.zeros(num_rows)
        np.add.at(exact[k], row_W, np.asarray(v, np.float64))
    windows = np.bincount(row_W, minlength=num_rows)
    info = dict(est.info, windows_per_row=windows, forward_passes_per_row=windows * est.forward_passes)
    return lk.Estimate(est.estimator, samples, forward_passes=est.forward_passes,
                       infinite_variance=est.infinite_variance, exact=exact, info=info,
                       se_method=est.se_method, min_samples=est.min_samples)


def _tokens(texts, what: str, tokenizer: Tokenizer = TEXT8) -> tuple[list[np.ndarray], list[dict]]:
    if isinstance(texts, str):
        raise TypeError(f"{what}: expected a list of strings, got one string (wrap it in a list)")
    if texts is None or not hasattr(texts, "__iter__"):
        raise TypeError(f"{what}: expected a list of strings, got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError(f"{what} is empty: give at least one string")
    ids, changed = [], []
    for i, t in enumerate(texts):
        if not isinstance(t, str) and tokenizer.from_ids is not None and _is_id_sequence(t):
            ids.append(np.asarray(tokenizer.from_ids(np.asarray(t)), np.int32))  # the model's token ids
            changed.append({})
            continue
        if not isinstance(t, str):
            ids_too = " or a sequence of token ids" if tokenizer.from_ids is not None else ""
            raise TypeError(f"{what}[{i}] is {type(t).__name__}, not a str{ids_too}")
        x, ch = tokenizer.encode(t)
        ids.append(np.asarray(x, np.int32))
        changed.append(ch)
    return ids, changed


def _is_id_sequence(t) -> bool:
    """A 1-D sequence (list, tuple, array) of integers: a text given as token ids."""
    if isinstance(t, (bytes, dict)) or not hasattr(t, "__len__"):
        return False
    a = np.asarray(t)
    return a.ndim == 1 and (a.size == 0 or np.issubdtype(a.dtype, np.integer))


def encode_rows(texts, what: str, tokenizer: Tokenizer = TEXT8, nonempty: bool = True
                ) -> tuple[list[np.ndarray], list[dict]]:
    """Per text: int32 token ids by ``tokenizer`` and {input character: count} its cleaning
    changed. Raises TypeError for anything but a list of strings, ValueError for an empty list or
    (``nonempty``) a text with no tokens, naming ``what[i]``."""
    ids, changed = _tokens(texts, what, tokenizer)
    if nonempty:
        check_nonempty(ids, what, tokenizer)
    return ids, changed


def prompt_contexts(prompt_ids: list[np.ndarray], tokenizer: Tokenizer = TEXT8) -> list[np.ndarray]:
    """The context of each response: its prompt's tokens and the tokenizer's separator (text8: one
    space); an empty prompt: none."""
    sep = np.asarray(tokenizer.separator, np.int32)
    return [np.concatenate([p, sep]) if len(p) else p for p in prompt_ids]


def check_nonempty(ids, what: str, tokenizer: Tokenizer = TEXT8) -> None:
    """ValueError naming ``what[i]`` for the first row with no tokens."""
    for i, t in enumerate(ids):
        if len(t) == 0:
            why = ("after cleaning to the text8 alphabet (a-z and space)" if tokenizer.name == "text8"
                   else f"after {tokenizer.name} tokenization")
            raise ValueError(f"{what}[{i}] is empty {why}: nothing to score")
