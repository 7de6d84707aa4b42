"""Scoring your own data (infodiff.scoring): windows, pads and per-row sums against an exact
oracle, and the trained-run API and CLI (evaluate.py --config.eval.input=FILE).

Oracle: a 2nd-order Markov chain over ACGT (exact conditionals of every window, any length),
model length L = 12. With a context of at least the chain's order before every scored piece,
the windowed -log p(response | prompt) equals the chain rule of the transition table exactly,
so each row's estimate must be within 4 of its SEs of that value; short responses (padded) and
long ones (pieces), prompts longer than L (left-truncated) and empty prompts are included.
"""

import jax
import numpy as np
import pytest

from infodiff import likelihood as lk
from infodiff import oracles, scoring

L = 12
S = 256
Z_MAX = 4.0


@pytest.fixture(scope="module")
def chain():
    return oracles.random_markov(np.random.default_rng(5), "ACGT", order=2)


def _chain_rule_nll(mk, ctx, y):
    """-log p(y | ctx) of the stationary chain; ctx shorter than the order uses the chain's own
    marginal of the first symbols (log_prob of ctx + y minus that of ctx)."""
    full = np.concatenate([ctx, y])[None].astype(np.int32)
    lp_full = mk.log_prob(full)[0]
    lp_ctx = mk.log_prob(np.asarray(ctx, np.int32)[None])[0] if len(ctx) else 0.0
    return -(lp_full - lp_ctx)


def _z(est, truth):
    """z-scores; a row with SE 0 (one scored token: k_dce is exact) must match to float32
    round-off and gets z = 0."""
    se = est.stderr
    exact = se == 0
    np.testing.assert_allclose(est.mean[exact], truth[exact], rtol=1e-5, atol=1e-5)
    return np.where(exact, 0.0, (est.mean - truth) / np.where(exact, 1.0, se))


def test_response_windows_layout():
    ctx = [np.arange(20) % 4, np.zeros(0, np.int32)]
    y = [np.ones(5, np.int32), np.full(30, 2, np.int32)]
    w = scoring.response_windows(ctx, y, L)
    # row 0: one window = last 7 context tokens + 5 response tokens, no pads
    assert (w.row_W == 0).sum() == 1 and w.target_WxL[0].sum() == 5 and not w.pad_WxL[0].any()
    np.testing.assert_array_equal(w.x_WxL[0, :7], (np.arange(20) % 4)[-7:])
    # row 1: 30 tokens > L -> pieces of 6, each after the 6 before it (the first has none)
    r1 = np.flatnonzero(w.row_W == 1)
    assert len(r1) == 5 and w.target_WxL[r1].sum() == 30
    assert w.pad_WxL[r1[0]].sum() == L - 6 and not w.pad_WxL[r1[1:]].any()
    assert not np.any(w.target_WxL & w.pad_WxL)


def test_conditional_rows_match_the_exact_chain_rule(chain):
    rng = np.random.default_rng(0)
    cases = []  # (prompt length, response length)
    for P, R in [(4, 3), (4, 8), (9, 3), (20, 5), (2, 12), (6, 25), (0, 5), (0, 17), (3, 1)]:
        seq = chain.sample(rng, 1, length=P + R)[0]
        cases.append((seq[:P], seq[P:]))
    ctx, y = [c for c, _ in cases], [r for _, r in cases]
    w = scoring.response_windows(ctx, y, L)
    est = lk.nll(chain, w.x_WxL, jax.random.key(1), estimator="k_dce", num_samples=S,
                 target_BxL=w.target_WxL, pad_BxL=w.pad_WxL)
    rows = scoring.sum_windows(est, w.row_W, len(cases))
    truth = np.array([_chain_rule_nll(chain, c, r) for c, r in cases])
    z = _z(rows, truth)
    print("\nz-scores per row:", np.round(z, 2), "\nestimate:", np.round(rows.mean, 3), "\nexact:   ", np.round(truth, 3))
    assert np.all(np.abs(z) < Z_MAX), (z, rows.mean, truth)
    np.testing.assert_array_equal(rows.info["windows_per_row"], [1, 1, 1, 1, 1, 5, 1, 3, 1])


@pytest.mark.slow
def test_documents_are_sums_of_independent_windows(chain):
    rng = np.random.default_rng(1)
    docs = [chain.sample(rng, 1, length=n)[0] for n in (5, 12, 30)]
    w = scoring.document_windows(docs, L)
    est = lk.nll(chain, w.x_WxL, jax.random.key(2), estimator="k_dce", num_samples=S,
                 target_BxL=w.target_WxL, pad_BxL=w.pad_WxL)
    rows = scoring.sum_windows(est, w.row_W, len(docs))
    truth = np.array([-sum(chain.log_prob(d[i:i + L][None])[0] for i in range(0, len(d), L)) for d in docs])
    assert np.all(np.abs(_z(rows, truth)) < Z_MAX), (rows.mean, truth)


@pytest.mark.slow
def test_coupled_ratio_of_unequal_lengths_is_unbiased_and_coupled(chain):
    rng = np.random.default_rng(2)
    ctx, a, b = [], [], []
    for Ra, Rb in [(3, 5), (8, 8), (6, 2), (10, 7)]:
        seq = chain.sample(rng, 1, length=6 + Ra)[0]
        ctx.append(seq[:6])
        a.append(seq[6:])
        b.append(rng.permutation(chain.sample(rng, 1, length=Rb)[0]))
    b[1] = a[1].copy()
    b[1][3] = (b[1][3] + 1) % 4  # one substitution: the case coupling is for
    wa, wb = scoring.response_windows(ctx, a, L), scoring.response_windows(ctx, b, L)
    truth = np.array([_chain_rule_nll(chain, c, y2) - _chain_rule_nll(chain, c, y1) for c, y1, y2 in zip(ctx, a, b)])
    out = {}
    for coupled in (True, False):
        ea, eb = lk.paired_nll(chain, wa.x_WxL, wb.x_WxL, jax.random.key(3), target_a_BxL=wa.target_WxL,
                               target_b_BxL=wb.target_WxL, pad_a_BxL=wa.pad_WxL, pad_b_BxL=wb.pad_WxL,
                               coupled=coupled, estimator="k_dce", num_samples=S)
        r = lk.Estimate("k_dce", eb.samples - ea.samples, forward_passes=2 * S)
        assert np.all(np.abs(_z(r, truth)) < Z_MAX), (coupled, r.mean, truth)
        out[coupled] = r.stderr
    # row 1 (b = a with one substitution) shares every mask: the coupled SE is far below the decoupled
    assert out[True][1] < 0.7 * out[False][1], out  # measured 0.114 vs 0.214


def test_pads_are_refused_where_they_cannot_work(chain):
    x = chain.sample(np.random.default_rng(0), 2, length=L)
    pad = np.zeros_like(x, bool)
    pad[:, -3:] = True
    with pytest.raises(ValueError, match="both a pad and a target"):
        lk.nll(chain, x, jax.random.key(0), estimator="k_dce", num_samples=4, target_BxL=np.ones_like(pad),
               pad_BxL=pad)
    with pytest.raises(ValueError, match="pad_BxL must be bool"):
        lk.nll(chain, x, jax.random.key(0), estimator="k_dce", num_samples=4, pad_BxL=pad.astype(int))


def test_clean_reports_changed_characters():
    text, changed = scoring.clean("Hello,  World 42!\n")
    assert text == "hello world four two"
    assert changed == {"H": 1, ",": 1, "W": 1, "4": 1, "2": 1, "!": 1, "\n": 1}


# ---------------------------------------------------------------------------------------------
# A trained run: the API and evaluate.py --config.eval.input=FILE
# ---------------------------------------------------------------------------------------------
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOCS = ["The cat sat on the mat.", "And the dog ate the hat, 42 times!", "the cat " * 6,
        "Short.", "A much longer line about the cat and the dog and the hat that runs past the model length"]
PROMPTS = ["the cat sat on", "the dog", "", "and the dog ate the hat and the cat sat on the mat and"]
RESPONSES = ["the mat", "ate the hat and the cat sat on the mat", "the cat", "the hat"]
ALTS = ["mat the", "ate the hat and the cat sat on the hat", "tac eht", "the cat sat"]


@pytest.fixture(scope="module")
def run_dir(trained_masked_run, tmp_path_factory):
    """This module's copy of the suite's tiny trained masked run (tests/conftest.py): the tests
    write reports into it."""
    from tests.conftest import copy_run

    return copy_run(trained_masked_run, tmp_path_factory.mktemp("scoring_run") / "run")


def _write(path, lines):
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return path


@pytest.mark.slow
def test_api_scores_strings(run_dir):
    import infodiff

    run = infodiff.load_run(str(run_dir))
    assert run.seq_len == 16 and run.num_samples == 32
    est = run.nll(DOCS)
    assert est.mean.shape == (5,) and np.all(est.stderr > 0) and np.all(np.isfinite(est.mean))
    np.testing.assert_array_equal(est.info["windows_per_row"], [2, 3, 3, 1, 6])  # ceil(chars / 16)
    assert run.last_changed[1] == {"A": 1, ",": 1, "4": 1, "2": 1, "!": 1}
    again = infodiff.load_run(str(run_dir)).nll(DOCS)
    np.testing.assert_array_equal(est.mean, again.mean)  # seeded by eval.seed
    c = run.conditional_nll(PROMPTS, RESPONSES)
    assert c.mean.shape == (4,) and np.all(c.mean > 0)
    r = run.log_ratio(PROMPTS, RESPONSES, ALTS)
    d = run.log_ratio(PROMPTS, RESPONSES, ALTS, coupled=False)
    assert r.mean.shape == (4,)
    assert r.stderr[1] < d.stderr[1]  # one substituted word: coupling helps
    assert [e.info["bound"] for e in (est, c, r, d)] == ["nelbo", "nelbo", "nelbo_difference", "nelbo_difference"]


@pytest.mark.slow
def test_api_user_errors(run_dir):
    import infodiff

    run = infodiff.load_run(str(run_dir))
    with pytest.raises(ValueError, match=r"texts\[1\] is empty after cleaning"):
        run.nll(["ok", "!!! ..."])
    with pytest.raises(TypeError, match="got one string"):
        run.nll("a single string")
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        run.conditional_nll(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="cannot score rows of different lengths"):
        infodiff.load_run(str(run_dir), estimator="neyman")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        infodiff.load_run(str(run_dir / "nope"))


def _cli(args, **kw):
    return subprocess.run([sys.executable, str(REPO / "evaluate.py"), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"}, **kw)


@pytest.mark.slow
def test_cli_pairs_match_the_api(run_dir, tmp_path):
    import infodiff

    f = _write(tmp_path / "pairs.jsonl", [{"id": f"p{i}", "prompt": p, "response": y}
                                           for i, (p, y) in enumerate(zip(PROMPTS, RESPONSES))])
    r = _cli(["--workdir", str(run_dir), f"--config.eval.input={f}"])
    assert r.returncode == 0, r.stderr[-2000:]
    from infodiff.evaluation import inputs

    out = Path(inputs.default_out_dir(str(run_dir), str(f)))
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    api = infodiff.load_run(str(run_dir)).conditional_nll(PROMPTS, RESPONSES)
    # evaluate.py splits each call's rows over one CPU device per core, the API runs on one:
    # the same draws, float32 rounding of the forward apart (measured 7.7e-9 relative)
    np.testing.assert_allclose([x["value"] for x in rows], api.mean, rtol=1e-6)
    np.testing.assert_allclose([x["se"] for x in rows], api.stderr, rtol=1e-6)
    assert [x["id"] for x in rows] == ["p0", "p1", "p2", "p3"]
    assert [(x["prompt"], x["response"]) for x in rows] == list(zip(PROMPTS, RESPONSES))  # what was scored
    assert rows[0]["response_cleaned"] == "the mat" and "bits_per_char_stderr" in rows[0]
    rep = json.loads((out / "report.json").read_text())
    assert rep["kind"] == "input" and rep["input"]["format"] == "pairs" and (out / "rows.png").stat().st_size > 10_000
    assert (out / "rows.csv").read_text().splitlines()[0].startswith("id,value,se,samples")
    assert "bits per character" in r.stdout


@pytest.mark.slow
def test_text_and_ratio_files(run_dir, tmp_path):
    from ml_collections import ConfigDict

    from infodiff import evaluation, training

    cfg = ConfigDict(training.saved_config(str(run_dir)))
    cfg.eval.input = str(_write(tmp_path / "docs.txt", DOCS[:2] + ["", "   "] + DOCS[2:]))
    rep, out = evaluation.evaluate(cfg, str(run_dir))
    from infodiff.evaluation import report as report_lib

    assert set(report_lib.COMMON_KEYS + report_lib.INPUT_KEYS) <= set(rep), set(report_lib.INPUT_KEYS) - set(rep)
    assert rep["input"]["rows"] == 5 and [r["id"] for r in rep["rows_preview"]] == ["1", "2", "5", "6", "7"]
    assert rep["cleaning"]["characters"]["4"] == 1 and rep["summary"]["characters"] > 100
    assert rep["cleaning"]["statement"].startswith("a CLEANED copy is scored, not the input as given")
    evaluation.write_report(rep, out)
    assert "bits per character" in (Path(out) / "report.txt").read_text()
    assert "CLEANED TEXT SCORED" in (Path(out) / "report.txt").read_text()
    cfg.eval.input = str(_write(tmp_path / "ab.jsonl", [{"prompt": p, "a": a, "b": b}
                                                        for p, a, b in zip(PROMPTS, RESPONSES, ALTS)]))
    rep, out = evaluation.evaluate(cfg, str(run_dir))
    s = rep["summary"]
    assert 0 <= s["fraction_resolved_2se"] <= 1 and s["se_ratio_decoupled_over_coupled_median"] > 0
    assert {"value_decoupled", "se_decoupled", "resolved_2se"} <= set(rep["rows_preview"][0])


@pytest.mark.slow
@pytest.mark.parametrize("lines, match", [
    (['{"prompt": "a", "response": "b"}', "not json"], r"bad\.jsonl:2: not valid JSON"),
    (['{"prompt": "a", "response": "b"}', '{"prompt": "a", "a": "b", "b": "c"}'], r"bad\.jsonl:2: a ratios line"),
    (['{"prompt": "a", "answer": "b"}'], r"bad\.jsonl:1: keys \['answer', 'prompt'\]"),
    (['{"prompt": "a", "response": 3}'], r"'response' must be a string"),
    (['{"prompt": "a", "response": "!!"}'], r"bad\.jsonl: every row is empty after cleaning .*\(lines 1\)"),
    (['{"id": "x", "prompt": "a", "response": "b"}', '{"id": "x", "prompt": "a", "response": "c"}'],
     r"bad\.jsonl:2: id 'x' was already used on line 1"),
    (['{"id": null, "prompt": "a", "response": "b"}'], r"\"id\" must be a string or an integer"),
    (['{"prompt": "a", "a": "b", "b": "c"}', '{"prompt": "a", "a": "bb", "b": "' + "c" * 40 + '"}'],
     r"row '2': a and b\[1\] need the same number of windows"),
])
def test_bad_input_files_are_named(run_dir, tmp_path, lines, match):
    from ml_collections import ConfigDict

    from infodiff import evaluation, training

    cfg = ConfigDict(training.saved_config(str(run_dir)))
    cfg.eval.input = str(_write(tmp_path / "bad.jsonl", lines))
    with pytest.raises(ValueError, match=match):
        evaluation.evaluate(cfg, str(run_dir))


def test_input_not_utf8_is_said_with_its_lines(tmp_path, caplog):
    from infodiff.evaluation import inputs

    f = tmp_path / "latin.txt"
    f.write_bytes(b"hello world\nthe cat sat \xff\xfe on the mat\n\xe9t\xe9 caf\xe9 \xef\xbf\xbd\nanother line\n")
    notes = []
    with caplog.at_level("WARNING"):
        kind, ids, cols = inputs.read_input(str(f), notes=notes)
    assert ids == ["1", "2", "3", "4"] and cols["text"][2] == "\ufffdt\ufffd caf\ufffd \ufffd"  # replaced, as before
    assert notes == [f"eval.input {f}: not UTF-8: 5 invalid byte sequences on 2 lines (lines 2, 3), each replaced "
                     "by U+FFFD, which the text8 cleaning removes: the scored text differs there (re-encode the "
                     "file as UTF-8, e.g. iconv -f latin1 -t utf-8)"]  # the file's own U+FFFD is not counted
    assert notes[0] in caplog.text
    g = tmp_path / "fine.txt"
    g.write_bytes("caf\u00e9 \ufffd ok\n".encode())
    notes = []
    inputs.read_input(str(g), notes=notes)
    assert notes == []


@pytest.mark.parametrize("name, body, message", [
    ("e.txt", "...!!!\n\n?\n", r"e\.txt: every row is empty after cleaning to the text8 alphabet "
     r"\(a-z and space\) \(lines 1, 3\): nothing to score; give the rows letters$"),
    ("f.txt", "...!!!", r"f\.txt: every row is empty after cleaning .*\(lines 1\)"),
    ("e.jsonl", '{"prompt": "x", "response": "!!!"}\n', r"e\.jsonl: every row is empty after cleaning .*letters$"),
    ("r.jsonl", '{"prompt": "", "a": "yes", "b": "--"}\n', r"r\.jsonl: every row is empty after cleaning"),
])
def test_a_file_empty_after_cleaning_names_its_file_and_lines(tmp_path, name, body, message):
    """Rows that clean to nothing are skipped with a note (tests/test_bytes.py); a file with none left is an error."""
    from infodiff.evaluation import inputs

    f = tmp_path / name
    f.write_text(body)
    with pytest.raises(ValueError, match=message) as e:
        inputs.read_input(str(f))
    assert str(e.value).startswith(f"eval.input {f}:") and "\n" not in str(e.value)


@pytest.mark.slow
def test_lines_split_at_newlines_only_and_bom_accepted(run_dir, tmp_path):
    from ml_collections import ConfigDict

    from infodiff import evaluation, training
    from infodiff.evaluation import inputs

    f = tmp_path / "u.txt"
    f.write_text("first line\u2028still first\x0cstill\r\nsecond line\n", encoding="utf-8")
    kind, ids, cols = inputs.read_input(str(f))
    assert ids == ["1", "2"] and cols["text"][1] == "second line"
    g = tmp_path / "bom.jsonl"
    g.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "a\u2028b", "response": "c"}, ensure_ascii=False).encode())
    assert inputs.read_input(str(g))[0] == "pairs"
    cfg = ConfigDict(training.saved_config(str(run_dir)))
    cfg.eval.input = str(g)
    cfg.eval.estimator = "lambda_dce"
    rep, _ = evaluation.evaluate(cfg, str(run_dir))
    assert rep["infinite_variance"] and "INFINITE VARIANCE" in evaluation.format_report(rep)
    cfg.eval.estimator = "bogus"
    with pytest.raises(ValueError, match="unknown estimator 'bogus'"):
        evaluation.evaluate(cfg, str(run_dir))


@pytest.mark.slow
def test_ratio_rows_share_the_prompt_context(run_dir):
    import infodiff

    run = infodiff.load_run(str(run_dir))
    prompt = ["and the dog ate the hat and"]  # 28 characters with the joining space; L = 16
    r = run.log_ratio(prompt, ["the"], ["the cat sat o"])
    assert r.info["context_per_row"].tolist() == [16 - 13]  # both see the 3 characters the longer one leaves
    c = run.conditional_nll(prompt * 2, ["the", "the cat sat on the"])
    assert c.info["context_per_row"].tolist() == [13, 8] and run.last_context.tolist() == [28, 28]
    with pytest.raises(ValueError, match="must be an integer >= 2"):
        run.nll(["abc"], num_samples=0)
    with pytest.raises(TypeError, match="seed must be an integer"):
        run.nll(["abc"], seed="a")
    with pytest.raises(ValueError, match="texts is empty"):
        run.nll([])


@pytest.mark.slow
def test_target_se_adds_rounds_until_every_row_reaches_it(run_dir, tmp_path):
    import infodiff
    from ml_collections import ConfigDict

    from infodiff import evaluation, training

    run = infodiff.load_run(str(run_dir))
    base = run.conditional_nll(PROMPTS, RESPONSES, num_samples=8)
    target = float(np.min(base.stderr)) / 2  # needs about 4x the samples for every row
    est = run.conditional_nll(PROMPTS, RESPONSES, num_samples=8, target_se=target, max_samples=512)
    assert est.info["target_se_reached"] and np.all(est.stderr <= target), (est.stderr, target)
    assert est.num_samples in (32, 64, 128, 256, 512) and est.num_samples > 8
    np.testing.assert_array_equal(est.samples[:, :8], base.samples)  # round 0 is the fixed-budget run
    capped = run.conditional_nll(PROMPTS, RESPONSES, num_samples=8, target_se=1e-6, max_samples=24)
    assert capped.num_samples == 24 and not capped.info["target_se_reached"]
    assert est.info["bound"] == capped.info["bound"] == "nelbo"  # kept over the rounds
    cfg = ConfigDict(training.saved_config(str(run_dir)))
    cfg.eval.input = str(_write(tmp_path / "t.jsonl", [{"prompt": p, "response": y} for p, y in zip(PROMPTS, RESPONSES)]))
    cfg.eval.target_se, cfg.eval.input_max_samples = 1e-6, 64
    rep, _ = evaluation.evaluate(cfg, str(run_dir))
    assert rep["target_se_reached"] is False and rep["num_samples_per_window"] == 64
    assert any("target_se" in n for n in rep["notes"])


@pytest.mark.slow
def test_cli_missing_input_is_one_line(run_dir):
    r = _cli(["--workdir", str(run_dir), "--config.eval.input=/nope/x.txt"])
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "error: FileNotFoundError: eval.input: file not found: '/nope/x.txt'"
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def poisson_run(tmp_path_factory):
    from configs import poisson_synthetic
    from infodiff import tasks, training

    c = poisson_synthetic.get_config()
    for k, v in {"data.num_train": 256, "data.num_valid": 64, "data.num_test": 64, "model.hidden": 16,
                 "model.num_layers": 1, "model.emb_dim": 8, "train.num_steps": 2, "train.batch_size": 32,
                 "train.eval_batches": 1, "eval.num_samples": 8, "eval.num_generate": 10}.items():
        g, n = k.split(".")
        c[g][n] = v
    d = tmp_path_factory.mktemp("poisson_run")
    training.train(tasks.make_task(c), str(d))
    return d, c


@pytest.mark.slow
def test_poisson_counts_file(poisson_run, tmp_path):
    from infodiff import evaluation

    d, c = poisson_run
    f = tmp_path / "counts.npy"
    np.save(f, np.array([[0], [3], [7], [12]]))
    c = c.copy_and_resolve_references()
    c.eval.input = str(f)
    rep, out = evaluation.evaluate(c, str(d))
    assert rep["input"]["format"] == "counts" and rep["input"]["rows"] == 4 and "cleaning" not in rep
    assert rep["kind"] == "input" and rep["bound"] == "nelbo" and rep["process"]["name"] == "poisson"
    assert rep["units"]["nll"] == "nats per example"  # units only: `bound` says what the number is
    assert not Path(out).exists()  # nothing is written before the report is printed
    evaluation.write_report(rep, out)  # rows.* with the report, as one unit
    rows = [json.loads(x) for x in (Path(out) / "rows.jsonl").read_text().splitlines()]
    assert all(r["se"] > 0 and np.isfinite(r["value"]) for r in rows) and rows[0]["dims"] == 1
    assert [r["id"] for r in rows] == ["1", "2", "3", "4"]  # 1-based, as every input's rows
    assert "bits per dimension" in evaluation.format_report(rep)
    for bad, match in [(np.array([[1, 2]]), r"has shape \(1, 2\); expected \[N, 1\]"),
                       (np.array([[-1]]), "negative"), (np.array([[0.5]]), "finite integers")]:
        np.save(f, bad)
        with pytest.raises(ValueError, match=match):
            evaluation.evaluate(c, str(d))
    c.eval.input = str(_write(tmp_path / "x.txt", ["abc"]))
    with pytest.raises(ValueError, match="a Poisson run scores counts: give a .npy"):
        evaluation.evaluate(c, str(d))


# ---------------------------------------------------------------------------------------------
# A SEDD Run's windows and pads against the exact score of a Markov chain over the text alphabet
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("graph, noise_law, num_samples", [("absorb", "defensive", 128), ("uniform", "importance", 512)])
def test_sedd_run_windows_and_pads_match_the_exact_chain(graph, noise_law, num_samples):
    """A text Run around ``OracleScore`` of a 1st-order chain over text8's 27 characters, L = 8:
    documents (padded last window, several windows), conditionals (clean prompt context, padded
    short response, a long response in pieces) and the coupled ratio, each within 4 SE of the
    chain's exact value (the I-MDSE NELBO of an exact score is -log p up to the prior KL at
    lam_max = 0.999, ~1e-5 nats per token)."""
    import types

    from infodiff.data import text as text_data
    from infodiff.processes import score_entropy as se

    Lw = 8
    mk = oracles.random_markov(np.random.default_rng(3), "".join(text_data.VOCAB), order=1)
    proc = se.ScoreEntropyProcess(graph=graph, vocab_size=mk.vocab_size, noise_law=noise_law, lam_max=0.999)
    run = scoring.Run("oracle", types.SimpleNamespace(eval=types.SimpleNamespace(seed=0)),
                      types.SimpleNamespace(seq_len=Lw), se.OracleScore(mk, graph), proc, 0, num_samples, 64)
    rng = np.random.default_rng(0)

    def text(n):  # a chain sample as a string, and its ids after the text8 cleaning
        t = scoring.clean("".join(text_data.VOCAB[i] for i in mk.sample(rng, 1, length=n)[0]))[0]
        return t, text_data.encode(t).astype(np.int32)

    docs = [text(n) for n in (5, 8, 19)]
    est = run.nll([t for t, _ in docs], seed=1)
    truth = np.array([-sum(mk.log_prob(d[i:i + Lw][None])[0] for i in range(0, len(d), Lw)) for _, d in docs])
    np.testing.assert_array_equal(est.info["windows_per_row"], [-(-len(d) // Lw) for _, d in docs])
    assert np.all(np.abs((est.mean - truth) / est.stderr) < Z_MAX), (est.mean, est.stderr, truth)

    prompts, ys = [text(6)[0], "", text(3)[0]], [text(3)[0], text(5)[0], text(11)[0]]
    c = run.conditional_nll(prompts, ys, seed=2)
    space = text_data.encode(" ").astype(np.int32)
    ctx = [np.concatenate([text_data.encode(p), space]).astype(np.int32) if p else np.zeros(0, np.int32)
           for p in prompts]
    yid = [text_data.encode(y).astype(np.int32) for y in ys]
    # the windows' own context: row 0 sees the last L - 3 = 5 context characters (order-1 chain: enough)
    truth_c = np.array([_chain_rule_nll(mk, cx, y) for cx, y in zip(ctx, yid)])
    assert np.all(np.abs((c.mean - truth_c) / c.stderr) < Z_MAX), (c.mean, c.stderr, truth_c)

    alts = [text(3)[0], text(4)[0], text(9)[0]]
    r = run.log_ratio(prompts, ys, alts, seed=3)
    aid = [text_data.encode(y).astype(np.int32) for y in alts]
    truth_r = np.array([_chain_rule_nll(mk, cx, b) - _chain_rule_nll(mk, cx, a) for cx, a, b in zip(ctx, yid, aid)])
    assert np.all(np.abs((r.mean - truth_r) / r.stderr) < Z_MAX), (r.mean, r.stderr, truth_r)
    # what each number is: a Run cannot know its denoiser is exact, so it says NELBO (equal to
    # -log p here, as the z-scores above show)
    assert (est.info["bound"], c.info["bound"], r.info["bound"]) == ("nelbo", "nelbo", "nelbo_difference")
    print(f"\n{graph}: z docs {np.round((est.mean - truth) / est.stderr, 2)}, conditional "
          f"{np.round((c.mean - truth_c) / c.stderr, 2)}, ratio {np.round((r.mean - truth_r) / r.stderr, 2)}")
