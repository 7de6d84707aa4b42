"""infodiff.progress: a bar on a terminal (also one that reports a 0 x 0 size, as `script` does),
none when stderr is a file or pipe; restart_clock keeps the count."""

import os
import pty
import subprocess
import sys

from infodiff import progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = ("import time; from infodiff import progress\n"
        "b = progress.bar(4, 'demo', 'step', mininterval=0)\n"
        "b.set_postfix({'loss': '1.5', 'bpc': '2.0000'})\n"
        "for _ in range(4): time.sleep(0.05); b.update(1)\n"
        "b.close(); print('done')\n")


def _run(stderr_is_tty: bool) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    if not stderr_is_tty:
        p = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)
        return p.stderr
    master, slave = pty.openpty()  # a fresh pty reports 0 x 0, like `script -qc ... /dev/null`
    try:
        p = subprocess.run([sys.executable, "-c", CODE], env=env, stdout=subprocess.DEVNULL, stderr=slave,
                           timeout=60)
        assert p.returncode == 0
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)


def test_bar_on_a_terminal_even_of_size_zero():
    master, slave = pty.openpty()
    try:
        assert os.get_terminal_size(slave).columns == 0  # what the test relies on
    finally:
        os.close(master)
        os.close(slave)
    out = _run(True)
    assert "demo: 100%" in out and "4/4" in out and "loss=1.5, bpc=2.0000" in out, out


def test_no_bar_when_not_a_terminal():
    assert _run(False) == ""


def test_restart_clock_keeps_the_count():
    import io

    import tqdm

    b = tqdm.tqdm(total=10, desc="x", file=io.StringIO())
    b.update(3)
    progress.restart_clock(b, "y")
    assert (b.n, b.initial, b.desc) == (3, 3, "y")
    b.close()


def test_restart_clock_after_a_resume_never_draws_a_negative_rate():
    """A resumed bar (initial 60 of 90) restarted after compilation: every drawn line keeps the
    count and no rate or ETA is negative (reset() drew 0/90 at -1.7e6 step/s)."""
    import io
    import re
    import time

    import tqdm

    buf = io.StringIO()
    b = tqdm.tqdm(total=90, initial=60, file=buf, mininterval=0, ascii=True, ncols=100, unit="step")
    time.sleep(0.05)
    progress.restart_clock(b, "train")
    b.update(5)
    b.close()
    lines = [x for x in buf.getvalue().replace("\r", "\n").splitlines() if x.strip()]
    assert not any(" 0/90" in x for x in lines), lines
    assert not any(re.search(r"-\d|<-", x) for x in lines), lines
