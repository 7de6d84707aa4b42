"""The lm-eval model against an exact oracle (docs/harness.md, RESULTS.md): a Markov chain over
text8's 27 characters is the model (``infodiff.from_function``, L = 64); questions are a
48-character context sampled from the chain, its true 12-character continuation and 3
continuations sampled independently. Reports the z-scores of every ``loglikelihood`` value against
the exact log p(continuation | context), whether every question decided at 95 % picked the exact
argmax, and adaptive stopping against a fixed 128 samples per option (passes, agreement).

    python scripts/choice_oracle.py [--questions 200] [--order 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--order", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.5, help="the chain's table temperature (lower: peakier)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0, help="first round per option (0: the default, twice the estimator's min_samples)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    import infodiff
    from infodiff import oracles, scoring
    from infodiff.data import text as text_data
    from infodiff.harness import InfodiffLM
    from lm_eval.api.instance import Instance

    rng = np.random.default_rng(a.seed)
    chain = oracles.random_markov(rng, "".join(text_data.VOCAB), order=a.order, temperature=a.temperature)
    run = infodiff.from_function(chain, vocab_size=27, mask_id=27, seq_len=64, seed=a.seed)

    def sample(n):
        return text_data.decode(chain.sample(rng, 1, length=n)[0])

    qs = []
    while len(qs) < a.questions:
        s = sample(61)
        prompt, true = s[:48], s[49:]
        if s[48] != " " or prompt != scoring.clean(prompt)[0] or true != scoring.clean(true)[0] or len(true) != 12:
            continue  # a word boundary at 48, and nothing the cleaning would change
        others = []
        while len(others) < 3:
            o = sample(12)
            if o == scoring.clean(o)[0] and len(o) == 12 and o not in others and o != true:
                others.append(o)
        ans = int(rng.integers(4))
        qs.append((prompt, others[:ans] + [true] + others[ans:], ans))

    def exact(prompt, option):
        ctx = text_data.encode(prompt + " ").astype(np.int32)
        full = np.concatenate([ctx, text_data.encode(option).astype(np.int32)])[None]
        return float(chain.log_prob(full)[0] - chain.log_prob(ctx[None])[0])

    truth = [np.array([exact(p, o) for o in opts]) for p, opts, _ in qs]
    reqs = [Instance("loglikelihood", {}, (p, " " + o), j, ("oracle_mc", q, 1))
            for q, (p, opts, _) in enumerate(qs) for j, o in enumerate(opts)]
    lm = InfodiffLM(run=run, first_samples=a.first or None)
    t = time.time()
    out = lm.loglikelihood(reqs)
    wall = time.time() - t
    ll = np.array([o[0] for o in out])
    se = np.concatenate([r["option_stderr"] for r in lm.records])
    z = (ll - np.concatenate(truth)) / se
    decided = np.array([r["decided"] for r in lm.records])
    choice = np.array([r["choice"] for r in lm.records])
    exact_best = np.array([int(np.argmax(t_)) for t_ in truth])
    answers = np.array([q[2] for q in qs])
    t = time.time()
    fixed = infodiff.choose(run, [q[0] for q in qs], [q[1] for q in qs], adaptive=False, num_samples=128)
    wall_fixed = time.time() - t
    passes = np.array([r["forward_passes"] for r in lm.records])
    res = {"questions": len(qs), "order": a.order, "temperature": a.temperature, "first_samples": lm.first_samples,
           "values": int(len(z)), "max_abs_z": float(np.abs(z).max()), "fraction_abs_z_below_1.96": float(np.mean(
               np.abs(z) < 1.96)), "all_within_4_se": bool(np.all(np.abs(z) < 4)),
           "fraction_decided": float(decided.mean()),
           "decided_equal_exact_argmax": bool(np.all(choice[decided] == exact_best[decided])),
           "wrong_decided": int(np.sum(choice[decided] != exact_best[decided])),
           "accuracy_vs_answers": float(np.mean(choice == answers)),
           "exact_argmax_accuracy": float(np.mean(exact_best == answers)),
           "passes_per_question_adaptive": float(passes.mean()),
           "passes_per_question_fixed_128": float(fixed.forward_passes.mean()),
           "passes_ratio": float(fixed.forward_passes.mean() / passes.mean()),
           "agreement_adaptive_fixed": float(np.mean(choice == fixed.choice)),
           "fixed_equal_exact_argmax": float(np.mean(fixed.choice == exact_best)),
           "adaptive_equal_exact_argmax": float(np.mean(choice == exact_best)),
           "wall_s_adaptive": wall, "wall_s_fixed": wall_fixed,
           "wrong_decided_questions": [
               {"question": int(q), "samples_per_option": lm.records[q]["samples_per_option"],
                "margin": lm.records[q]["margin"], "margin_stderr": lm.records[q]["margin_stderr"],
                "exact_margin": float(truth[q][choice[q]] - truth[q][exact_best[q]]),
                "option_nll": lm.records[q]["option_nll"], "exact_nll": (-truth[q]).tolist()}
               for q in np.flatnonzero(decided & (choice != exact_best))]}
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
