"""Readers beside a writer, reports as one unit, input mode on a read-only workdir (issue 24,
items 3, 4 and 6).

* A reader (evaluation, ``training.load_checkpoint``) whose listed checkpoints are deleted by a
  live writer's ``keep_checkpoints`` while it reads lists again and retries: a deletion is
  never reported as damage, a damaged checkpoint still is, and the reader takes no lock and
  moves nothing. (scripts/fault_reader_writer.py runs the real thing: evaluate.py beside
  train.py.)
* report.json, report.txt (and input mode's rows.*) are one unit: killed at any file-system
  call of a write, every file shows the old evaluation or every file the new one; leftovers of
  killed writes are removed by the next write. (scripts/fault_report_kill.py: kill -9 of
  evaluate.py during its write.)
* Input mode computes everything before writing anything, so the table is printed before a
  read-only workdir refuses the write (as the split mode does).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import ml_collections
import pytest

from infodiff import cli, evaluation, training
from infodiff.evaluation import inputs
from infodiff.evaluation import report as report_lib
from infodiff.training import checkpoint as ckpt_lib
from tests.test_faults import (REPO, _cli_env, _mount_tmpfs, _refuse_writes, assert_same_state, base,  # noqa: F401
                               corpus, data_file, fault_config, flip_bit, reference, reference_run, steps_in,
                               task, wd)
from tests.test_training import compilation_cache  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


# ---------------------------------------------------------------------------------------------
# Readers beside a writer
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def bad_warnings(caplog):
    """The 'skipping a bad checkpoint' warnings logged during the test."""
    caplog.set_level(logging.INFO)
    return lambda: [r.getMessage() for r in caplog.records if "skipping a bad checkpoint" in r.getMessage()]


def _writer_between_listing_and_reading(monkeypatch, action, when_step: int):
    """Run ``action()`` once, as a writer would, just before the reader's first read of
    checkpoint ``when_step`` (after the reader listed the checkpoints)."""
    real = ckpt_lib.restore_checkpoint
    calls = []

    def restore(mngr, step, *a, **k):
        calls.append(int(step))
        if int(step) == when_step and calls.count(when_step) == 1:
            action()
        return real(mngr, step, *a, **k)

    monkeypatch.setattr(ckpt_lib, "restore_checkpoint", restore)
    return calls


@pytest.mark.slow
def test_reader_lists_again_when_the_writer_deletes_what_it_listed(wd, reference_run, reference, monkeypatch,
                                                                   bad_warnings):
    """keep_checkpoints of a live writer: step 20 is saved and 5, 10, 15 (all the reader listed)
    are deleted between the listing and the reads; the reader lists again and reads step 20."""
    ck = wd / "checkpoints"

    def writer():
        shutil.copytree(reference_run / "checkpoints" / "20", ck / "20")
        for s in (15, 10, 5):
            shutil.rmtree(ck / str(s))

    calls = _writer_between_listing_and_reading(monkeypatch, writer, 15)
    with training.WorkdirLock(wd):  # a writer holds the lock: the reader neither needs nor takes it
        state, meta = training.load_checkpoint(wd, task())
        lock_text = (wd / training.workdir.LOCK_NAME).read_text()
    assert meta["step"] == 20 and calls[-1] == 20 and 15 in calls
    assert_same_state(state, reference)
    assert json.loads(lock_text)["pid"] == os.getpid()
    assert bad_warnings() == []  # deleted, not damaged
    assert not (wd / training.checkpoint.CORRUPT_DIR).exists() and steps_in(wd) == [20]


@pytest.mark.slow
def test_a_deletion_in_progress_is_not_damage(wd, reference_run, bad_warnings, monkeypatch):
    """orbax's rmtree is not atomic: the reader meets half-deleted directories that disappear
    a moment later. Steps 10 and 15 lose their files before they are read, their directories
    go 0.3 s later, and a new step 20 appears: the reader waits for that, lists again and
    reads step 20 without calling anything damaged."""
    ck = wd / "checkpoints"

    def writer():
        for s in (15, 10, 5):
            for p in sorted((ck / str(s)).rglob("*"), reverse=True):
                p.unlink() if p.is_file() else None

        def finish():
            time.sleep(0.3)
            shutil.copytree(reference_run / "checkpoints" / "20", ck / "20")
            for s in (15, 10, 5):
                shutil.rmtree(ck / str(s))

        threading.Thread(target=finish, daemon=True).start()

    _writer_between_listing_and_reading(monkeypatch, writer, 15)
    meta = training.load_checkpoint(wd, task())[1]
    assert meta["step"] == 20 and bad_warnings() == []


@pytest.mark.slow
def test_a_damaged_checkpoint_is_still_damage_beside_a_writer(wd, bad_warnings, monkeypatch):
    """Step 15 has a flipped bit and stays; 5 and 10 are deleted while the reader reads: the
    error names step 15 as damaged (the deleted ones are not named), nothing is moved."""
    flip_bit(data_file(wd / "checkpoints" / "15"))
    ck = wd / "checkpoints"
    monkeypatch.setattr(ckpt_lib, "_DELETION_GRACE_S", 0.3)
    _writer_between_listing_and_reading(monkeypatch, lambda: [shutil.rmtree(ck / s) for s in ("10", "5")], 15)
    with pytest.raises(training.CheckpointError) as e:
        training.load_checkpoint(wd, task())
    msg = str(e.value)
    assert msg.startswith(f"no checkpoint in {ck} passes verification: checkpoint step 15: ")
    assert "checksum" in msg and "step 10" not in msg and "step 5" not in msg and "\n" not in msg
    assert any("step 15" in w for w in bad_warnings())
    assert steps_in(wd) == [15] and not (wd / training.checkpoint.CORRUPT_DIR).exists()


@pytest.mark.slow
def test_damaged_newest_is_skipped_when_older_ones_are_deleted_and_a_new_one_comes(wd, reference_run, bad_warnings,
                                                                                   monkeypatch):
    flip_bit(data_file(wd / "checkpoints" / "15"))
    ck = wd / "checkpoints"

    def writer():
        shutil.rmtree(ck / "10")
        shutil.rmtree(ck / "5")
        shutil.copytree(reference_run / "checkpoints" / "20", ck / "20")

    _writer_between_listing_and_reading(monkeypatch, writer, 15)
    assert training.load_checkpoint(wd, task())[1]["step"] == 20
    assert steps_in(wd) == [15, 20]  # the damaged one stays where it is (a reader moves nothing)


@pytest.mark.slow
def test_a_named_step_deleted_while_read_says_so(wd, monkeypatch):
    ck = wd / "checkpoints"
    _writer_between_listing_and_reading(monkeypatch, lambda: shutil.rmtree(ck / "10"), 10)
    with pytest.raises(FileNotFoundError, match=r"checkpoint step 10 in .* was deleted while it was read"):
        training.load_checkpoint(wd, task(), step=10)


@pytest.mark.slow
def test_a_reader_faster_deletion_than_reading_gives_up_with_one_line(wd, reference_run, monkeypatch):
    """Every listed checkpoint is gone by the time it is read, forever: a bounded number of
    attempts, then one line saying what to do."""
    ck = wd / "checkpoints"
    monkeypatch.setattr(ckpt_lib, "_READ_ATTEMPTS", 3)
    real = ckpt_lib.restore_checkpoint
    n = [20]

    def restore(mngr, step, *a, **k):
        shutil.rmtree(ck / str(step), ignore_errors=True)
        n[0] += 5
        shutil.copytree(reference_run / "checkpoints" / "20", ck / str(n[0]))
        return real(mngr, step, *a, **k)

    monkeypatch.setattr(ckpt_lib, "restore_checkpoint", restore)
    with pytest.raises(training.CheckpointError, match=r"deleted faster than they could be read \(3 attempts\)"):
        training.load_meta(wd)


# ---------------------------------------------------------------------------------------------
# report.json and report.txt as one unit
# ---------------------------------------------------------------------------------------------
def _rep(i: int) -> dict:
    return {"kind": "oracle", "nll": float(i)}


@pytest.fixture
def plain_format(monkeypatch):
    monkeypatch.setattr(report_lib, "format_report", lambda r: f"nll {r['nll']}")


def _shown(out: Path) -> tuple:
    """(nll in report.json, nll in report.txt, nll in rows.jsonl or None)."""
    j = json.loads((out / "report.json").read_text())["nll"]
    t = float((out / "report.txt").read_text().split()[1])
    rows = out / "rows.jsonl"
    return j, t, (json.loads(rows.read_text())["nll"] if rows.exists() else None)


def _write(out: Path, i: int, rows: bool = False):
    rep = report_lib.Report(_rep(i), attachments={"rows.jsonl": json.dumps({"nll": float(i)}).encode()} if rows else {})
    return report_lib.write_report(rep, str(out))


def test_report_files_are_links_into_one_version(tmp_path, plain_format):
    out = tmp_path / "out"
    jpath, tpath = _write(out, 1)
    assert (jpath, tpath) == (str(out / "report.json"), str(out / "report.txt"))
    _write(out, 2, rows=True)
    assert _shown(out) == (2.0, 2.0, 2.0)
    assert os.readlink(out / "report.json") == os.path.join(".reports", "current", "report.json")
    versions = [p for p in (out / ".reports").iterdir() if p.name != "current"]
    assert len(versions) == 1 and os.readlink(out / ".reports" / "current") == versions[0].name
    _write(out, 3)  # no rows this time: the link to a file the newest version lacks is removed
    assert _shown(out) == (3.0, 3.0, None) and not os.path.lexists(out / "rows.jsonl")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, symlinks=True)  # relative links: a copied workdir shows its own files
    assert _shown(copy) == (3.0, 3.0, None)


def test_reports_of_an_older_infodiff_are_replaced_without_a_mixed_moment(tmp_path, plain_format):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(_rep(7)))
    (out / "report.txt").write_text("nll 7.0\n")
    (out / ".report.json.999999999.0a1b2c3d.tmp").write_text("{")  # a killed atomic write of an older run
    _write(out, 8)
    assert _shown(out) == (8.0, 8.0, None)
    assert sorted(p.name for p in out.iterdir()) == [".reports", "report.json", "report.txt"]


def _crash_at(k: int):
    """Patch the file-system calls a write makes; the k-th one ends the process at once
    (os._exit: no clean-up handler runs, as with kill -9). Returns the counter."""
    count = [0]

    def wrap(fn):
        def inner(*a, **kw):
            count[0] += 1
            if count[0] == k:
                os._exit(9)
            return fn(*a, **kw)
        return inner

    for name in ("replace", "rename", "symlink", "mkdir", "fsync", "unlink", "link"):
        setattr(os, name, wrap(getattr(os, name)))
    shutil.rmtree = wrap(shutil.rmtree)
    return count


def _run_forked(fn) -> int:
    """``fn()`` in a forked child; its exit status."""
    from infodiff import parallel

    parallel.is_primary()  # JAX's backend is set up before the fork, not in the child
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns that fork and threads do not mix; the child only writes files
        pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("before", ["links", "files of an older infodiff", "nothing"])
def test_killed_at_every_step_of_a_write_the_files_agree(tmp_path, plain_format, before):
    """Every prefix of a write's file-system calls (kill -9 after it): report.json, report.txt
    and rows.jsonl are all the old evaluation's (or all absent) or all the new one's; the next
    write removes what the killed one left."""
    old = {"links": (1.0, 1.0, 1.0), "files of an older infodiff": (1.0, 1.0, 1.0), "nothing": None}[before]
    k, outcomes = 1, set()
    while True:
        out = tmp_path / f"k{k}"
        if before == "files of an older infodiff":
            out.mkdir()
            (out / "report.json").write_text(json.dumps(_rep(1)))
            (out / "report.txt").write_text("nll 1.0\n")
            (out / "rows.jsonl").write_text(json.dumps({"nll": 1.0}))
        elif before == "links":
            _write(out, 1, rows=True)
        code = _run_forked(lambda: (_crash_at(k), _write(out, 2, rows=True)))
        assert code in (0, 9), code
        present = [(out / n).exists() for n in ("report.json", "report.txt", "rows.jsonl")]
        shown = _shown(out) if all(present) else (None if not any(present) else present)
        assert shown in (old, (2.0, 2.0, 2.0)), (k, shown)
        outcomes.add(shown)
        _write(out, 3, rows=True)  # the next evaluation: clean, nothing left over
        assert _shown(out) == (3.0, 3.0, 3.0)
        left = sorted(p.name for p in out.iterdir()) + sorted(p.name for p in (out / ".reports").iterdir())
        assert len(left) == 6 and not [n for n in left if n.endswith(".tmp")], (k, left)
        if code == 0:
            break
        k += 1
    assert outcomes == {old, (2.0, 2.0, 2.0)} and k > 8  # both outcomes seen, every call boundary tried


def test_read_only_report_dir_changes_nothing(tmp_path, plain_format, monkeypatch):
    out = tmp_path / "out"
    _write(out, 1, rows=True)
    before = {p: (p.is_symlink(), p.read_bytes() if p.is_file() else None) for p in out.rglob("*")}
    _refuse_writes(monkeypatch, out, errno.EROFS)
    with pytest.raises(training.StorageError, match=rf"cannot write {out / 'report.json'}: \[Errno 30\] "):
        _write(out, 2, rows=True)
    monkeypatch.undo()
    assert {p: (p.is_symlink(), p.read_bytes() if p.is_file() else None) for p in out.rglob("*")} == before


def test_no_symbolic_links_falls_back_to_one_file_at_a_time(tmp_path, plain_format, monkeypatch, caplog):
    def no_links(*a, **k):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", no_links)
    out = tmp_path / "out"
    _write(out, 4, rows=True)
    assert _shown(out) == (4.0, 4.0, 4.0) and not (out / ".reports").exists()
    assert not (out / "report.json").is_symlink()


# ---------------------------------------------------------------------------------------------
# Input mode on a read-only workdir: the table first
# ---------------------------------------------------------------------------------------------
def _input_config(run: Path, path: Path) -> ml_collections.ConfigDict:
    cfg = ml_collections.ConfigDict(training.saved_config(str(run)))
    cfg.eval.input = str(path)
    cfg.eval.input_samples = 4
    return cfg


@pytest.mark.slow
def test_input_mode_writes_nothing_before_the_report_is_printed(reference_run, tmp_path, monkeypatch):
    """evaluation.evaluate scores the file without writing (rows.* travel with the report); the
    write after the table is printed fails on a read-only workdir with one line, and nothing
    is created."""
    run = tmp_path / "run"
    shutil.copytree(reference_run, run)
    docs = tmp_path / "docs.txt"
    docs.write_text("the cat sat on the mat\nthe dog ate the hat\n")
    snapshot = sorted(str(p) for p in run.rglob("*"))
    _refuse_writes(monkeypatch, run, errno.EROFS)
    rep, out = evaluation.evaluate(_input_config(run, docs), str(run))
    table = evaluation.format_report(rep)
    assert "infodiff input report" in table and "bits per character" in table
    assert sorted(rep.attachments) == ["rows.csv", "rows.jsonl", "rows.png"]
    with pytest.raises(training.StorageError,
                       match=rf"cannot write {re.escape(os.path.join(out, 'report.json'))}: \[Errno 30\] "):
        evaluation.write_report(rep, out)
    monkeypatch.undo()
    assert sorted(str(p) for p in run.rglob("*")) == snapshot
    jpath, _ = evaluation.write_report(rep, out)  # writable again: everything, as one unit
    written = json.loads(Path(jpath).read_text())
    rows = [json.loads(line) for line in (Path(out) / "rows.jsonl").read_text().splitlines()]
    assert written["summary"] == json.loads(json.dumps(rep["summary"])) and [r["id"] for r in rows] == ["1", "2"]
    assert all(Path(p).exists() for p in written["files"]) and (Path(out) / "rows.png").stat().st_size > 10_000


@pytest.mark.slow
def test_cli_input_mode_on_a_read_only_workdir_prints_the_table_first(reference_run, tmp_path, compilation_cache):
    """The real thing where the machine allows mounting: a read-only tmpfs workdir."""
    mnt = tmp_path / "ro"
    if not _mount_tmpfs(mnt, "16m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        run = mnt / "run"
        shutil.copytree(reference_run, run)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, timeout=10)
        docs = tmp_path / "docs.txt"
        docs.write_text("the cat sat on the mat\nthe dog ate the hat\n")
        proc = subprocess.run([sys.executable, "evaluate.py", f"--workdir={run}", f"--config.eval.input={docs}",
                               "--config.eval.input_samples=4"], cwd=REPO, env=_cli_env(compilation_cache),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == cli.EXIT_ERROR, proc.stderr[-3000:]
        assert "infodiff input report" in proc.stdout and "total NELBO (nats)" in proc.stdout
        assert "first 2 of 2 rows" in proc.stdout  # the per-row scores are on the screen
        last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
        out = inputs.default_out_dir(str(run), str(docs))
        assert last.startswith(f"error: StorageError: cannot write {os.path.join(out, 'report.json')}: "
                               "[Errno 30] Read-only file system (EROFS)"), last
        assert "Traceback" not in proc.stderr and not (run / "scores").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)
