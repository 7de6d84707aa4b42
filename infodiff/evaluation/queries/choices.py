"""``evaluate.py --workdir W --config.eval.input=mc.jsonl``: multiple-choice questions, one JSON
object per line, ``{"prompt": str, "choices": [str, ...], "answer": int}`` (``answer`` optional,
for every line or none; ``id`` optional), decided by :func:`infodiff.choices.choose` (coupled
options, adaptive stopping; :mod:`infodiff.choices`). Each row: the chosen option, its margin
over the runner-up ± SE (nats), whether it is decided at ``eval.choice_confidence``, the samples
and forward passes it took; the report: accuracy with the error from the sample of questions and
the Monte Carlo error (:class:`infodiff.choices.Choices`). Same seed, same file -> the decisions of
``infodiff.choose(run, ...)`` on the same questions.
Registered as the input kind 'choices' (:mod:`infodiff.evaluation.queries`).
"""

from __future__ import annotations

import types

import numpy as np

from infodiff import choices as choices_lib
from infodiff import likelihood as lk
from infodiff import validation
from infodiff.evaluation import inputs, jsonl, plots
from infodiff.evaluation import report as report_lib
from infodiff.evaluation.queries import Query, register

__all__ = ["read_choices", "evaluate_choices", "QUERY"]


def read_choices(path: str, lines: list[str]) -> tuple[str, list[str], dict]:
    """('choices', row ids, {'prompt': [str], 'choices': [[str]], 'answer': [int] (when given)}).
    Raises ValueError naming the file and line for a line that is not a JSON object, other keys, a
    prompt that is not a string, fewer than 2 options or an option that is not a string, an answer
    that is not an option index, answers on some lines only, a repeated id, or no rows."""
    ids, cols, seen, with_answer = [], {"prompt": [], "choices": [], "answer": []}, {}, None
    for i, obj in jsonl.json_rows(path, lines):
        keys = set(obj) - {"id"}
        if keys not in ({"prompt", "choices"}, {"prompt", "choices", "answer"}):
            raise ValueError(f"{path}:{i}: keys {sorted(obj)}; a multiple-choice file (line 1 has \"choices\") needs "
                             "{\"prompt\", \"choices\"} and optionally \"answer\" and \"id\" on every line")
        if with_answer is None:
            with_answer = "answer" in obj
        elif with_answer != ("answer" in obj):
            raise ValueError(f"{path}:{i}: \"answer\" is given on some lines only: give it on every line or none")
        p, c = obj["prompt"], obj["choices"]
        if not isinstance(p, str):
            raise ValueError(f"{path}:{i}: 'prompt' must be a string, got {type(p).__name__}")
        if not isinstance(c, list) or len(c) < 2 or not all(isinstance(o, str) for o in c):
            raise ValueError(f"{path}:{i}: 'choices' must be a list of at least 2 strings")
        if with_answer:
            a = obj["answer"]
            if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(c):
                raise ValueError(f"{path}:{i}: 'answer' must be the index of an option, 0 to {len(c) - 1}; got {a!r}")
            cols["answer"].append(a)
        ids.append(jsonl.row_id(path, i, obj, seen))
        cols["prompt"].append(p)
        cols["choices"].append(c)
    if not ids:
        raise ValueError(f"eval.input {path!r} has no rows")
    if not with_answer:
        del cols["answer"]
    return "choices", ids, cols


def evaluate_choices(config, ids, cols, run, row_errors) -> tuple:
    """(:class:`infodiff.choices.Choices`, rows, summary) of a multiple-choice file;
    ``row_errors``: :mod:`infodiff.evaluation.inputs`' renamer of a row's ValueError."""
    ev = config.eval
    conf, first, cap = ev.get("choice_confidence", 0.95), ev.get("choice_samples", 0), ev.get("choice_max_samples", 0)
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0 < conf < 1:
        raise ValueError(f"config.eval.choice_confidence={conf!r} must be a number in (0, 1), e.g. 0.95")
    for name, v in (("choice_samples", first), ("choice_max_samples", cap)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v == 1:
            raise ValueError(f"config.eval.{name}={v!r} must be 0 (the default) or an integer >= 2 (samples per option)")
        validation.check_budget(v, f"config.eval.{name}")
    d_first, d_cap = choices_lib.default_samples(run.process)
    first, cap = first or d_first, cap or max(d_cap, first or d_first)
    if cap < first:
        raise ValueError(f"config.eval.choice_max_samples={cap} is below the first round's {first} samples per option "
                         "(config.eval.choice_samples); raise it or leave it 0")
    res = row_errors(lambda: choices_lib.choose(run, cols["prompt"], cols["choices"], answers=cols.get("answer"),
                                        confidence=float(ev.get("choice_confidence", 0.95)), num_samples=first,
                                        max_samples=cap), ids)
    rows = []
    for q, rid in enumerate(ids):
        r = {"id": rid, "value": float(res.margin[q]), "se": float(res.margin_stderr[q]),
             "samples": int(res.samples[q]), "forward_passes": int(res.forward_passes[q]),
             "changed_chars": int(sum(run.last_changed[q].values())),
             "prompt_chars": int(res.info["prompt_tokens"][q]), "context_chars": int(res.info["context_per_question"][q]),
             "options": len(cols["choices"][q]), "choice": int(res.choice[q]), "runner_up": int(res.runner_up[q]),
             "decided": bool(res.decided[q]), "p_flip": float(res.p_flip[q]), "rounds": int(res.rounds[q]),
             "option_nll": [float(v) for v in res.nll[q]], "option_se": [float(v) for v in res.nll_stderr[q]],
             "p_best": [float(v) for v in res.p_best[q]]}
        if res.answers is not None:
            r.update(answer=int(res.answers[q]), correct=bool(res.correct[q]))
        rows.append(r)
    return res, rows, res.summary()


def estimate_view(res, process):
    """What the input report reads of an Estimate (estimator, samples, SE method), for choices."""

    return types.SimpleNamespace(estimator=f"{res.estimator}:{'coupled' if res.coupled else 'decoupled'}",
                                 infinite_variance=bool(process.infinite_variance), num_samples=res.first_samples,
                                 se_method=process.se_method, is_exact=False, min_samples=int(process.min_samples),
                                 few_samples=res.first_samples < int(process.min_samples),
                                 se_note=lk.SE_METHODS[process.se_method])



def _evaluate_choices(req) -> tuple[dict, str]:
    """A multiple-choice file read by :func:`infodiff.evaluation.inputs.evaluate_text` (``req``: its
    :class:`~infodiff.evaluation.inputs.Request`)."""
    config, workdir, t0, path, ids, cols = req.config, req.workdir, req.t0, req.path, req.ids, req.cols
    run, order, read_notes = req.run, req.order, req.notes
    if order and order["interval"]:
        raise ValueError(f"config.eval.interval=True: {path} holds multiple-choice questions, which get no interval; "
                         "drop --config.eval.interval")
    out_dir = inputs.output_dir_of(config, workdir)
    report_lib.refuse_existing(out_dir, config)  # after the file's and the settings' checks, before any work
    res, rows, summary = evaluate_choices(config, ids, cols, run, inputs.row_errors)
    for q, r in enumerate(rows):  # what was scored (logged inputs)
        r.update(prompt=inputs.shown(cols["prompt"][q]), choices=[inputs.shown(c) for c in cols["choices"][q]])
    changed = run.last_changed
    all_changed: dict = {}
    for c in changed:
        for k, v in c.items():
            all_changed[k] = all_changed.get(k, 0) + v
    cleaning = ({"statement": (f"a CLEANED copy is scored, not the input as given ({run.tokenizer.name}: case "
                               "folded, digits spelled out, other characters a space)"),
                 "rules": "text8 (infodiff.data.text.CLEANING_RULES)",
                 "rows_changed": int(sum(1 for c in changed if c)), "characters": all_changed}
                if run.tokenizer.cleans else None)
    rep = inputs.input_report(inputs.ReportContext(
        config, "choices", "argmin over options of -log p(option | prompt), coupled; value: the margin "
        "-log p(runner-up) + log p(choice)", {"item": "question", "nll": "nats per question"},
        "nelbo_difference", path, len(ids), workdir, inputs.run_checkpoint(run), run.seq_len,
        estimate_view(res, run.process), summary, run.task.process_info(run.process), cleaning, rows, out_dir, t0))
    if read_notes:
        rep.setdefault("notes", []).extend(read_notes)
    cut = [r["id"] for r in rows if r["context_chars"] < r["prompt_chars"]]
    if cut:
        rep.setdefault("notes", []).append(
            f"{len(cut)} of {len(rows)} questions saw only the last characters of their prompt (the model sees "
            f"{run.seq_len}: the options' first window keeps L - the longest option; rows.jsonl: context_chars): ids "
            f"{', '.join(cut[:10])}{', ...' if len(cut) > 10 else ''}")
    undecided = [r["id"] for r in rows if not r["decided"]]
    if undecided:
        rep.setdefault("notes", []).append(
            f"{len(undecided)} of {len(rows)} questions not decided at confidence {res.confidence} within "
            f"{res.max_samples} samples per option (config.eval.choice_max_samples): their choice is the current "
            f"best; ids {', '.join(undecided[:10])}{', ...' if len(undecided) > 10 else ''}")
    return rep, out_dir


def _draw(axes, rows, quantity, bits) -> None:
    """rows.png: each question's margin over the runner-up +- 2 SE, sorted (decided / not, right /
    wrong with answers), and a histogram of forward passes per question (adaptive stopping)."""
    v = np.array([r["value"] for r in rows])
    se = np.array([r["se"] for r in rows])
    order = np.argsort(v)
    ok = np.array([r.get("correct", True) for r in rows])[order]
    dec = np.array([r["decided"] for r in rows])[order]
    i = np.arange(1, len(rows) + 1)
    for sel, color, label in ((ok & dec, "C0", "decided"), (ok & ~dec, "C1", "not decided")):
        axes[0].errorbar(i[sel], v[order][sel], yerr=2 * se[order][sel], fmt="o", ms=3, capsize=2, color=color,
                         label=label + (", correct" if "correct" in rows[0] else ""))
    if "correct" in rows[0]:
        for sel, color, label in ((~ok & dec, "C3", "decided, wrong"), (~ok & ~dec, "C4", "not decided, wrong")):
            axes[0].errorbar(i[sel], v[order][sel], yerr=2 * se[order][sel], fmt="x", ms=4, capsize=2,
                             color=color, label=label)
    axes[0].axhline(0.0, color="grey", lw=0.8)
    axes[0].set_yscale("symlog", linthresh=1.0)
    axes[0].set_xlabel("question (sorted by margin)")
    axes[0].set_ylabel("margin over the runner-up (nats) ± 2 SE")
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{len(rows)} questions; decided: {np.mean(dec):.0%}")
    plots.integer_axis(axes[0].xaxis)  # questions, 1-based
    fp = np.array([r["forward_passes"] for r in rows])
    axes[1].hist(fp, bins=np.unique(fp).size if np.unique(fp).size < 30 else 30, color="C2", edgecolor="white")
    axes[1].set_xlabel("forward passes per question (all options)")
    axes[1].set_ylabel("questions")
    axes[1].set_title(f"adaptive stopping: mean {fp.mean():.0f} passes")
    plots.integer_axis(axes[1].xaxis)  # passes
    plots.integer_axis(axes[1].yaxis)  # row counts


def _summary_lines(r) -> list:
    s = r["summary"]
    out = [("questions", f"{s['questions']}, {s['fraction_decided']:.1%} decided at confidence {s['confidence']}"),
           ("forward passes per question", f"mean {s['forward_passes_per_question_mean']:.1f}, median "
            f"{s['forward_passes_per_question_median']:.0f}, max {s['forward_passes_per_question_max']} "
            f"({'adaptive' if s['adaptive'] else 'fixed'}, {s['first_samples']} to {s['max_samples']} samples per "
            f"option, {'coupled' if s['coupled'] else 'decoupled'} options)"),
           ("expected flips", f"{s['expected_flips']:.3g} questions (would change with unlimited samples)")]
    if "accuracy" in s:
        se = "" if s.get("accuracy_stderr") is None else f" ± {s['accuracy_stderr']:.4f} (questions)"
        out.insert(0, ("accuracy", f"{s['accuracy']:.4f}{se} ± {s['accuracy_mc_stderr']:.4f} (Monte Carlo, at most)"))
    else:
        out.append(("Monte Carlo error of an accuracy", f"at most {s['accuracy_mc_stderr']:.4f}"))
    return out


def _preview(prev, name):
    hdr = ["id", "choice", "answer", "margin (nats)", "SE", "decided", "p_flip", "passes"]
    body = [[p["id"], p["choice"], p.get("answer", "-"), f"{p['value']:.3f}", f"{p['se']:.3f}",
             "yes" if p["decided"] else "no", f"{p['p_flip']:.2g}", p["forward_passes"]] for p in prev]
    return hdr, body


QUERY = register(Query(
    name="choices", extension=".jsonl", input_format="text", evaluate=inputs.evaluate_text, score=_evaluate_choices,
    load=lambda path: inputs.read_input(path)[1],
    detects=lambda obj: "choices" in obj, read=read_choices,
    draw=_draw, summary_lines=_summary_lines, preview=_preview,
    config_keys=("eval.choice_confidence", "eval.choice_samples", "eval.choice_max_samples", "eval.limit"),
    compare_refusal=("{path} holds multiple-choice questions; --compare scores documents (.txt) or "
                     "{{prompt, response}} pairs: score the questions with each run on its own"),
    few_samples_key="eval.choice_samples",
    sample=lambda folder: jsonl.write_rows(folder, "mc.jsonl", [
        {"prompt": "the cat", "choices": [" sat", " dog"], "answer": 0}]),
    malformed=lambda folder: jsonl.write_rows(folder, "bad_mc.jsonl", [
        {"prompt": "the cat", "choices": [" sat", " dog"]}, {"prompt": "one", "choices": [" two"]}])))
