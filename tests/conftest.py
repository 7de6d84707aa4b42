"""Session set-up and the fixtures shared by the test files.

Set-up: the entry points' compilation cache (infodiff.cli.use_compilation_cache) goes to a
directory of this test session, not the user's ~/.cache, and is removed afterwards; the programs
a test module compiled are freed after it (:func:`_free_compiled_programs`).

Shared tiny model (use these instead of training another tiny model; every tiny training costs
seconds of compilation, and the suite has a 15-minute budget on 2 cores):

* ``tiny_masked_config(**overrides)`` (a function: ``from tests.conftest import
  tiny_masked_config``): configs/masked_text.py shrunk to 1 layer, width 32, L = 16, B = 8,
  30 steps (checkpoints and train logs every 10); overrides as ``{"train.num_steps": 20}``.
  ``tests.test_training.tiny_config`` is the same function.
* ``toy_corpus()``: a periodic, learnable character stream (the toy corpus of every tiny run);
  ``train_run(config, workdir, corpus=None, **kwargs)``: ``training.train`` of it.
* fixtures ``trained_masked_run`` and ``trained_masked_result`` (session): the workdir (a
  ``Path``) of ``tiny_masked_config()`` trained on ``toy_corpus()``: checkpoints 10, 20, 30, metrics.jsonl, config.json.
  READ ONLY. Anything that writes into a workdir (evaluate.py / ``evaluation.evaluate`` of the
  split writes report.json there, scoring a file writes ``W/scores/``, resuming adds
  checkpoints) works on a copy: ``copy_run(trained_masked_run, tmp_path / "run")`` (or a
  module-scoped fixture that copies it once for the module, as tests/test_scoring.py does).
  ``trained_masked_result`` is what ``training.train`` returned for it.
  ``trained_masked_run_every_5``: the same config with ``EVERY_5_STEPS`` (20 steps, checkpoints
  5, 10, 15, 20), the fault tests' reference run; read only too. With pytest-xdist every
  worker process trains its own (once).
* ``persistent_compilation_cache(dir)`` (a context manager) and fixture ``session_xla_cache``
  (session): the persistent XLA cache of the in-process trainings; the shared runs fill it and
  ``tests.test_training.compilation_cache`` (a module fixture other files import) points at it.
"""

import contextlib
import gc
import os
import shutil
import tempfile
import types
from pathlib import Path

import pytest

# XLA:CPU compiles the suite's tens of thousands of small programs with LLVM's optimisation off:
# compilation is most of the suite's time (docs/testing.md, "Time"). XLA's graph passes run as before; the machine code differs, so float
# results can differ in the last bits (and a sampled path after a threshold), within every
# tolerance of the suite. INFODIFF_TEST_XLA_DEFAULT=1 runs the suite with XLA's defaults.
# Subprocesses inherit it; one that sets its own XLA_FLAGS takes them from xla_flags().
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


def xla_flags(*extra: str) -> str:
    """The session's XLA_FLAGS (:data:`FAST_COMPILE` unless INFODIFF_TEST_XLA_DEFAULT=1) plus
    ``extra`` (e.g. ``--xla_force_host_platform_device_count=2``), for a subprocess's env."""
    base = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(
        "--xla_force_host_platform_device_count")]
    return " ".join([*base, *extra])


if os.environ.get("INFODIFF_TEST_XLA_DEFAULT") != "1":
    _flags = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join([*_flags, *(f for f in FAST_COMPILE if f not in _flags)])

_CACHE = None
if "INFODIFF_COMPILATION_CACHE" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="infodiff-test-xla-")
    os.environ["INFODIFF_COMPILATION_CACHE"] = _CACHE  # inherited by the CLI subprocesses


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop JAX's in-memory executables after each test module. Every XLA:CPU executable holds
    a few memory mappings until it is freed; the suite compiles tens of thousands of programs
    in one process, and a process past the kernel's ``vm.max_map_count`` (65530 by default)
    segfaults in the next compile (the full suite did, at 81 %)."""
    yield
    import jax

    jax.clear_caches()
    gc.collect()


PHRASE = "the cat sat on the mat and the dog ate the hat "


def tiny_masked_config(**overrides):
    """configs/masked_text.py shrunk: 1 layer, width 32, L = 16, B = 8, 30 steps; ``overrides``
    as ``{"section.key": value}``. Returns a fresh ``ml_collections.ConfigDict``."""
    from infodiff.configs import masked_text

    c = masked_text.get_config()
    c.model.num_layers = 1
    c.model.num_heads = 2
    c.model.width = 32
    c.data.seq_len = 16
    c.train.batch_size = 8
    c.train.num_steps = 30
    c.train.log_every = 10
    c.train.eval_every = 1000
    c.train.eval_batches = 2
    c.train.ckpt_every = 10
    c.train.keep_checkpoints = 5
    c.optim.lr = 3e-3
    c.optim.warmup_steps = 2
    for k, v in overrides.items():
        section, name = k.split(".")
        c[section][name] = v
    return c


def toy_corpus(n_chars: int = 20000):
    """A periodic, learnable character stream (ids in [0, 27)): train, valid, test, checksums."""
    from infodiff.data import text as text_data

    ids = text_data.encode((PHRASE * (n_chars // len(PHRASE) + 1))[:n_chars])
    return types.SimpleNamespace(
        train=ids, valid=ids[: n_chars // 10], test=ids[: n_chars // 10], name="toy",
        checksums={"train": "toy-train", "valid": "toy-valid", "test": "toy-test"},
    )


def train_run(config, workdir, corpus=None, **kwargs) -> dict:
    """`training.train` of the task of `config` on `corpus` (default: the toy corpus)."""
    from infodiff import tasks, training

    return training.train(tasks.make_task(config, data=toy_corpus() if corpus is None else corpus),
                          workdir, **kwargs)


def copy_run(run: Path, dest: Path) -> Path:
    """A private copy of the workdir ``run`` at ``dest`` (for tests that write into a run)."""
    shutil.copytree(run, dest)
    return Path(dest)


@contextlib.contextmanager
def persistent_compilation_cache(cache_dir: str):
    """JAX's persistent compilation cache in ``cache_dir`` for every program compiled inside
    (identical programs compile once), the previous settings restored after."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    old = {n: getattr(jax.config, n) for n in names}
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    cc.reset_cache()
    try:
        yield str(cache_dir)
    finally:
        for n, v in old.items():
            jax.config.update(n, v)
        cc.reset_cache()


@pytest.fixture(scope="session")
def session_xla_cache(tmp_path_factory) -> str:
    """One persistent compilation cache directory for the in-process trainings of the session
    (the shared trained runs and the modules using tests/test_training.py's
    ``compilation_cache``): the programs of the tiny model compile once per session."""
    return str(tmp_path_factory.mktemp("xla_cache"))


# The fault tests' run (tests/test_faults.py, test_readers_and_reports.py): 20 steps, a checkpoint
# and a train log every 5, all 4 checkpoints kept.
EVERY_5_STEPS = {"train.num_steps": 20, "train.log_every": 5, "train.ckpt_every": 5, "train.keep_checkpoints": 10}


@pytest.fixture(scope="session")
def trained_masked_run_every_5(tmp_path_factory, session_xla_cache) -> Path:
    """``tiny_masked_config(**EVERY_5_STEPS)`` trained 20 steps on ``toy_corpus()``:
    checkpoints 5, 10, 15, 20 (read only, as ``trained_masked_run``)."""
    wd = tmp_path_factory.mktemp("trained_masked_run_every_5") / "run"
    with persistent_compilation_cache(session_xla_cache):
        assert train_run(tiny_masked_config(**EVERY_5_STEPS), wd)["step"] == 20
    return wd


@pytest.fixture(scope="session")
def _trained_masked(tmp_path_factory, session_xla_cache) -> tuple[Path, dict]:
    wd = tmp_path_factory.mktemp("trained_masked_run") / "run"
    with persistent_compilation_cache(session_xla_cache):
        return wd, train_run(tiny_masked_config(), wd)


@pytest.fixture(scope="session")
def trained_masked_run(_trained_masked) -> Path:
    """``tiny_masked_config()`` trained 30 steps on ``toy_corpus()`` (read only: see above)."""
    return _trained_masked[0]


@pytest.fixture(scope="session")
def trained_masked_result(_trained_masked) -> dict:
    """What ``training.train`` returned for ``trained_masked_run`` (step, interrupted, valid)."""
    return _trained_masked[1]


def pytest_sessionfinish(session, exitstatus):
    del session, exitstatus
    if _CACHE:
        shutil.rmtree(_CACHE, ignore_errors=True)


# A test-only process: the masked process registered under another name. It gets every
# generated contract, calibration and resume test (tests/test_processes.py, test_calibration.py,
# test_training.py) with no edit there; those files assert that its cases are among their ids.
import dataclasses  # noqa: E402

from infodiff import tasks  # noqa: E402
from infodiff.tasks import masked as _masked  # noqa: E402

TEST_PROCESS = "test_masked"


def _test_calibration_cases():
    k_dce = next(c for c in _masked.calibration_cases() if c.name == "k_dce")
    return [dataclasses.replace(k_dce, name=f"{TEST_PROCESS} k_dce")]


tasks.register(dataclasses.replace(
    _masked.REGISTRATION, name=TEST_PROCESS,
    contract_cases=lambda: _masked.contract_cases(TEST_PROCESS, ("k_dce",)),
    calibration_cases=_test_calibration_cases,
    tiny_config=lambda: _masked.tiny_config(TEST_PROCESS)))
