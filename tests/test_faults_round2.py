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
from tests.test_training import compilation_cache  # noqa: F401  (a fixture)


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
    for trial in range(8):  # a fresh folder each time: the writers also race to create .reports/
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


# ---------------------------------------------------------------------------------------------
# from_function: every host call checked; the user's own exception
# ---------------------------------------------------------------------------------------------
def _external(mode: str):
    import numpy as np

    import infodiff

    V, L = 27, 8
    W = np.random.default_rng(0).normal(size=(V + 1, V)).astype(np.float32)
    calls = [0]

    def logprobs(x):
        calls[0] += 1
        logits = W[x]
        lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        if calls[0] >= 4:  # the probe call is the first; from the 4th call on the function goes wrong
            if mode == "plus1":
                return lp + 1
            if mode == "raise":
                raise KeyError("my model broke")
            if mode == "shape":
                return lp[:, :-1]
            if mode == "mask":
                return np.concatenate([lp[..., :-1], np.zeros_like(lp[..., -1:])], -1)
        return lp

    run = infodiff.from_function(logprobs, vocab_size=V, mask_id=V, seq_len=L, num_samples=8, batch_size=4)
    return run, ["the quick brown fox jumps", "over the lazy dog and the cat"] * 2


def test_from_function_output_that_stops_summing_to_one_is_refused():
    """The issue's example: ``logp + 1`` from the 4th call on was scored (53.98 nats instead of
    74.98); now the call is refused, naming it and its rows."""
    run, texts = _external("plus1")
    with pytest.raises(ValueError, match=r"^logprobs_fn's call \d+ after from_function \(rows 0-3 of ids \[4, 8\]\): "
                                         r"logprobs_fn's output is not log-probabilities: logsumexp .* is 1 at"):
        run.nll(texts)


@pytest.mark.parametrize("mode, match", [("shape", r"returned shape \(4, 7, 27\) for ids of shape \(4, 8\)"),
                                         ("mask", r"returned 0\.0 at|logsumexp|finite")])
def test_from_function_later_bad_shape_is_one_value_error(mode, match):
    run, texts = _external(mode)
    with pytest.raises(ValueError, match=match) as e:
        run.nll(texts)
    assert "\n" not in str(e.value) and "call" in str(e.value)


def _choose_tokens(run):
    from infodiff import choices

    enc = run.encode
    return choices.choose_tokens(run, [enc("the ")], [[enc("fox"), enc("dog")]], num_samples=8,
                                 max_samples=8, adaptive=False)


def _lm_eval_call(run, what):
    import types

    from infodiff.harness import InfodiffLM

    lm = InfodiffLM(run=run)
    if what == "generate_until":
        return lm.generate_until([types.SimpleNamespace(args=("the quick", {"until": ["."], "max_gen_toks": 4}))])
    enc = run.encode
    return lm._is_greedy([enc("the ")], [enc("fox")])  # the is_greedy of lm-eval's single requests


@pytest.mark.parametrize("query", ["conditional_nll", "choose", "choose_tokens", "generate_until", "is_greedy"])
def test_from_function_user_exception_is_reraised_as_itself(query, caplog):
    """A Run method, and every query that calls the network from outside the Run
    (``infodiff.choose``; ``choices.choose_tokens``, the lm-eval model's generation and greedy
    check) inside ``Run.guard``: the user's own KeyError, not JAX's wrapper."""
    import infodiff

    run, texts = _external("raise")
    call = {"conditional_nll": lambda: run.conditional_nll(["the quick"], [" brown fox jumps over"]),
            "choose": lambda: infodiff.choose(run, ["the"], [["fox", "dog"]]),
            "choose_tokens": lambda: _choose_tokens(run),
            "generate_until": lambda: _lm_eval_call(run, "generate_until"),
            "is_greedy": lambda: _lm_eval_call(run, "is_greedy")}[query]
    with pytest.raises(KeyError) as e:
        call()
    assert e.type is KeyError and e.value.args == ("my model broke",)
    # JAX's own "jax.pure_callback failed" traceback of it is not logged: the error is said once
    assert not [r for r in caplog.records if "callback failed" in r.getMessage()], caplog.text[:2000]
    assert any(n.startswith("infodiff: raised in logprobs_fn's call") for n in getattr(e.value, "__notes__", []))


def test_from_function_good_function_gives_the_same_numbers_twice():
    import numpy as np

    run, texts = _external("ok")
    a, b = run.nll(texts), run.nll(texts)
    np.testing.assert_array_equal(a.mean, b.mean)


# ---------------------------------------------------------------------------------------------
# Budgets: an upper bound, checked before any work, refused in one line with the cost
# ---------------------------------------------------------------------------------------------
def test_interval_orders_above_the_bound_is_one_line_with_its_cost():
    from infodiff.tasks import masked
    from tests.test_training import tiny_config

    cfg = tiny_config()
    with cfg.unlocked():
        cfg.eval.interval, cfg.eval.interval_orders = True, 1_000_000_000
    with pytest.raises(ValueError, match=r"^config\.eval\.interval_orders=1000000000 is above the bound 1048576 per "
                                         r"item: it implies .* forward passes per item \(about .* years at 1 ms each\) "
                                         r"and 8 GB of per-sample values per item") as e:
        masked.order_settings(cfg)
    assert "\n" not in str(e.value)
    with cfg.unlocked():
        cfg.eval.interval_orders = 16
    assert masked.order_settings(cfg)["orders"] == 16  # a bound, not a change to what passes


@pytest.mark.parametrize("call", [
    lambda v: __import__("infodiff.validation", fromlist=["x"]).check_num_samples(v, "config.eval.num_samples"),
    lambda v: __import__("infodiff.choices", fromlist=["x"]).check_settings(0.95, 32, v),
])
def test_sample_budgets_above_the_bound_are_refused(call):
    from infodiff import validation

    assert call(validation.MAX_PER_ITEM) in (None, validation.MAX_PER_ITEM)
    with pytest.raises(ValueError, match=r"is above the bound 1048576 per item: it implies 1\.05e\+06 forward"):
        call(validation.MAX_PER_ITEM + 1)


# ---------------------------------------------------------------------------------------------
# Input paths that are not files; JSON of any depth or size
# ---------------------------------------------------------------------------------------------
def _special(tmp_path: Path, kind: str) -> str:
    if kind == "directory":
        (tmp_path / "d.txt").mkdir()
        return str(tmp_path / "d.txt")
    if kind == "FIFO":
        os.mkfifo(tmp_path / "f.jsonl")  # opened for reading it would wait for a writer forever
        return str(tmp_path / "f.jsonl")
    if kind == "loop":
        os.symlink(tmp_path / "b.txt", tmp_path / "a.txt")
        os.symlink(tmp_path / "a.txt", tmp_path / "b.txt")
        return str(tmp_path / "a.txt")
    return "/dev/zero"


@pytest.mark.parametrize("kind, said", [("directory", "is a directory"), ("FIFO", r"is a FIFO \(named pipe\)"),
                                        ("loop", "is a loop of symbolic links"), ("device", "is a character device")])
def test_input_that_is_not_a_file_is_named_as_what_it_is(tmp_path, kind, said):
    from infodiff.evaluation import inputs, queries

    path = _special(tmp_path, kind)
    assert queries.detect(path) in (None, *queries.REGISTRY.values())  # returns at once (never opens a FIFO)
    with pytest.raises(ValueError, match=rf"^eval\.input '{path}' {said}") as e:
        inputs.read_input(path)
    assert "\n" not in str(e.value) and "not found" not in str(e.value)


@pytest.mark.parametrize("line, said", [
    ("[" * 100_000 + "]" * 100_000, r":1: JSON nested too deeply to read"),
    ('{"id": ' + "9" * 5000 + ', "prompt": "a", "response": "b"}', r":1: not readable as JSON \(Exceeds the limit"),
])
def test_json_errors_of_any_depth_or_size_are_one_line_with_file_and_line(tmp_path, line, said):
    from infodiff.evaluation import inputs

    f = tmp_path / "rows.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(ValueError, match=rf"^{f}{said}") as e:
        inputs.read_input(str(f))
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# The harness: one line for what evaluate.py says in one; output checked first, written atomically
# ---------------------------------------------------------------------------------------------
def _harness_main(monkeypatch, capsys, raise_in_run, argv):
    pytest.importorskip("lm_eval")
    import lm_eval.__main__ as lm_main

    from infodiff import harness

    ran = []

    def fake_cli_evaluate():
        ran.append(True)
        if raise_in_run is not None:
            raise raise_in_run

    monkeypatch.setattr(lm_main, "cli_evaluate", fake_cli_evaluate)
    monkeypatch.setattr("sys.argv", ["x"])
    code = harness.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err, bool(ran)


@pytest.mark.parametrize("exc, said", [
    (IndexError("list index out of range"), r"^error: IndexError: list index out of range; a task's target"),
    (__import__("infodiff.training.checkpoint", fromlist=["x"]).CheckpointError("no checkpoint in W passes "
                                                                                 "verification"),
     r"^error: CheckpointError: no checkpoint in W passes verification"),
])
def test_harness_errors_are_one_line(monkeypatch, capsys, exc, said):
    import re

    code, err, ran = _harness_main(monkeypatch, capsys, exc, ["--tasks", "t"])
    assert code == 1 and ran and len(err) == 1 and re.search(said, err[0]), err


def test_harness_output_path_that_is_a_file_is_refused_before_the_run(monkeypatch, capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    code, err, ran = _harness_main(monkeypatch, capsys, None, ["--tasks", "t", "--output_path", str(f)])
    assert code == 1 and not ran and len(err) == 1 and "is a file, not a folder" in err[0]
    assert f.read_text() == "x"


def test_harness_output_path_that_cannot_be_written_is_refused_before_the_run(monkeypatch, capsys):
    """A folder that cannot be made or written (here under /proc; root passes os.access): refused
    before the run, so no result is computed and then lost."""
    code, err, ran = _harness_main(monkeypatch, capsys, None, ["--tasks", "t", "--output_path", "/proc/x"])
    assert code == 1 and not ran and len(err) == 1 and "cannot write in '/proc/x'" in err[0], err


def test_harness_files_are_new_and_atomic(tmp_path):
    """Two writes of one name in one second keep both files (os.link: never over another's)."""
    p = str(tmp_path / "infodiff_choices_T.json")
    a, b = files_lib.atomic_write_new(p, b"1"), files_lib.atomic_write_new(p, b"2")
    assert (a, b) == (p, str(tmp_path / "infodiff_choices_T-2.json"))
    assert Path(a).read_bytes() == b"1" and Path(b).read_bytes() == b"2"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["infodiff_choices_T-2.json", "infodiff_choices_T.json"]


# ---------------------------------------------------------------------------------------------
# A file over the size limit (ulimit -f): one StorageError line
# ---------------------------------------------------------------------------------------------
def test_file_too_large_is_a_storage_error():
    import errno

    from infodiff import cli
    from infodiff.training import workdir as workdir_lib

    e = workdir_lib.storage_error(OSError(errno.EFBIG, "File too large"), "/w/checkpoints", "save a checkpoint in")
    assert isinstance(e, workdir_lib.StorageError) and e.errno == errno.EFBIG
    assert str(e) == ("cannot save a checkpoint in /w/checkpoints: [Errno 27] File too large (EFBIG); a file would "
                      "exceed the size limit (ulimit -f, or the file system's): raise it or use another --workdir")
    ts = ValueError('OUT_OF_RANGE: Error writing "x/0.0" in OCDBT database: [OS error 27: File too large]')
    assert workdir_lib.storage_error(ts, "/w").errno == errno.EFBIG  # TensorStore's text, as orbax raises it
    assert cli._STORAGE_FAULT.search('[process=0] Failed ... (ValueError: OUT_OF_RANGE: Error writing "ema_params')


# ---------------------------------------------------------------------------------------------
# Byte runs: a leading BOM is not scored, and the report says so
# ---------------------------------------------------------------------------------------------
def test_byte_run_states_that_a_leading_bom_is_not_scored(tmp_path):
    from infodiff import scoring
    from infodiff.evaluation import inputs

    with_bom, without = tmp_path / "a.txt", tmp_path / "b.txt"
    with_bom.write_bytes(b"\xef\xbb\xbfhello\nworld\n")
    without.write_bytes(b"hello\nworld\n")
    notes_a, notes_b = [], []
    a = inputs.read_input(str(with_bom), notes=notes_a, tokenizer=scoring.BYTES)
    b = inputs.read_input(str(without), notes=notes_b, tokenizer=scoring.BYTES)
    assert a == b and a[2]["text"][0] == "hello"  # the same rows, the same bytes scored
    assert notes_b == [] and notes_a == [f"eval.input {with_bom}: its leading UTF-8 byte order mark (3 bytes, EF BB "
                                         "BF) is not scored: it marks the encoding, not the text"]


# ---------------------------------------------------------------------------------------------
# A read-only output folder: the error says the listed files were not written either
# ---------------------------------------------------------------------------------------------
def test_read_only_folder_says_the_listed_rows_files_were_not_written(tmp_path, plain_format, monkeypatch):
    import errno

    from infodiff.training import workdir as workdir_lib
    from tests.test_faults import _refuse_writes

    out = tmp_path / "out"
    _refuse_writes(monkeypatch, out, errno.EROFS)
    rep = report_lib.Report(_rep(1), attachments={"rows.jsonl": b"{}", "rows.csv": b"", "rows.png": b""})
    with pytest.raises(workdir_lib.StorageError, match=r"\[Errno 30\] .*; none of the files the report lists "
                                                       r"\(rows\.jsonl, rows\.csv, rows\.png\) was written either$"):
        report_lib.write_report(rep, str(out))
    monkeypatch.undo()
    assert not out.exists()


def test_orbax_metadata_warning_beside_a_writer_is_silenced():
    import logging

    from infodiff.training import logs

    f = logs._QuietLibraries()

    def rec(msg, level=logging.WARNING, path="/x/site-packages/orbax/checkpoint/_src/metadata/checkpoint.py"):
        return logging.LogRecord("absl", level, path, 1, msg, ("/w/checkpoints/5/_CHECKPOINT_METADATA",), None)

    assert not f.filter(rec("Metadata file does not exist: %s"))
    assert f.filter(rec("Failed to read Metadata file: %s", logging.ERROR))  # other orbax warnings still show
    assert f.filter(rec("Metadata file does not exist: %s", path="/x/infodiff/evaluation/run.py"))


# ---------------------------------------------------------------------------------------------
# As a user: two evaluate.py on one workdir at once (slow: a training and two evaluations)
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_two_evaluations_at_once_one_written_one_refused_nothing_lost(tmp_path, compilation_cache):
    import subprocess
    import sys

    from tests.test_faults import REPO, _cli_env
    from tests.test_training import PHRASE

    text8 = tmp_path / "tiny_text8"
    text8.write_text((PHRASE * 800)[:30000])
    wd = tmp_path / "run"
    env = _cli_env(compilation_cache)
    subprocess.run([sys.executable, "train.py", "--config", "configs/masked_text.py", f"--workdir={wd}",
                    f"--config.data.path={text8}", "--config.train.num_steps=2", "--config.model.num_layers=1",
                    "--config.model.num_heads=2", "--config.model.width=32", "--config.data.seq_len=16",
                    "--config.train.batch_size=8"], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    procs = [subprocess.Popen([sys.executable, "evaluate.py", "--workdir", str(wd), f"--config.eval.seed={s}",
                               "--config.eval.max_sequences=8"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in (1, 2)]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = [o[0] for o in outs]
    assert sorted(codes) == [0, 1], outs  # one written, one refused: never both "written"
    win, lose = (outs[0], outs[1]) if codes[0] == 0 else (outs[1], outs[0])
    assert "report written to" in win[1] and "report written" not in lose[1]
    err = [ln for ln in lose[2].strip().splitlines() if ln.startswith("error: ")]
    assert len(err) == 1 and "Traceback" not in lose[2], lose[2][-3000:]
    shown = json.loads((wd / "report.json").read_text())["seed"]
    kept = [p for p in (wd / ".reports").iterdir() if p.name.startswith("kept-")]
    if err[0].startswith("error: UnitExistsError: "):  # the commits raced: the loser's files are kept
        assert len(kept) == 1 and {shown, json.loads((kept[0] / "report.json").read_text())["seed"]} == {1, 2}
    else:  # the loser started after the winner had written: refused before any work
        assert "already holds a report" in err[0] and not kept


def test_a_released_checkpoint_given_as_a_workdir_is_one_line(tmp_path):
    """A folder whose config.json is a released checkpoint's (or another program's) given where a
    training run belongs: one ValueError naming the folder and, for weights, --pretrained."""
    import shutil as _shutil

    from infodiff import config_rules, training
    from infodiff.configs import saved_run

    ckpt = tmp_path / "ck"
    _shutil.copytree(Path(__file__).parent / "fixtures" / "pretrained" / "mdlm", ckpt)
    for read in (training.saved_config, saved_run.get_config):
        with pytest.raises(ValueError, match=r"is not an infodiff training run: .*--pretrained") as e:
            read(str(ckpt))
        assert "\n" not in str(e.value)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match=r"has no 'process', 'model', 'data', 'train', 'eval' section \(keys: a\)"):
        training.saved_config(str(other))
    config_rules.check_run_config({k: {} for k in config_rules.RUN_SECTIONS}, str(other))  # a run's: accepted


def test_a_folder_whose_report_json_was_removed_still_holds_a_report(tmp_path, plain_format):
    """report.json deleted by hand, its unit (.reports/current) left: the rerun is refused before
    any work, not after it at commit time."""
    import ml_collections

    out = tmp_path / "w"
    report_lib.write_report(report_lib.Report(_rep(1)), str(out))
    (out / "report.json").unlink()
    cfg = ml_collections.ConfigDict({"eval": {"overwrite": False}})
    with pytest.raises(ValueError, match=r"already holds a report \(\.reports/current; report\.json was removed"):
        report_lib.refuse_existing(str(out), cfg)
    cfg.eval.overwrite = True
    report_lib.refuse_existing(str(out), cfg)
