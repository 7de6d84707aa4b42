"""kill -9 of `evaluate.py` while it writes its report: do the files on disk still agree?

Trains a tiny masked text run (or uses ``--workdir``), measures how long evaluate.py takes from
printing its table to "report written" (the write), then runs ``--kills`` evaluations, each
with another ``eval.seed`` (so each run's numbers differ), and sends SIGKILL a random time
(uniform over 1.2 x the measured write) after the table appears. After every kill it checks:

* split mode: ``W/report.json`` and ``W/report.txt`` are from the same evaluation (the NLL,
  checkpoint step and wall time in the text equal the JSON's);
* input mode (``--mode input``): also ``W/scores/<file>/rows.jsonl`` (its rows equal the
  report's ``rows_preview``);

and counts the temporary files left (``.report.json.<pid>.<hex>.tmp``, unfinished versions in
``.reports/``), which the next evaluation must remove. A last evaluation runs without a kill.

    python scripts/fault_report_kill.py                    # 20 kills, split mode
    python scripts/fault_report_kill.py --mode input
    python scripts/fault_report_kill.py --repo /path/to/an/older/checkout   # the same against it

Exit status 0 when the files agreed after every kill and nothing was left after the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_reader_writer import EVAL, PHRASE, TINY  # noqa: E402  (the same tiny run)
DOCS = ["the cat sat on the mat", "the dog ate the hat and the cat", "a hat on a mat", "the end"]


def run_eval(cmd, repo, env, kill_after=None):
    """Run evaluate.py; with ``kill_after`` (s) SIGKILL it that long after its table appears.
    Returns (exit code, seconds from the table to 'report written' or None, whether the kill
    came before 'report written' was printed)."""
    p = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = {}
    err = []
    threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()

    def killer():
        time.sleep(kill_after)
        p.send_signal(signal.SIGKILL)
        seen["kill"] = time.monotonic()

    for line in p.stdout:
        now = time.monotonic()
        if "table" not in seen and re.match(r"infodiff (likelihood|input) report", line):
            seen["table"] = now
            if kill_after is not None:
                threading.Thread(target=killer, daemon=True).start()
        if line.startswith("report written to"):
            seen["written"] = now
    code = p.wait()
    write_s = seen["written"] - seen["table"] if "written" in seen and "table" in seen else None
    if code not in (0, -signal.SIGKILL):
        sys.stderr.write("".join(err[-20:]))
    return code, write_s, "written" not in seen


def shown(out_dir: str, mode: str) -> dict:
    """What the files on disk say: the evaluation each comes from."""
    rep = json.load(open(os.path.join(out_dir, "report.json")))
    txt = open(os.path.join(out_dir, "report.txt")).read()
    wall = re.search(r"wall time\s+([0-9.]+) s", txt).group(1)
    same = f"{rep['wall_time_s']:.1f}" == wall and f"step {rep['checkpoint_step']} " in txt
    if mode == "split":
        same = same and f"{rep['nll']:.4f} ± {rep['nll_stderr']:.4f}" in txt
    else:
        s = rep["summary"]
        same = same and f"{s['total_nats']:.3f} ± {s['total_stderr']:.3f}" in txt
        rows = [json.loads(x) for x in open(os.path.join(out_dir, "rows.jsonl")).read().splitlines()]
        same = same and json.loads(json.dumps(rep["rows_preview"])) == rows[:len(rep["rows_preview"])]
    return {"same_run": bool(same), "seed": rep["config"]["eval"]["seed"]}


def leftovers(out_dir: str) -> list[str]:
    found = [n for n in os.listdir(out_dir) if n.endswith(".tmp")]
    base = os.path.join(out_dir, ".reports")
    if os.path.isdir(base):
        cur = os.readlink(os.path.join(base, "current")) if os.path.islink(os.path.join(base, "current")) else None
        found += [f".reports/{n}" for n in os.listdir(base) if n not in ("current", cur)]
    return sorted(found)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--mode", choices=("split", "input"), default="split")
    ap.add_argument("--workdir", default=None, help="a trained run (default: train a tiny one)")
    ap.add_argument("--repo", default=HERE, help="the checkout whose evaluate.py is run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = tempfile.mkdtemp(prefix="fault_report_kill_")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=args.repo, PYTHONUNBUFFERED="1",
               INFODIFF_COMPILATION_CACHE=os.path.join(base, "xla"), INFODIFF_CPU_DEVICES="1")
    wd = args.workdir
    if wd is None:
        corpus = os.path.join(base, "tiny_text8")
        with open(corpus, "w") as f:
            f.write((PHRASE * 800)[:30000])
        wd = os.path.join(base, "run")
        subprocess.run([sys.executable, "train.py", "--config", "configs/masked_text.py", f"--workdir={wd}",
                        f"--config.data.path={corpus}", *TINY, "--config.train.num_steps=40",
                        "--config.train.ckpt_every=40", "--config.train.eval_every=20"],
                       cwd=args.repo, env=env, check=True, capture_output=True)
    cmd = [sys.executable, "evaluate.py", f"--workdir={wd}", *EVAL]
    out_dir = wd
    if args.mode == "input":
        docs = os.path.join(base, "docs.txt")
        with open(docs, "w") as f:
            f.write("\n".join(DOCS) + "\n")
        cmd = [sys.executable, "evaluate.py", f"--workdir={wd}", f"--config.eval.input={docs}",
               "--config.eval.input_samples=4"]
        out_dir = os.path.join(wd, "scores", "docs.txt")

    writes = []
    for i in range(4):  # the write's duration: the median of the last 3 (the first run also compiles)
        code, w, _ = run_eval(cmd + [f"--config.eval.seed={900 + i}"], args.repo, env)
        assert code == 0, f"evaluate.py failed (exit {code})"
        writes.append(w)
    window = max(sorted(writes[1:])[1], 0.005)
    print(f"write: {', '.join(f'{1000 * w:.1f}' for w in writes[1:])} ms from the table to 'report written'; "
          f"kills uniform over [0, {1200 * window:.1f}] ms after the table", flush=True)

    results = []
    for i in range(args.kills):
        before = shown(out_dir, args.mode)["seed"]
        seed = 1000 + i
        delay = rng.uniform(0, 1.2 * window)
        code, _, early = run_eval(cmd + [f"--config.eval.seed={seed}"], args.repo, env, kill_after=delay)
        s = shown(out_dir, args.mode)
        left = leftovers(out_dir)
        outcome = "new" if s["seed"] == seed else ("old" if s["seed"] == before else "other")
        results.append({"kill": i + 1, "delay_ms": 1000 * delay, "exit": code, "killed_before_done": early,
                        "files_agree": s["same_run"], "shown": outcome, "leftovers": left})
        print(f"kill {i + 1:2d} at {1000 * delay:6.1f} ms: exit {code}, report.json {outcome}, "
              f"files {'agree' if s['same_run'] else 'DISAGREE'}, {len(left)} left over"
              + (f" {left}" if left else ""), flush=True)
    code, _, _ = run_eval(cmd + ["--config.eval.seed=5000"], args.repo, env)
    final_left = leftovers(out_dir)
    final = shown(out_dir, args.mode)
    killed = [r for r in results if r["exit"] == -signal.SIGKILL]
    summary = {"mode": args.mode, "kills": len(results),
               "killed_during_or_before_the_write": sum(r["killed_before_done"] for r in killed),
               "disagreeing_after_a_kill": sum(not r["files_agree"] for r in results),
               "new": sum(r["shown"] == "new" for r in results), "old": sum(r["shown"] == "old" for r in results),
               "kills_leaving_temporary_files": sum(bool(r["leftovers"]) for r in results),
               "left_after_the_next_run": final_left, "last_run_exit": code, "last_run_agrees": final["same_run"],
               "write_ms": 1000 * window, "repo": args.repo, "workdir": wd}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "kills": results}, f, indent=1)
    ok = summary["disagreeing_after_a_kill"] == 0 and not final_left and code == 0 and final["same_run"]
    print(f"{len(results)} kill -9 during {args.mode}-mode report writes: {summary['disagreeing_after_a_kill']} "
          f"with disagreeing files ({summary['new']} new, {summary['old']} old), "
          f"{summary['kills_leaving_temporary_files']} left temporary files, {len(final_left)} after the next "
          f"run -> {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
