"""Session set-up: the entry points' compilation cache (infodiff.cli.use_compilation_cache) goes
to a directory of this test session, not the user's ~/.cache, and is removed afterwards."""

import os
import shutil
import tempfile

_CACHE = None
if "INFODIFF_COMPILATION_CACHE" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="infodiff-test-xla-")
    os.environ["INFODIFF_COMPILATION_CACHE"] = _CACHE  # inherited by the CLI subprocesses


def pytest_sessionfinish(session, exitstatus):
    del session, exitstatus
    if _CACHE:
        shutil.rmtree(_CACHE, ignore_errors=True)
