"""Multi-process runs on CPU (gloo collectives): a run's result does not depend on how it was
launched (1 device, 1 process x 4 devices, 2 processes x 2 devices, with parameters sharded
over fsdp), a run saved by 2 processes resumes in 1, and evaluate.py across 2 processes gives
the single-process report; a process that dies or never joins is one line on every other one
(infodiff/supervise.py).

Each test starts its processes itself (train.py / evaluate.py with ``--coordinator_address``
on a free local port, ``XLA_FLAGS=--xla_force_host_platform_device_count=2``), waits with a
deadline and kills whatever is left. Tiny models, 4 steps, the constant learning-rate schedule
(so a run resumed with a longer ``train.num_steps`` takes the steps an uninterrupted run takes).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import jax
import numpy as np
import pytest

from infodiff import tasks, training
from tests.conftest import xla_flags

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300

_TEXT = {"model.num_layers": 1, "model.num_heads": 2, "model.width": 32, "data.seq_len": 16,
         "train.batch_size": 8, "train.num_steps": 4, "train.log_every": 2, "train.eval_every": 1000,
         "train.eval_batches": 1, "train.ckpt_every": 2, "optim.warmup_steps": 1, "optim.decay": "constant",
         "optim.lr": 3e-3}
RUNS = {
    "masked": ("configs/masked_text.py", _TEXT),
    "sedd": ("configs/sedd_absorb_text.py", _TEXT),
    "poisson": ("configs/poisson_synthetic.py", {
        "data.num_train": 256, "data.num_valid": 64, "data.num_test": 64, "model.hidden": 16,
        "model.num_layers": 1, "model.emb_dim": 8, "train.batch_size": 16, "train.num_steps": 4,
        "train.log_every": 2, "train.eval_every": 1000, "train.eval_batches": 1, "train.ckpt_every": 2,
        "optim.warmup_steps": 1, "optim.decay": "constant"}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def started(script: str, args: list[str], num_processes: int, devices: int, logdir: Path,
            per_process: list[list[str]] | None = None, env: dict | None = None,
            only: list[int] | None = None) -> Iterator[list[subprocess.Popen]]:
    """``script args`` running as ``num_processes`` processes of ``devices`` CPU devices each
    (stderr in ``logdir/<script>.<i>.err``; ``env``: more variables; ``only``: start only these
    process ids, in that order in the list yielded); whatever is still running at the end is
    killed."""
    logdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={devices}"),
               **(env or {}))
    port = _free_port()
    procs, logs = [], []
    try:
        for i in (range(num_processes) if only is None else only):
            extra = ([f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={num_processes}",
                      f"--process_id={i}"] if num_processes > 1 else [])
            err = open(logdir / f"{Path(script).stem}.{i}.err", "w")
            logs.append(err)
            own = per_process[i] if per_process else []
            procs.append(subprocess.Popen([sys.executable, script, *args, *own, *extra], cwd=REPO, env=env,
                                          stdout=subprocess.DEVNULL, stderr=err))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


def wait_all(procs: list[subprocess.Popen], deadline: float) -> None:
    for p in procs:
        p.wait(timeout=max(1.0, deadline - time.time()))


def stderr_texts(script: str, num_processes: int, logdir: Path) -> list[str]:
    return [(logdir / f"{Path(script).stem}.{i}.err").read_text() for i in range(num_processes)]


def launch(script: str, args: list[str], num_processes: int, devices: int, logdir: Path,
           per_process: list[list[str]] | None = None, expect_rc: int = 0) -> list[str]:
    """Run ``script args`` as ``num_processes`` processes of ``devices`` CPU devices each; the
    stderr text of each. Fails (after killing them all) on another exit status or the deadline."""
    with started(script, args, num_processes, devices, logdir, per_process) as procs:
        wait_all(procs, time.time() + TIMEOUT_S)
    texts = stderr_texts(script, num_processes, logdir)
    for p, text in zip(procs, texts):
        assert p.returncode == expect_rc, "\n=====\n".join(t[-3000:] for t in texts)
    return texts


def _flags(overrides: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def _config(kind: str, **more):
    path, overrides = RUNS[kind]
    spec = importlib.util.spec_from_file_location(f"_cfg_{kind}", REPO / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    for k, v in {**overrides, **more}.items():
        node = c
        *parents, leaf = k.split(".")
        for name in parents:
            node = node[name]
        node[leaf] = v
    return c


def train_cli(kind: str, workdir: Path, num_processes: int, devices: int, **more) -> list[str]:
    path, overrides = RUNS[kind]
    return launch("train.py", ["--config", path, f"--workdir={workdir}", *_flags({**overrides, **more})],
                  num_processes, devices, workdir.parent / f"{workdir.name}.logs")


def params_of(kind: str, workdir: Path, **more):
    task = tasks.make_task(_config(kind, **more))
    state, meta = training.load_checkpoint(str(workdir), task)
    return jax.device_get(state.params), meta


# Adam moves each parameter by at most ~lr per step whatever its gradient, so an element whose
# gradient is at the level of float rounding (a reduction summed in another order on another
# layout) may move by a different fraction of lr: the absolute tolerance is a thousandth of the
# largest total move (4 steps x lr 3e-3), far below what a wrong batch or key changes (~lr).
ATOL = 1e-3 * 4 * 3e-3


def assert_same_params(a, b, what: str):
    leaves_a, leaves_b = jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 3
    for (path, x), y in zip(leaves_a, leaves_b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=ATOL, err_msg=f"{what}: {jax.tree_util.keystr(path)}")


@pytest.fixture(scope="module")
def masked_runs(tmp_path_factory):
    """The same tiny masked run on 1 device (in process), 1 process x 4 devices, 2 x 2."""
    root = tmp_path_factory.mktemp("masked")
    training.train(tasks.make_task(_config("masked")), str(root / "one"))
    train_cli("masked", root / "four", 1, 4)
    logs = train_cli("masked", root / "two_by_two", 2, 2)
    return root, logs


@pytest.mark.slow
def test_masked_same_parameters_however_launched(masked_runs):
    root, logs = masked_runs
    one, meta = params_of("masked", root / "one")
    assert meta["step"] == 4
    for name in ("four", "two_by_two"):
        other, meta = params_of("masked", root / name)
        assert meta["step"] == 4
        assert_same_params(one, other, name)
    # the parameters moved (a test of equality between runs that did nothing would be empty)
    init = jax.device_get(tasks.make_task(_config("masked")).init_params(
        jax.random.fold_in(jax.random.key(int(_config("masked").seed)), 0)))
    assert max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(init))) > 1e-3
    assert "2 process(es) x 2 device(s)" in logs[0] and "mesh data=4 fsdp=1" in logs[0]
    assert "parallel:" not in logs[1]  # process 1 does not repeat process 0's lines
    # one writer: metrics.jsonl of the 2-process run has the records of the 1-device run
    recs = [json.loads(line)["step"] for line in open(root / "two_by_two" / "metrics.jsonl")]
    assert recs == [json.loads(line)["step"] for line in open(root / "one" / "metrics.jsonl")]


@pytest.mark.slow
def test_fsdp_shards_parameters_and_resumes_on_one_process(masked_runs, tmp_path):
    root, _ = masked_runs
    wd = tmp_path / "fsdp"
    logs = train_cli("masked", wd, 2, 2, **{"train.mesh.fsdp": 2, "train.num_steps": 2})
    line = next(s for s in logs[0].splitlines() if "parallel:" in s)
    assert "mesh data=2 fsdp=2" in line, line
    m = re.search(r"(\d+) of (\d+) parameter arrays \(([\d.]+)% of the parameters\) split over fsdp", line)
    assert m, line
    assert 0 < int(m[1]) < int(m[2]), line  # kernels and the embedding split, biases and norms whole
    assert float(m[3]) > 90.0, line
    # the orbax checkpoint records how each array was sharded when saved
    sharding_file = wd / "checkpoints" / "2" / "state" / "_sharding"
    if sharding_file.exists():
        assert "fsdp" in sharding_file.read_text()
    # saved by 2 processes on a data x fsdp = 2 x 2 mesh; resumed by this one process, one device
    result = training.train(tasks.make_task(_config("masked")), str(wd))
    assert result["step"] == 4
    resumed, _ = params_of("masked", wd)
    one, _ = params_of("masked", root / "one")
    assert_same_params(one, resumed, "fsdp 2x2 to step 2, then 1 device to step 4")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sedd", "poisson"])
def test_sedd_and_poisson_same_parameters_on_two_processes(kind, tmp_path):
    training.train(tasks.make_task(_config(kind)), str(tmp_path / "one"))
    train_cli(kind, tmp_path / "two", 2, 2, **{"train.mesh.fsdp": 2})
    one, _ = params_of(kind, tmp_path / "one")
    two, meta = params_of(kind, tmp_path / "two")
    assert meta["step"] == 4
    assert_same_params(one, two, f"{kind}: 1 device vs 2 processes x 2 devices, fsdp 2")


@pytest.mark.slow
def test_evaluation_across_two_processes_gives_the_single_process_report(masked_runs, tmp_path):
    root, _ = masked_runs
    wd = root / "two_by_two"
    ev = ["--config.eval.estimator=k_dce", "--config.eval.num_samples=2", "--config.eval.max_sequences=12",
          "--config.eval.num_generate=0", "--config.eval.batch_size=16"]
    launch("evaluate.py", [f"--workdir={wd}", *ev], 1, 1, tmp_path / "ev1")
    single = json.loads((wd / "report.json").read_text())
    launch("evaluate.py", [f"--workdir={wd}", *ev, "--config.eval.overwrite=True"], 2, 2, tmp_path / "ev2")
    multi = json.loads((wd / "report.json").read_text())
    assert (multi["env"]["devices"], multi["env"]["processes"], single["env"]["devices"]) == (4, 2, 1)
    assert multi["forward_passes"] == single["forward_passes"] > 0
    np.testing.assert_allclose(multi["nll"], single["nll"], rtol=1e-6)
    np.testing.assert_allclose(multi["nll_stderr"], single["nll_stderr"], rtol=1e-4)
    assert single["nll_stderr"] > 0


@pytest.mark.slow
def test_processes_started_with_different_configs_stop_with_one_line(tmp_path):
    path, overrides = RUNS["masked"]
    args = ["--config", path, f"--workdir={tmp_path / 'w'}", *_flags(overrides)]
    texts = launch("train.py", args, 2, 2, tmp_path / "logs", per_process=[[], ["--config.train.mesh.fsdp=2"]],
                   expect_rc=1)
    for text in texts:
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert errors == ["error: DistributedError: processes [1] were started with a config or --workdir "
                          "different from process 0's: start every process with the same command (only "
                          "--process_id differs)"], text[-2000:]
        assert "Traceback" not in text


@pytest.mark.slow
def test_sigterm_to_one_process_stops_every_process_at_the_same_step(tmp_path):
    """A scheduler's SIGTERM may reach the processes at different steps: they agree at the next
    log window, all save that step and exit 128 + 15."""
    path, overrides = RUNS["masked"]
    wd = tmp_path / "w"
    args = ["--config", path, f"--workdir={wd}", *_flags({**overrides, "train.num_steps": 100_000,
                                                          "train.ckpt_every": 100_000})]
    with started("train.py", args, 2, 2, tmp_path / "logs") as procs:
        deadline = time.time() + TIMEOUT_S
        metrics = wd / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # training is under way
            assert time.time() < deadline and all(p.poll() is None for p in procs), "training did not start"
            time.sleep(0.5)
        procs[1].send_signal(signal.SIGTERM)  # process 1 only
        wait_all(procs, deadline)
    texts = stderr_texts("train.py", 2, tmp_path / "logs")
    assert [p.returncode for p in procs] == [128 + signal.SIGTERM] * 2, [t[-1500:] for t in texts]
    steps = sorted(int(d.name) for d in (wd / "checkpoints").iterdir() if d.name.isdigit())
    assert len(steps) == 1 and steps[0] % 2 == 0 and 0 < steps[0] < 100_000, steps  # one step, a window end
    assert "done at step %d (SIGTERM)" % steps[0] in texts[0], texts[0][-1500:]
    assert "Traceback" not in texts[0] + texts[1]


# ---------------------------------------------------------------------------------------------
# A process that dies or never joins (infodiff/supervise.py): one line on every other process
# ---------------------------------------------------------------------------------------------
# What JAX's C++ client prints when it ends a process (a check failure, Python's fault handler).
_CPP_NOISE = re.compile(r"^(?:[EF]\d{4} \d\d:\d\d|\*\*\* Check failure|Fatal Python error|terminate called|"
                        r"Traceback|    @ +0x)", re.M)


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def _assert_one_line(text: str, expected: str) -> None:
    assert _errors(text) == [expected], text[-3000:]
    assert not _CPP_NOISE.search(text), text[-3000:]


def _lost(k: int, n: int, script: str) -> str:
    again = "; a training run resumes from its last checkpoint" if script == "train.py" else ""
    return (f"error: PeerLost: process {k} of {n} died (its connection closed without an exit status: killed, e.g. "
            f"by kill -9 or for memory, or its host went down); this process stopped too. Rerun all {n} processes "
            f"with the same command{again}")


def test_a_process_that_never_started_is_named_on_every_process_within_the_timeout(tmp_path):
    """Process 1 of 3 never starts: 0 and 2 name it; a process whose coordinator never starts
    says so. Each stops within INFODIFF_DISTRIBUTED_TIMEOUT (JAX is never started)."""
    path, overrides = RUNS["masked"]
    args = ["--config", path, f"--workdir={tmp_path / 'w'}", *_flags(overrides)]
    env = {"INFODIFF_DISTRIBUTED_TIMEOUT": "5"}
    t0 = time.time()
    with started("train.py", args, 3, 1, tmp_path / "three", env=env, only=[0, 2]) as procs, \
            started("train.py", args, 2, 1, tmp_path / "alone", env=env, only=[1]) as alone:
        wait_all(procs + alone, t0 + 60)
    elapsed = time.time() - t0
    assert [p.returncode for p in procs + alone] == [75] * 3
    assert elapsed < 5 + 30, elapsed
    three = [(tmp_path / "three" / f"train.{i}.err").read_text() for i in (0, 2)]
    port = re.search(r"at (127\.0\.0\.1:\d+)", three[0])[1]
    for text in three:
        _assert_one_line(text, "error: PeerMissing: process 1 of 3 did not join within 5 s (INFODIFF_DISTRIBUTED_"
                               "TIMEOUT): start it (--process_id=1, the same command otherwise; coordinator "
                               f"{port}) or raise the timeout")
    text = (tmp_path / "alone" / "train.1.err").read_text()
    port = re.search(r"at (127\.0\.0\.1:\d+)", text)[1]
    _assert_one_line(text, f"error: PeerMissing: process 0 of 2 (the coordinator, {port}) did not answer within 5 s "
                           "(INFODIFF_DISTRIBUTED_TIMEOUT): start it (--process_id=0, the same command otherwise) on "
                           "that host, check --coordinator_address, or raise the timeout")


@pytest.mark.slow
def test_a_process_killed_mid_training_is_one_line_on_the_other(tmp_path):
    """kill -9 of process 0 during training. It hosts JAX's coordination service, so the other
    process's JAX client aborts at once (a C++ check failure, before this change): the survivor
    prints one line naming process 0 and exits 75 within seconds. (Process 1 killed instead: the
    survivor's JAX noticed only its missing heartbeats, 57-88 s later, then aborted too; the
    supervisors' relay of a death is tested below without JAX.)"""
    path, overrides = RUNS["masked"]
    wd = tmp_path / "w"
    args = ["--config", path, f"--workdir={wd}", *_flags({**overrides, "train.num_steps": 100_000,
                                                          "train.ckpt_every": 100_000})]
    metrics = wd / "metrics.jsonl"
    with started("train.py", args, 2, 2, tmp_path / "logs", env={"INFODIFF_DISTRIBUTED_TIMEOUT": "60"}) as procs:
        deadline = time.time() + TIMEOUT_S
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # training is under way
            assert time.time() < deadline and all(p.poll() is None for p in procs), "training did not start"
            time.sleep(0.2)
        procs[0].kill()
        t_kill = time.time()
        procs[1].wait(timeout=60)
        after = time.time() - t_kill
    text = stderr_texts("train.py", 2, tmp_path / "logs")[1]
    assert procs[1].returncode == 75, text[-3000:]
    assert after < 30, after
    _assert_one_line(text, _lost(0, 2, "train.py"))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
    except OSError:
        return []


_FAKE_WORKER = """
import os, sys, time
from infodiff import supervise
pid, n, port, worker = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.exit(supervise.supervise(["-c", worker], f"127.0.0.1:{port}", n, pid, timeout=20))
"""


@pytest.mark.slow
def test_supervisors_relay_a_death_and_an_exit_status(tmp_path):
    """Without JAX: three supervisors whose workers sleep. The supervisor of process 1 killed
    (its worker dies with it): 0 and 2 name it at once. Process 1's worker exiting with status 3
    while the others' run on: they name it and its status after the grace period."""
    script = tmp_path / "fake.py"
    script.write_text(_FAKE_WORKER)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    sleep = "import time; time.sleep(120)"
    for case, worker1, expected in [
        ("kill", sleep, _lost(1, 3, "fake.py")),
        ("exit", "import sys, time; time.sleep(1); print('error: Boom: my own reason', file=sys.stderr); sys.exit(3)",
         "error: PeerLost: process 1 of 3 stopped with exit status 3 (its own log says why); this process stopped "
         "too. Rerun all 3 processes with the same command"),
    ]:
        port = _free_port()
        procs = []
        try:
            for i in range(3):
                procs.append(subprocess.Popen([sys.executable, str(script), str(i), "3", str(port),
                                               worker1 if i == 1 else sleep], env=env, text=True,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            if case == "kill":
                deadline = time.time() + 60
                while not all(_children(p.pid) for p in procs):  # all joined, their workers started
                    assert time.time() < deadline and all(p.poll() is None for p in procs)
                    time.sleep(0.1)
                procs[1].kill()
            t0 = time.time()
            outs = [p.communicate(timeout=60)[1] for p in procs]
            after = time.time() - t0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for i in (0, 2):
            assert procs[i].returncode == 75, (case, outs[i])
            _assert_one_line(outs[i], expected)
        if case == "kill":
            assert after < 5, after
        else:
            assert procs[1].returncode == 3 and _errors(outs[1]) == ["error: Boom: my own reason"], outs[1]
            assert 10 <= after < 40, after  # supervise.GRACE_S: the others may be stopping by themselves
