"""Readers beside a live writer: `evaluate.py --workdir W` while `train.py` checkpoints W.

Starts a tiny masked text run (1 layer, width 32, length 16, batch 8 on a 30 kB corpus) that
saves a checkpoint every ``--ckpt-every`` steps and keeps ``--keep`` of them, then runs
``--evaluations`` evaluations of W while it trains (``--parallel`` at a time), then stops the
run (SIGTERM: it saves and exits 143). Prints one line per evaluation and a summary:

* failures: evaluations that did not exit 0 (before the fix: ``CheckpointError: no checkpoint
  ... passes verification`` when keep-k deleted the listed checkpoints during the read);
* every report's ``checkpoint_step`` was a real checkpoint (seen in W/checkpoints by a poller
  and logged in W/metrics.jsonl) and verified (no "skipping a bad checkpoint" warning);
* the writer's checkpoint cadence (mean seconds between new step directories).

    python scripts/fault_reader_writer.py                       # 50 evaluations, keep 2
    python scripts/fault_reader_writer.py --evaluations 20 --keep 1 --ckpt-every 60

Exit status 0 when every evaluation succeeded and every check held, 1 otherwise. CPU only
(JAX_PLATFORMS=cpu).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHRASE = "the cat sat on the mat and the dog ate the hat "
TINY = ["--config.model.num_layers=1", "--config.model.num_heads=2", "--config.model.width=32",
        "--config.data.seq_len=16", "--config.train.batch_size=8"]
EVAL = ["--config.eval.max_sequences=16", "--config.eval.num_samples=2", "--config.eval.num_generate=1",
        "--config.eval.sample_steps=4"]


def _env(cache: str) -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, INFODIFF_COMPILATION_CACHE=cache,
                INFODIFF_CPU_DEVICES="1")


class Poller(threading.Thread):
    """Records when each checkpoint step directory first appears."""

    def __init__(self, ckpt_dir: str):
        super().__init__(daemon=True)
        self.dir, self.seen, self.stop = ckpt_dir, {}, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                names = os.listdir(self.dir)
            except OSError:
                names = []
            now = time.time()
            for n in names:
                if n.isdigit() and int(n) not in self.seen:
                    self.seen[int(n)] = now
            time.sleep(0.02)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evaluations", type=int, default=50)
    ap.add_argument("--parallel", type=int, default=1, help="evaluations at a time")
    ap.add_argument("--ckpt-every", type=int, default=45, help="steps between checkpoints (~0.5 s on 2 CPU cores)")
    ap.add_argument("--keep", type=int, default=2, help="train.keep_checkpoints")
    ap.add_argument("--workdir", default=None, help="default: a new temporary directory")
    ap.add_argument("--json", default=None, help="write the summary here")
    args = ap.parse_args()

    base = args.workdir or tempfile.mkdtemp(prefix="fault_reader_writer_")
    os.makedirs(base, exist_ok=True)
    corpus = os.path.join(base, "tiny_text8")
    with open(corpus, "w") as f:
        f.write((PHRASE * 800)[:30000])
    wd, cache = os.path.join(base, "run"), os.path.join(base, "xla")
    env = _env(cache)
    train_cmd = [sys.executable, "train.py", "--config", "configs/masked_text.py", f"--workdir={wd}",
                 f"--config.data.path={corpus}", *TINY, "--config.train.num_steps=10000000",
                 f"--config.train.ckpt_every={args.ckpt_every}", f"--config.train.keep_checkpoints={args.keep}",
                 f"--config.train.log_every={args.ckpt_every}", "--config.train.eval_every=100000000"]
    eval_cmd = [sys.executable, "evaluate.py", f"--workdir={wd}", *EVAL]

    poller = Poller(os.path.join(wd, "checkpoints"))
    poller.start()
    log = open(os.path.join(base, "train.log"), "w")
    trainer = subprocess.Popen(train_cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    t0 = time.time()
    while len(poller.seen) < args.keep + 1:  # the run is saving and deleting
        if trainer.poll() is not None or time.time() - t0 > 600:
            print(open(os.path.join(base, "train.log")).read()[-3000:], file=sys.stderr)
            print("the training run did not start checkpointing", file=sys.stderr)
            return 1
        time.sleep(0.1)

    def one(i: int) -> dict:
        t = time.time()
        p = subprocess.run(eval_cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        m = re.search(r"checkpoint\s+step (\d+) \(", p.stdout)
        err = [ln for ln in p.stderr.splitlines() if ln.strip() and "%|" not in ln and "batch/s" not in ln]
        out = {"i": i, "rc": p.returncode, "step": int(m.group(1)) if m else None, "seconds": time.time() - t,
               "skipped_bad": sum("skipping a bad checkpoint" in ln for ln in p.stderr.splitlines()),
               "last_stderr": err[-1] if err else ""}
        alive = trainer.poll() is None
        print(f"evaluation {i + 1:3d}: exit {p.returncode}, step {out['step']}, {out['seconds']:.1f} s"
              + ("" if alive else " (writer no longer running)")
              + ("" if p.returncode == 0 else f": {out['last_stderr'][:300]}"), flush=True)
        out["writer_alive"] = alive
        return out

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the training run is stopped below
    try:
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(one, range(args.evaluations)))
        writer_alive = trainer.poll() is None
    finally:
        os.killpg(trainer.pid, signal.SIGTERM)
        try:
            trainer.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    time.sleep(0.2)
    poller.stop.set()
    poller.join()

    recorded = set()
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        for line in f:
            try:
                recorded.add(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                pass
    times = sorted(poller.seen.values())
    cadence = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
    failures = [r for r in results if r["rc"] != 0]
    not_real = [r for r in results if r["rc"] == 0 and (r["step"] not in poller.seen or r["step"] not in recorded)]
    unverified = [r for r in results if r["skipped_bad"]]
    summary = {"evaluations": len(results), "failures": len(failures), "steps_not_a_checkpoint": len(not_real),
               "skipped_bad_checkpoint_warnings": len(unverified), "keep": args.keep,
               "ckpt_every_steps": args.ckpt_every, "checkpoints_written": len(poller.seen),
               "seconds_between_checkpoints": cadence, "writer_alive_throughout": writer_alive,
               "distinct_steps_evaluated": len({r["step"] for r in results if r["step"] is not None}),
               "trainer_exit": trainer.returncode, "workdir": wd,
               "failure_messages": sorted({r["last_stderr"][:300] for r in failures})}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "evaluations": results}, f, indent=1)
    ok = not failures and not not_real and not unverified and writer_alive
    print(f"{len(results)} evaluations beside a writer checkpointing every {cadence:.2f} s (keep {args.keep}): "
          f"{len(failures)} failures, {len(not_real)} steps that were not a checkpoint, "
          f"{len(unverified)} with a skipped-checkpoint warning -> {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
