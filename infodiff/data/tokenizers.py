"""How a trained text run turns a string into token ids (:class:`Tokenizer`): :data:`TEXT8`, the
corpus's cleaning (infodiff/data/text.py), and :data:`BYTES`, UTF-8 bytes as given
(infodiff/data/text_bytes.py). A text task exposes its own as ``task.tokenizer``; :mod:`infodiff.scoring`
re-exports these names (docs/scoring.md).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import numpy as np

from infodiff.data import text as text_data

__all__ = ["clean", "Tokenizer", "TEXT8", "BYTES"]


def clean(text: str) -> tuple[str, dict]:
    """(text8-cleaned text, {character: count} of the input characters outside the alphabet
    a-z and space, which the cleaning changed: upper case, digits (spelled out), punctuation,
    newlines, non-ASCII). Runs of spaces collapsing are not counted."""
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    out = text_data.clean_text8(text)
    return out, dict(collections.Counter(c for c in text if c not in text_data.VOCAB))


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """How a run turns a string into token ids.

    ``name``: 'text8' (the corpus's cleaning, :func:`clean`) or another; ``unit``: what one token
    is ('character', 'byte', 'token'), the unit of a report's bits per unit; ``encode(str)`` ->
    (int32 ids [n], {input character: count} that cleaning changed, empty when nothing is cleaned);
    ``separator``: the ids put between a prompt and its response (text8: one space); ``cleans``:
    whether ``encode`` changes the text (a report then says it scores a cleaned text); ``cleaned(str)``
    -> the text as scored (where ``cleans``; rows.jsonl logs it beside the original); ``from_ids``
    (None: strings only) -> a text given as the model's token ids, as int32 library ids (ValueError
    for an id the model cannot take)."""

    name: str
    unit: str
    encode: Callable[[str], tuple[np.ndarray, dict]]
    separator: tuple[int, ...] = ()
    cleans: bool = False
    cleaned: Callable[[str], str] | None = None
    from_ids: Callable[[object], np.ndarray] | None = None


def _text8_encode(text: str) -> tuple[np.ndarray, dict]:
    c, changed = clean(text)
    return text_data.encode(c).astype(np.int32), changed


TEXT8 = Tokenizer("text8", "character", _text8_encode, separator=(text_data.VOCAB.index(" "),), cleans=True,
                  cleaned=lambda text: clean(text)[0])


def _bytes_encode(text: str) -> tuple[np.ndarray, dict]:
    # surrogateescape: a file read with errors='surrogateescape' gives back its own bytes, valid or not
    # (evaluation/inputs.py); a lone surrogate of any other origin is refused by UnicodeEncodeError
    return np.frombuffer(text.encode("utf-8", errors="surrogateescape"), np.uint8).astype(np.int32), {}


# Byte-level runs (data.name 'bytes', infodiff/data/text_bytes.py): the UTF-8 bytes as given, nothing cleaned.
BYTES = Tokenizer("bytes", "byte", _bytes_encode, separator=(ord(" "),), cleans=False)
