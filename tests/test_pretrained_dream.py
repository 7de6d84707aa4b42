"""Dream port (infodiff/pretrained/dream.py) against the official implementation.

Fixture (scripts/make_dream_fixture.py, the hub's modeling_dream.py under transformers 4.46.2):
a tiny random Dream checkpoint in the published layout (BF16, two shards with their index; q/k/v
biases, grouped key/value heads) and the official ``DreamModel`` raw logits. Tolerances as in
tests/test_pretrained_llada.py: float32 within 1e-4 of max|official|, each one-detail change off by
more than 10x that, bfloat16 within 3e-2. The shifted alignment (position i predicts token i + 1)
is checked against the official logits, and a conditional NELBO through ``from_function`` runs.
"""
from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

import infodiff
from infodiff.pretrained import dream, llada
from infodiff.pretrained.base import PretrainedError
from tests.test_pretrained_llada import (BF16_TOL, PARITY_TOL, _causal_attention, _kv_tiled_attention, _one_line,
                                         _rotary_interleaved)

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "pretrained" / "dream"


def _config(**changes) -> dict:
    return {**json.loads((FIXTURE / "config.json").read_text()), **changes}


def _load(dtype=jnp.float32, **changes):
    return dream.load(FIXTURE, _config(**changes), "dream", dtype)


def _rel_error(m) -> float:
    z = np.load(FIXTURE / "parity.npz")
    out = np.asarray(m.apply(m.params, z["input_ids"], np.zeros(len(z["input_ids"]), np.float32)))
    assert out.shape == z["logits_f32"].shape and out.dtype == np.float32
    return float(np.abs(out - z["logits_f32"]).max() / np.abs(z["logits_f32"]).max())


def test_detect():
    assert dream.detect(_config()) == "dream"
    assert dream.detect({"architectures": ["DreamModel"]}) == "dream"
    assert dream.detect({"model_type": "llada"}) is None
    assert llada.detect(_config()) is None


def test_float32_parity_with_official():
    m = _load()
    assert (m.kind, m.output, m.time_conditioned, m.vocab_size, m.mask_id) == ("dream", "logits", False, 320, 300)
    assert m.info["logits_shift"] == 1
    assert _rel_error(m) <= PARITY_TOL


def test_bfloat16_close_to_official():
    assert _rel_error(_load(jnp.bfloat16)) <= BF16_TOL


def _no_bias(m):
    layers = dict(m.params["layers"], **{k: jnp.zeros_like(m.params["layers"][k]) for k in ("q_bias", "k_bias")})
    return m._replace(params=dict(m.params, layers=layers))


ONE_DETAIL = {
    "rotary_interleaved": (("rotary", _rotary_interleaved), {}, None),
    "attention_causal": (("attention", _causal_attention), {}, None),
    "kv_heads_tiled": (("attention", _kv_tiled_attention), {}, None),
    "rope_theta_10000": (None, {"rope_theta": 10000.0}, None),
    "rms_norm_eps_1e-5": (None, {"rms_norm_eps": 1e-5}, None),
    "no_qk_bias": (None, {}, _no_bias),
}


@pytest.mark.parametrize("detail", list(ONE_DETAIL))
def test_one_detail_changed_fails_parity(detail, monkeypatch):
    patch, changes, transform = ONE_DETAIL[detail]
    if patch is not None:
        monkeypatch.setattr(llada, *patch)
    m = _load(**changes)
    if transform is not None:
        m = transform(m)
    assert _rel_error(m) > 10 * PARITY_TOL


def test_denoiser_logits_shift_right():
    """Position i reads the official raw logits of i - 1 (position 0 its own)."""
    z = np.load(FIXTURE / "parity.npz")
    ref = z["logits_f32"]
    out = np.asarray(dream.denoiser_logits(jnp.asarray(ref)))
    np.testing.assert_array_equal(out[:, 1:], ref[:, :-1])
    np.testing.assert_array_equal(out[:, 0], ref[:, 0])


@pytest.mark.parametrize("changes,words", [
    ({"num_hidden_layers": 3}, ["missing", "model.layers.2."]),
    ({"num_key_value_heads": 4}, ["shapes differ", "k_proj"]),
    ({"tie_word_embeddings": True}, ["unrecognised", "lm_head.weight"]),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, ["rope_scaling="]),
    ({"mask_token_id": 400}, ["mask_token_id=400"]),
])
def test_mismatch_is_one_line(changes, words):
    with pytest.raises(PretrainedError) as e:
        _load(**changes)
    _one_line(e, *words)


def test_conditional_nelbo_runs():
    """Dream as a masked-diffusion denoiser (shifted logits, mask logit at -inf): a conditional
    NELBO given a visible first token, finite with a finite positive SE."""
    m = _load()

    def logprobs(x_BxL):
        return dream.logprobs(m.apply(m.params, x_BxL, jnp.zeros(x_BxL.shape[0], jnp.float32)), m.mask_id)

    run = infodiff.from_function(logprobs, vocab_size=m.vocab_size, mask_id=m.mask_id, seq_len=16,
                                 encode=lambda s: [ord(c) for c in s], num_samples=8, batch_size=64, seed=0)
    est = run.conditional_nll(["A"], ["tiny Dream"])
    assert np.all(np.isfinite(est.mean)) and np.all(est.mean > 0)
    assert np.all(np.isfinite(est.stderr)) and np.all(est.stderr > 0)
