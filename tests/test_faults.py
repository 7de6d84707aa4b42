"""Fault injection (issue 12): corrupt checkpoints, two writers, full and read-only storage,
kill -9 during a save, resumed log windows, and the input checks of the drivers.

Every fault ends with no data lost (nothing deleted, the good checkpoints intact), a one-line
error for the user (no traceback from the CLI), and, where training continues, parameters
bit-identical to an uninterrupted run. One tiny masked model (tests/test_training.py's config,
20 steps, checkpoints every 5) is trained twice per module: an uninterrupted reference and a
run stopped at step 15 whose workdir each test copies.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import string
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from infodiff import cli, likelihood, oracles, tasks, training, validation
from infodiff.evaluation import report as report_lib
from infodiff.training import guard as guard_lib
from infodiff.training import loop as loop_lib
from infodiff.training import workdir as workdir_lib
from tests.conftest import EVERY_5_STEPS
from tests.test_training import PHRASE, compilation_cache, tiny_config, toy_corpus, train_run  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
# orbax leaves coroutines of a failed (corrupt) read un-awaited; their GC warnings are expected here
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def fault_config(**overrides):
    """20 steps, checkpoints every 5 (tests/conftest.py EVERY_5_STEPS)."""
    return tiny_config(**dict(EVERY_5_STEPS, **overrides))


def steps_in(wd) -> list[int]:
    d = Path(wd) / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())


def metrics(wd) -> list[dict]:
    return [json.loads(line) for line in (Path(wd) / "metrics.jsonl").read_text().splitlines()]


def assert_same_state(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb and len(la) > 10
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def flip_bit(path: Path, frac: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    assert data, path
    i = min(len(data) - 1, int(len(data) * frac))
    data[i] ^= 0x10
    path.write_bytes(bytes(data))


def data_file(step_dir: Path) -> Path:
    """The largest array data file of a checkpoint (TensorStore OCDBT chunk)."""
    files = list((step_dir / "state" / "ocdbt.process_0" / "d").iterdir())
    return max(files, key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def corpus():
    return toy_corpus()


@pytest.fixture(scope="module")
def reference_run(trained_masked_run_every_5):
    """The uninterrupted run (20 steps, checkpoints 5, 10, 15, 20): its workdir (read only; the
    session's, tests/conftest.py)."""
    return trained_masked_run_every_5


@pytest.fixture(scope="module")
def reference(reference_run):
    """The uninterrupted run's final state (step 20)."""
    state, meta = training.load_checkpoint(reference_run, task())
    assert meta["step"] == 20
    return state


@pytest.fixture(scope="module")
def base(reference_run, tmp_path_factory):
    """The reference run as if killed before saving step 20: checkpoints 5, 10, 15 (sealed)."""
    wd = tmp_path_factory.mktemp("base") / "wd"
    shutil.copytree(reference_run, wd)
    shutil.rmtree(wd / "checkpoints" / "20")
    assert steps_in(wd) == [5, 10, 15]
    for s in (5, 10, 15):
        assert (wd / "checkpoints" / str(s) / training.checkpoint.MANIFEST).exists()
    return wd


@pytest.fixture
def wd(base, tmp_path):
    out = tmp_path / "wd"
    shutil.copytree(base, out)
    return out


def task():
    return tasks.make_task(fault_config(), data=toy_corpus())


def resume_matches(wd, corpus, reference):
    """Resume to step 20 and compare with the uninterrupted run."""
    result = train_run(fault_config(), wd, corpus)
    assert result["step"] == 20 and result["interrupted"] is None
    state, meta = training.load_checkpoint(wd, task())
    assert meta["step"] == 20
    assert_same_state(state, reference)
    keys = [(r["step"], r["split"]) for r in metrics(wd)]
    assert len(keys) == len(set(keys))  # every step logged once
    assert not [p for p in (Path(wd) / "checkpoints").iterdir() if workdir_lib.TMP_MARKER in p.name]


# ---------------------------------------------------------------------------------------------
# Corrupt checkpoints
# ---------------------------------------------------------------------------------------------
KINDS = {
    "array data": lambda d: data_file(d),
    "ocdbt manifest": lambda d: d / "state" / "manifest.ocdbt",
    "ocdbt process manifest": lambda d: d / "state" / "ocdbt.process_0" / "manifest.ocdbt",
    "pytree metadata": lambda d: d / "state" / "_METADATA",
    "sharding": lambda d: d / "state" / "_sharding",
    "array metadata": lambda d: d / "state" / "array_metadatas" / "process_0",
    "meta json": lambda d: d / "meta" / "metadata",
    "checkpoint metadata": lambda d: d / "_CHECKPOINT_METADATA",
    "commit marker": lambda d: d / "state" / "commit_success.txt",
    "checksum file": lambda d: d / training.checkpoint.MANIFEST,
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bit_flip_in_each_file_kind_is_detected_and_skipped(wd, kind):
    step15 = wd / "checkpoints" / "15"
    target = KINDS[kind](step15)
    flip_bit(target)
    before = target.read_bytes()
    # the named step: a one-line error naming the step (and, for data files, the file)
    with pytest.raises(training.CheckpointError, match=r"checkpoint step 15") as e:
        training.load_checkpoint(wd, task(), step=15)
    assert "\n" not in str(e.value)
    if kind != "checksum file":
        assert str(target) in str(e.value)
    # the default: skipped with a warning, the previous one used, nothing deleted
    state, meta = training.load_checkpoint(wd, task())
    assert meta["step"] == 10 and int(state.step) == 10
    assert steps_in(wd) == [5, 10, 15] and target.read_bytes() == before


@pytest.mark.slow
def test_bit_flip_resume_uses_previous_and_matches_uninterrupted(wd, corpus, reference):
    target = data_file(wd / "checkpoints" / "15")
    flip_bit(target)
    rel = target.relative_to(wd / "checkpoints" / "15")
    resume_matches(wd, corpus, reference)
    # the bad checkpoint was moved aside, not deleted: byte for byte what was there
    kept = wd / training.CORRUPT_DIR / "15"
    assert (kept / rel).exists() and steps_in(wd) == [5, 10, 15, 20]


@pytest.mark.slow
def test_unsealed_checkpoint_is_still_verified(wd):
    """Killed before the file checksums were written: the state and metadata checksums in the
    checkpoint still catch a flipped bit."""
    d = wd / "checkpoints" / "15"
    (d / training.checkpoint.MANIFEST).unlink()
    meta_file = d / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["data_position"] = 14  # still valid JSON, wrong content
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(training.CheckpointError, match=r"step 15: its metadata .* does not match the checksum"):
        training.load_meta(wd, step=15)
    (d / "meta" / "metadata").write_text(json.dumps(dict(meta, data_position=15)))  # repaired
    flip_bit(data_file(d))
    with pytest.raises(training.CheckpointError, match=r"step 15: its state .*(does not match the checksum|cannot be read)"):
        training.load_checkpoint(wd, task(), step=15)
    assert training.load_checkpoint(wd, task())[1]["step"] == 10


def test_truncated_file_resumes_from_previous(wd, corpus, reference):
    target = data_file(wd / "checkpoints" / "15")
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    with pytest.raises(training.CheckpointError, match=rf"step 15: file {target} does not match"):
        training.load_checkpoint(wd, task(), step=15)
    resume_matches(wd, corpus, reference)


@pytest.mark.slow
def test_garbled_metadata_resumes_from_previous(wd, corpus, reference):
    d = wd / "checkpoints" / "15"
    (d / training.checkpoint.MANIFEST).unlink()  # so that the JSON parser itself sees it
    (d / "meta" / "metadata").write_bytes(b'{"step": 15, "seed": ')
    with pytest.raises(training.CheckpointError, match=r"step 15: its metadata .*/15/meta cannot be read "
                                                       r"\(JSONDecodeError"):
        training.load_meta(wd, step=15)
    (d / "meta" / "metadata").write_bytes(b"\xff\xfe garbage {")
    with pytest.raises(training.CheckpointError, match=r"step 15: its metadata .*/15/meta cannot be read"):
        training.load_meta(wd, step=15)
    assert training.load_meta(wd)["step"] == 10
    resume_matches(wd, corpus, reference)


@pytest.mark.slow
def test_no_good_checkpoint_is_one_error_and_nothing_moves(wd, corpus):
    for s in (5, 10, 15):
        flip_bit(data_file(wd / "checkpoints" / str(s)))
    with pytest.raises(training.CheckpointError, match="no checkpoint in .* passes verification") as e:
        train_run(fault_config(), wd, corpus)
    assert "step 5" in str(e.value) and "step 15" in str(e.value)
    assert steps_in(wd) == [5, 10, 15] and not (wd / training.CORRUPT_DIR).exists()


def test_shape_mismatch_says_config_and_checkpoint_disagree(wd):
    other = tasks.make_task(fault_config(**{"model.width": 64}), data=toy_corpus())
    with pytest.raises(training.ConfigMismatchError,
                       match=r"config and checkpoint step 15 .* disagree: model\.width: config=64 checkpoint=32") as e:
        training.load_checkpoint(wd, other)
    assert "delete" not in str(e.value) and "not damaged" in str(e.value)
    assert steps_in(wd) == [5, 10, 15]


@pytest.mark.slow
def test_non_finite_loss_names_the_newest_verified_checkpoint(wd):
    flip_bit(data_file(wd / "checkpoints" / "15"))
    t = task()
    opt = training.make_optimizer(t.config)
    abstract = training.abstract_train_state(t.init_params, opt, training.make_mesh())
    mngr = ocp.CheckpointManager(os.path.join(wd, "checkpoints"), item_names=("state", "meta"))
    try:
        step, state, meta, failures = training.newest_verified(mngr, abstract)
    finally:
        mngr.close()
    assert step == 10 and int(state.step) == 10 and [f.step for f in failures] == [15]
    window = loop_lib._Window(15)
    window.add({"loss": jnp.float32(jnp.nan), "grad_norm": jnp.float32(1.0)})
    guard = guard_lib.DivergenceGuard(t.config, t.uniform_nll, lambda: step)
    with pytest.raises(guard_lib.DivergenceError, match="diverged at step 16: non-finite training loss nan; .*"
                       "newest good checkpoint is step 10 .*smaller --config.optim.lr"):
        window.check(guard, 16)


# ---------------------------------------------------------------------------------------------
# One writer per workdir
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_second_writer_is_refused(wd, corpus):
    before = (wd / "metrics.jsonl").read_bytes()
    with training.WorkdirLock(wd):
        with pytest.raises(training.WorkdirLockedError,
                           match=rf"is in use: pid {os.getpid()} on host .* holds .*train\.lock"):
            train_run(fault_config(), wd, corpus)
    assert (wd / "metrics.jsonl").read_bytes() == before and steps_in(wd) == [5, 10, 15]
    # released on exit: the file stays, empty
    assert (wd / workdir_lib.LOCK_NAME).read_text() == ""


def test_stale_lock_is_taken_over(tmp_path):
    (tmp_path / workdir_lib.LOCK_NAME).write_text(json.dumps({"host": "gone", "pid": 999999, "since": 1.0}))
    with training.WorkdirLock(tmp_path) as lock:
        assert lock.stale == {"host": "gone", "pid": 999999, "since": 1.0}
        owner = json.loads((tmp_path / workdir_lib.LOCK_NAME).read_text())
        assert owner["pid"] == os.getpid()
    with training.WorkdirLock(tmp_path) as lock:
        assert lock.stale is None  # released cleanly last time


def test_evaluating_before_the_first_checkpoint_says_whether_training_runs(tmp_path):
    """No checkpoint yet: the one line says whether a training run holds train.lock (wait for
    its first checkpoint, at train.ckpt_every) or none does (start it)."""
    (tmp_path / "config.json").write_text(json.dumps({"process": {}, "model": {}, "data": {}, "eval": {},
                                                      "train": {"ckpt_every": 250}}))
    (tmp_path / training.CKPT_DIR).mkdir()
    with pytest.raises(FileNotFoundError, match=r"no training is running there: start it .*at step 250"):
        training.load_meta(tmp_path)
    with training.WorkdirLock(tmp_path):
        assert workdir_lib.lock_holder(tmp_path)["pid"] == os.getpid()
        with pytest.raises(FileNotFoundError, match=rf"training is running there \(pid {os.getpid()} .*saved step 250"):
            training.load_meta(tmp_path)
    assert workdir_lib.lock_holder(tmp_path) is None  # released
    (tmp_path / training.CKPT_DIR).rmdir()
    with pytest.raises(FileNotFoundError, match="no training is running there") as e:
        training.load_meta(tmp_path)
    assert len(cli.one_line(e.value)) < 300


def test_config_mismatch_line_names_the_first_differences(monkeypatch):
    """A config that differs in many keys: one line under 300 characters naming the first
    differences and how many more; --debug (INFODIFF_TRACEBACK) lists all."""
    monkeypatch.delenv("INFODIFF_TRACEBACK", raising=False)
    saved = {"config": {"model": {f"k{i}": i for i in range(12)}}}
    new = {"model": {f"k{i}": i + 1 for i in range(12)}}
    with pytest.raises(training.ConfigMismatchError) as e:
        training.check_resumable(saved, new, {}, "/w/checkpoints/3")
    line = cli.one_line(e.value)
    assert len(line) < 300 and "model.k0: checkpoint=0 new=1" in line and "and 10 more (--debug shows all)" in line
    monkeypatch.setenv("INFODIFF_TRACEBACK", "1")
    with pytest.raises(training.ConfigMismatchError) as e:
        training.check_resumable(saved, new, {}, "/w/checkpoints/3")
    assert "model.k9: checkpoint=9 new=10" in str(e.value) and "more" not in str(e.value)


def _cli_env(cache_dir):
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache_dir,
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
                PYTHONPATH=str(REPO))


@pytest.mark.slow
def test_cli_second_writer_gets_one_line(tmp_path, compilation_cache):
    text8 = tmp_path / "tiny_text8"
    text8.write_text((PHRASE * 800)[:30000])
    wd = tmp_path / "run"
    cmd = [sys.executable, "train.py", "--config", "configs/masked_text.py", f"--workdir={wd}",
           f"--config.data.path={text8}", "--config.train.num_steps=2", "--config.model.num_layers=1",
           "--config.model.num_heads=2", "--config.model.width=32", "--config.data.seq_len=16",
           "--config.train.batch_size=8"]
    with training.WorkdirLock(wd):
        proc = subprocess.run(cmd, cwd=REPO, env=_cli_env(compilation_cache), capture_output=True,
                              text=True, timeout=240)
    assert proc.returncode == cli.EXIT_ERROR, proc.stderr[-3000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("error: WorkdirLockedError: ") and f"pid {os.getpid()}" in last
    assert "Traceback" not in proc.stderr
    assert not (wd / "metrics.jsonl").exists() and not (wd / "checkpoints").exists()


# ---------------------------------------------------------------------------------------------
# Storage faults
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_disk_full_during_a_checkpoint_save(wd, corpus, reference, monkeypatch):
    real_save = ocp.CheckpointManager.save

    def full_disk_save(self, step, *args, **kwargs):
        if step == 20:  # as a write of step 20 running out of space
            tmp = Path(self.directory) / f"20{workdir_lib.TMP_MARKER}-123"
            (tmp / "state").mkdir(parents=True)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "state" / "d"))
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk_save)
    with pytest.raises(training.StorageError) as e:
        train_run(fault_config(), wd, corpus)
    msg = str(e.value)
    assert msg.startswith(f"cannot save a checkpoint to {wd / 'checkpoints' / '20'}: [Errno 28]")
    assert "ENOSPC" in msg and "\n" not in msg and e.value.errno == errno.ENOSPC
    assert not [p for p in (wd / "checkpoints").iterdir() if workdir_lib.TMP_MARKER in p.name]
    assert steps_in(wd) == [5, 10, 15]
    assert (wd / workdir_lib.LOCK_NAME).read_text() == ""  # the lock was released
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    resume_matches(wd, corpus, reference)


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.slow
def test_real_disk_full_on_a_small_tmpfs(tmp_path, corpus, reference):
    """The real thing where the machine allows mounting (root): TensorStore's own ENOSPC."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "900k"):  # two tiny checkpoints fit, the third does not
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        wd = mnt / "wd"
        with pytest.raises(training.StorageError, match=r"\[Errno 28\] No space left on device \(ENOSPC\)") as e:
            train_run(fault_config(), wd, corpus)
        assert str(wd / "checkpoints") in str(e.value) and "\n" not in str(e.value)
        assert steps_in(wd) == [5, 10]
        assert not [p for p in (wd / "checkpoints").iterdir() if workdir_lib.TMP_MARKER in p.name]
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True, timeout=10)
        resume_matches(wd, corpus, reference)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)


def _refuse_writes(monkeypatch, under: Path, code: int):
    """Writes (open for writing, os.open with write flags, mkstemp) under `under` fail with `code`."""
    import builtins
    import tempfile

    real_open, real_os_open, real_mkstemp = builtins.open, os.open, tempfile.mkstemp
    under = str(under)

    def inside(p):
        return str(os.path.abspath(os.fspath(p))).startswith(under)

    def fake_open(file, mode="r", *a, **k):
        if isinstance(file, (str, os.PathLike)) and inside(file) and any(c in mode for c in "wax+"):
            raise OSError(code, os.strerror(code), os.fspath(file))
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_os_open(path, flags, *a, **k)

    def fake_mkstemp(*a, dir=None, **k):
        if dir is not None and inside(dir):
            raise OSError(code, os.strerror(code), os.fspath(dir))
        return real_mkstemp(*a, dir=dir, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(tempfile, "mkstemp", fake_mkstemp)


def test_disk_full_appending_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    with pytest.MonkeyPatch.context() as mp:
        _refuse_writes(mp, tmp_path, errno.ENOSPC)
        with pytest.raises(training.StorageError, match=rf"cannot write {path}: \[Errno 28\] No space left on device \(ENOSPC\)"):
            training.append_jsonl(str(path), {"step": 2})
    assert path.read_text() == '{"step": 1}\n'


@pytest.mark.slow
def test_read_only_workdir_refuses_training_before_any_work(wd, corpus, monkeypatch):
    snapshot = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()}
    _refuse_writes(monkeypatch, wd, errno.EROFS)
    with pytest.raises(training.StorageError) as e:
        train_run(fault_config(), wd, corpus)
    assert str(e.value).startswith(f"cannot write {wd / workdir_lib.LOCK_NAME}: [Errno 30] Read-only file system (EROFS)")
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()} == snapshot


def test_read_only_report_dir_keeps_the_old_report(tmp_path, monkeypatch):
    rep = {"kind": "oracle", "nll": 1.5}
    monkeypatch.setattr(report_lib, "format_report", lambda r: "the table")
    (tmp_path / "report.json").write_text("old")
    _refuse_writes(monkeypatch, tmp_path, errno.EROFS)
    with pytest.raises(training.StorageError,
                       match=rf"cannot write {tmp_path / 'report.json'}: \[Errno 30\] Read-only file system \(EROFS\)"):
        report_lib.write_report(rep, str(tmp_path))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    assert (tmp_path / "report.json").read_text() == "old"


def test_cli_prints_one_line_and_exits_non_zero(capsys):
    def main(argv):
        print("the report")  # printed before the failing write: kept
        raise training.StorageError(errno.EROFS, "/w/report.json")

    with pytest.raises(SystemExit) as e:
        cli.exit_on_user_error(main)(["evaluate.py"])
    assert e.value.code == cli.EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == "the report\n"
    assert err == ("error: StorageError: cannot write /w/report.json: [Errno 30] Read-only file system "
                   "(EROFS); the filesystem is read-only: use a writable --workdir\n")
    with pytest.raises(KeyError):  # a bug keeps its traceback
        cli.exit_on_user_error(lambda argv: {}["x"])([])
    # orbax / TensorStore wrap the errno in other exception types: still recognised
    err = workdir_lib.storage_error(RuntimeError("Error writing local file: No space left on device"), "/w/x")
    assert err is not None and err.errno == errno.ENOSPC
    assert workdir_lib.storage_error(RuntimeError("shape mismatch"), "/w/x") is None


_KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    import orbax.checkpoint as ocp
    from tests import test_faults as F
    real_save = ocp.CheckpointManager.save
    def save_then_die(self, step, *args, **kwargs):
        out = real_save(self, step, *args, **kwargs)
        if step == 15:  # the async write of step 15 has started: kill -9 now
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    ocp.CheckpointManager.save = save_then_die
    F.train_run(F.fault_config(), {wd!r}, F.toy_corpus())
    """
)


@pytest.mark.slow
def test_kill9_during_a_save(tmp_path, corpus, reference, compilation_cache):
    wd = tmp_path / "wd"
    proc = subprocess.run([sys.executable, "-c", _KILL_SCRIPT.format(repo=str(REPO), wd=str(wd))],
                          env=_cli_env(compilation_cache), capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert json.loads((wd / workdir_lib.LOCK_NAME).read_text())["pid"] != os.getpid()  # left behind
    assert set(steps_in(wd)) >= {5, 10}
    resume_matches(wd, corpus, reference)  # stale lock taken over, temporary directory removed
    assert steps_in(wd) == [5, 10, 15, 20]


# ---------------------------------------------------------------------------------------------
# Resumed log windows
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cut_log_windows_are_marked_partial(tmp_path, corpus, reference):
    wd = tmp_path / "wd"
    assert train_run(fault_config(), wd, corpus, stop_at_step=12)["step"] == 12
    resume_matches(wd, corpus, reference)
    train = {r["step"]: r for r in metrics(wd) if r["split"] == "train"}
    assert sorted(train) == [5, 10, 12, 15, 20]
    assert [s for s, r in train.items() if r.get("partial")] == [12, 15]
    assert train[12]["first_step"] == 11 and train[15]["first_step"] == 13
    assert "partial" not in train[20] and "first_step" not in train[10]


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tab():
    """One tabular oracle for every input test (compiled estimator programs are shared)."""
    return oracles.random_tabular(np.random.default_rng(0), "ACGT", 4, 16)


def test_sequence_length_must_match_a_tabular_oracle(tab):
    x8 = np.zeros((3, 8), np.int32)
    with pytest.raises(ValueError, match=r"x has sequences of length 8 but the denoiser \(TabularOracle\) "
                                         r"is defined on sequences of length 4"):
        likelihood.nll(tab, x8, jax.random.key(0), num_samples=4)
    # Markov chains take any length
    validation.check_seq_len(x8[:, :6], oracles.random_markov(np.random.default_rng(0), "AC", 1, seq_len=4))


def test_unnormalised_denoiser_is_refused(tab):
    x = tab.sample(np.random.default_rng(1), 3)

    def shifted(z, t):
        return tab(z, t) + 0.5

    with pytest.raises(ValueError, match=r"not normalised: logsumexp over the 4 tokens is \+0\.5 \(must be 0\)"):
        likelihood.nll(shifted, x, jax.random.key(0), num_samples=4, vocab_size=4)
    est = likelihood.nll(shifted, x, jax.random.key(0), num_samples=4, vocab_size=4, check_normalised=False)
    assert np.all(np.isfinite(est.mean))


def test_oracle_memory_is_refused_before_allocating():
    alphabet = string.ascii_letters + string.digits
    assert len(alphabet) == 62
    t0 = time.time()
    with pytest.raises(ValueError, match=r"a 62-symbol order-4 Markov oracle would take about 5\.24 PB of "
                                         r"memory, more than the limit of 4\.29 GB"):
        oracles.random_markov(np.random.default_rng(0), alphabet, 4)
    assert time.time() - t0 < 1.0
    with pytest.raises(ValueError, match=r"drawing 4 distinct sequences from 62\^12 would take"):
        oracles.random_tabular(np.random.default_rng(0), alphabet, 12, 4)


def test_random_markov_alphabet_and_order():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="alphabet must be a non-empty string; got ''"):
        oracles.random_markov(rng, "", 2)
    with pytest.raises(ValueError, match="order must be an integer >= 1; got -1"):
        oracles.random_markov(rng, "AC", -1)
    with pytest.raises(ValueError, match="a 2-symbol order-40 Markov oracle would take about"):
        oracles.random_markov(rng, "AC", 40)
    with pytest.raises(ValueError, match="has 1 symbol; a Markov chain needs at least 2"):
        oracles.random_markov(rng, "A", 2)
    with pytest.raises(ValueError, match="repeats the symbol 'A'"):
        oracles.random_markov(rng, "AA", 2)


def test_empty_batches_are_refused(tab):
    with pytest.raises(ValueError, match=r"x is an empty batch \(shape \(0, 3\)\): give at least one item"):
        likelihood.poisson_nll(lambda z, a: z + 1.0, np.zeros((0, 3)), jax.random.key(0), num_samples=4)
    with pytest.raises(ValueError, match=r"x is an empty batch \(shape \(0, 4\)\)"):
        likelihood.nll(tab, np.zeros((0, 4), np.int32), jax.random.key(0), num_samples=4)
    with pytest.raises(ValueError, match=r"prompt is an empty batch"):
        likelihood.log_ratio(tab, np.zeros((0, 2), np.int32), np.zeros((0, 2), np.int32),
                             np.zeros((0, 2), np.int32), jax.random.key(0), num_samples=4)


def test_integer_seed_is_accepted_as_a_key(tab):
    x = tab.sample(np.random.default_rng(1), 3)
    a = likelihood.nll(tab, x, 0, num_samples=4)
    b = likelihood.nll(tab, x, jax.random.key(0), num_samples=4)
    np.testing.assert_array_equal(a.samples, b.samples)
    # poisson_nll converts the seed first: the error is about the data, not the key
    with pytest.raises(ValueError, match="empty batch"):
        likelihood.poisson_nll(lambda z, al: z, np.zeros((0, 3)), 0, num_samples=4)
    with pytest.raises(TypeError, match="key must be a JAX PRNG key .* or an integer seed; got str"):
        likelihood.nll(tab, x, "0", num_samples=4)


def test_report_records_argv_and_git_revision():
    cfg = ml_collections.ConfigDict({"eval": {"seed": 0}})
    common = report_lib.common(cfg, 0, time.time())
    assert common["argv"] == list(sys.argv)
    assert set(report_lib.COMMON_KEYS) >= {"argv", "git"}
    git = common["git"]
    assert git is not None and len(git["revision"]) == 40 and isinstance(git["dirty"], bool)
    assert report_lib.git_info("/") is None  # outside a checkout


def test_atomic_writes_are_utf8_with_the_umasks_permissions(tmp_path):
    """Reports are written UTF-8 whatever the locale (an ASCII one failed on the report's ±)
    and with the permissions the umask gives (not mkstemp's 0600); no temporary file is left."""
    old = os.umask(0o027)
    try:
        workdir_lib.atomic_write_text(str(tmp_path / "report.txt"), "nll 1.5 ± 0.1\n")
        workdir_lib.atomic_write_bytes(str(tmp_path / "a.png"), b"\x89PNG")
    finally:
        os.umask(old)
    assert (tmp_path / "report.txt").read_bytes() == "nll 1.5 ± 0.1\n".encode("utf-8")
    assert (tmp_path / "a.png").read_bytes() == b"\x89PNG"
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {"report.txt": 0o640, "a.png": 0o640}


@pytest.mark.slow
def test_orbax_storage_error_lines_are_held_back(capsys):
    """A failed save makes orbax log four error lines (up to 870 characters) from its threads
    before infodiff's one-line StorageError; the CLI's log filter holds back orbax's error
    records about a storage fault (not others, not warnings, not other modules')."""
    import logging

    def record(level, msg, path="/venv/lib/python3.11/site-packages/orbax/checkpoint/_src/futures/future.py"):
        return logging.LogRecord("absl", level, path, 1, msg, None, None)

    flt = cli._OrbaxStorageErrors()
    full = ('[process=0][thread=array_type_handler][operation_id=3] _SignalingThread.run() raised an exception: '
            'RESOURCE_EXHAUSTED: Error writing "ema_params.x/0" in OCDBT database at local file "/w/15/d": '
            '[OS error 28: No space left on device]')
    assert flt.filter(record(logging.ERROR, full)) is False
    assert flt.filter(record(logging.ERROR, "[process=0] Save Finalize thread failed (Read-only file system)")) is False
    assert flt.filter(record(logging.ERROR, "some other orbax error")) is True
    assert flt.filter(record(logging.WARNING, full)) is True
    assert flt.filter(record(logging.ERROR, full, path="/repo/infodiff/training/loop.py")) is True
    assert len(flt.held) == 2
    saved = cli._ORBAX_FILTER
    try:
        cli._ORBAX_FILTER = flt
        assert cli._report_held_storage_errors(lambda: 7)() == 7  # the run went on: say so, in one line
    finally:
        cli._ORBAX_FILTER = saved
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: orbax logged 2 storage errors that did not stop the run "
                                               "(--debug shows them): [process=0][thread=array_type_handler]"), err


@pytest.mark.slow
def test_cli_full_disk_is_one_line_without_orbax_logs(tmp_path, compilation_cache):
    """train.py on a 900 kB tmpfs: the third checkpoint does not fit. stderr ends with the one
    StorageError line; orbax's four long error lines are not shown (with --debug they are)."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "900k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        text8 = tmp_path / "tiny_text8"
        text8.write_text((PHRASE * 800)[:30000])
        cmd = [sys.executable, "train.py", "--config", "configs/masked_text.py", f"--workdir={mnt / 'wd'}",
               f"--config.data.path={text8}", "--config.train.num_steps=30", "--config.model.num_layers=1",
               "--config.model.num_heads=2", "--config.model.width=32", "--config.data.seq_len=16",
               "--config.train.batch_size=8", "--config.train.log_every=5", "--config.train.ckpt_every=5",
               "--config.train.eval_every=1000"]
        proc = subprocess.run(cmd, cwd=REPO, env=_cli_env(compilation_cache), capture_output=True, text=True,
                              timeout=240)
        assert proc.returncode == cli.EXIT_ERROR, proc.stderr[-3000:]
        lines = [ln.split("\r")[-1] for ln in proc.stderr.splitlines() if ln.strip()]
        assert lines[-1].startswith(f"error: StorageError: cannot save a checkpoint in {mnt / 'wd' / 'checkpoints'}: "
                                    "[Errno 28] No space left on device (ENOSPC)"), proc.stderr[-3000:]
        assert not any("RESOURCE_EXHAUSTED" in ln or "orbax" in ln.lower().replace(".orbax-checkpoint-tmp", "")
                       for ln in lines), proc.stderr[-3000:]
        assert max(len(ln) for ln in lines) < 300 and "Traceback" not in proc.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)
