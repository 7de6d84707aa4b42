"""Tests for infodiff.training (the loop, state, checkpoints), infodiff.tasks (the masked task)
and train.py (tiny models; CPU-fast).

In-process tests share one tiny config so that, with the persistent compilation cache enabled
for this module, each distinct XLA program is compiled once. No test needs the network: the
corpus is a synthetic object (in process) or a tiny text8-format file (CLI).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from infodiff import tasks, training
from infodiff.data import text as text_data
from tests.conftest import (PHRASE, copy_run, persistent_compilation_cache, tiny_masked_config,  # noqa: F401
                            toy_corpus, train_run, xla_flags)

REPO = Path(__file__).resolve().parents[1]


# The tiny config, corpus and training call shared by the suite (tests/conftest.py); the names
# tiny_config, toy_corpus, train_run, PHRASE stay importable from here.
tiny_config = tiny_masked_config


def load(workdir, config=None):
    """(state, meta) of the latest checkpoint; `config` default: the checkpoint's own."""
    if config is None:
        config = ml_collections.ConfigDict(training.load_meta(workdir)["config"])
    return training.load_checkpoint(workdir, tasks.make_task(config))


def read_metrics(workdir) -> list[dict]:
    with open(Path(workdir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(session_xla_cache):
    """Persistent XLA cache for this module (and the modules importing this fixture): identical
    programs compile once. The directory is the session's (tests/conftest.py), which the
    shared trained runs filled: their programs are not compiled again here."""
    with persistent_compilation_cache(session_xla_cache) as cache_dir:
        yield cache_dir


def _leaves_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    return len(la)


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_loss_decreases_on_learnable_stream(trained_masked_run, trained_masked_result):
    tmp_path, result = trained_masked_run, trained_masked_result  # tiny_config() trained on toy_corpus()
    train = [r for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert [r["step"] for r in train] == [10, 20, 30]
    first, last = train[0]["metrics"]["bpc"], train[-1]["metrics"]["bpc"]
    # Uniform over 27 symbols is log2(27) = 4.75 bits/char; the network starts there exactly.
    assert first < np.log2(27) + 0.05
    assert last < first - 1.0, (first, last)
    assert result["step"] == 30 and result["interrupted"] is None
    assert result["valid"]["bpc"] < np.log2(27) - 1.0, result["valid"]
    for r in train:
        m = r["metrics"]
        assert set(m) >= {"loss", "bpc", "grad_norm", "lr", "tokens_per_s", "steps_per_s"}
        np.testing.assert_allclose(m["bpc"], m["loss"] / (16 * np.log(2)), rtol=1e-5)
    assert (tmp_path / "config.json").exists()
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [10, 20, 30]


# ---------------------------------------------------------------------------------------------
# Checkpoint / resume
# ---------------------------------------------------------------------------------------------
RESUMABLE = [name for name, reg in tasks.REGISTRY.items() if reg.tiny_config is not None]


def test_the_resume_test_is_generated_from_the_registry():
    assert {"masked", "sedd", "poisson", "test_masked"} <= set(RESUMABLE)


@pytest.mark.slow
@pytest.mark.parametrize("name", RESUMABLE)
def test_resume_is_bit_identical(tmp_path, name):
    """Every registration's tiny run (``tiny_config()``): N steps in one go and N/2 steps then a
    resume for the other N/2 give bit-identical states (params, EMA params, optimizer moments,
    counts) and metrics (all but the throughput)."""
    cfg = tasks.REGISTRY[name].tiny_config()
    N = int(cfg.train.num_steps)
    full = training.train(tasks.make_task(cfg), tmp_path / "full")
    part = training.train(tasks.make_task(cfg), tmp_path / "part", stop_at_step=N // 2)
    assert part["step"] == N // 2
    resumed = training.train(tasks.make_task(cfg), tmp_path / "part")
    assert full["step"] == resumed["step"] == N and full["valid"] == resumed["valid"]
    task = tasks.make_task(cfg)
    s_full, _ = training.load_checkpoint(tmp_path / "full", task)
    s_res, _ = training.load_checkpoint(tmp_path / "part", task)
    assert _leaves_equal(s_full, s_res) > 10

    def logged(workdir):
        timing = {"steps_per_s", task.rate_name}
        return [(r["step"], r["split"], {k: v for k, v in r["metrics"].items() if k not in timing})
                for r in read_metrics(workdir)]

    assert logged(tmp_path / "full") == logged(tmp_path / "part")


@pytest.mark.slow
def test_resume_from_an_earlier_checkpoint_and_its_config_checks(tmp_path, trained_masked_run,
                                                                  trained_masked_result):
    """The masked run stopped at 17 resumed from checkpoint 10 (17 lost) recomputes 11..17 to
    the uninterrupted run's state; the records logged after 10 are dropped; a changed model /
    optimizer key or data is refused; a cadence change is not."""
    cfg, corpus = tiny_config(), toy_corpus()
    full = trained_masked_result  # tiny_config() trained on toy_corpus(), written here:
    copy_run(trained_masked_run, tmp_path / "full")
    assert full["step"] == 30

    # Interrupted run: stops at step 17 (checkpoints 10 and 17) ...
    part = train_run(cfg, tmp_path / "part", corpus, stop_at_step=17)
    assert part["step"] == 17
    ckpts = tmp_path / "part" / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir()) == [10, 17]
    _, meta = load(tmp_path / "part", cfg)
    assert meta["step"] == 17 and meta["data_position"] == 17 and meta["seed"] == cfg.seed
    assert meta["provenance"]["data"] == meta["data"] and meta["provenance"]["packages"]["infodiff"]  # who wrote it
    # ... and as if it had been killed before saving 17: resume from 10 recomputes 11..17.
    shutil.rmtree(ckpts / "17")
    resumed = train_run(cfg, tmp_path / "part", corpus)
    assert resumed["step"] == 30

    s_full, _ = load(tmp_path / "full", cfg)
    s_res, _ = load(tmp_path / "part", cfg)
    assert int(s_full.step) == int(s_res.step) == 30
    n = _leaves_equal(s_full, s_res)  # params, EMA params, Adam moments, counts: bit-identical
    assert n > 10
    # and training actually moved the parameters away from the initialisation
    s_init = training.init_train_state(tasks.make_task(cfg).init_params, training.make_optimizer(cfg),
                                       jax.random.fold_in(jax.random.key(cfg.seed), 0))
    diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), s_full.params, s_init.params)
    assert max(jax.tree_util.tree_leaves(diffs)) > 1e-3
    # Validation numbers of both runs at the final step agree too (same EMA params, same keys).
    v_full = [r for r in read_metrics(tmp_path / "full") if r["split"] == "valid"][-1]
    v_res = [r for r in read_metrics(tmp_path / "part") if r["split"] == "valid"][-1]
    assert v_full["step"] == v_res["step"] == 30
    assert v_full["metrics"] == v_res["metrics"]
    # Records logged after checkpoint 10 by the interrupted run were dropped on resume:
    # every (step, split) appears exactly once.
    keys = [(r["step"], r["split"]) for r in read_metrics(tmp_path / "part")]
    assert len(keys) == len(set(keys)) and (20, "train") in keys

    # Resuming with a different (non-resumable) config is an error naming the keys ...
    bad = tiny_config(**{"optim.b1": 0.8, "model.width": 64})
    with pytest.raises(training.ConfigMismatchError, match=r"model\.width.*optim\.b1"):
        train_run(bad, tmp_path / "full", corpus)
    # ... and so is resuming on different data.
    other = toy_corpus()
    other.checksums = dict(other.checksums, train="different")
    with pytest.raises(training.ConfigMismatchError, match="checksums"):
        train_run(cfg, tmp_path / "full", other)
    # Cadence changes are allowed: extending the run on its schedule continues from step 30.
    longer = tiny_config(**{"train.num_steps": 32, "train.log_every": 1, "train.ckpt_every": 7,
                            "optim.decay_steps": 30})
    assert train_run(longer, tmp_path / "full", corpus)["step"] == 32


@pytest.mark.slow
def test_signal_saves_checkpoint_and_resumes(tmp_path, monkeypatch):
    cfg, corpus = tiny_config(), toy_corpus()
    real_batch = text_data.train_batch

    def batch_then_interrupt(tokens, seq_len, batch_size, seed, step, **kwargs):
        if step == 5:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C during step 5
        return real_batch(tokens, seq_len, batch_size, seed, step, **kwargs)

    monkeypatch.setattr(text_data, "train_batch", batch_then_interrupt)
    before = signal.getsignal(signal.SIGINT)
    result = train_run(cfg, tmp_path, corpus)
    assert result["interrupted"] == "SIGINT"
    assert result["step"] == 6  # step 5 completes, then the loop stops
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    state, meta = load(tmp_path, cfg)
    assert int(state.step) == 6 and meta["data_position"] == 6

    monkeypatch.setattr(text_data, "train_batch", real_batch)
    again = train_run(cfg, tmp_path, corpus)
    assert again["interrupted"] is None and again["step"] == 30


# ---------------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------------
def test_bad_tokens_raise(tmp_path):
    cfg = tiny_config()
    corpus = toy_corpus()
    corpus.train = corpus.train.copy()
    corpus.train[123] = 27  # the MASK id must never be data
    with pytest.raises(ValueError, match=r"token id 27 .*index 123"):
        train_run(cfg, tmp_path / "a", corpus)
    corpus = toy_corpus()
    corpus.valid = corpus.valid.astype(np.int32)
    corpus.valid[7] = -3
    with pytest.raises(ValueError, match=r"validation.*token id -3"):
        train_run(cfg, tmp_path / "b", corpus)
    with pytest.raises(ValueError, match="workdir"):
        train_run(cfg, "")
    with pytest.raises(ValueError, match=r"config.train.log_every must be >= 1; got 0"):
        train_run(tiny_config(**{"train.log_every": 0}), tmp_path / "c")
    c = tiny_config()
    c.process.name = "gaussian"
    with pytest.raises(ValueError, match=r"config.process.name='gaussian'; choose from"):
        tasks.make_task(c)


def test_batch_not_divisible_by_devices_raises():
    mesh = training.make_mesh()
    training.check_batch_divisible(8, mesh)  # 1 device: anything positive is fine
    with pytest.raises(ValueError, match="batch size 0"):
        training.check_batch_divisible(0, mesh)
    # (the 4-device case is in test_sharded_matches_single_device)


def test_lr_schedule_and_optimizer():
    cfg = tiny_config(**{"train.num_steps": 100, "optim.warmup_steps": 10})
    sched = training.make_lr_schedule(cfg)
    np.testing.assert_allclose([sched(0), sched(5), sched(10), sched(100)],
                               [0.0, 1.5e-3, 3e-3, 3e-4], rtol=1e-5)
    # shorter than the warmup (e.g. a smoke run with the default 200-step warmup): still valid
    short = training.make_lr_schedule(tiny_config(**{"train.num_steps": 60, "optim.warmup_steps": 200}))
    np.testing.assert_allclose([short(0), short(59), short(200)], [0.0, 3e-3 * 59 / 200, 3e-3], rtol=1e-5)
    const = training.make_lr_schedule(tiny_config(**{"optim.decay": "constant", "optim.warmup_steps": 4}))
    np.testing.assert_allclose([const(2), const(4), const(1000)], [1.5e-3, 3e-3, 3e-3], rtol=1e-6)
    with pytest.raises(ValueError, match="decay"):
        training.make_lr_schedule(tiny_config(**{"optim.decay": "linear"}))
    # the denoiser wrapper: eval mode, vocab_size, hashable by identity
    task = tasks.make_task(cfg)
    state = training.init_train_state(task.init_params, training.make_optimizer(cfg), jax.random.key(0))
    den = task.denoiser(state.params)
    assert den.vocab_size == 27 and hash(den) == hash(den) and den != task.denoiser(state.params)
    out = jax.jit(den)(jnp.full((2, 16), 27, jnp.int32), jnp.ones((2,)))
    assert out.shape == (2, 16, 27) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, -np.log(27.0), rtol=1e-6)  # zero-initialised head


@pytest.mark.parametrize("decay", ["cosine", "constant"])
def test_warmup_warning_only_when_the_run_ends_inside_the_warmup(decay):
    def warning(num_steps, warmup):
        return training.warmup_warning(tiny_config(**{"train.num_steps": num_steps,
                                                      "optim.warmup_steps": warmup, "optim.decay": decay}))

    msg = warning(100, 300)
    assert msg.startswith("config.train.num_steps=100 ends inside the 300-step warmup "
                          "(config.optim.warmup_steps): the learning rate never reaches config.optim.lr=0.003")
    assert "peaks at 0.00099," in msg and "lower config.optim.warmup_steps or train longer" in msg
    # num_steps == warmup: the last update (step 299) is still at 299/300 of the peak
    msg = warning(300, 300)
    assert "num_steps=300 ends inside the 300-step warmup" in msg and "peaks at 0.00299," in msg
    for num_steps, warmup in [(301, 300), (30, 2), (5, 0), (0, 200)]:
        assert warning(num_steps, warmup) is None, (num_steps, warmup)


@pytest.mark.slow
def test_run_inside_the_warmup_logs_one_warning(tmp_path, caplog):
    """The loop logs the warning once, at the start (when none is due: the test above)."""
    import logging as logging_std

    with caplog.at_level(logging_std.WARNING):
        train_run(tiny_config(**{"train.num_steps": 2, "optim.warmup_steps": 2, "train.ckpt_every": 2}),
                  tmp_path / "short")
    lines = [r.getMessage() for r in caplog.records if "warmup" in r.getMessage()]
    assert lines == [training.warmup_warning(tiny_config(**{"train.num_steps": 2, "optim.warmup_steps": 2}))]
    assert "num_steps=2 ends inside the 2-step warmup" in lines[0]


# ---------------------------------------------------------------------------------------------
# Data parallelism
# ---------------------------------------------------------------------------------------------
_SHARDED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    sys.path.insert(0, {repo!r})
    sys.path.insert(0, {tests!r})
    import test_training as T
    from infodiff import training
    assert jax.device_count() == 4, jax.devices()
    out = T.sharded_grads(training.make_mesh())
    np.savez({out!r}, **out)
    errors = {{}}
    try:
        training.check_batch_divisible(6, training.make_mesh())
    except ValueError as e:
        errors["check"] = str(e)
    try:
        T.train_run(T.tiny_config(**{{"train.batch_size": 6}}), {wd!r})
    except ValueError as e:
        errors["train"] = str(e)
    print("ERRORS=" + json.dumps(errors))
    """
)


def sharded_grads(mesh) -> dict:
    """Loss, gradients and one train step's metrics of a fixed batch and state on `mesh`."""
    cfg = tiny_config(**{"optim.warmup_steps": 0})
    task, opt = tasks.make_task(cfg), training.make_optimizer(cfg)
    state = training.init_train_state(task.init_params, opt, jax.random.key(3), mesh)
    # perturb the zero-initialised head so every gradient is non-trivial
    state = state.replace(params=jax.tree.map(lambda p: p + 0.05 * jnp.cos(jnp.arange(p.size).reshape(p.shape)),
                                              state.params))
    x_BxL = np.random.default_rng(0).integers(0, 27, (8, 16)).astype(np.int32)
    key = jax.random.key(11)
    repl, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    x_dev = jax.device_put(x_BxL, batch)
    assert len(x_dev.addressable_shards) == mesh.devices.size
    grad_fn = jax.jit(jax.value_and_grad(lambda p, x, k: task.loss_fn(p, x, k, train=True), has_aux=True),
                      in_shardings=(repl, batch, repl))
    (loss, loss_B), grads = grad_fn(state.params, x_dev, key)
    _, metrics = training.make_train_step(task, opt, mesh)(state, x_dev, key)
    out = {"loss": np.asarray(loss), "loss_B": np.asarray(loss_B),
           "grad_norm": np.asarray(metrics["grad_norm"]), "step_loss": np.asarray(metrics["loss"])}
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        out["g" + jax.tree_util.keystr(path)] = np.asarray(g)
    return out


@pytest.mark.slow
def test_sharded_matches_single_device(tmp_path):
    out_file = tmp_path / "sharded.npz"
    script = _SHARDED_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), out=str(out_file),
                                    wd=str(tmp_path / "wd6"))
    env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=4"), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.split("ERRORS=")[-1].strip())
    assert "multiple of the number of devices (4" in errors["check"]
    assert "batch size 6" in errors["train"]

    four = dict(np.load(out_file))
    one = sharded_grads(training.make_mesh(jax.devices()[:1]))
    assert set(one) == set(four) and len(one) > 10
    for k in one:
        np.testing.assert_allclose(four[k], one[k], rtol=1e-5, atol=1e-6 * np.abs(one[k]).max(),
                                   err_msg=k)
    assert float(one["loss"]) > 0


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_trains_and_writes_outputs(tmp_path, compilation_cache):
    text8 = tmp_path / "tiny_text8"
    text8.write_text((PHRASE * 800)[:30000])
    wd = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=compilation_cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    cmd = [sys.executable, "train.py", "--config", "configs/masked_text.py", f"--workdir={wd}",
           f"--config.data.path={text8}", "--config.train.num_steps=3", "--config.model.num_layers=1",
           "--config.model.num_heads=2", "--config.model.width=32", "--config.data.seq_len=16",
           "--config.train.batch_size=8", "--config.train.log_every=1", "--config.train.ckpt_every=2",
           "--config.train.eval_batches=1", "--config.optim.lr=2e-3"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir()) == [2, 3]
    records = read_metrics(wd)
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3]
    assert [r["step"] for r in records if r["split"] == "valid"] == [3]
    saved = json.loads((wd / "config.json").read_text())
    assert saved["optim"]["lr"] == 2e-3 and saved["data"]["path"] == str(text8)
    assert "Renaming" not in proc.stderr  # orbax INFO chatter is filtered
    state, meta = load(wd)
    assert int(state.step) == 3 and meta["config"]["model"]["width"] == 32

    # a typo in an override is an error (locked config), and --workdir is required
    typo = subprocess.run(cmd[:4] + ["--config.optim.lrr=1"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert typo.returncode != 0 and "lrr" in typo.stderr
    # without --config (the default config file): a misspelt key is one line too, no traceback
    typo = subprocess.run([sys.executable, "train.py", f"--workdir={wd}", "--config.train.mesh.fsdpp=2"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert typo.returncode == 1 and "Traceback" not in typo.stderr, typo.stderr[-2000:]
    assert typo.stderr.strip().splitlines() == ["error: unknown config key --config.train.mesh.fsdpp ('fsdpp' is "
                                                "not in the config); did you mean 'fsdp'?"], typo.stderr
    nowd = subprocess.run([sys.executable, "train.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert nowd.returncode != 0 and "workdir" in nowd.stderr

    # evaluate.py on the run: its saved config, overrides of the estimator and MC budget
    ev = subprocess.run([sys.executable, "evaluate.py", f"--workdir={wd}",
                         "--config.eval.estimator=k_dce", "--config.eval.num_samples=3",
                         "--config.eval.max_sequences=40", "--config.eval.batch_size=64"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert ev.returncode == 0, ev.stderr[-3000:]
    rep = json.loads((wd / "report.json").read_text())
    assert rep["kind"] == "network" and rep["estimator"] == "k_dce"
    assert rep["checkpoint_step"] == 3 and rep["params"] == "ema"
    assert rep["num_samples_per_item"] == 3 and rep["data"]["num_items"] == 40
    assert rep["forward_passes"] == 120 and rep["data"]["item_size"] == 16
    assert 0 < rep["bits"] < 10 and rep["bits_stderr"] > 0 and rep["units"]["tokens_per_item"] == 16
    assert rep["stderr_kind"].startswith("data+mc")
    assert "bits per character" in ev.stdout and (wd / "report.txt").exists()
    # Evaluating with another config than the run's is refused, naming the keys.
    ev = subprocess.run([sys.executable, "evaluate.py", f"--workdir={wd}", "--config",
                         "configs/masked_text.py"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=240)
    assert ev.returncode != 0 and "model." in ev.stderr and "ConfigMismatchError" in ev.stderr
    assert "--debug shows all" in ev.stderr and len(ev.stderr.strip()) < 400  # the first differences, one line


def test_config_differences_new_keys():
    saved = {"model": {"width": 32}, "eval": {"num_samples": 4}}
    new = {"model": {"width": 32, "added_later": 1}, "eval": {"num_samples": 8}}
    # eval.* may differ; a key the run never had is a difference when resuming ...
    assert training.config_differences(saved, new) == ["model.added_later"]
    # ... but not when evaluating an older run (saved_run.py fills it from the defaults).
    assert training.config_differences(saved, new, ignore_new_keys=True) == []
    assert training.config_differences(saved, {"model": {"width": 64}}, ignore_new_keys=True) == ["model.width"]


@pytest.mark.slow
def test_corrupt_checkpoint_is_skipped_and_named(tmp_path):
    c = tiny_config(**{"train.num_steps": 4, "train.ckpt_every": 2})
    train_run(c, tmp_path)
    (tmp_path / "checkpoints" / "4" / "meta" / "metadata").write_bytes(b"\xff\xfe garbage")
    # asked for by step: one clear error naming the step and the file
    for read in (lambda: training.load_checkpoint(tmp_path, tasks.make_task(c), step=4),
                 lambda: training.load_meta(tmp_path, step=4)):
        with pytest.raises(training.CheckpointError, match=r"checkpoint step 4: .*checkpoints/4/"):
            read()
    # by default every restore path (evaluation, metadata only, resuming) skips it for step 2
    assert load(tmp_path, c)[1]["step"] == 2 and training.load_meta(tmp_path)["step"] == 2
    assert train_run(c, tmp_path)["step"] == 4  # resumed from 2; the bad 4 is kept aside
    assert (tmp_path / training.CORRUPT_DIR / "4" / "meta" / "metadata").read_bytes() == b"\xff\xfe garbage"
    assert load(tmp_path, c)[1]["step"] == 4
    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        training.load_meta(tmp_path / "nothing")


def test_public_api_has_no_private_names():
    import infodiff.training.checkpoint
    import infodiff.training.loop
    import infodiff.training.state

    for mod in (training, tasks, infodiff.training.state, infodiff.training.checkpoint, infodiff.training.loop):
        assert not [n for n in mod.__all__ if n.startswith("_")], mod.__name__
        assert all(hasattr(mod, n) for n in mod.__all__), mod.__name__
    assert isinstance(tasks.make_task(tiny_config()), tasks.MaskedTask)
