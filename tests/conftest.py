"""Session set-up: the entry points' compilation cache (infodiff.cli.use_compilation_cache) goes
to a directory of this test session, not the user's ~/.cache, and is removed afterwards; the
programs a test module compiled are freed after it (:func:`_free_compiled_programs`)."""

import gc
import os
import shutil
import tempfile

import pytest

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
