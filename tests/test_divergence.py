"""Nothing lost to a diverged run (issue 24): NaN and exploding states are never saved, the
last good checkpoint survives keep-k at any cadence and a rerun with a smaller learning rate
resumes from it; changing train.num_steps of a run is explicit; reports beyond the uniform
model are flagged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest

from infodiff import tasks, training
from infodiff.evaluation import report as report_lib
from infodiff.training import guard as guard_lib
from tests.test_faults import fault_config, metrics, steps_in
from tests.test_training import load, toy_corpus, train_run

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

NAN_FROM = 7  # the update of step index 7 (0-based) reads a poisoned batch: state 8 is NaN


def poisoned_task(config, from_step: int = NAN_FROM):
    """The task of ``config`` whose training batches from ``from_step`` on hold an id far out of
    the vocabulary (the embedding lookup gives NaN): a NaN loss, gradient and state."""
    task = tasks.make_task(config, data=toy_corpus())
    clean = task.train_batch

    def train_batch(step, rows=slice(None)):
        b = np.array(clean(step, rows))
        if step >= from_step:
            b[:, 0] = 10**6
        return b

    task.train_batch = train_batch
    return task


def all_checkpoints_finite(wd) -> bool:
    ok = []
    for step in steps_in(wd):
        state, _ = training.load_checkpoint(wd, tasks.make_task(
            ml_collections.ConfigDict(training.load_meta(wd, step)["config"]), data=toy_corpus()), step=step)
        ok.append(guard_lib.all_finite(state))
    return all(ok)


@pytest.mark.slow
@pytest.mark.parametrize("ckpt_every", [1, 3, 5])
def test_nan_is_never_saved_and_a_smaller_lr_resumes_from_the_last_good_checkpoint(tmp_path, ckpt_every):
    cfg = fault_config(**{"train.ckpt_every": ckpt_every, "train.log_every": 10, "train.keep_checkpoints": 2})
    good = (NAN_FROM // ckpt_every) * ckpt_every  # the last save before the poisoned update
    with pytest.raises(guard_lib.DivergenceError,
                       match=rf"diverged at step {NAN_FROM + 1}: .*newest good checkpoint is step {good} .*"
                             r"smaller --config\.optim\.lr \(now 0\.003\)") as e:
        training.train(poisoned_task(cfg), tmp_path)
    assert e.value.newest_good == good and max(steps_in(tmp_path)) == good
    assert all_checkpoints_finite(tmp_path)
    # the rerun with a smaller learning rate resumes from the last good step and finishes
    smaller = fault_config(**{"train.ckpt_every": ckpt_every, "train.log_every": 10, "train.keep_checkpoints": 2,
                              "optim.lr": 1e-3})
    out = train_run(smaller, tmp_path)
    assert out["step"] == 20 and out["interrupted"] is None
    assert math.isfinite(out["valid"]["loss"]) and all_checkpoints_finite(tmp_path)
    train_records = [r for r in metrics(tmp_path) if r["split"] == "train"]
    assert train_records[-1]["step"] == 20 and [r["first_step"] for r in train_records if r.get("partial")] == [good + 1]


@pytest.mark.slow
def test_an_exploding_learning_rate_stops_before_the_first_bad_save(tmp_path):
    cfg = fault_config(**{"optim.lr": 1e4, "optim.warmup_steps": 200, "train.ckpt_every": 1})
    with pytest.raises(guard_lib.DivergenceError, match=r"diverged at step 2: the loss of the parameters on a "
                       r"validation batch .* is .*x the reference .*newest good checkpoint is step 1") as e:
        training.train(poisoned_task(cfg, from_step=10**9), tmp_path)
    assert "--config.optim.grad_clip" in str(e.value) and "divergence_guard=False" in str(e.value)
    assert steps_in(tmp_path) == [1] and all_checkpoints_finite(tmp_path)


class _Config:
    def __init__(self, guard=True, ratio=10.0):
        self.train = ml_collections.ConfigDict({"divergence_guard": guard, "max_loss_ratio": ratio})
        self.optim = ml_collections.ConfigDict({"lr": 1e-3, "grad_clip": 1.0})


def steps(*pairs):
    return [{"loss": np.float32(loss), "grad_norm": np.float32(g)} for loss, g in pairs]


def test_guard_rules():
    on, off = (guard_lib.DivergenceGuard(_Config(g), 100.0, lambda: 5) for g in (True, False))
    on.check_steps(steps((90, 1), (5000, 1), (1e6, 1)), 3)  # training losses are Monte Carlo draws: no ratio rule
    with pytest.raises(guard_lib.DivergenceError, match=r"validation loss 1100 nats per example is 11x the reference 100"):
        on.check_valid(1100.0, 3)
    off.check_valid(1100.0, 3)
    with pytest.raises(guard_lib.DivergenceError, match=r"step 2: non-finite gradient norm \(grad_norm inf"):
        on.check_steps(steps((90, 1), (90, np.inf)), 2)
    off.check_steps(steps((90, 1), (90, np.inf)), 2)
    for g in (on, off):  # a non-finite loss or state stops the run whatever the opt-out
        with pytest.raises(guard_lib.DivergenceError, match="step 4: non-finite training loss nan"):
            g.check_steps(steps((90, 1), (np.nan, 1)), 4)
        with pytest.raises(guard_lib.DivergenceError, match="hold NaN or inf"):
            g.check_state({"w": np.array([1.0, np.nan], np.float32), "step": np.int32(3)}, 3, dict)
    with pytest.raises(guard_lib.DivergenceError, match="EMA parameters on a validation batch 2000"):
        on.check_state({"w": np.ones(2, np.float32)}, 3, lambda: {"EMA parameters": 2000.0})
    off.check_state({"w": np.ones(2, np.float32)}, 3, lambda: {"EMA parameters": 2000.0})
    with pytest.raises(guard_lib.DivergenceError, match="validation loss inf"):
        off.check_valid(float("inf"), 7)


def test_the_advice_offers_what_a_resume_accepts():
    cfg = _Config()
    cfg.optim.grad_clip = 0.0
    with pytest.raises(guard_lib.DivergenceError) as e:  # clipping cannot be switched on in a resumed run
        guard_lib.DivergenceGuard(cfg, 100.0, lambda: 5).check_valid(float("nan"), 7)
    assert "grad_clip" not in str(e.value) and "resumes from step 5" in str(e.value)
    with pytest.raises(guard_lib.DivergenceError, match=r"grad_clip=1.0 \(now off\) \(it starts again\)"):
        guard_lib.DivergenceGuard(cfg, 100.0, lambda: None).check_valid(float("nan"), 7)


@pytest.mark.slow
def test_the_last_step_is_saved_only_after_its_final_validation(tmp_path, monkeypatch):
    cfg = fault_config(**{"train.num_steps": 10, "train.ckpt_every": 5, "train.eval_every": 4})
    real = guard_lib.DivergenceGuard.check_valid

    def failing_at_10(self, loss, step):
        if step == 10:
            self._fail(step, "validation loss 1e9 (made up)")
        return real(self, loss, step)

    monkeypatch.setattr(guard_lib.DivergenceGuard, "check_valid", failing_at_10)
    with pytest.raises(guard_lib.DivergenceError, match="step 10: validation loss 1e9 .*newest good checkpoint is step 5"):
        train_run(cfg, tmp_path)
    assert steps_in(tmp_path) == [5]
    assert [r["step"] for r in metrics(tmp_path) if r["split"] == "valid"] == [4, 8, 10]


@pytest.mark.slow
def test_the_final_validation_runs_after_validations_inside_the_run(tmp_path):
    cfg = fault_config(**{"train.num_steps": 10, "train.ckpt_every": 5, "train.eval_every": 4})
    out = train_run(cfg, tmp_path)
    records = [r for r in metrics(tmp_path) if r["split"] == "valid"]
    assert [r["step"] for r in records] == [4, 8, 10] and out["valid"] == records[-1]["metrics"]
    before = (tmp_path / "metrics.jsonl").read_bytes()
    assert train_run(cfg, tmp_path)["valid"] == out["valid"] and (tmp_path / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow
def test_a_diverged_checkpoint_of_an_older_version_is_moved_aside_on_resume(tmp_path):
    good = {"train.num_steps": 10, "train.ckpt_every": 5, "optim.decay_steps": 10}
    train_run(fault_config(**good), tmp_path)
    # finite but blown-up states saved with the guard off (what an older version saved unchecked)
    train_run(fault_config(**dict(good, **{"train.num_steps": 20, "optim.lr": 300.0,
                                           "train.divergence_guard": False})), tmp_path)
    assert steps_in(tmp_path) == [5, 10, 15, 20] and all_checkpoints_finite(tmp_path)
    out = train_run(fault_config(**dict(good, **{"train.num_steps": 20})), tmp_path)
    assert sorted(p.name for p in (tmp_path / training.CORRUPT_DIR).iterdir()) == ["15", "20"]
    assert out["step"] == 20 and steps_in(tmp_path) == [5, 10, 15, 20]  # trained again from step 10
    assert all_checkpoints_finite(tmp_path) and out["valid"]["loss"] < 2 * 16 * math.log(27)


def test_max_loss_ratio_must_exceed_one(tmp_path):
    with pytest.raises(ValueError, match=r"config.train.max_loss_ratio must be > 1 .*got 0.5"):
        train_run(fault_config(**{"train.max_loss_ratio": 0.5}), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


# ---------------------------------------------------------------------------------------------
# Changing train.num_steps of a run
# ---------------------------------------------------------------------------------------------
def schedule_config(num_steps, **kw):
    return fault_config(**{"train.num_steps": num_steps, "train.ckpt_every": 10, "train.log_every": 10, **kw})


@pytest.mark.slow
def test_a_longer_run_must_say_how_its_schedule_continues(tmp_path):
    wd = tmp_path / "w"
    train_run(schedule_config(20), wd)
    before = {p: (wd / p).read_bytes() for p in ("config.json", "metrics.jsonl")}
    with pytest.raises(training.ConfigMismatchError,
                       match=r"cannot resume .* at step 20 with config.train.num_steps=40 and config.optim.decay_steps=0 "
                             r"\(the saved run has 20 and 0\): the learning rate of step \d+ would change .* Choose: the "
                             r"saved run's values, --config.train.num_steps=20 --config.optim.decay_steps=0, or 40 steps "
                             r"on the saved run's schedule, --config.train.num_steps=40 --config.optim.decay_steps=20"):
        train_run(schedule_config(40), wd)
    with pytest.raises(training.ConfigMismatchError, match=r"Choose: the saved run's values, --config.train.num_steps=20 "
                       r"--config.optim.decay_steps=0, or a new --workdir"):  # only decay_steps changed: one choice
        train_run(schedule_config(20, **{"optim.decay_steps": 30}), wd)
    with pytest.raises(training.ConfigMismatchError, match=r"already at step 20, past config.train.num_steps=10"):
        train_run(schedule_config(10), wd)
    assert {p: (wd / p).read_bytes() for p in before} == before and steps_in(wd) == [10, 20]
    # the extension keeps the saved schedule: the same parameters as one uninterrupted run with it
    train_run(schedule_config(40, **{"optim.decay_steps": 20}), wd)
    ref = tmp_path / "ref"
    train_run(schedule_config(40, **{"optim.decay_steps": 20}), ref)
    a, _ = load(wd)
    b, _ = load(ref)
    assert int(a.step) == 40 and jax.tree.all(jax.tree.map(np.array_equal, a.params, b.params))


@pytest.mark.slow
def test_a_run_inside_its_warmup_may_grow(tmp_path):
    # every step so far used the warmup's rates, which do not depend on the length of the run
    train_run(schedule_config(10, **{"optim.warmup_steps": 15}), tmp_path)
    assert train_run(schedule_config(20, **{"optim.warmup_steps": 15}), tmp_path)["step"] == 20


@pytest.mark.slow
def test_rerunning_a_finished_run_appends_nothing(tmp_path):
    first = train_run(schedule_config(20), tmp_path)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    again = train_run(schedule_config(20), tmp_path)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert again["step"] == 20 and again["valid"] == first["valid"] and again["train"]["loss"] == first["train"]["loss"]
    assert sum(r["split"] == "valid" and r["step"] == 20 for r in metrics(tmp_path)) == 1


@pytest.mark.slow
def test_switching_gradient_clipping_on_or_off_is_refused(tmp_path):
    train_run(schedule_config(10), tmp_path)
    with pytest.raises(training.ConfigMismatchError, match=r"grad_clip=0 switches gradient clipping off"):
        train_run(schedule_config(20, **{"optim.grad_clip": 0.0, "optim.decay_steps": 10}), tmp_path)


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------
def test_reports_beyond_the_uniform_model_are_flagged():
    u = 16 * math.log(27)
    assert report_lib.worse_than_uniform(40.0, 0.5, u, "nats per sequence") == []
    assert report_lib.worse_than_uniform(u + 0.5, 0.5, u, "nats per sequence") == []  # within 1.96 SE
    (w,) = report_lib.worse_than_uniform(1e30, 0.5, u, "nats per sequence")
    assert "above the uniform model's 52.73" in w and "do not report it" in w
    assert report_lib.worse_than_uniform(float("nan"), 0.5, None, "nats per example")
    assert report_lib.worse_than_uniform(3.0, 0.5, None, "nats per example") == []


@pytest.mark.slow
def test_evaluating_a_diverged_run_warns(tmp_path):
    from infodiff import evaluation
    from tests.test_evaluation import _masked, _tiny

    cfg = _tiny(_masked(), **{"optim.lr": 30.0, "optim.warmup_steps": 0, "train.divergence_guard": False,
                              "train.num_steps": 6, "eval.num_generate": 0})
    training.train(tasks.make_task(cfg), str(tmp_path))
    rep, _ = evaluation.evaluate(cfg, str(tmp_path))
    assert rep["uniform_nll"] == pytest.approx(16 * math.log(27))
    assert rep["nll"] > rep["uniform_nll"] and len(rep["warnings"]) == 1
    assert "WARNING: the NLL" in evaluation.format_report(rep)
