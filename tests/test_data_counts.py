"""Tests for infodiff.data.counts (count data sets for Poisson diffusion)."""

import gzip
import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest

from infodiff.data import counts
from infodiff.data.text import CorpusCacheError, default_cache_dir


def _cached(path_parts):
    return os.path.exists(os.path.join(default_cache_dir(), *path_parts))


# --------------------------------------------------------------------------------------------
# Real data (digits and randhie: the wheels are 13 and 11 MB; downloaded once into the cache)
# --------------------------------------------------------------------------------------------
def test_digits_shapes_ranges_splits():
    d = counts.load_digits()
    assert d.sizes == {"train": 1439, "valid": 179, "test": 179}
    assert d.event_shape == (8, 8) and d.dim == 64 and d.max_count == 16
    for k in ("train", "valid", "test"):
        a = d.split(k)
        assert a.dtype == np.uint8 and a.shape[1:] == (8, 8)
        assert a.min() == 0 and a.max() == 16
        assert d.checksums[k] == counts.split_sha256(a)
        assert not a.flags.writeable
    assert d.flat("valid").shape == (179, 64) and d.flat("valid").dtype == np.int32
    # the digits are the 1797 rows of the csv; mean pixel value is 4.88 for the full set
    allx = np.concatenate([d.train, d.valid, d.test]).reshape(-1, 64)
    assert abs(allx.mean() - 4.884) < 1e-3
    # a second load reads the cache and gives identical data
    d2 = counts.load_digits()
    assert d2.checksums == d.checksums


def test_split_indices_disjoint_and_cover():
    for n in (1797, 20190, 10):
        idx = counts._permutation_split(n)
        allidx = np.concatenate([idx["train"], idx["valid"], idx["test"]])
        assert np.array_equal(np.sort(allidx), np.arange(n))
    assert np.array_equal(counts._permutation_split(100)["test"], counts._permutation_split(100)["test"])


def test_randhie():
    d = counts.load_randhie()
    assert d.sizes == {"train": 16152, "valid": 2019, "test": 2019}
    assert d.event_shape == (1,) and d.max_count == 77
    allx = np.concatenate([d.train, d.valid, d.test])[:, 0]
    assert allx.min() == 0 and allx.max() == 77
    assert abs(allx.mean() - 2.860426) < 1e-5  # statsmodels' documented data: mean mdvis
    assert np.bincount(allx)[0] == 6308


@pytest.mark.slow
@pytest.mark.skipif(not _cached(["debs", counts._FMNIST_DEB]),
                    reason="Fashion-MNIST .deb (31 MB) not in the cache; fixture test below covers parsing")
def test_fashion_mnist_real():
    d = counts.load_fashion_mnist()
    assert d.sizes == {"train": 55000, "valid": 5000, "test": 10000}
    assert d.event_shape == (28, 28) and d.train.dtype == np.uint8
    assert d.test.max() == 255 and d.test.min() == 0
    # the official test set's mean grey level
    assert abs(d.test.mean() - 73.1463) < 1e-3


# --------------------------------------------------------------------------------------------
# Fetch / cache errors
# --------------------------------------------------------------------------------------------
def test_sha_mismatch_of_a_placed_wheel(tmp_path):
    wdir = tmp_path / "wheels"
    wdir.mkdir()
    (wdir / counts._SKLEARN.filename).write_bytes(b"not a wheel")
    with pytest.raises(ValueError, match="sha256 mismatch"):
        counts.load_digits(cache_dir=str(tmp_path))


def test_corrupt_cache_is_detected(tmp_path):
    src = os.path.join(default_cache_dir(), "wheels", counts._STATSMODELS.filename)
    if not os.path.exists(src):
        counts.load_randhie()  # fetch into the default cache
    (tmp_path / "wheels").mkdir()
    shutil.copy(src, tmp_path / "wheels" / counts._STATSMODELS.filename)
    d = counts.load_randhie(cache_dir=str(tmp_path))
    p = tmp_path / "counts_v1" / "randhie" / "test.npy"
    arr = np.load(p)
    arr[0, 0] += 1
    np.save(p, arr)
    with pytest.raises(CorpusCacheError, match="corrupt"):
        counts.load_randhie(cache_dir=str(tmp_path))
    # a stale manifest (other split seed) is refused too
    np.save(p, d.test)
    m = tmp_path / "counts_v1" / "randhie" / "manifest.json"
    man = json.loads(m.read_text())
    man["split_seed"] = 1
    m.write_text(json.dumps(man))
    with pytest.raises(CorpusCacheError, match="split_seed"):
        counts.load_randhie(cache_dir=str(tmp_path))


def _idx(arr, ndim):
    head = (0x0800 + ndim).to_bytes(4, "big") + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return gzip.compress(head + arr.astype(np.uint8).tobytes(), compresslevel=1)


def _fake_deb(path, n_train=60000, n_test=10000):
    rng = np.random.default_rng(0)
    # mostly-zero images (fast to compress) with a few random pixels
    tr, te = np.zeros((n_train, 28, 28), np.uint8), np.zeros((n_test, 28, 28), np.uint8)
    tr[:, 14, 14] = rng.integers(0, 256, n_train)
    te[:, 3, 5] = 255
    files = {
        "train-images-idx3-ubyte.gz": _idx(tr, 3),
        "t10k-images-idx3-ubyte.gz": _idx(te, 3),
        "train-labels-idx1-ubyte.gz": _idx(rng.integers(0, 10, n_train), 1),
        "t10k-labels-idx1-ubyte.gz": _idx(rng.integers(0, 10, n_test), 1),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo("./" + counts._FMNIST_DIR + name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    members = [(b"debian-binary", b"2.0\n"), (b"control.tar.xz", b""), (b"data.tar.gz", buf.getvalue())]
    with open(path, "wb") as f:
        f.write(b"!<arch>\n")
        for name, data in members:
            hdr = name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
            hdr += str(len(data)).encode().ljust(10) + b"`\n"
            f.write(hdr + data + (b"\n" if len(data) % 2 else b""))


def test_fashion_mnist_parsing_with_a_fixture_deb(tmp_path, monkeypatch):
    (tmp_path / "debs").mkdir()
    deb = tmp_path / "debs" / counts._FMNIST_DEB
    _fake_deb(deb, n_train=60000, n_test=10000)
    # the pinned hash is the real package's; the fixture gets its own
    with pytest.raises(ValueError, match="sha256 mismatch"):
        counts.load_fashion_mnist(cache_dir=str(tmp_path))
    monkeypatch.setattr(counts, "_FMNIST_SHA256", counts.sha256_file(str(deb)))
    d = counts.load_fashion_mnist(cache_dir=str(tmp_path))
    assert d.sizes == {"train": 55000, "valid": 5000, "test": 10000}
    assert d.max_count == 255 and d.event_shape == (28, 28)
    assert np.all(d.test[:, 3, 5] == 255) and d.test.sum() == 255 * 10000


def test_download_failure_is_clear(tmp_path, monkeypatch):
    monkeypatch.setattr(counts, "_FMNIST_URL", "http://127.0.0.1:9/nothing.deb")
    with pytest.raises(RuntimeError, match="apt-get download dataset-fashion-mnist"):
        counts.load_fashion_mnist(cache_dir=str(tmp_path))


# --------------------------------------------------------------------------------------------
# Chorales
# --------------------------------------------------------------------------------------------
def test_chorales_committed_file():
    assert os.path.getsize(counts.chorales_path()) < 2_000_000
    d = counts.load_chorales()
    P, T = d.event_shape
    assert (P, T) == (46, 32) and d.max_count == 4
    with np.load(counts.chorales_path()) as f:
        split, offsets, roll = f["split"], f["offsets"], f["roll_PxT"]
        assert int(f["low_pitch"]) == 36
    # windows per split = sum over that split's chorales of floor(len / 32): split by chorale
    lens = np.diff(offsets)
    for i, k in enumerate(("train", "valid", "test")):
        assert d.sizes[k] == int((lens[split == i] // 32).sum())
    assert d.train.max() <= 4 and d.train.dtype == np.uint8
    # every step of a chorale has at most 4 sounding voices
    assert roll.sum(0).max() <= 4
    assert counts.load_chorales(window=16).sizes["train"] >= 2 * d.sizes["train"]


def test_chorales_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare_chorales.py"):
        counts.load_chorales(str(tmp_path / "missing.npz"))
    with pytest.raises(ValueError, match="window"):
        counts.load_chorales(window=0)
    bad = tmp_path / "bad.npz"
    np.savez(bad, roll_PxT=np.full((3, 10), 5, np.uint8), offsets=np.array([0, 10]),
             split=np.array([0], np.int8), low_pitch=np.int64(60))
    with pytest.raises(ValueError, match="voice count of 5"):
        counts.load_chorales(str(bad), window=2)


def test_load_counts_unknown_name_and_split():
    with pytest.raises(ValueError, match="unknown count data set 'mnist'"):
        counts.load_counts("mnist")
    with pytest.raises(ValueError, match="unknown split"):
        counts.load_chorales().split("training")


def test_batch_indices_deterministic_epochs():
    n, B = 10, 4
    a = np.concatenate([counts.batch_iterator_indices(n, B, 3, s) for s in range(5)])
    b = np.concatenate([counts.batch_iterator_indices(n, B, 3, s) for s in range(5)])
    assert np.array_equal(a, b)
    assert sorted(a[:10]) == list(range(10)) and sorted(a[10:20]) == list(range(10))
    with pytest.raises(ValueError):
        counts.batch_iterator_indices(0, 4, 0, 0)
