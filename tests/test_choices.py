"""Multiple choice (infodiff.choices, infodiff.choose), the lm-eval model (infodiff.harness) and
evaluate.py on a choices .jsonl, against an exact oracle.

Oracle: a 1st-order Markov chain over text8's 27 characters scored through
``infodiff.from_function`` (a NumPy denoiser), model length L = 16: every option's
-log p(option | prompt) is the chain rule of its transition table, so each estimate must be within
4 of its SEs of it, and every question decided at 95 % must pick the exact argmax.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import infodiff
from infodiff import choices as choices_lib
from infodiff import oracles, scoring
from infodiff.data import text as text_data

L = 16
Z_MAX = 4.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def chain():
    return oracles.random_markov(np.random.default_rng(11), "".join(text_data.VOCAB), order=1)


@pytest.fixture(scope="module")
def run(chain):
    return infodiff.from_function(chain, vocab_size=27, mask_id=27, seq_len=L, seed=3)


@pytest.fixture(scope="module")
def unigram():
    """A context-free JAX denoiser (i.i.d. tokens): quick to compile, for the fast tier."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(2).normal(size=27), jnp.float32))
    return infodiff.from_function(lambda x: jnp.broadcast_to(logp, (*x.shape, 27)), vocab_size=27, mask_id=27,
                                  seq_len=L, seed=3)


def _text(chain, rng, n):
    return scoring.clean("".join(text_data.VOCAB[i] for i in chain.sample(rng, 1, length=n)[0]))[0]


def _exact(chain, prompt, option):
    """-log p(option | prompt + ' ') of the chain (its conditional given the last token)."""
    ctx = text_data.encode(prompt + " ").astype(np.int32) if prompt else np.zeros(0, np.int32)
    y = text_data.encode(option).astype(np.int32)
    full = np.concatenate([ctx, y])[None]
    return -(chain.log_prob(full)[0] - (chain.log_prob(ctx[None])[0] if len(ctx) else 0.0))


@pytest.fixture(scope="module")
def questions(chain):
    rng = np.random.default_rng(0)
    qs = []
    while len(qs) < 24:
        p = _text(chain, rng, 9)
        opts = [_text(chain, rng, int(rng.integers(3, 7))) for _ in range(3 if len(qs) % 2 else 4)]
        if p and all(opts) and len(set(opts)) == len(opts):
            qs.append((p, opts))
    return qs


@pytest.mark.slow
def test_choices_match_the_exact_chain_and_decisions_are_right(chain, run, questions):
    P, C = [q[0] for q in questions], [q[1] for q in questions]
    exact = [np.array([_exact(chain, p, o) for o in opts]) for p, opts in questions]
    answers = [int(np.argmin(e)) for e in exact]
    res = infodiff.choose(run, P, C, answers=answers)
    z = np.concatenate([(m - e) / s for m, e, s in zip(res.nll, exact, res.nll_stderr)])
    print("\nz:", np.round(z, 2), "\ndecided:", res.decided.mean(), "passes:", res.forward_passes)
    assert np.all(np.abs(z) < Z_MAX), z
    assert np.all(res.choice[res.decided] == np.asarray(answers)[res.decided])
    assert res.decided.mean() > 0.5
    # margins: the runner-up's NELBO minus the choice's, from the coupled samples
    for q in range(len(P)):
        assert res.margin[q] == pytest.approx(res.nll[q][res.runner_up[q]] - res.nll[q][res.choice[q]], abs=1e-9)
    # adaptive: a decided question stops early; an undecided one spends max_samples per option
    assert np.all(res.samples[~res.decided] == 128) and res.samples[res.decided].min() == 32
    # a tie (the same option three times, coupled: every difference 0) is never decided; each is best
    # with probability 1/3, so the accuracy's MC variance of the question is (1/3)(2/3)
    tie = infodiff.choose(run, [P[0]], [[C[0][0]] * 3])
    assert not tie.decided[0] and tie.samples[0] == 128 and tie.margin[0] == 0.0
    np.testing.assert_allclose(tie.p_best[0], 1 / 3, atol=0.03)
    assert tie.p_flip[0] == pytest.approx(2 / 3, abs=0.03)
    assert tie.accuracy_mc_stderr == pytest.approx(np.sqrt(2 / 9), abs=0.02)
    n_opts = np.array([len(c) for c in C])  # passes: samples x options (one window each)
    np.testing.assert_array_equal(res.forward_passes, res.samples * n_opts)
    s = res.summary()
    v = [np.max(p * (1 - p)) for p in res.p_best]
    assert s["accuracy_mc_stderr"] == pytest.approx(np.sqrt(np.sum(v)) / len(P))
    np.testing.assert_allclose(res.p_flip, [1 - p[c] for p, c in zip(res.p_best, res.choice)])
    assert all(abs(p.sum() - 1) < 1e-12 for p in res.p_best)
    assert res.accuracy_stderr == pytest.approx(np.sqrt(res.accuracy * (1 - res.accuracy) / (len(P) - 1)))
    # same seed -> the same decisions and numbers
    again = infodiff.choose(run, P, C, answers=answers)
    np.testing.assert_array_equal(again.choice, res.choice)
    np.testing.assert_array_equal(again.margin, res.margin)


@pytest.mark.slow
def test_coupling_decides_with_fewer_samples(chain, run):
    """Options that differ in one character (the case coupling is for: their masks coincide)."""
    rng = np.random.default_rng(7)
    P, C = [], []
    while len(P) < 12:
        p, y = _text(chain, rng, 9), _text(chain, rng, 8)
        if len(y) < 6 or not p:
            continue
        opts = [y] + [y[:i] + c + y[i + 1:] for i, c in zip(rng.choice(len(y), 3, replace=False), "aeo")]
        if len(set(opts)) == 4 and " " not in "".join(o[0] + o[-1] for o in opts):
            P.append(p)
            C.append(opts)
    c = infodiff.choose(run, P, C)
    d = infodiff.choose(run, P, C, coupled=False)
    print("\nsamples per option, coupled:", c.samples, "decoupled:", d.samples)
    assert c.samples.mean() < 0.7 * d.samples.mean(), (c.samples.mean(), d.samples.mean())


def test_bad_questions_are_refused(unigram):
    run = unigram
    with pytest.raises(ValueError, match=r"choices\[0\] must be a list of at least 2"):
        infodiff.choose(run, ["a"], [["b"]])
    with pytest.raises(ValueError, match=r"answers\[0\]=5"):
        infodiff.choose(run, ["a"], [["b", "c"]], answers=[5])
    with pytest.raises(ValueError, match="confidence=1.5"):
        infodiff.choose(run, ["a"], [["b", "c"]], confidence=1.5)
    with pytest.raises(ValueError, match="max_samples=8 is below num_samples=32"):
        infodiff.choose(run, ["a"], [["b", "c"]], max_samples=8)
    with pytest.raises(ValueError, match=r"choices\[0\] option\[1\] is empty"):
        infodiff.choose(run, ["a"], [["b", "!!"]])
    with pytest.raises(AttributeError, match=r"^Run\.choose is now infodiff\.choose\(run, prompts, choices, \.\.\.\)"):
        run.choose(["a"], [["b", "c"]])  # the Run is the scorer interface only
    with pytest.raises(AttributeError, match="'ExternalRun' object has no attribute 'chose'"):
        run.chose


def test_levels_and_looks():
    assert choices_lib.looks(16, 128) == 4 and choices_lib.looks(16, 16) == 1 and choices_lib.looks(16, 100) == 4
    assert choices_lib.decision_level(0.95, 4, 4) == pytest.approx(0.05 / 12)


# ---------------------------------------------------------------------------------------------
# The lm-eval model: the same numbers as infodiff.choose / Run.nll, and is_greedy
# ---------------------------------------------------------------------------------------------
needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                   reason="lm-eval is not installed (pip install -e '.[harness]')")


def _instances(kind, args_list, doc_ids=None):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=kind, doc={}, arguments=a, idx=i % 4,
                     metadata=("t", None if doc_ids is None else doc_ids[i], 1)) for i, a in enumerate(args_list)]


@needs_lm_eval
def test_harness_loglikelihood_is_choose(unigram, questions):
    from infodiff.harness import InfodiffLM

    run = unigram
    lm = InfodiffLM(run=run)
    reqs, doc = [], []
    for q, (p, opts) in enumerate(questions):
        for o in opts:
            reqs.append((p, " " + o))  # lm-eval's target_delimiter
            doc.append(q)
    out = lm.loglikelihood(_instances("loglikelihood", reqs, doc))
    res = infodiff.choose(run, [q[0] for q in questions], [q[1] for q in questions])
    np.testing.assert_array_equal(np.array([o[0] for o in out]), -np.concatenate(res.nll))
    assert [r["choice"] for r in lm.records] == res.choice.tolist()
    s = lm.choice_summary()["t"]
    assert s["questions"] == len(questions) and s["accuracy_mc_stderr"] > 0


@needs_lm_eval
def test_harness_mutual_info_requests_are_their_own_questions(unigram):
    """acc_mutual_info adds an unconditional request ("" context) per option, with the same doc_id."""
    from infodiff.harness import InfodiffLM

    lm = InfodiffLM(run=unigram)
    opts = ["abc", "de", "fgh"]
    reqs = [(ctx, " " + o) for ctx in ("the prompt", "") for o in opts]
    out = lm.loglikelihood(_instances("loglikelihood", reqs, [0] * len(reqs)))
    assert len(lm.records) == 2 and [r["unconditional"] for r in lm.records] == [False, True]
    assert lm.choice_summary()["t"]["questions"] == 1
    # the unconditional options are scored without the prompt: their own windows, not the prompt's
    assert [r["option_nll"] for r in lm.records][1] == pytest.approx([-v for v, _ in out[3:]])


@needs_lm_eval
@pytest.mark.slow
def test_harness_options_with_their_own_contexts(chain, run):
    """Winogrande-style: the options change the context and share the continuation."""
    from infodiff.harness import InfodiffLM

    rng = np.random.default_rng(9)
    qs = [([_text(chain, rng, 7) for _ in range(2)], _text(chain, rng, 5)) for _ in range(6)]
    qs = [(c, y) for c, y in qs if all(c) and y]
    reqs = [(c, " " + y) for cs, y in qs for c in cs]
    doc = [q for q, (cs, _) in enumerate(qs) for _ in cs]
    lm = InfodiffLM(run=run)
    out = np.array([o[0] for o in lm.loglikelihood(_instances("loglikelihood", reqs, doc))])
    truth = np.array([-_exact(chain, c, y) for cs, y in qs for c in cs])
    se = np.concatenate([r["option_stderr"] for r in lm.records])
    assert np.all(np.abs((out - truth) / np.where(se > 0, se, 1)) < Z_MAX), (out, truth, se)
    best = np.array([int(np.argmax(truth[2 * q:2 * q + 2])) for q in range(len(qs))])
    dec = np.array([r["decided"] for r in lm.records])
    assert np.all(np.array([r["choice"] for r in lm.records])[dec] == best[dec])


@needs_lm_eval
@pytest.mark.slow
def test_harness_single_requests_and_is_greedy(chain, run):
    from infodiff.harness import InfodiffLM

    lm = InfodiffLM(run=run)
    ctx = "the"
    lp = np.array([-_exact(chain, ctx, c) for c in text_data.VOCAB[:26]])  # one letter after "the "
    best, other = text_data.VOCAB[int(np.argmax(lp))], text_data.VOCAB[int(np.argmin(lp))]
    out = lm.loglikelihood(_instances("loglikelihood", [(ctx, " " + best), (ctx + "x", " " + other)]))
    assert out[0][1] is True and out[1][1] is False
    # one token scored exactly by k_dce: the exact conditional
    assert out[0][0] == pytest.approx(float(lp.max()), abs=1e-4)
    assert lm.single_records[0]["stderr"] == 0.0 and lm.single_records[0]["is_greedy"] is True


@needs_lm_eval
@pytest.mark.slow
def test_harness_rolling_is_run_nll(chain, run):
    from infodiff.harness import InfodiffLM

    rng = np.random.default_rng(4)
    docs = [_text(chain, rng, n) for n in (7, 20, 40)]
    lm = InfodiffLM(run=run)
    out = lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [(d,) for d in docs]))
    est = run.nll(docs)
    np.testing.assert_array_equal(np.array(out), -est.mean)
    truth = np.array([-sum(chain.log_prob(text_data.encode(d)[i:i + L][None].astype(np.int32))[0]
                           for i in range(0, len(d), L)) for d in docs])
    assert np.all(np.abs((est.mean - truth) / est.stderr) < Z_MAX)


@needs_lm_eval
def test_harness_rejects_unknown_model_args(unigram):
    run = unigram
    from infodiff.harness import InfodiffLM

    with pytest.raises(ValueError, match="unknown model_args"):
        InfodiffLM(run=run, confidense=0.9)
    with pytest.raises(ValueError, match="give workdir"):
        InfodiffLM()


# ---------------------------------------------------------------------------------------------
# A trained run: lm-eval's CLI, evaluate.py and infodiff.choose give the same decisions
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(trained_masked_run, tmp_path_factory):
    """This module's copy of the suite's tiny trained masked run (tests/conftest.py)."""
    from tests.conftest import copy_run

    return copy_run(trained_masked_run, tmp_path_factory.mktemp("choices_run") / "run")


@needs_lm_eval
@pytest.mark.slow
def test_harness_cli_evaluate_and_choose_agree(run_dir, tmp_path):
    qs = [{"id": f"q{i}", "prompt": p, "choices": c, "answer": a} for i, (p, c, a) in enumerate([
        ("in the beginning", ["god created", "xqz vvv", "the end"], 0),
        ("to be or not", ["to be", "qqqq zz", "and so"], 0),
        ("and the lord", ["spake unto", "kkk kkk"], 0)])]
    task = tmp_path / "task"
    task.mkdir()
    (task / "mc.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    (task / "t.yaml").write_text(
        "task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + str(task / "mc.jsonl")
        + "\ntest_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{prompt}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: answer\ntarget_delimiter: \" \"\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    env = dict(os.environ, PYTHONPATH=ROOT, HF_DATASETS_OFFLINE="1")
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "infodiff.harness", "--model", "infodiff", "--model_args",
                        f"workdir={run_dir}", "--tasks", "tiny_mc", "--include_path", str(task), "--output_path",
                        str(out)], env=env, capture_output=True, text=True, cwd=str(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "acc MC error" in p.stdout and "tiny_mc" in p.stdout
    harness = json.loads(sorted(out.glob("infodiff_choices_*.json"))[-1].read_text())
    h_choice = [q["choice"] for q in sorted(harness["questions"], key=lambda q: q["doc_id"])]

    p = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "--workdir", str(run_dir),
                        f"--config.eval.input={task / 'mc.jsonl'}"], env=env, capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "accuracy" in p.stdout and "decided at confidence 0.95" in p.stdout
    rows_path = [os.path.join(dp, "rows.jsonl") for dp, _, fs in os.walk(run_dir) if "rows.jsonl" in fs][0]
    rows = [json.loads(ln) for ln in open(rows_path)]
    run = infodiff.load_run(str(run_dir))
    res = infodiff.choose(run, [q["prompt"] for q in qs], [q["choices"] for q in qs], answers=[q["answer"] for q in qs])
    assert h_choice == [r["choice"] for r in rows] == res.choice.tolist()
    assert [r["value"] for r in rows] == pytest.approx(res.margin.tolist(), rel=1e-5)  # evaluate.py splits rows over CPU devices: float rounding
    # generate_until: the ancestral sampler continues the context, cut at `until`
    from infodiff.harness import InfodiffLM

    lm = InfodiffLM(run=run)
    (text,) = lm.generate_until(_instances("generate_until", [("in the beginning", {"until": ["\n"],
                                                                                      "max_gen_toks": 6})]))
    assert isinstance(text, str) and len(text) <= 6 and set(text) <= set(text_data.VOCAB)


def test_choices_file_errors(tmp_path):
    from infodiff.evaluation import inputs

    def read(lines):
        f = tmp_path / "mc.jsonl"
        f.write_text("".join(lines))
        return inputs.read_input(str(f))

    kind, ids, cols = read(['{"prompt": "a", "choices": ["b", "c"], "answer": 1}\n'])
    assert kind == "choices" and cols["answer"] == [1] and cols["choices"] == [["b", "c"]]
    f = tmp_path / "bom.jsonl"  # a UTF-8 BOM: still a choices file
    f.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "a", "choices": ["b", "c"]}\n')
    assert inputs.read_input(str(f))[0] == "choices"
    with pytest.raises(ValueError, match=r"mc.jsonl:2: \"answer\" is given on some lines only"):
        read(['{"prompt": "a", "choices": ["b", "c"], "answer": 1}\n', '{"prompt": "a", "choices": ["b", "c"]}\n'])
    with pytest.raises(ValueError, match=r"mc.jsonl:1: 'answer' must be the index of an option, 0 to 1"):
        read(['{"prompt": "a", "choices": ["b", "c"], "answer": 2}\n'])
    with pytest.raises(ValueError, match=r"mc.jsonl:1: 'choices' must be a list of at least 2 strings"):
        read(['{"prompt": "a", "choices": ["b"]}\n'])
    with pytest.raises(ValueError, match=r"mc.jsonl:2: keys"):
        read(['{"prompt": "a", "choices": ["b", "c"]}\n', '{"prompt": "a", "response": "b"}\n'])


def test_report_rows_of_one_question_with_an_answer():
    """One question: lm-eval's acc_stderr is not defined (null), the report still renders."""
    from infodiff.evaluation import report as report_lib

    s = {"questions": 1, "fraction_decided": 1.0, "confidence": 0.95, "forward_passes_per_question_mean": 64.0,
         "forward_passes_per_question_median": 64.0, "forward_passes_per_question_max": 64, "adaptive": True,
         "first_samples": 32, "max_samples": 128, "coupled": True, "expected_flips": 0.0, "accuracy": 1.0,
         "accuracy_stderr": None, "accuracy_mc_stderr": 0.0}
    rows = dict(report_lib._input_summary_rows({"summary": s, "input": {"format": "choices"}}))
    assert rows["accuracy"].startswith("1.0000 ± 0.0000 (Monte Carlo")


def test_lm_eval_command_without_the_extra_is_one_line():
    env = dict(os.environ, PYTHONPATH=ROOT)
    code = "import sys; sys.modules['lm_eval'] = None; from infodiff.commands import lm_eval; sys.exit(lm_eval.run())"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"error: infodiff-lm-eval needs lm-evaluation-harness: pip install -e '{ROOT}[harness]' "
        "(or pip install 'lm-eval>=0.4.13')"]  # from a checkout; installed: pip install 'infodiff[harness]'
    # an installed copy (no pyproject.toml beside the package) names the extra of the package
    code = ("import os, sys; os.path.isfile = lambda p: False; sys.modules['lm_eval'] = None; "
            "from infodiff.commands import lm_eval; sys.exit(lm_eval.run())")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "pip install 'infodiff[harness]'" in p.stderr, p.stderr
