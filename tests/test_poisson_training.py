"""End-to-end Poisson diffusion: the Poisson task of infodiff.tasks trained by infodiff.training
(train -> checkpoint -> resume) and evaluated by infodiff.poisson_training (CLI and library)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import poisson_common
from infodiff import evaluation
from infodiff import likelihood as lk
from infodiff import tasks, training
from infodiff.data import counts as counts_lib
from infodiff.tasks import poisson as poisson_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config(**over):
    c = poisson_common.base("poisson_synthetic")
    c.data.name = "synthetic"
    c.data.num_train, c.data.num_valid, c.data.num_test = 256, 64, 64
    c.model.hidden = 16
    c.model.num_layers = 1
    c.model.emb_dim = 8
    c.optim.warmup_steps = 2
    c.train.batch_size = 32
    c.train.num_steps = 4
    c.train.log_every = 2
    c.train.eval_every = 100  # validation only at the end (keeps the test fast)
    c.train.eval_batches = 1
    c.train.ckpt_every = 2
    c.eval.num_samples = 8
    c.eval.num_generate = 200
    c.eval.sample_steps = 30
    for k, v in over.items():
        sec, key = k.split(".")
        c[sec][key] = v
    return c


def _pmf_data(seed=0):
    """A 2-D product pmf on {0..4} (independent of the synthetic-distribution module)."""
    probs = np.array([0.35, 0.25, 0.2, 0.15, 0.05])
    splits = {}
    for i, (k, n) in enumerate((("train", 256), ("valid", 64), ("test", 64))):
        rng = np.random.default_rng([seed, i])
        splits[k] = rng.choice(5, size=(n, 2), p=probs).astype(np.int32)
    return counts_lib.make_dataset("toy", splits, (2,), 4, "toy pmf"), probs


def _params_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _train(cfg, workdir, data=None, **kwargs):
    return training.train(tasks.make_task(cfg, data=data), str(workdir), **kwargs)


def _restore(cfg, workdir, data=None):
    return training.load_checkpoint(str(workdir), tasks.make_task(cfg, data=data))


@pytest.mark.slow
def test_untrained_prior_init_nll_matches_independent_entropy(tmp_path):
    """With init_prior and zero output layer, step 0's denoiser is the EXACT posterior mean of the
    training marginals, so the estimated NLL equals the exact cross-entropy within 4 SE."""
    data, probs = _pmf_data()
    cfg = _tiny_config(**{"train.num_steps": 0, "eval.num_samples": 32, "eval.num_generate": 0})
    result = _train(cfg, tmp_path / "w", data)
    assert result["step"] == 0 and len(result["proposal"]) == 3
    task = tasks.make_task(cfg, data=data)
    state, _ = training.load_checkpoint(str(tmp_path / "w"), task)
    den, scaling = task.denoiser(state.ema_params), task.scaling
    # EMA == params at step 0; prior_logits = log of the smoothed training histogram
    q = np.exp(tasks.empirical_prior_logits(data.flat("train"), 5)).astype(np.float64)
    x = data.flat("test")
    exact = -(np.log(q[0][x[:, 0]]) + np.log(q[1][x[:, 1]]))
    prop = tasks.poisson_proposal(cfg, scaling.scale(data.flat("train")), scaling)
    assert list(prop) == result["proposal"]
    est = lk.nll(den, scaling.scale(x), jax.random.key(3), num_samples=int(cfg.eval.num_samples),
                 process=tasks.poisson_estimation_process(cfg, scaling, prop))
    err = est.mean - exact
    se = np.sqrt(np.sum(est.stderr**2)) / len(x)
    assert abs(err.mean()) < 4 * se, (err.mean(), se)


def test_bad_inputs(tmp_path):
    data, _ = _pmf_data()
    bad = counts_lib.make_dataset("toy", {"train": np.full((64, 2), 7, np.int32), "valid": data.valid,
                                   "test": data.test}, (2,), 4, "bad")
    with pytest.raises(ValueError, match=r"exceeds max_count = 4"):
        _train(_tiny_config(), tmp_path / "b", bad)
    neg = counts_lib.make_dataset("toy", {"train": np.full((64, 2), -1, np.int32), "valid": data.valid,
                                   "test": data.test}, (2,), 4, "neg")
    with pytest.raises(ValueError, match="-1"):
        _train(_tiny_config(), tmp_path / "n", neg)
    with pytest.raises(ValueError, match="workdir"):
        _train(_tiny_config(), "", data)
    with pytest.raises(ValueError, match="proposal='nope'"):
        _train(_tiny_config(**{"process.proposal": "nope"}), tmp_path / "p", data)
    with pytest.raises(ValueError, match="config.data.distribution='nope'"):
        tasks.make_task(_tiny_config(**{"data.distribution": "nope"})).data
    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        training.load_checkpoint(str(tmp_path / "nothing"), tasks.make_task(_tiny_config(), data=data))


# Overrides shared by the CLI run and the in-process run (a tiny synthetic problem): the
# registration's tiny run.
_OVER = poisson_task.TINY_RUN


@pytest.mark.slow
def test_cli_train_equals_library_resume_and_evaluate(tmp_path):
    """train.py's run equals the library's interrupted and resumed run (the generated resume test
    of test_training.py covers the library alone); then evaluate.py on it."""
    from configs import poisson_synthetic

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    wd = str(tmp_path / "cli")
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/poisson_synthetic.py", "--workdir", wd,
                        *[f"--config.{k}={v}" for k, v in _OVER.items()]],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

    # the same run in-process, interrupted at step 2 and resumed: bit-identical to the CLI run
    cfg = poisson_synthetic.get_config()
    for k, v in _OVER.items():
        sec, key = k.split(".")
        cfg[sec][key] = v
    part = _train(cfg, tmp_path / "part", stop_at_step=2)
    assert part["step"] == 2
    resumed = _train(cfg, tmp_path / "part")
    assert resumed["step"] == 4 and np.isfinite(resumed["valid"]["loss"])
    sa, _ = _restore(cfg, wd)
    sb, meta = _restore(cfg, tmp_path / "part")
    assert _params_equal(sa.params, sb.params) and _params_equal(sa.ema_params, sb.ema_params)
    assert meta["step"] == 4
    # metrics.jsonl: each train step logged once after the resume; nats and bits/dim agree
    recs = [json.loads(line) for line in open(tmp_path / "part" / "metrics.jsonl")]
    assert [r["step"] for r in recs if r["split"] == "train"] == [2, 4]
    m = recs[-1]["metrics"]
    assert abs(m["bpd"] - m["loss"] / np.log(2)) < 1e-5  # D = 1
    # a changed model key cannot resume
    bad = poisson_synthetic.get_config()
    for k, v in dict(_OVER, **{"model.hidden": 32}).items():
        sec, key = k.split(".")
        bad[sec][key] = v
    with pytest.raises(training.ConfigMismatchError, match="model.hidden"):
        _train(bad, tmp_path / "part")

    r = subprocess.run([sys.executable, "evaluate.py", "--workdir", wd, "--config.eval.num_samples=4",
                        "--config.eval.num_generate=100", "--config.eval.sample_steps=20"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(os.path.join(wd, "report.json")))
    assert rep["version"] == evaluation.REPORT_VERSION and rep["kind"] == "network"
    assert rep["process"]["name"] == "poisson" and rep["data"]["num_items"] == 64
    assert rep["units"]["bits"] == "bits per dimension" and rep["units"]["tokens_per_item"] == 1
    assert np.isfinite(rep["nll"]) and rep["nll_stderr"] > 0 and rep["stderr_data_and_mc"] > 0
    assert abs(rep["terms"]["total"] - rep["nll"]) < 1e-9
    assert rep["extras"]["exact_entropy_nats_per_example"] > 0 and rep["extras"]["wasserstein1"] >= 0
    assert os.path.exists(os.path.join(wd, "samples.png")) and "bits per dimension" in r.stdout
    # a typo in an override is an error (locked config)
    r = subprocess.run([sys.executable, "evaluate.py", "--workdir", wd, "--config.eval.num_sample=4"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "num_sample" in r.stderr

@pytest.mark.slow
def test_oracle_mode_matches_exact_entropy_and_increment_sampler_beats_paper():
    from configs import oracle_poisson

    c = oracle_poisson.get_config()
    c.data.distribution = "zip"
    c.eval.num_examples, c.eval.num_samples = 100, 32
    c.eval.num_generate, c.eval.sampler_steps = 2000, (100,)
    rep = evaluation.evaluate_oracle(c)
    # exact denoiser: the MC estimate equals the exact -log p(x) of the same samples within 4 SE
    row = rep["results"]["unconditional"][0]
    assert abs(row["bias"]) < 4 * row["bias_stderr"], rep
    assert rep["exact_entropy_nats"] > 0 and rep["process"]["name"] == "poisson"
    s = rep["results"]["samplers"][0]
    # TV of an exact sample of 2000 draws is ~tv_of_exact_sample; the increment sampler is close
    # to it, the paper-literal Algorithm 2 is biased (docs/poisson.md §4.4: 0.10 at T = 100)
    assert s["tv"]["increment"][0] < 3 * s["tv_of_exact_sample"] + 0.01
    assert s["tv"]["paper"][0] > s["tv"]["increment"][0] + 0.05
    assert "sampler total variation" in evaluation.format_report(rep)
