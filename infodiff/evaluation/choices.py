"""``evaluate.py --workdir W --config.eval.input=mc.jsonl``: multiple-choice questions, one JSON
object per line, ``{"prompt": str, "choices": [str, ...], "answer": int}`` (``answer`` optional,
for every line or none; ``id`` optional), decided by :meth:`infodiff.scoring.Run.choose` (coupled
options, adaptive stopping; :mod:`infodiff.choices`). Each row: the chosen option, its margin
over the runner-up ± SE (nats), whether it is decided at ``eval.choice_confidence``, the samples
and forward passes it took; the report: accuracy with the error from the sample of questions and
the Monte Carlo error (:class:`infodiff.choices.Choices`). Same seed, same file -> the decisions of
``run.choose`` on the same questions.
"""

from __future__ import annotations

from infodiff import validation
import types

from infodiff import choices as choices_lib
from infodiff import likelihood as lk
from infodiff.evaluation import jsonl

__all__ = ["read_choices", "evaluate_choices"]


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
    res = row_errors(lambda: run.choose(cols["prompt"], cols["choices"], answers=cols.get("answer"),
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

