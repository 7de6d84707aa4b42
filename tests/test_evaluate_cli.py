"""End-to-end: evaluate.py in oracle mode (reports, bias within SE) and its bad-input errors."""

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from infodiff import oracles
from infodiff.processes import masking
from tests.conftest import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, cwd=REPO):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "evaluate.py", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_oracle_tabular_cli_from_file(tmp_path):
    tab = oracles.random_tabular(np.random.default_rng(0), "ACGT", 5, 40)
    path = tmp_path / "table.json"
    path.write_text(json.dumps(tab.to_json()))
    out = tmp_path / "out"
    r = _run(["--config", "configs/oracle_tabular.py", f"--config.data.path={path}",
              "--config.eval.num_sequences=4", "--config.eval.num_samples=512",
              "--config.data.prompt_len=2", f"--config.eval.output_dir={out}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "-log p(x), nats per sequence" in r.stdout and "coupled" in r.stdout
    rep = json.loads((out / "report.json").read_text())
    assert (out / "report.txt").exists()
    png = out / "estimates.png"  # bias +- 2 SE of every estimator
    assert str(png) in rep["plots"] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert rep["kind"] == "oracle" and rep["num_items"] == 4 and rep["process"]["name"] == "masked"
    names = [u["estimator"] for u in rep["results"]["unconditional"]]
    assert names == list(masking.LAWS)  # configs/oracle_common.py lists every registered estimator
    def unbiased(row):  # exact rows (every subset enumerated): float32 round-off only
        if row["exact"]:
            return abs(row["bias"]) < 1e-5 * max(1.0, abs(row["mean_exact"])) and row["bias_stderr"] == 0
        return abs(row["bias"]) < 4 * row["bias_stderr"]

    for section in ("unconditional", "conditional"):
        for row in rep["results"][section]:
            assert unbiased(row), row
    assert rep["results"]["unconditional"][-1]["exact"]  # neyman: 2^5 - 1 subsets < the budget
    for pair in rep["results"]["ratio"]:
        for kind in ("coupled", "decoupled"):
            assert unbiased(pair[kind]), pair


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, message",
    [
        (None, "file not found"),
        ("", "is empty"),
        ('{"AB": 0.5, "BA": 0.25}', "sum to 0.75"),
        ('{"AB": 0.5, "B": 0.5}', "malformed key 'B'"),
    ],
)
def test_oracle_cli_bad_table(tmp_path, content, message):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    r = _run(["--config", "configs/oracle_tabular.py", f"--config.data.path={path}",
              f"--config.eval.output_dir={tmp_path / 'o'}"])
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


def test_config_typo_is_an_error(tmp_path):
    r = _run(["--config", "configs/oracle_markov.py", "--config.eval.num_sampels=3"])
    assert r.returncode != 0 and "num_sampels" in r.stderr


def test_workdir_without_run_is_a_clear_error(tmp_path):
    r = _run(["--workdir", str(tmp_path / "nothing")])
    assert r.returncode != 0 and "config.json not found" in r.stderr


@pytest.mark.slow
def test_oracle_cli_one_token_response_and_strict_json(tmp_path):
    out = tmp_path / "o"
    r = _run(["--config", "configs/oracle_markov.py", "--config.data.order=2",
              "--config.data.prompt_len=1", "--config.data.response_len=1",
              "--config.eval.num_sequences=3", "--config.eval.num_samples=16",
              f"--config.eval.output_dir={out}"])
    assert r.returncode == 0, r.stderr[-3000:]
    text = (out / "report.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    rep = json.loads(text)
    # With one target token k_dce / time_free / stratified are exact: zero variance, z undefined.
    kd = next(u for u in rep["results"]["conditional"] if u["estimator"] == "k_dce")
    assert kd["per_sample_variance"] == 0 and kd["bias_z"] is None
    assert abs(kd["bias"]) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "configs/oracle_tabular.py", "--config.data.prompt_len=10"], "prompt_len=10 must be in [0, 7]"),
        (["--config", "configs/oracle_tabular.py", "--config.eval.estimators="], "estimators is empty"),
        (["--config", "configs/oracle_markov.py", "--config.eval.estimators=k_dce,timefree"], "unknown estimator 'timefree'"),
        (["--config", "configs/oracle_markov.py", "--config.eval.num_sequences=0"], "num_sequences must be >= 1"),
    ],
)
def test_oracle_cli_refuses_bad_settings_before_running(tmp_path, args, message):
    r = _run(args + [f"--config.eval.output_dir={tmp_path / 'o'}"])
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "o" / "report.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--config", "configs/oracle_tabular.py", "--config.eval.num_sequence=4"],
     "error: unknown config key --config.eval.num_sequence ('num_sequence' is not in the config); "
     "did you mean 'num_sequences'?"),
    (["--config", "configs/oracle_tabular.py", "--config.eval.num_sequences=abc"],
     "error: IllegalFlagValueError: flag --config.eval.num_sequences=abc: invalid literal for int()"),
    (["--workdir", "GARBLED"], "config.json is not valid JSON (Expecting value at line 2 column 1)"),
])
def test_flag_parsing_errors_are_one_line(tmp_path, args, message):
    """A misspelt key, a bad value or a garbled saved config: one line on stderr, exit status 1."""
    (tmp_path / "config.json").write_text('{"model": \n')
    args = [str(tmp_path) if a == "GARBLED" else a for a in args]
    r = _run(args)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr


@pytest.mark.parametrize("script, args, key", [
    ("train.py", ["--help"], "optim.warmup_steps = 200"),
    ("evaluate.py", ["--help", "--config", "configs/oracle_poisson.py"], "eval.num_samples = 1000"),
    ("evaluate.py", ["-h", "--config=configs/oracle_poisson.py"],
     "eval.loc = -1.0   # not read: only when eval.proposal = 'manual'"),
])
def test_help_lists_the_config_keys_and_exits_0(script, args, key):
    r = subprocess.run([sys.executable, script, *args], cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "flags:" in r.stdout and "(override with --config.KEY=VALUE)" in r.stdout
    assert key in r.stdout


@pytest.mark.slow
def test_sigint_in_evaluate_says_what_was_lost(tmp_path):
    """Ctrl-C during a long oracle evaluation: one line saying nothing was written, status 130,
    no report; log lines carry no absl prefix."""
    import signal
    import time

    import pty

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("INFODIFF_TRACEBACK", None)
    master, slave = pty.openpty()  # stderr a terminal: the evaluation draws its progress bar there
    p = subprocess.Popen([sys.executable, "evaluate.py", "--config", "configs/oracle_markov.py",
                          f"--config.eval.output_dir={tmp_path}"], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)

    def read_err():
        try:
            return os.read(master, 4096).decode(errors="replace")
        except OSError:  # EIO: the process closed its terminal
            return ""

    err = ""
    try:
        t0 = time.time()
        while time.time() - t0 < 300:  # until a batch of the estimate has run (compiled, steady state)
            chunk = read_err()
            if not chunk:
                break
            err += chunk
            if "| 1/" in err:
                break
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=300)
        while chunk := read_err():
            err += chunk
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    err = err.replace("\r\n", "\n")
    assert p.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGINT): the work in progress is lost"), err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "report.json").exists()


def test_compilation_cache_directory_and_its_switches(monkeypatch, tmp_path, capsys):
    from infodiff import cli

    for var in ("JAX_COMPILATION_CACHE_DIR", "INFODIFF_COMPILATION_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.compilation_cache_dir() == str(tmp_path / ".cache" / "infodiff" / "xla")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.compilation_cache_dir() == str(tmp_path / "xdg" / "infodiff" / "xla")
    for on in ("1", "on", " Yes ", "true", " "):  # the default directory, not a directory named "1"
        monkeypatch.setenv("INFODIFF_COMPILATION_CACHE", on)
        assert cli.compilation_cache_dir() == str(tmp_path / "xdg" / "infodiff" / "xla")
    monkeypatch.setenv("INFODIFF_COMPILATION_CACHE", str(tmp_path / "mine"))
    assert cli.compilation_cache_dir() == str(tmp_path / "mine")
    for off in ("off", "0", "False", " none "):
        monkeypatch.setenv("INFODIFF_COMPILATION_CACHE", off)
        assert cli.compilation_cache_dir() is None
        assert cli.use_compilation_cache() is None
    assert not (tmp_path / "xdg").exists()  # off: nothing created
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("INFODIFF_COMPILATION_CACHE", str(tmp_path / "file" / "xla"))
    assert cli.use_compilation_cache() is None  # not creatable: a warning, the run goes on
    assert "warning: no compilation cache" in capsys.readouterr().err
    monkeypatch.setenv("INFODIFF_COMPILATION_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))  # JAX's own setting wins
    assert cli.compilation_cache_dir() is None


@pytest.mark.slow
def test_damaged_compilation_cache_entries_are_removed(tmp_path):
    import zlib

    from infodiff import cli

    payload = zlib.compress(os.urandom(5000))
    (tmp_path / "jit_good-1-cache").write_bytes(payload)
    (tmp_path / "jit_cut-2-cache").write_bytes(payload[: len(payload) // 2])  # a write cut short
    (tmp_path / "jit_empty-3-cache").write_bytes(b"")
    (tmp_path / "jit_junk-4-cache").write_bytes(b"not zlib at all")
    (tmp_path / "jit_zstd-5-cache").write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(64))  # zstd frame: not checked
    (tmp_path / "notes.txt").write_bytes(b"")  # not an entry: left alone
    assert sorted(cli.remove_damaged_cache_entries(str(tmp_path))) == ["jit_cut-2-cache", "jit_empty-3-cache",
                                                                      "jit_junk-4-cache"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [cli.VERIFIED_INDEX, "jit_good-1-cache", "jit_zstd-5-cache",
                                                          "notes.txt"]
    # An entry found whole is not read again unless its size, mtime or inode changes: damage
    # that keeps all three goes unseen (recorded, not re-read); a truncation, a copy with the
    # old mtime kept, or a clock stepped back are seen.
    good = tmp_path / "jit_good-1-cache"
    st = good.stat()
    with open(good, "r+b") as f:
        f.write(b"\0" * 8)  # same size
    os.utime(good, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cli.remove_damaged_cache_entries(str(tmp_path)) == []
    good.write_bytes(payload[:100])
    os.utime(good, ns=(st.st_atime_ns, st.st_mtime_ns))  # cut short, its old mtime put back
    (tmp_path / "jit_new-6-cache").write_bytes(payload)
    copy = tmp_path / "jit_copy-7-cache"
    copy.write_bytes(payload[:10])
    os.utime(copy, (0, 0))  # a copy that kept an old mtime (cp -a, tar x)
    (tmp_path / f".{cli.VERIFIED_INDEX}.99.ab.tmp").write_bytes(b"")  # left by a killed scan
    os.utime(tmp_path / f".{cli.VERIFIED_INDEX}.99.ab.tmp", (0, 0))
    assert sorted(cli.remove_damaged_cache_entries(str(tmp_path))) == ["jit_copy-7-cache", "jit_good-1-cache"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [cli.VERIFIED_INDEX, "jit_new-6-cache", "jit_zstd-5-cache",
                                                          "notes.txt"]
    import json

    assert sorted(json.loads((tmp_path / cli.VERIFIED_INDEX).read_text())) == ["jit_new-6-cache", "jit_zstd-5-cache"]
    new = tmp_path / "jit_new-6-cache"
    st = new.stat()
    new.write_bytes(b"\0" * st.st_size)  # damage that keeps size, mtime and inode ...
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    (tmp_path / cli.VERIFIED_INDEX).write_text("{not json")  # ... seen once the record is unreadable
    assert cli.remove_damaged_cache_entries(str(tmp_path)) == ["jit_new-6-cache"]


@pytest.mark.slow
def test_a_rerun_from_the_compilation_cache_gives_the_same_numbers(tmp_path):
    cache = tmp_path / "xla"
    args = ["--config", "configs/oracle_markov.py", "--config.data.order=2", "--config.eval.num_sequences=3",
            "--config.eval.num_samples=16", "--config.eval.estimators=k_dce,stratified"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", INFODIFF_COMPILATION_CACHE=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",  # cache every program, however quick
               JAX_DEBUG_LOG_MODULES="jax._src.compiler")  # logs each cache hit
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    reports = []
    for run in ("first", "second"):
        out = tmp_path / run
        r = subprocess.run([sys.executable, "evaluate.py", *args, f"--config.eval.output_dir={out}"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        hits = "Persistent compilation cache hit for 'jit__chunk_values'" in r.stderr
        if run == "first":
            entries = sorted(p.name for p in cache.iterdir())
            assert any(name.startswith("jit__chunk_values") for name in entries), entries
            assert not hits
        else:
            assert hits, r.stderr[-3000:]  # the second run read the driver's program from the cache
        reports.append(json.loads((out / "report.json").read_text())["results"])
    assert reports[0] == reports[1]

    # Damage that the start-up scan cannot see (a well-formed zlib stream of garbage, zstd magic
    # and garbage, a byte changed in place with size, mtime and inode kept): JAX fails to read
    # each entry; it is removed with one line naming it and written anew, so the next run is clean.
    entries = sorted(p for p in cache.iterdir() if p.name.startswith("jit__chunk_values"))
    assert len(entries) >= 3, entries
    damaged = {}
    for entry, how in zip(entries, ("zlib", "zstd", "flip")):
        st, data = entry.stat(), entry.read_bytes()
        if how == "zlib":
            new = zlib.compress(os.urandom(len(data)))
        elif how == "zstd":
            new = b"\x28\xb5\x2f\xfd" + os.urandom(len(data) - 4)
        else:
            new = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
        with open(entry, "r+b") as f:
            f.truncate(0)
            f.write(new)
        os.utime(entry, ns=(st.st_atime_ns, st.st_mtime_ns))
        damaged[entry.name.removesuffix("-cache")] = how
    for run in ("damaged", "healed"):
        out = tmp_path / run
        r = subprocess.run([sys.executable, "evaluate.py", *args, f"--config.eval.output_dir={out}"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "UserWarning" not in r.stderr and "warnings.warn" not in r.stderr, r.stderr[-3000:]
        notes = [line.split("\r")[-1] for line in r.stderr.splitlines() if "compilation cache entry" in line]
        if run == "damaged":
            assert len(notes) == len(damaged), notes
            for key in damaged:
                note = next(n for n in notes if key in n)
                assert note.startswith(f"warning: compilation cache entry {cache / key}-cache could not be read ("), note
                assert note.endswith("removed: compiled again in this run and written anew"), note
                assert (cache / f"{key}-cache").exists()  # written anew
        else:
            assert notes == [], notes
            for key in damaged:
                assert f"Persistent compilation cache hit for 'jit__chunk_values' with key '{key}'" in r.stderr, key
                assert f"PERSISTENT COMPILATION CACHE MISS for 'jit__chunk_values' with key '{key}'" not in r.stderr
        assert json.loads((out / "report.json").read_text())["results"] == reports[0]


def test_jax_cache_warnings_are_one_line(monkeypatch, capsys):
    import warnings

    from infodiff import cli

    others = []
    monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: others.append(str(a[0])))  # restored after
    cli.condense_cache_warnings()
    cli.condense_cache_warnings()  # idempotent
    warnings.warn_explicit("Error writing persistent compilation cache entry for 'jit_f': OSError: [Errno 28]\n"
                           "No space left on device", UserWarning, "/x/jax/_src/compiler.py", 833)
    warnings.warn_explicit("something else", UserWarning, "/x/mine.py", 1)
    assert capsys.readouterr().err == ("warning: Error writing persistent compilation cache entry for 'jit_f': OSError: "
                                       "[Errno 28] No space left on device (the compiled program is not kept for "
                                       "later runs)\n")
    assert others == ["something else"]  # other warnings as before


@pytest.mark.slow
def test_evaluation_split_over_cpu_devices_gives_the_one_device_numbers(tmp_path):
    from infodiff import cli

    if cli.usable_cores() < 2:
        pytest.skip("needs 2 cores (INFODIFF_CPU_DEVICES may not exceed them)")
    # evaluate.py gives JAX one CPU device per core (infodiff.cli.use_cpu_cores_as_devices) and
    # splits every estimator call's rows over them: the same draws, so the same numbers
    args = ["--config", "configs/oracle_markov.py", "--config.data.order=2", "--config.eval.num_sequences=3",
            "--config.eval.num_samples=16", "--config.eval.estimators=k_dce,stratified"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags())  # no device count set
    env.pop("JAX_NUM_CPU_DEVICES", None)
    reports = {}
    for n in ("1", "2"):
        out = tmp_path / n
        r = subprocess.run([sys.executable, "evaluate.py", *args, f"--config.eval.output_dir={out}"], cwd=REPO,
                           env=dict(env, INFODIFF_CPU_DEVICES=n), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        reports[n] = json.loads((out / "report.json").read_text())
        assert reports[n]["env"]["devices"] == int(n)
    for kind in ("unconditional", "conditional"):
        one, two = reports["1"]["results"][kind], reports["2"]["results"][kind]
        assert [e["estimator"] for e in one] == [e["estimator"] for e in two] == ["k_dce", "stratified"]
        for a, b in zip(one, two):
            assert a["forward_passes"] == b["forward_passes"]
            np.testing.assert_allclose(b["mean_estimate"], a["mean_estimate"], rtol=1e-6)
            np.testing.assert_allclose(b["bias_stderr"], a["bias_stderr"], rtol=1e-4)
            assert a["mean_estimate"] != a["mean_exact"]  # a Monte Carlo estimate, not the oracle's value
    r = subprocess.run([sys.executable, "evaluate.py", *args, f"--config.eval.output_dir={tmp_path / 'bad'}"],
                       cwd=REPO, env=dict(env, INFODIFF_CPU_DEVICES="two"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ValueError: INFODIFF_CPU_DEVICES='two': give a whole number from 1 (one "
                               "device) to "), r.stderr


def test_cpu_devices_default_is_the_cores_this_process_may_use(monkeypatch):
    from infodiff import cli

    monkeypatch.delenv("INFODIFF_CPU_DEVICES", raising=False)
    cores = {"n": 3}
    monkeypatch.setattr(cli, "usable_cores", lambda: cores["n"])
    assert cli.cpu_devices() == 3
    cores["n"] = 64
    assert cli.cpu_devices() == cli.MAX_DEFAULT_CPU_DEVICES
    monkeypatch.setenv("INFODIFF_CPU_DEVICES", "12")
    assert cli.cpu_devices() == 12
    for bad in ("0", "-1", "1.5", "65", "99999", "\u00b2", "\u0663"):  # more than the cores; non-ASCII digits
        monkeypatch.setenv("INFODIFF_CPU_DEVICES", bad)
        with pytest.raises(ValueError, match="INFODIFF_CPU_DEVICES"):
            cli.cpu_devices()


def test_usable_cores_follow_the_affinity_and_a_cgroup_quota(monkeypatch, tmp_path):
    from infodiff import cli

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(cli, "CGROUP_CPU_MAX", str(quota))
    assert cli.usable_cores() == 16  # no cgroup file
    for text, cores in (("max 100000\n", 16), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000", 1),
                        ("garbage", 16)):
        quota.write_text(text)
        assert cli.usable_cores() == cores, text


# ---------------------------------------------------------------------------------------------
# A SEDD run scores a user's .txt / .jsonl (evaluate.py --config.eval.input=FILE and the API)
# ---------------------------------------------------------------------------------------------
def _sedd_run(tmp_path, graph):
    """A tiny SEDD run (configs/sedd_<graph>_text.py shrunk, 20 steps on the toy corpus)."""
    import importlib

    from tests.test_training import train_run

    c = importlib.import_module(f"configs.sedd_{graph}_text").get_config()
    for k, v in {"model.num_layers": 1, "model.num_heads": 2, "model.width": 32, "data.seq_len": 16,
                 "train.batch_size": 8, "train.num_steps": 20, "train.log_every": 10, "train.eval_every": 1000,
                 "train.eval_batches": 1, "train.ckpt_every": 20, "optim.warmup_steps": 2,
                 "eval.num_generate": 0}.items():
        section, name = k.split(".")
        c[section][name] = v
    wd = tmp_path / f"sedd_{graph}"
    train_run(c, str(wd))
    return wd


def _lines(path, rows):
    path.write_text("".join((json.dumps(r) if isinstance(r, dict) else r) + "\n" for r in rows))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("graph, min_samples", [("absorb", 128), ("uniform", 512)])
def test_sedd_run_scores_text_pairs_and_ratios(tmp_path, graph, min_samples):
    import infodiff
    from ml_collections import ConfigDict

    from infodiff import evaluation, training

    wd = _sedd_run(tmp_path, graph)
    docs = _lines(tmp_path / "docs.txt", ["The cat sat on the mat, and then a line longer than the model.", "",
                                           "Short."])
    r = _run(["--workdir", str(wd), f"--config.eval.input={docs}", "--config.eval.input_samples=8"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"config.eval.input_samples=8 is below the imdse_{graph}" in r.stderr  # the one-line warning
    from infodiff.evaluation import inputs

    out = Path(inputs.default_out_dir(str(wd), str(docs)))
    rep = json.loads((out / "report.json").read_text())
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert rep["kind"] == "input" and rep["input"]["format"] == "text" and rep["process"]["graph"] == graph
    assert rep["estimator"].startswith(f"imdse_{graph}:") and rep["bound"] == "nelbo"
    assert rep["units"]["nll"] == "nats per row"
    assert [x["id"] for x in rows] == ["1", "3"] and [x["windows"] for x in rows] == [4, 1]
    assert all(x["se"] > 0 and np.isfinite(x["value"]) and np.isfinite(x["se"]) for x in rows)
    assert rep["few_samples"] and rep["min_samples"] == min_samples
    assert any(f"use --config.eval.input_samples={min_samples}" in n for n in rep["notes"])
    assert "NELBO" in r.stdout

    cfg = ConfigDict(training.saved_config(str(wd)))
    assert cfg.eval.input_samples == min_samples  # the config's default is the process's minimum
    cfg.eval.input_samples = 8
    prompts, ys, alts = ["the cat sat on", "", "and the dog ate the hat and the cat"], ["the mat", "the cat", "the hat"], \
        ["the hat", "tac eht", "the mat"]
    cfg.eval.input = str(_lines(tmp_path / "pairs.jsonl", [{"prompt": p, "response": y} for p, y in zip(prompts, ys)]))
    rep, _ = evaluation.evaluate(cfg, str(wd))
    assert rep["input"]["format"] == "pairs" and rep["input"]["rows"] == 3
    assert all(x["se"] > 0 and np.isfinite(x["value"]) for x in rep["rows_preview"])
    assert [x["context_chars"] for x in rep["rows_preview"]] == [9, 0, 9]  # L - 7 of the prompt (+ space)
    cfg.eval.input = str(_lines(tmp_path / "ab.jsonl", [{"prompt": p, "a": a, "b": b}
                                                         for p, a, b in zip(prompts, ys, alts)]))
    rep, _ = evaluation.evaluate(cfg, str(wd))
    assert rep["input"]["format"] == "ratios" and rep["estimator"].endswith(":coupled")
    assert rep["bound"] == "nelbo_difference" and rep["units"]["nll"] == "nats per row"
    assert all(x["se"] > 0 and np.isfinite(x["value"]) and x["se_decoupled"] > 0 for x in rep["rows_preview"])

    run = infodiff.load_run(str(wd), num_samples=8)
    n, c, lr = run.nll(["the cat sat"]), run.conditional_nll(prompts, ys), run.log_ratio(prompts, ys, alts)
    assert n.mean.shape == (1,) and c.mean.shape == lr.mean.shape == (3,)
    assert n.few_samples and np.all(c.stderr > 0) and np.all(np.isfinite(lr.mean))
    with pytest.raises(ValueError, match="scores text with 'imdse'"):
        infodiff.load_run(str(wd), estimator="k_dce")
