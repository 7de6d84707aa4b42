"""BD3-LM (kuleshov-group/bd3lms) against the official hub model, scored through the block process:
the block NELBO against its exact value (masks enumerated per block), the exact block likelihood
against a brute-force sum over all orders within each block.

Fixtures tests/fixtures/pretrained/bd3lm_bs{4,8,16}/ (scripts/make_dit_fixtures.py --bd3lm): random
tiny weights in the hub layout (the 8 one time-conditioned), the two-copy inputs [x_t, x_0] and
the official outputs (models/hf BD3LM + Diffusion._process_sigma/_subs_parameterization).
"""
import itertools
import json
import math
import pathlib
import shutil

import numpy as np
import pytest

import infodiff
from infodiff import pretrained
from infodiff.pretrained import bd3lm, dit
from tests.test_pretrained_dit import REL_TOL, _interleaved, parity

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "pretrained"
NAMES = ("bd3lm_bs4", "bd3lm_bs8", "bd3lm_bs16")
WINDOW = [int(v) for v in np.random.default_rng(0).integers(0, 40, 16)]


def test_facts():
    for name, bs, tc in zip(NAMES, (4, 8, 16), (False, True, False)):
        d = pretrained.load(FIXTURES / name)
        assert (d.kind, d.info["block_size"], d.time_conditioned, d.vocab_size, d.mask_id, d.max_seq_len) == \
            ("bd3lm", bs, tc, 41, 40, 16)


@pytest.mark.parametrize("name", NAMES)
def test_parity_with_official(name):
    worst, scale = parity(name)
    assert worst <= REL_TOL * scale, (name, worst, scale)


@pytest.mark.parametrize("module,detail,value,names", [
    (dit, "rotate_half", _interleaved, NAMES),
    (dit, "LN_EPS", 1e-6, NAMES),
    (dit, "ROTATE_V", True, NAMES),
    (bd3lm, "BLOCK_CAUSAL_CLEAN", False, ("bd3lm_bs4",)),  # needs >= 3 blocks to matter
    (bd3lm, "ROTARY_PER_COPY", False, ("bd3lm_bs4", "bd3lm_bs8")),  # rotary is relative: one block cannot tell
])
def test_one_detail_changed_fails_parity(monkeypatch, module, detail, value, names):
    monkeypatch.setattr(module, detail, value)
    for name in names:
        worst, scale = parity(name)
        assert worst > REL_TOL * scale, (detail, name, worst, scale)


def _logp(loaded, z_NxL):
    out = loaded.apply(loaded.params, bd3lm.network_input(np.asarray(z_NxL, np.int32)),
                       np.zeros(len(z_NxL), np.float32))
    return np.asarray(out, np.float64)


def test_block_output_ignores_later_blocks():
    """The denoiser contract: block b's output reads the clean prefix and block b only."""
    loaded = pretrained.load(FIXTURES / "bd3lm_bs4")
    z = np.array([WINDOW, WINDOW])
    z[:, 5] = 40  # block 1 partly masked
    z[1, 8:] = (z[1, 8:] + 7) % 40  # other tokens in the later blocks
    z[0, 8:] = 40
    out = _logp(loaded, z)
    np.testing.assert_array_equal(out[0, :8], out[1, :8])
    assert np.abs(out[0, 8:] - out[1, 8:]).max() > 1e-3  # later blocks' outputs do change


def _block_masks(bs):
    return [np.array(m) for m in itertools.product([False, True], repeat=bs) if any(m)]


def exact_block_nelbo(loaded, ids, bs) -> float:
    """The masked NELBO per block of a time-free network, sum_b sum_k (1/k) mean_{|M|=k, M in block b}
    sum_{i in M} -log p(x_i | prefix, z^b), every mask enumerated, the later blocks masked."""
    x, total = np.asarray(ids), 0.0
    for b in range(len(ids) // bs):
        sl = slice(b * bs, (b + 1) * bs)
        masks = _block_masks(bs)
        z = np.repeat(x[None], len(masks), 0)
        z[:, (b + 1) * bs:] = 40
        for r, m in enumerate(masks):
            z[r, sl][m] = 40
        nll = -np.take_along_axis(_logp(loaded, z)[:, sl], x[sl][None, :, None], -1)[..., 0]
        size = np.array([m.sum() for m in masks])
        per = np.array([nll[r][m].sum() for r, m in enumerate(masks)])
        total += sum(per[size == k].mean() / k for k in range(1, bs + 1))
    return total


def brute_force_block_nll(loaded, ids, bs) -> float:
    """-sum_b log (1/L'!) sum over the orders of block b of prod_j p(x_(j) | prefix, revealed)."""
    x, total = np.asarray(ids), 0.0
    for b in range(len(ids) // bs):
        perms = list(itertools.permutations(range(b * bs, (b + 1) * bs)))
        z = np.repeat(x[None], len(perms) * bs, 0)
        z[:, b * bs:] = 40
        for p, order in enumerate(perms):
            for j in range(bs):
                z[p * bs + j, list(order[:j])] = x[list(order[:j])]
        lp = _logp(loaded, z)
        step = np.array([lp[p * bs + j, order[j], x[order[j]]] for p, order in enumerate(perms) for j in range(bs)])
        per_order = step.reshape(len(perms), bs).sum(1)
        total -= float(np.logaddexp.reduce(per_order) - math.log(len(perms)))
    return total


def test_block_nelbo_and_exact_block_likelihood_bs4():
    d = FIXTURES / "bd3lm_bs4"
    run = infodiff.load_pretrained(d, num_samples=256)
    loaded = run.loaded
    est = run.nll([WINDOW])
    assert est.estimator == "k_dce per block of 4"
    nelbo = exact_block_nelbo(loaded, WINDOW, 4)
    assert abs(est.mean[0] - nelbo) < 4 * est.stderr[0], (est.mean, est.stderr, nelbo)
    ex = run.exact_nll([WINDOW])
    assert ex.info["bound"] == "exact" and ex.stderr[0] == 0 and ex.info["forward_passes_per_row"][0] == 4 * 15
    np.testing.assert_allclose(ex.mean[0], brute_force_block_nll(loaded, WINDOW, 4), rtol=1e-5)
    assert ex.mean[0] <= nelbo  # Jensen: the any-order likelihood is at least the NELBO's average
    info = run.task.process_info(run.process)
    assert (info["name"], info["block_size"], info["kind"]) == ("block", 4, "bd3lm")


def test_time_conditioned_bd3lm_scores_but_has_no_exact():
    run = infodiff.load_pretrained(FIXTURES / "bd3lm_bs8", num_samples=32)
    est = run.nll([WINDOW])
    assert np.isfinite(est.mean).all() and est.stderr[0] > 0
    with pytest.raises(ValueError) as e:
        run.exact_nll([WINDOW])
    assert "\n" not in str(e.value) and "time-conditioned" in str(e.value)


def test_bad_bd3lm_configs_are_one_line(tmp_path):
    d = tmp_path / "c"
    shutil.copytree(FIXTURES / "bd3lm_bs4", d)
    cfg = json.loads((d / "config.json").read_text())
    for change, words in [({"block_size": 5}, "block_size=5 does not divide model_length=16"),
                          ({"cross_attn": False}, "cross_attn=False"),
                          ({"time_conditioning": True, "adaln": False}, "adaln=False")]:
        (d / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(pretrained.PretrainedError) as e:
            pretrained.load(d)
        assert "\n" not in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.slow  # ~25 s: two reports compiled
def test_evaluate_pretrained_reports_bd3lm_and_duo(tmp_path):
    """evaluate.py --pretrained's path (infodiff.evaluation.evaluate) on both new kinds: the block
    NELBO for bd3lm, the uniform-state NELBO for duo (a 16-character document: one whole window)."""
    from infodiff import evaluation
    from tests.test_pretrained_cli import _config
    from tests.test_pretrained_run import _char_tokenizer

    for name, docs, process in (("bd3lm_bs4", "hello world\n", "block"), ("duo", "sixteen chars ok\n", "duo")):
        d = tmp_path / name
        shutil.copytree(FIXTURES / name, d)
        _char_tokenizer(d, 40)
        (tmp_path / f"{name}.txt").write_text(docs)
        config = _config(d, input=str(tmp_path / f"{name}.txt"), output_dir=str(tmp_path / f"out_{name}"),
                         input_samples=8)
        report, _ = evaluation.evaluate(config, None, pretrained=str(d))
        assert (report["process"]["name"], report["process"]["kind"], report["bound"]) == (process, name[:5], "nelbo")
        assert np.isfinite(report["summary"]["bits_per_byte"])
