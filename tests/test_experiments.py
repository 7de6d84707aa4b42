"""Experiment scripts (tiny settings) and their building blocks."""

import json
import os

import jax
import numpy as np
import pytest

import experiments
from infodiff import likelihood as lk, oracles
from infodiff.data import text as text_data


def test_auroc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(0.7, size=60)
    b[:3] = a[:3]  # ties count one half
    pairwise = np.mean((b[None, :] > a[:, None]) + 0.5 * (b[None, :] == a[:, None]))
    assert experiments.auroc(a, b) == pytest.approx(pairwise, abs=1e-12)


def test_python_docs_corpus_is_clean_english():
    txt = experiments.python_docs_text()
    assert len(txt) > 100_000
    assert set(txt) <= set(text_data.VOCAB)
    assert " the " in txt


def test_aligned_batches_do_not_straddle_sequences():
    stream = np.repeat(np.arange(20, dtype=np.uint8) % 4, 8)  # 20 sequences of 8 equal symbols
    x = text_data.train_batch(stream, 8, 64, seed=0, step=3, aligned=True)
    assert np.all(x == x[:, :1])


def test_paired_estimates_share_masks():
    mk = oracles.random_markov(np.random.default_rng(1), "ACGT", 2)
    x = mk.sample(np.random.default_rng(2), 3, length=12)
    y2 = mk.sample_response(np.random.default_rng(3), x[:, :6], 6)
    kw = dict(estimator="time_free", num_samples=64)
    ea, eb = lk.paired_conditional_nll(mk, x[:, :6], x[:, 6:], y2, jax.random.PRNGKey(0), **kw)
    r = lk.log_ratio(mk, x[:, :6], x[:, 6:], y2, jax.random.PRNGKey(0), **kw)
    np.testing.assert_allclose(r.samples, eb.samples - ea.samples)
    assert r.forward_passes == ea.forward_passes + eb.forward_passes == 128
    # The same draw for y and y' = y gives a difference of exactly zero.
    ea, eb = lk.paired_conditional_nll(mk, x[:, :6], x[:, 6:], x[:, 6:], jax.random.PRNGKey(0),
                                       estimator="time_free", num_samples=16)
    np.testing.assert_array_equal(ea.samples, eb.samples)


def _tiny(cfg):
    cfg.model.update(dict(num_layers=1, num_heads=2, width=32))
    cfg.train.update(dict(num_steps=4, batch_size=16, log_every=2, eval_every=4, eval_batches=1,
                          ckpt_every=4))
    return cfg


@pytest.mark.slow
def test_dna128_experiment_runs_and_writes_results(tmp_path):
    from configs import exp_dna128

    cfg = _tiny(exp_dna128.get_config())
    cfg.toy.update(dict(num_train=2000, num_valid=200, num_mc=8))
    res = experiments.run(cfg, str(tmp_path))
    for ext in ("json", "md", "png"):
        assert os.path.getsize(tmp_path / f"results.{ext}") > 0
    assert os.path.getsize(tmp_path / "train" / "training_curves.png") > 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["num_sequences"] == 128 and len(saved["per_sequence"]) == 128
    # An almost untrained model: the enumerated value is near 8 log 4 for every sequence, far
    # above the exact NLL -- the experiment must report a large error, not hide it.
    assert res["model_vs_truth_enumerated"]["mean_error"] > 1.0


@pytest.mark.slow
def test_markov_and_variance_experiments_run(tmp_path):
    from configs import exp_variance

    cfg = _tiny(exp_variance.get_config())
    cfg.toy.update(dict(num_train=500, num_valid=50, num_pairs=4, num_mc=4))
    cfg.variance.update(dict(num_pairs=3, reps=3, budgets=(32,), estimators=("time_free", "stratified"),
                             ratio_samples=(5,), ratio_reps=3, vpf_passes=256, batch_size=2048))
    res = experiments.run(cfg, str(tmp_path / "variance"))
    vpf = res["variance_per_forward_pass"]
    assert set(vpf) == {"dna128", "markov4_conditional"}
    for rows in vpf.values():
        assert rows["stratified"]["ratio_time_free_over_this"] > 3
        for r in rows.values():
            assert r["max_abs_z"] < 4.5
    cfg.experiment = "markov_cond"
    res = experiments.run(cfg, str(tmp_path / "variance"))  # reuses the trained model
    assert res["oracle_check"]["max_abs_z"] < 4.5
    assert (tmp_path / "variance" / "results.png").exists()


def test_exact_time_free_values_equal_the_exact_nll_for_an_oracle():
    """Enumerating every mask with the exact oracle gives -log p(x) to float32 round-off."""
    tab = oracles.random_tabular(np.random.default_rng(3), "ACGT", 6, 40)
    x = tab.sample(np.random.default_rng(4), 5)
    vals = experiments.exact_time_free_values(tab, x, 4, batch_size=100)  # several chunks
    np.testing.assert_allclose(vals, -tab.log_prob(x), rtol=2e-5)


def test_bad_experiment_settings_are_refused(tmp_path):
    from configs import exp_markov_cond

    cfg = exp_markov_cond.get_config()
    cfg.toy.num_mc = 1
    with pytest.raises(ValueError, match=r"config.toy.num_mc=1 must be an integer >= 2"):
        experiments.run(cfg, str(tmp_path))
    cfg.toy.num_mc = 4
    cfg.experiment = "nope"
    with pytest.raises(ValueError, match="unknown experiment 'nope'"):
        experiments.run(cfg, str(tmp_path))


def test_markov_toy_reads_a_table_file_and_refuses_a_bad_one(tmp_path):
    """config.toy.table: the chain of the file (to the table's float64 values); a missing file or
    a chain of another order is refused naming the file."""
    from configs import exp_markov_cond

    tc = exp_markov_cond.get_config().toy
    src = oracles.random_markov(np.random.default_rng(5), "ACGT", 4, 0.3)
    path = tmp_path / "table.json"
    path.write_text(json.dumps(src.to_json()))
    tc.table = str(path)
    chain = experiments.markov_chain(tc)
    assert chain.order == 4
    x = src.sample(np.random.default_rng(6), 8, 12)
    np.testing.assert_allclose(chain.log_prob(x), src.log_prob(x), rtol=1e-12)
    tc.table = ""  # generated: a different chain
    assert not np.allclose(experiments.markov_chain(tc).log_prob(x), src.log_prob(x))
    tc.table = str(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match=r"missing.json': no such file \(give a JSON file \{context: "
                                                r"\{symbol: probability\}\}"):
        experiments.markov_chain(tc)
    tc.table = str(tmp_path)
    with pytest.raises(FileNotFoundError, match="is a directory"):
        experiments.markov_chain(tc)
    path3 = tmp_path / "order3.json"
    path3.write_text(json.dumps(oracles.random_markov(np.random.default_rng(5), "ACGT", 3).to_json()))
    tc.table = str(path3)
    with pytest.raises(ValueError, match="order 3"):
        experiments.markov_chain(tc)


def test_paper_override_sets():
    """configs/exp_*.py:paper hold the paper's settings; an unknown variant is refused."""
    from configs import exp_dna128, exp_markov_cond

    d = exp_dna128.get_config("paper")
    assert (d.model.num_layers, d.model.width, d.model.num_heads) == (8, 256, 8)
    assert (d.train.batch_size, d.train.num_steps, d.optim.lr) == (512, 70_000, 3e-4)
    m = exp_markov_cond.get_config("paper")
    assert (m.train.batch_size, m.train.num_steps, m.optim.lr, m.optim.weight_decay) == (1024, 80_000, 6e-4, 0.01)
    from configs import exp_variance

    assert exp_variance.get_config("paper").train.batch_size == 1024
    for c in (d, m):
        assert (c.optim.decay, c.optim.warmup_steps, c.optim.b2, c.optim.ema_decay, c.model.dropout) == (
            "constant", 2500, 0.999, 0.9999, 0.02)
    assert exp_markov_cond.get_config().train.batch_size == 64  # the CPU default is unchanged
    with pytest.raises(ValueError, match="unknown config variant 'papr'"):
        exp_dna128.get_config("papr")


@pytest.mark.slow
def test_temperature_override_with_a_table_is_refused(tmp_path):
    """A chain read from a file has no temperature: overriding it is an unread key, refused in one
    line before any work."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = tmp_path / "table.json"
    path.write_text(json.dumps(oracles.random_markov(np.random.default_rng(5), "ACGT", 4).to_json()))
    p = subprocess.run([sys.executable, "run_experiment.py", "--config", "configs/exp_markov_cond.py",
                        f"--workdir={tmp_path / 'w'}", f"--config.toy.table={path}",
                        "--config.toy.temperature=0.3"], cwd=repo, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "toy.temperature" in p.stderr and "toy.table is empty" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_an_interrupted_training_stops_the_experiment(tmp_path, monkeypatch):
    """Ctrl-C during an experiment's training (a checkpoint saved, ``interrupted`` set) stops the
    experiment: nothing is scored or written with a half-trained model."""
    from configs import exp_dna128
    from infodiff import training

    monkeypatch.setattr(training, "train", lambda task, workdir: {"interrupted": "SIGINT", "step": 3})
    cfg = _tiny(exp_dna128.get_config())
    cfg.toy.update(dict(num_train=200, num_valid=20, num_mc=8))
    with pytest.raises(KeyboardInterrupt):
        experiments.run(cfg, str(tmp_path))
    assert not (tmp_path / "results.json").exists()
