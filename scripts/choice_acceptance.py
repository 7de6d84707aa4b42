"""Multiple choice on a trained text run, three ways and two budgets (docs/harness.md, RESULTS.md):

    python scripts/choice_acceptance.py --workdir runs/masked_text --out /tmp/mc [--questions 200]

1. ``python -m infodiff.harness`` (lm-eval) on the local task of scripts/make_choice_task.py:
   lm-eval's acc and acc_stderr, and the Monte Carlo error of acc;
2. ``evaluate.py --config.eval.input=mc.jsonl`` on the same questions (it calls ``infodiff.choose``):
   the same decisions with the same seed;
3. ``infodiff.choose`` with a fixed 128 samples per option (LLaDA's budget) against the adaptive
   default: forward passes per question and the agreement of the decisions; and adaptive with
   decoupled options (independent draws per option) on the first ``--decoupled`` questions.
Prints a table and writes OUT/acceptance.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd):
    t = time.time()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_DATASETS_OFFLINE="1")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return time.time() - t, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--decoupled", type=int, default=100, help="questions for the decoupled comparison")
    a = ap.parse_args()
    py = sys.executable
    _run([py, "scripts/make_choice_task.py", "--out", a.out, "--questions", str(a.questions)])
    res = {"workdir": os.path.abspath(a.workdir), "questions": a.questions}

    wall, _ = _run([py, "-m", "infodiff.harness", "--model", "infodiff", "--model_args", f"workdir={a.workdir}",
                    "--tasks", "infodiff_corpus_mc", "--include_path", os.path.join(a.out, "lm_eval"),
                    "--output_path", os.path.join(a.out, "harness")])
    rfile = sorted(glob.glob(os.path.join(a.out, "harness", "**", "results_*.json"), recursive=True))[-1]
    lm = json.load(open(rfile))["results"]["infodiff_corpus_mc"]
    ch = json.load(open(sorted(glob.glob(os.path.join(a.out, "harness", "infodiff_choices_*.json")))[-1]))
    hs = ch["summary"]["infodiff_corpus_mc"]
    h_choice = np.array([q["choice"] for q in sorted(ch["questions"], key=lambda q: q["doc_id"])])
    res["harness"] = {"acc": lm["acc,none"], "acc_stderr": lm["acc_stderr,none"], **hs, "wall_s": wall}
    _save(a.out, res)

    out_dir = os.path.join(a.out, "evaluate")
    wall, _ = _run([py, "evaluate.py", "--workdir", a.workdir, f"--config.eval.input={a.out}/mc.jsonl",
                    f"--config.eval.output_dir={out_dir}"] if _has_output_dir() else
                   [py, "evaluate.py", "--workdir", a.workdir, f"--config.eval.input={a.out}/mc.jsonl"])
    rep_path = os.path.join(out_dir if _has_output_dir() else os.path.join(a.workdir, "scores", "mc.jsonl"),
                            "report.json")
    rep = json.load(open(rep_path))
    rows = [json.loads(ln) for ln in open(os.path.join(os.path.dirname(rep_path), "rows.jsonl"))]
    e_choice = np.array([r["choice"] for r in rows])
    res["evaluate"] = {k: rep["summary"][k] for k in ("accuracy", "accuracy_stderr", "accuracy_mc_stderr",
                                                      "fraction_decided", "forward_passes_per_question_mean")}
    res["evaluate"]["wall_s"] = wall
    res["harness_equals_evaluate"] = bool(np.array_equal(h_choice, e_choice))
    _save(a.out, res)

    import infodiff

    run = infodiff.load_run(a.workdir)
    qs = [json.loads(ln) for ln in open(os.path.join(a.out, "mc.jsonl"))]
    P, C, A = [q["prompt"] for q in qs], [q["choices"] for q in qs], [q["answer"] for q in qs]
    t = time.time()
    fixed = infodiff.choose(run, P, C, answers=A, adaptive=False, num_samples=128)
    res["fixed_128"] = {**fixed.summary(), "wall_s": time.time() - t}
    agree = e_choice == fixed.choice
    dec = np.array([r["decided"] for r in rows])
    res["adaptive_vs_fixed"] = {
        "passes_ratio_fixed_over_adaptive": fixed.forward_passes.mean() / np.mean([r["forward_passes"] for r in rows]),
        "agreement": float(agree.mean()), "agreement_on_decided": float(agree[dec].mean()) if dec.any() else None,
        "fixed_fraction_decided": fixed.fraction_decided}
    _save(a.out, res)
    n = min(a.decoupled, len(qs))
    t = time.time()
    dcp = infodiff.choose(run, P[:n], C[:n], answers=A[:n], coupled=False)
    res["decoupled_first"] = {**dcp.summary(), "wall_s": time.time() - t,
                              "coupled_passes_mean_same_questions": float(np.mean([r["forward_passes"]
                                                                                   for r in rows[:n]])),
                              "coupled_fraction_decided_same_questions": float(dec[:n].mean())}
    # loglikelihood_rolling against evaluate.py's .txt mode on the same documents
    from infodiff.data import text as text_data
    from infodiff.harness import InfodiffLM
    from lm_eval.api.instance import Instance

    stream = text_data.decode(text_data.load_corpus().test)
    docs = [stream[i * 997:i * 997 + 150].strip() for i in range(20)]
    with open(os.path.join(a.out, "docs.txt"), "w") as f:
        f.writelines(d + "\n" for d in docs)
    docs_out = os.path.join(a.out, "evaluate_docs")
    _run([py, "evaluate.py", "--workdir", a.workdir, f"--config.eval.input={a.out}/docs.txt"]
         + ([f"--config.eval.output_dir={docs_out}"] if _has_output_dir() else []))
    drows = [json.loads(ln) for ln in open(os.path.join(docs_out if _has_output_dir() else
                                                        os.path.join(a.workdir, "scores", "docs.txt"), "rows.jsonl"))]
    lm = InfodiffLM(run=run)
    rolled = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (d,), 0, ("docs", i, 1))
                                       for i, d in enumerate(docs)])
    diff = np.abs(-np.array(rolled) - np.array([r["value"] for r in drows]))
    res["rolling_vs_txt"] = {"documents": len(docs), "max_abs_diff_nats": float(diff.max()),
                             "max_rel_diff": float((diff / np.array([r["value"] for r in drows])).max()),
                             "total_nats": float(-np.sum(rolled))}
    with open(os.path.join(a.out, "acceptance.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)
    print(json.dumps(res, indent=1, default=float))


def _save(out, res):
    with open(os.path.join(out, "acceptance.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)


def _has_output_dir() -> bool:
    import ml_collections  # noqa: F401

    sys.path.insert(0, ROOT)
    from configs import masked_text

    return "output_dir" in masked_text.get_config().eval


if __name__ == "__main__":
    main()
