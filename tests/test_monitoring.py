"""config.train.log_to: TensorBoard event files mirror metrics.jsonl, also across a resume and
over steps an interrupted run wrote past its checkpoint; W&B offline (skipped without wandb);
bad values refused up front."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from infodiff.training import sinks
from tests.test_training import compilation_cache, read_metrics, tiny_config, train_run  # noqa: F401


def _event_scalars(logdir) -> dict:
    """{tag: [(step, value)]} read back with the event reader of TensorBoard's UI (its purge of orphaned steps)."""
    from tensorboard.backend.event_processing import plugin_event_accumulator as event_accumulator

    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    import tensorboard.util.tensor_util as tu

    return {tag: [(e.step, float(tu.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def _f32(curve) -> list:
    return [(s, float(np.float32(v))) for s, v in curve]


def _jsonl_curve(workdir, split, name) -> list:
    return [(r["step"], r["metrics"][name]) for r in read_metrics(workdir) if r["split"] == split]


@pytest.mark.slow  # two short training runs: 25 s alone, 80 s on busy cores
def test_tensorboard_mirrors_metrics_across_resume(tmp_path):
    pytest.importorskip("tensorboard")
    wd = tmp_path / "run"
    cfg = tiny_config(**{"train.num_steps": 12, "train.log_every": 2, "train.ckpt_every": 4,
                         "train.eval_every": 6, "train.log_to": "jsonl,tensorboard"})
    train_run(cfg, wd, stop_at_step=10)           # stops at 10 (a checkpoint there)
    shutil.rmtree(wd / "checkpoints" / "10")      # as if killed after step 10's records: resumes at 8
    train_run(cfg, wd)                             # 8 -> 12, a second event file
    assert len(list((wd / "tensorboard").iterdir())) == 2
    got = _event_scalars(wd / "tensorboard")
    want = _jsonl_curve(wd, "train", "loss")
    assert [s for s, _ in want] == [2, 4, 6, 8, 10, 12]
    assert got["train/loss"] == _f32(want)   # float32 in the event file: the same numbers
    assert got["valid/bpc"] == _f32(_jsonl_curve(wd, "valid", "bpc"))
    names = set(next(r for r in read_metrics(wd) if r["split"] == "train")["metrics"])
    assert {t.split("/", 1)[1] for t in got if t.startswith("train/")} == names


def test_log_to_values(tmp_path):
    assert sinks.parse_log_to("jsonl") == ("jsonl",)
    assert sinks.parse_log_to(" TensorBoard , jsonl,tensorboard") == ("tensorboard", "jsonl")
    assert sinks.parse_log_to(["wandb"]) == ("wandb",)
    with pytest.raises(ValueError, match=r"'tensorbord' is not one of jsonl, tensorboard, wandb"):
        sinks.parse_log_to("jsonl,tensorbord")
    with pytest.raises(ValueError, match="names no destination"):
        sinks.parse_log_to("")
    # refused before any work: nothing written
    with pytest.raises(ValueError, match="tensorbord"):
        train_run(tiny_config(**{"train.log_to": "tensorbord"}), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_wandb_offline(tmp_path, monkeypatch):
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"pip install 'infodiff\[wandb\]'"):
            sinks.check_available(["wandb"])
        pytest.skip("wandb is not installed (the [wandb] extra): its missing-library error checked instead")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wd = tmp_path / "run"
    train_run(tiny_config(**{"train.num_steps": 4, "train.log_every": 2, "train.log_to": "wandb"}), wd)
    assert list((wd / "wandb").glob("offline-run-*"))
    assert json.loads(Path(wd / "metrics.jsonl").read_text().splitlines()[0])["step"] == 2


def test_train_without_config_continues_the_saved_one(tmp_path):
    """train.py --workdir W without --config: W's saved config.json if W is a run, else the
    default config (cli.saved_config_arg; evaluate.py uses it without the existence check)."""
    from infodiff import cli

    saved = f"--config={cli.CONFIG_DIR}/saved_run.py:{tmp_path}"
    argv = ["train.py", f"--workdir={tmp_path}", "--config.train.num_steps=5"]
    assert cli.saved_config_arg(argv, only_if_saved=True) == argv  # a new workdir: the default config
    assert cli.saved_config_arg(argv) == [argv[0], saved, *argv[1:]]  # evaluate.py
    (tmp_path / "config.json").write_text("{}")
    assert cli.saved_config_arg(argv, only_if_saved=True) == [argv[0], saved, *argv[1:]]
    assert cli.saved_config_arg(["train.py", "--workdir", str(tmp_path)], only_if_saved=True)[1] == saved
    given = ["train.py", "--config", "masked_text", f"--workdir={tmp_path}"]
    assert cli.saved_config_arg(given, only_if_saved=True) == given  # --config wins
