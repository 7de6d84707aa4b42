"""Faults, round 2 (issue 35): concurrent evaluations of one workdir, comparisons' folders,
external models checked on every call, budgets bounded before any work, the harness's errors,
input paths that are not files. Each fault ends in one line (or both results kept), nothing lost.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from infodiff import files as files_lib
from infodiff.evaluation import report as report_lib


# ---------------------------------------------------------------------------------------------
# Exclusive commits: two evaluations of one workdir at once
# ---------------------------------------------------------------------------------------------
def _rep(i: int) -> dict:
    return {"kind": "network", "nll": float(i)}


@pytest.fixture
def plain_format(monkeypatch):
    monkeypatch.setattr(report_lib, "format_report", lambda r: f"nll {r['nll']}")


def _fork_writers(out: Path, n: int, exclusive: bool) -> list[tuple[int, str]]:
    """``n`` forked processes wait at one pipe, then each writes report ``i`` into ``out`` at
    once; returns each one's (exit status, first line of its error or 'written')."""
    from infodiff import parallel

    parallel.is_primary()  # JAX's backend is set up before the fork, not in the children
    go_r, go_w = os.pipe()
    kids = []
    for i in range(n):
        res_r, res_w = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # JAX warns that fork and threads do not mix; children only write files
            pid = os.fork()
        if pid == 0:
            os.close(go_w)
            os.read(go_r, 1)  # every child starts writing when the pipe closes
            try:
                report_lib.write_report(report_lib.Report(_rep(i), attachments={"rows.jsonl": b'{"nll": %d}' % i}),
                                        str(out), exclusive=exclusive)
                msg, code = "written", 0
            except files_lib.UnitExistsError as e:
                msg, code = str(e), 3
            except BaseException as e:  # noqa: BLE001
                msg, code = repr(e), 1
            os.write(res_w, msg.encode())
            os._exit(code)
        os.close(res_w)
        kids.append((pid, res_r))
    os.close(go_r)
    os.close(go_w)  # go
    out_list = []
    for pid, res_r in kids:
        msg = b""
        while chunk := os.read(res_r, 65536):
            msg += chunk
        os.close(res_r)
        out_list.append((os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), msg.decode()))
    return out_list


def test_two_evaluations_at_once_never_both_say_written(tmp_path, plain_format):
    """Writers racing for one folder (exclusive: no eval.overwrite): exactly one commits, each
    other one is refused in one line at commit time naming the winner and where its own files
    are kept, and every result is on disk (the shown one and each kept one)."""
    for trial in range(3):
        out = tmp_path / f"w{trial}"
        results = _fork_writers(out, 4, exclusive=True)
        codes = [c for c, _ in results]
        assert codes.count(0) == 1 and codes.count(3) == 3, results
        winner = codes.index(0)
        assert json.loads((out / "report.json").read_text())["nll"] == float(winner)
        assert (out / "rows.jsonl").read_text() == '{"nll": %d}' % winner
        for i, (code, msg) in enumerate(results):
            if code:
                assert "\n" not in msg and "committed its files there" in msg and "--config.eval.output_dir" in msg
                kept = Path(msg.split("kept in ")[1].split("/;")[0])
                assert json.loads((kept / "report.json").read_text())["nll"] == float(i)
                assert (kept / "report.txt").read_text() == f"nll {float(i)}\n"
        # a later write (overwrite) cleans up as before and leaves the kept results alone
        report_lib.write_report(report_lib.Report(_rep(9)), str(out))
        assert json.loads((out / "report.json").read_text())["nll"] == 9.0 and not (out / "rows.jsonl").exists()
        assert len([p for p in (out / ".reports").iterdir() if p.name.startswith("kept-")]) == 3


def test_overwrite_lets_the_newest_replace(tmp_path, plain_format):
    """With eval.overwrite every writer commits (the newest shows); nothing half-written."""
    out = tmp_path / "w"
    results = _fork_writers(out, 3, exclusive=False)
    assert [c for c, _ in results] == [0, 0, 0], results
    shown = json.loads((out / "report.json").read_text())["nll"]
    assert (out / "report.txt").read_text() == f"nll {shown}\n"


def test_exclusive_write_into_an_older_infodiffs_files_is_refused(tmp_path, plain_format):
    out = tmp_path / "w"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(_rep(1)))
    with pytest.raises(files_lib.UnitExistsError, match="older infodiff"):
        report_lib.write_report(report_lib.Report(_rep(2)), str(out), exclusive=True)
    assert json.loads((out / "report.json").read_text())["nll"] == 1.0


# ---------------------------------------------------------------------------------------------
# Output folders named by the request
# ---------------------------------------------------------------------------------------------
def test_compare_folders_of_different_requests_differ(tmp_path):
    from infodiff.evaluation import comparison

    w = str(tmp_path / "w1")
    base = comparison.out_dir(w, "docs.txt", "a/other", 10, 20)
    assert base == comparison.out_dir(w, "docs.txt", "a/other/", 10, 20)  # the same request: the same folder
    assert os.path.basename(base).startswith("docs.txt.vs.other-")
    others = [comparison.out_dir(w, "docs.txt", "b/other", 10, 20),  # another model of the same name
              comparison.out_dir(w, "sub/docs.txt", "a/other", 10, 20),  # another input of the same name
              comparison.out_dir(w, "docs.txt", "a/other", 11, 20),  # a newer checkpoint of either run
              comparison.out_dir(w, "docs.txt", "a/other", 10, 21)]
    assert len({base, *others}) == 5
