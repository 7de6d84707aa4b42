"""lm-eval's rolling likelihood through infodiff: each document's NELBO keeps its SE, and the
summary printed after lm-eval's table gives bits per byte ± its Monte Carlo error (lm-eval's own
table says N/A), checked against the exact value of a context-free model."""

import importlib.util

import numpy as np
import pytest

import infodiff
from infodiff.data import text as text_data

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                reason="lm-eval is not installed (pip install 'infodiff[harness]')")
L = 16


@pytest.fixture(scope="module")
def unigram():
    """i.i.d. tokens: -log p(document) is the sum of its tokens' -log p, exactly."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(2).normal(size=27), jnp.float32))
    run = infodiff.from_function(lambda x: jnp.broadcast_to(logp, (*x.shape, 27)), vocab_size=27, mask_id=27,
                                 seq_len=L, seed=3)
    return run, np.asarray(logp, np.float64)


def _requests(task, docs):
    from lm_eval.api.instance import Instance

    return [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(d,), idx=0,
                     metadata=(task, i, 1)) for i, d in enumerate(docs)]


def test_rolling_summary_bits_per_byte_with_mc_error(unigram, capsys):
    from infodiff import harness

    run, logp = unigram
    rng = np.random.default_rng(5)
    docs = {"wiki": ["".join(rng.choice(list("abcdefgh "), n)) for n in (9, 30, 45)],
            "other": ["the cat sat on the mat"]}
    lm = harness.InfodiffLM(run=run, num_samples=4)
    for task, d in docs.items():
        out = lm.loglikelihood_rolling(_requests(task, d))
        assert len(out) == len(d)
    recs = lm.rolling_records
    assert [r["task"] for r in recs] == ["wiki"] * 3 + ["other"]
    assert all(r["nelbo_stderr"] >= 0 and r["forward_passes"] > 0 for r in recs)
    summary = lm.rolling_summary()
    s = summary["wiki"]
    nbytes = sum(len(d.encode()) for d in docs["wiki"])
    assert s["documents"] == 3 and s["bytes"] == nbytes
    w = [r for r in recs if r["task"] == "wiki"]
    assert s["bits_per_byte"] == pytest.approx(sum(r["nelbo"] for r in w) / (nbytes * np.log(2)))
    assert s["bits_per_byte_mc_stderr"] == pytest.approx(
        np.sqrt(sum(r["nelbo_stderr"] ** 2 for r in w)) / (nbytes * np.log(2)))
    exact = sum(-logp[text_data.encode(d)].sum() for d in docs["wiki"]) / (nbytes * np.log(2))
    assert abs(s["bits_per_byte"] - exact) <= 4 * s["bits_per_byte_mc_stderr"] + 1e-6
    assert s["bits_per_byte_mc_stderr"] > 0  # a Monte Carlo estimate, not an exact sum
    harness._print_rolling_summary(summary)
    printed = capsys.readouterr().out
    assert "infodiff: rolling likelihood" in printed
    assert f"wiki: bits_per_byte {s['bits_per_byte']:.4f} ± {s['bits_per_byte_mc_stderr']:.4f} (MC), 3 documents" \
        in printed
    assert "other: bits_per_byte" in printed
