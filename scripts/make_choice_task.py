"""Write a multiple-choice task from the embedded corpus's test split (issue acceptance, docs/harness.md):
each question is a 48-character context, the true 12-character continuation and 3 continuations of
12 characters taken from elsewhere in the split (answer at a random position).

    python scripts/make_choice_task.py --out /tmp/mc --questions 200

writes ``OUT/mc.jsonl`` ({"id", "prompt", "choices", "answer"}: ``evaluate.py --config.eval.input``
and ``infodiff.choose``) and ``OUT/lm_eval/infodiff_corpus_mc.yaml`` with ``OUT/lm_eval/mc.jsonl`` (an
lm-evaluation-harness task over the same questions, ``dataset_path: json``: ``--include_path``).
The prompt ends where the continuation starts; the continuation starts with its own first
character, and the model joins them with one space (the text8 runs' prompt separator), so both
are cut at word boundaries: the context ends before a space and each option is the 12 characters
after that space.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

TASK_YAML = """task: infodiff_corpus_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def questions(n: int, seed: int, context: int = 48, cont: int = 12, options: int = 4) -> list[dict]:
    from infodiff.data import text

    stream = text.decode(text.load_corpus().test)
    rng = np.random.default_rng(seed)
    spaces = np.flatnonzero(np.frombuffer(stream.encode("ascii"), np.uint8) == ord(" "))
    ok = spaces[(spaces >= context) & (spaces + 1 + cont < len(stream))]
    out, used = [], set()
    while len(out) < n:
        s = int(rng.choice(ok))
        if s in used:
            continue
        prompt, true = stream[s - context:s], stream[s + 1:s + 1 + cont]
        others = []
        while len(others) < options - 1:
            o = int(rng.choice(ok))
            if abs(o - s) < 4 * context:
                continue
            c = stream[o + 1:o + 1 + cont]
            if c != true and c not in others:
                others.append(c)
        answer = int(rng.integers(options))
        choices = others[:answer] + [true] + others[answer:]
        used.add(s)
        out.append({"id": f"q{len(out):04d}", "prompt": prompt, "choices": choices, "answer": answer})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    qs = questions(a.questions, a.seed)
    os.makedirs(os.path.join(a.out, "lm_eval"), exist_ok=True)
    for path in (os.path.join(a.out, "mc.jsonl"), os.path.join(a.out, "lm_eval", "mc.jsonl")):
        with open(path, "w") as f:
            f.writelines(json.dumps(q) + "\n" for q in qs)
    data = os.path.abspath(os.path.join(a.out, "lm_eval", "mc.jsonl"))
    with open(os.path.join(a.out, "lm_eval", "infodiff_corpus_mc.yaml"), "w") as f:
        f.write(TASK_YAML.format(data=data))
    print(f"{len(qs)} questions: {a.out}/mc.jsonl and {a.out}/lm_eval/ (lm-eval --include_path)")


if __name__ == "__main__":
    main()
