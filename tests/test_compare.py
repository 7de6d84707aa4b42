"""Model vs model (infodiff.compare): the paired difference of two runs on the same rows.

Oracles: two first-order Markov chains over the text alphabet (a-z and space) with exact
conditionals of every window, model length L = 16; chain b mixes chain a's table with another
random one, so the two -log p are close and strongly correlated, the case a paired SE is for.
Each row's exact -log p is the sum over its windows of the chain's own -log p of the window
(documents) or the chain rule of the response given its context (pairs), as in
tests/test_scoring.py; every estimate must be within 4 of its SEs of it.
"""

import dataclasses
import types

import numpy as np
import pytest
from ml_collections import ConfigDict

from infodiff import compare as compare_lib
from infodiff import likelihood as lk
from infodiff import oracles, scoring
from infodiff.data import text as text_data

L = 16
S = 128
Z_MAX = 4.0


def _oracle_run(chain, seq_len=L, estimator="k_dce", vocab_size=text_data.VOCAB_SIZE, tokenizer=scoring.TEXT8):
    """A scoring.Run whose denoiser is an exact oracle (no workdir, no checkpoint)."""
    cfg = ConfigDict({"eval": {"seed": 3}})
    task = types.SimpleNamespace(vocab_size=vocab_size, seq_len=seq_len, name="masked")
    process = lk.masked_process(estimator, vocab_size=text_data.VOCAB_SIZE)
    return scoring.Run(None, cfg, task, chain, process, 0, S, 256, tokenizer=tokenizer)


def _reversed_text8(text):
    ids, changed = scoring.TEXT8.encode(text)
    return ids[::-1].copy(), changed


@pytest.fixture(scope="module")
def chains():
    rng = np.random.default_rng(11)
    a = oracles.random_markov(rng, text_data.VOCAB, order=1, temperature=0.3, seq_len=L)
    other = oracles.random_markov(rng, text_data.VOCAB, order=1, temperature=0.3, seq_len=L)
    b = oracles.MarkovOracle(0.7 * a.trans + 0.3 * other.trans, text_data.VOCAB, seq_len=L)
    return a, b


@pytest.fixture(scope="module")
def docs(chains):
    """Cleaned documents of 5 to 40 characters sampled from chain a, and their token ids."""
    rng = np.random.default_rng(12)
    texts = [scoring.clean(text_data.decode(chains[0].sample(rng, 1, length=n)[0]))[0] for n in (5, 16, 23, 40, 9)]
    return texts, [text_data.encode(t).astype(np.int32) for t in texts]


def _doc_nll(chain, ids):
    return -sum(chain.log_prob(ids[i:i + L][None])[0] for i in range(0, len(ids), L))


def test_identical_runs_differ_by_exactly_zero(chains, docs):
    a, a_again = _oracle_run(chains[0]), _oracle_run(chains[0])
    c = compare_lib.compare(a, a_again, docs[0])
    assert c.coupled and c.same_noise and c.why_not == ""
    np.testing.assert_array_equal(c.difference, 0.0)
    np.testing.assert_array_equal(c.stderr_paired, 0.0)
    assert c.total == 0.0 and c.total_stderr_paired == 0.0 and c.total_stderr_unpaired > 0
    assert np.isnan(c.se_ratio)


def test_paired_difference_matches_the_exact_difference(chains, docs):
    import infodiff

    texts, ids = docs
    ra, rb = _oracle_run(chains[0]), _oracle_run(chains[1])
    c = infodiff.compare(ra, rb, texts)
    assert c.coupled and c.same_noise
    exact = np.array([_doc_nll(chains[0], x) - _doc_nll(chains[1], x) for x in ids])
    z = (c.difference - exact) / c.stderr_paired
    print("\nz:", np.round(z, 2), "\npaired SE:", np.round(c.stderr_paired, 3), "\nunpaired SE:",
          np.round(c.stderr_unpaired, 3))
    assert np.all(np.abs(z) < Z_MAX), (c.difference, exact, c.stderr_paired)
    assert abs(c.total - exact.sum()) < Z_MAX * c.total_stderr_paired
    # each side is the run's own estimate (same seed, samples and batch size), unchanged by pairing
    own = ra.nll(texts)
    np.testing.assert_array_equal(c.a.mean, own.mean)
    np.testing.assert_array_equal(c.a.stderr, own.stderr)
    # the paired SE is that of the per-sample differences, and far below the unpaired one here
    np.testing.assert_allclose(c.paired.mean, c.difference, rtol=0, atol=1e-9)
    assert c.total_stderr_paired < 0.5 * c.total_stderr_unpaired, c.summary()


def test_pairs_are_compared_on_the_same_windows(chains):
    rng = np.random.default_rng(13)
    prompts, responses, exact = [], [], []
    for P, R in [(6, 4), (3, 9), (12, 7), (1, 15)]:
        seq = chains[0].sample(rng, 1, length=P + R)[0]
        p, y = text_data.decode(seq[:P]).replace(" ", "x"), text_data.decode(seq[P:]).replace(" ", "x")
        prompts.append(p)
        responses.append(y)
        ctx, yi = text_data.encode(p + " ").astype(np.int32), text_data.encode(y).astype(np.int32)
        full = np.concatenate([ctx, yi])[None]
        exact.append(sum(-(ch.log_prob(full)[0] - ch.log_prob(ctx[None])[0]) * sgn
                         for ch, sgn in zip(chains, (1, -1))))
    c = compare_lib.compare(_oracle_run(chains[0]), _oracle_run(chains[1]), prompts=prompts, responses=responses)
    z = (c.difference - np.array(exact)) / c.stderr_paired
    assert c.coupled and np.all(np.abs(z) < Z_MAX), z


def test_runs_that_cannot_share_draws_are_independent(chains, docs):
    texts, ids = docs
    short = oracles.MarkovOracle(chains[1].trans, text_data.VOCAB, seq_len=12)
    c = compare_lib.compare(_oracle_run(chains[0]), _oracle_run(short, seq_len=12), texts)
    assert not c.coupled and "model lengths" in c.why_not and c.paired is None
    np.testing.assert_array_equal(c.stderr_paired, c.stderr_unpaired)
    assert c.total_stderr_paired == c.total_stderr_unpaired and c.se_ratio == 1.0
    exact_b = np.array([-sum(chains[1].log_prob(x[i:i + 12][None])[0] for i in range(0, len(x), 12)) for x in ids])
    exact = np.array([_doc_nll(chains[0], x) for x in ids]) - exact_b
    assert np.all(np.abs(c.difference - exact) < Z_MAX * c.stderr_unpaired)
    other = compare_lib.compare(_oracle_run(chains[0]), _oracle_run(chains[1], estimator="t_dce"), texts)
    assert not other.coupled and "different processes or estimators" in other.why_not


@pytest.mark.parametrize("kw, match", [
    ({"vocab_size": 28}, r"score text differently \(vocabulary size, tokenizer, unit, separator\)"),
    ({"tokenizer": dataclasses.replace(scoring.TEXT8, name="bytes", unit="byte")}, r"score text differently"),
    ({"tokenizer": dataclasses.replace(scoring.TEXT8, encode=_reversed_text8)},
     r"texts\[0\] is tokenized differently by the two runs \(a: \d+ tokens, b: \d+\); compare runs with the same"),
])
def test_runs_of_other_alphabets_are_refused(chains, docs, kw, match):
    with pytest.raises(ValueError, match=match) as e:
        compare_lib.compare(_oracle_run(chains[0]), _oracle_run(chains[1], **kw), docs[0])
    assert "\n" not in str(e.value)


def test_rows_are_texts_or_pairs(chains, docs):
    ra, rb = _oracle_run(chains[0]), _oracle_run(chains[1])
    with pytest.raises(ValueError, match="either texts"):
        compare_lib.compare(ra, rb, docs[0], prompts=["a"], responses=["b"])
    with pytest.raises(ValueError, match="either texts"):
        compare_lib.compare(ra, rb)


def test_target_se_adds_rounds_until_the_paired_se_is_reached(chains, docs):
    ra, rb = _oracle_run(chains[0]), _oracle_run(chains[1])
    first = compare_lib.compare(ra, rb, docs[0], num_samples=16)
    target = 0.6 * float(first.stderr_paired.max())
    c = compare_lib.compare(ra, rb, docs[0], num_samples=16, target_se=target, max_samples=256)
    assert c.a.info["target_se_reached"] and c.stderr_paired.max() <= target and c.a.num_samples > 16
    np.testing.assert_array_equal(c.a.samples[:, :16], first.a.samples)  # the first round is the same draw


def test_compare_mode_reads_only_its_keys():
    from configs import masked_text

    from infodiff import config_usage

    c = masked_text.get_config()
    c.eval.input = "docs.txt"
    config_usage.check_overrides(c, ["eval.input", "eval.input_samples", "eval.seed"], entry="compare")
    with pytest.raises(ValueError, match=r"config key eval.interval is not read by evaluate.py --compare .*: drop "
                                         r"--config.eval.interval"):
        config_usage.check_overrides(c, ["eval.input", "eval.interval"], entry="compare")
    with pytest.raises(ValueError, match="eval.num_samples is not read by evaluate.py --compare"):
        config_usage.check_overrides(c, ["eval.num_samples"], entry="compare")


# ---------------------------------------------------------------------------------------------
# Trained runs: the API and evaluate.py --compare
# ---------------------------------------------------------------------------------------------
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.test_scoring import DOCS, run_dir  # noqa: E402,F401 (the tiny trained masked run, a module fixture)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def short_run_dir(trained_masked_run, tmp_path_factory):
    """The tiny masked run of tests/test_scoring.py as it was at step 10 (of 30): a copy with
    checkpoints 20 and 30 removed."""
    import shutil

    from tests.conftest import copy_run

    d = copy_run(trained_masked_run, tmp_path_factory.mktemp("compare_short_run") / "run")
    for step in ("20", "30"):
        shutil.rmtree(d / "checkpoints" / step)
    return d


@pytest.mark.slow
def test_a_trained_run_loaded_twice_differs_by_exactly_zero(run_dir):
    import infodiff

    c = infodiff.compare(infodiff.load_run(str(run_dir)), infodiff.load_run(str(run_dir)), DOCS)
    assert c.coupled and c.same_noise
    np.testing.assert_array_equal(c.difference, 0.0)
    np.testing.assert_array_equal(c.stderr_paired, 0.0)
    assert c.total_stderr_paired == 0.0 < c.total_stderr_unpaired


def _cli(args):
    return subprocess.run([sys.executable, str(REPO / "evaluate.py"), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})


@pytest.mark.slow
def test_cli_compare_writes_a_comparison_report(run_dir, short_run_dir, tmp_path):
    import infodiff
    from tests.test_report_schema import assert_report_agrees

    f = tmp_path / "docs.txt"
    f.write_text("\n".join(DOCS) + "\n")
    r = _cli(["--workdir", str(run_dir), "--compare", str(short_run_dir), f"--config.eval.input={f}"])
    assert r.returncode == 0, r.stderr[-2000:]
    (out,) = (run_dir / "scores").glob(f"docs.txt.vs.{short_run_dir.name}-*")  # named by a hash of the request
    rep = json.loads((out / "report.json").read_text())
    assert rep["kind"] == "compare" and rep["bound"] == "model_difference" and rep["coupling"]["coupled"]
    assert_report_agrees(rep)
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert [x["id"] for x in rows] == ["1", "2", "3", "4", "5"] and (out / "rows.png").stat().st_size > 10_000
    api = infodiff.compare(infodiff.load_run(str(run_dir)), infodiff.load_run(str(short_run_dir)), DOCS)
    # evaluate.py splits each call's rows over one CPU device per core: the same draws, float rounding apart
    np.testing.assert_allclose([x["difference"] for x in rows], api.difference, rtol=1e-6)
    np.testing.assert_allclose([x["se_paired"] for x in rows], api.stderr_paired, rtol=1e-6)
    np.testing.assert_allclose(rep["summary"]["total_stderr_unpaired"], api.total_stderr_unpaired, rtol=1e-6)
    assert "total difference (nats)" in r.stdout and "SE unpaired / paired" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("extra, match", [
    ([], r"give it with --config.eval.input=FILE"),
    (["--config.eval.input=F", "--config.eval.interval=True"], r"config key eval.interval is not read by evaluate.py "
                                                              r"--compare"),
    (["--config.eval.input=F", "--compare=/nonexistent/run"], r"--compare '/nonexistent/run' does not exist"),
])
def test_cli_compare_user_errors_are_one_line(run_dir, tmp_path, extra, match):
    import re

    f = tmp_path / "docs.txt"
    f.write_text("the cat sat on the mat\n")
    extra = [a.replace("=F", f"={f}") for a in extra]
    compare = [] if any(a.startswith("--compare") for a in extra) else ["--compare", str(run_dir)]
    r = _cli(["--workdir", str(run_dir), *compare, *extra])
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert re.search(match, last), last
