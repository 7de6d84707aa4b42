"""infodiff export: a training run as config.json + model.safetensors, read back by
load_pretrained bit-identically (the parameters and every number of load_run)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import infodiff
from infodiff import tasks, training
from infodiff.pretrained import PretrainedError, export

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["the cat sat on the mat", "a hat"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from tests.test_training import tiny_config, train_run

    d = tmp_path_factory.mktemp("export_run")
    c = tiny_config()
    c.train.num_steps = 4
    c.train.ckpt_every = 4
    train_run(c, str(d))
    return d


def test_export_reads_back_bit_identically(run_dir, tmp_path):
    out = export.export(str(run_dir), str(tmp_path / "exported"))
    meta = json.loads(open(os.path.join(out, "config.json")).read())
    assert meta["model_type"] == "infodiff" and meta["params"] == "ema" and meta["checkpoint_step"] == 4
    run = infodiff.load_pretrained(out)
    task = tasks.make_task(run.task.config)
    params, _ = training.load_params(str(run_dir), task, ema=True)
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)) and a.dtype == b.dtype,
                        params, run.loaded.params)
    assert all(jax.tree.leaves(same))
    ref = infodiff.load_run(str(run_dir))
    np.testing.assert_array_equal(run.nll(TEXTS).samples, ref.nll(TEXTS).samples)  # every number the same
    assert run.process.estimator == ref.process.estimator and run.seq_len == ref.seq_len


def test_export_refuses_an_existing_directory_and_writes_nothing(run_dir, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(PretrainedError, match="exists and is not an empty directory"):
        export.export(str(run_dir), str(out))
    assert sorted(os.listdir(out)) == ["keep.txt"]
    r = subprocess.run([sys.executable, "-m", "infodiff", "export", "--workdir", str(run_dir), "--out", str(out)],
                       cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO), capture_output=True,
                       text=True, timeout=300)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "not an empty directory" in lines[0], r.stderr
    assert sorted(os.listdir(out)) == ["keep.txt"] and not [p for p in os.listdir(tmp_path) if p.startswith(".export")]
