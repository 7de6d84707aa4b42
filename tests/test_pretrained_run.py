"""infodiff.load_pretrained on the tiny DiT fixtures: the Run's NELBO against an exact computation
(masks enumerated; SEDD's lam-integral by Gauss-Legendre), token-id inputs, tokenizers, run.apply."""
import itertools
import math
import pathlib
import shutil
import string

import numpy as np
import pytest

import infodiff
from infodiff.pretrained import PretrainedError

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "pretrained"
TEXT_IDS = [3, 17, 0, 25, 9, 9, 31, 4]  # 8 tokens of a 16-token window: the other 8 are pads


def _masks(n):
    """bool [2^n - 1, n]: every non-empty subset of n positions."""
    return np.array([m for m in itertools.product([False, True], repeat=n) if any(m)])


def exact_mdlm_nelbo(loaded, ids) -> float:
    """The masked NELBO of a time-independent denoiser, sum_l (1/l) mean_{|M|=l} sum_{i in M}
    -log p(x_i | x with M and the pads masked) (MDLM Eq. 10 with the time integral done per mask
    size), every mask enumerated."""
    n, L = len(ids), loaded.max_seq_len
    M = _masks(n)
    x = np.full((len(M), L), loaded.mask_id, np.int32)
    x[:, :n] = np.where(M, loaded.mask_id, np.asarray(ids))
    logp = np.asarray(loaded.apply(loaded.params, x, np.zeros(len(M), np.float32)), np.float64)
    nll = -np.take_along_axis(logp[:, :n], np.asarray(ids)[None, :, None], axis=-1)[..., 0]
    per_mask = np.where(M, nll, 0.0).sum(-1)
    size = M.sum(-1)
    return float(sum(per_mask[size == k].mean() / k for k in range(1, n + 1)))


def exact_sedd_absorb_nelbo(loaded, ids, lam_max, nodes=64) -> float:
    """I-MDSE's expectation: int_0^lam_max E_M[DSE(x, z_M, lam)] / (1 - lam) dlam + the prior
    (1 - lam_max) sum_i -log c(x_i | all masked), c the normalised mean; DSE at a masked position
    = sum_v s_v - a log s_{x_i} + a (log a - 1), a = (1 - lam) / lam (SEDD Eq. 3 / score entropy),
    the mask subsets enumerated with weights lam^|M| (1 - lam)^(n - |M|)."""
    n, L, V = len(ids), loaded.max_seq_len, loaded.mask_id
    x_ids = np.asarray(ids)
    M = _masks(n)
    x = np.full((len(M), L), V, np.int32)
    x[:, :n] = np.where(M, V, x_ids)
    u, w = np.polynomial.legendre.leggauss(nodes)
    total = 0.0
    for lam, wt in zip(0.5 * lam_max * (u + 1), 0.5 * lam_max * w):
        sigma = np.full(len(M), -math.log1p(-lam), np.float32)
        ls = np.asarray(loaded.apply(loaded.params, x, sigma), np.float64)[:, :n, :V]
        a = (1 - lam) / lam
        dse = np.exp(ls).sum(-1) - a * np.take_along_axis(ls, x_ids[None, :, None], -1)[..., 0] + a * (math.log(a) - 1)
        k = M.sum(-1)
        prob = lam ** k * (1 - lam) ** (n - k)
        total += wt * float(np.sum(prob * np.where(M, dse, 0.0).sum(-1))) / (1 - lam)
    z = np.full((1, L), V, np.int32)
    s_T = -math.log1p(-lam_max)
    ls = np.asarray(loaded.apply(loaded.params, z, np.array([s_T], np.float32)), np.float64)[0, :n, :V]
    log_c = ls - np.log((1 - lam_max) / lam_max)
    log_c = log_c - np.log(np.exp(log_c).sum(-1, keepdims=True))
    prior = (1 - lam_max) * float(-np.take_along_axis(log_c, x_ids[:, None], -1).sum())
    return total + prior


def test_mdlm_nelbo_matches_exact():
    run = infodiff.load_pretrained(FIXTURES / "mdlm")
    truth = exact_mdlm_nelbo(run.loaded, TEXT_IDS)
    est = run.nll([TEXT_IDS], num_samples=512)
    assert est.info["bound"] == "nelbo"
    assert abs(est.mean[0] - truth) < 4 * est.stderr[0], (est.mean[0], est.stderr[0], truth)
    assert est.stderr[0] < 0.05 * truth  # the test can fail: the SE is small against the value


def test_sedd_absorb_nelbo_matches_exact():
    from infodiff.pretrained import run as run_lib

    run = infodiff.load_pretrained(FIXTURES / "sedd_absorb", num_samples=1024)
    lam_max = run_lib.lam_max_of(run.loaded.info["noise"])
    truth = exact_sedd_absorb_nelbo(run.loaded, TEXT_IDS, lam_max)
    est = run.nll([TEXT_IDS])
    assert abs(est.mean[0] - truth) < 4 * est.stderr[0], (est.mean[0], est.stderr[0], truth)
    assert est.stderr[0] < 0.1 * truth


def test_run_apply_is_the_raw_network():
    for name in ("sedd_absorb", "mdlm"):
        run = infodiff.load_pretrained(FIXTURES / name)
        f = np.load(FIXTURES / name / "io.npz")
        out = np.asarray(run.apply(f["x_BxL"], np.full(2, f["sigma_S"][1], np.float32)))
        ref = f["out_SxBxLxV"][1]
        keep = ref > -1e5
        assert np.abs(out - ref)[keep].max() <= 1e-4 * np.abs(ref[keep]).max()


def _char_tokenizer(directory, n):
    import tokenizers

    chars = (string.ascii_lowercase + " .,!?'\"-:;()[]{}")[:n]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.save(str(directory / "tokenizer.json"))
    return chars


def test_texts_through_the_tokenizer_beside_the_weights(tmp_path):
    d = tmp_path / "mdlm"
    shutil.copytree(FIXTURES / "mdlm", d)
    chars = _char_tokenizer(d, 40)
    run = infodiff.load_pretrained(d)
    text = "".join(chars[i] for i in TEXT_IDS)
    a = run.nll([text], seed=3, num_samples=16)
    b = run.nll([TEXT_IDS], seed=3, num_samples=16)
    np.testing.assert_array_equal(a.samples, b.samples)  # the same ids, the same draws
    with pytest.raises(ValueError, match="token id 40, the mask id"):
        run.nll([[1, 2, 40]])


def test_tokenizer_problems_are_one_line(tmp_path):
    d = tmp_path / "mdlm"
    shutil.copytree(FIXTURES / "mdlm", d)
    run = infodiff.load_pretrained(d)
    with pytest.raises(PretrainedError, match="no tokenizer.json beside"):
        run.nll(["abc"])
    other = tmp_path / "other"
    other.mkdir()
    _char_tokenizer(other, 12)
    with pytest.raises(PretrainedError, match="has 12 tokens but the model has 40 token ids"):
        infodiff.load_pretrained(d, tokenizer=other)
    with pytest.raises(PretrainedError, match="neither a tokenizer.json"):
        infodiff.load_pretrained(d, tokenizer=tmp_path / "nothing")

