"""The embedded KJV + Shakespeare corpus as raw UTF-8 bytes (byte-level text).

The same documents, in the same order, as the text8-format corpus of :mod:`infodiff.data.text`
(KJV verses joined by a space; Shakespeare's 42 ``*_gut.txt`` files in sorted name order joined by
a space), but not cleaned: case, punctuation, digits, newlines and non-ASCII characters are kept
as their UTF-8 bytes. Each source's bytes are split contiguously 90% / 5% / 5% (train / valid /
test, integer arithmetic on byte counts, the split rule of the text8 corpus) and the per-source
splits are concatenated in the order ``[bible, shakespeare]``.

Token ids are the byte values 0..255 (``VOCAB_SIZE`` = 256); the diffusion mask id (256) belongs
to the forward process. Bits per token of a byte run are bits per UTF-8 byte, lm-eval's
``bits_per_byte`` (docs/scoring.md).

Cache layout (root as :func:`infodiff.data.cache.default_cache_dir`; the sdists are shared with the
text8 corpus)::

    <cache_dir>/bytes_corpus_v1/{train,valid,test}.npy   uint8 byte values
    <cache_dir>/bytes_corpus_v1/manifest.json            sources, lengths, split checksums (written last)
"""

from __future__ import annotations

import numpy as np

from infodiff.data import text as text_data

__all__ = ["VOCAB_SIZE", "CORPUS_NAME", "encode", "decode", "load_corpus"]

VOCAB_SIZE = 256
CORPUS_NAME = text_data.BYTES_CORPUS_NAME


def encode(s: str) -> np.ndarray:
    """uint8 [n]: the UTF-8 bytes of ``s`` (n = ``len(s.encode('utf-8'))``). TypeError for a
    non-str (use ``np.frombuffer(b, np.uint8)`` for bytes that are not valid UTF-8)."""
    if not isinstance(s, str):
        raise TypeError(f"encode expects str, got {type(s).__name__}")
    return np.frombuffer(s.encode("utf-8"), dtype=np.uint8).copy()


def decode(ids) -> str:
    """The text of byte ids [n] in [0, 256); invalid UTF-8 is shown as U+FFFD (display only).
    ValueError naming the first id outside [0, 256) (256 is the mask id) and its position."""
    arr = np.asarray(ids)
    if arr.size == 0:
        return ""
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"decode expects a 1-D integer sequence of byte ids, got {arr.dtype} {arr.shape}")
    bad = np.flatnonzero((arr < 0) | (arr >= VOCAB_SIZE))
    if bad.size:
        pos = int(bad[0])
        raise ValueError(f"decode: id {int(arr[pos])} at position {pos} is not a byte value [0, 256) "
                         "(256 is the diffusion mask id)")
    return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def load_corpus(cache_dir: str | None = None) -> text_data.TextCorpus:
    """The byte corpus: :func:`infodiff.data.text.load_bytes_corpus` (uint8 byte values, ids in
    [0, 256), ``name == 'kjv+shakespeare-bytes'``, its own checksums). Raises as that function."""
    return text_data.load_bytes_corpus(cache_dir)
