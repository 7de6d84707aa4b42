"""Multiple choice with a trained text run: which option is most likely given the prompt, decided
with a stated confidence and as few samples as the question needs (docs/harness.md).

    res = choose(run, prompts, choices, answers=answers)      # infodiff.choose -> Choices
    res.choice, res.decided, res.margin, res.margin_stderr     # per question
    res.accuracy, res.accuracy_stderr, res.accuracy_mc_stderr  # with answers

Every option of a question is scored as -log p(option | prompt) (the network's NELBO, as
:meth:`infodiff.scoring.Run.conditional_nll`, one prompt context shared by all options: that of
the longest) with **coupled** draws (:func:`infodiff.likelihood.coupled_nll`: the same noise for
all options, so the decision rests on the noise of the differences). The chosen option is the one
with the smallest mean NELBO; its margin over option j is the mean of the per-sample differences
``NELBO_j - NELBO_chosen`` (nats).

**Adaptive stopping.** Rounds of samples (the first ``num_samples`` per option, default twice the
estimator's ``min_samples``; then as many as drawn so far, doubling) are drawn for the questions not
yet decided, until the chosen option beats every other one with one-sided Student-t tests at
level ``alpha = (1 - confidence) / ((n - 1) * looks)`` each (Bonferroni over the n - 1 rivals and
the ``looks`` = 1 + ceil(log2(max_samples / num_samples)) possible rounds, so optional stopping
keeps P(wrong decision) <= 1 - confidence per question), or ``max_samples`` per option are spent
(default the larger of 128, LLaDA's fixed budget, and 4 x the first round; then ``decided`` is
False and the choice is the current best).

*Why not min_samples.* ``min_samples`` is where an estimator's SE covers at 95 %; a decision rests
on the t distribution's far tail (level ~0.4 % for 4 options and 4 rounds), which heavy-tailed
per-sample values reach later: against an exact Markov chain (scripts/choice_oracle.py, 200
questions), a first round of 16 (k_dce's min_samples) made 2 wrong decisions among 98, one at 16
samples with its margin 5.5 SE from the exact value; a first round of 32 made none among 95 at
nearly the same cost (RESULTS.md, "Multiple choice"). ``adaptive=False`` draws
``num_samples`` per option once (a fixed budget) and applies the same test.

**MC error of the accuracy.** ``p_best[q][j]``: the probability that option j is the best with
unlimited samples, from the normal law of the options' mean NELBOs (their coupled samples'
covariance / S, each variance the option's SE^2; :data:`BEST_DRAWS` draws, ties broken at random,
a fixed seed per question), so that k exactly tied options get 1/k each. ``p_flip = 1 -
p_best[choice]``: the probability that the decision would change. Whether a question is answered
right with unlimited samples is Bernoulli(p_best[answer]); not knowing the answer (lm-eval's model
does not), its variance is at most ``v_q = max_j p_best[j] (1 - p_best[j])``, and
``accuracy_mc_stderr = sqrt(sum_q v_q) / Q`` (questions independent) bounds the Monte Carlo error
of the accuracy. Beside it, ``accuracy_stderr = sqrt(acc (1 - acc) / (Q - 1))`` is the error from
the sample of questions (lm-evaluation-harness's ``acc_stderr``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import scipy.stats

from infodiff import likelihood as lk
from infodiff import scoring
from infodiff import validation
from infodiff import windows

__all__ = ["Choices", "choose", "choose_tokens", "check_settings", "looks", "decision_level", "default_samples",
           "DEFAULT_MAX_SAMPLES"]

DEFAULT_MAX_SAMPLES = 128  # the least default cap per option: LLaDA's fixed budget (k_dce: adaptive never costs more)
FIRST_FACTOR = 2  # the first round: 2 x the estimator's min_samples (module docstring, "Why not min_samples")


def default_samples(process) -> tuple[int, int]:
    """(first round, cap) per option for ``process``: 2 x its ``min_samples`` (k_dce 32), and the
    larger of :data:`DEFAULT_MAX_SAMPLES` and 4 x the first round (k_dce 128)."""
    first = FIRST_FACTOR * int(process.min_samples)
    return first, max(DEFAULT_MAX_SAMPLES, 4 * first)
CHOICE_STREAM = 0xC401CE  # fold_in of a call's key for its choices: draws apart from the other methods'


@dataclasses.dataclass
class Choices:
    """The decisions of :func:`choose` for Q questions (nats; lists hold one array per question,
    as questions may have different numbers of options).

    nll: [Q] float64 [n_q] mean -log p(option | prompt) (NELBO); nll_stderr: their SEs.
    choice: int [Q] the option with the smallest NELBO; runner_up: int [Q] the next one.
    margin / margin_stderr: float64 [Q] NELBO(runner-up) - NELBO(choice) and its SE (coupled
      per-sample differences); p_flip: float64 [Q] (module docstring).
    decided: bool [Q] the choice passed its test at ``confidence``; samples: int [Q] per option;
    forward_passes: int [Q] per question, all options; rounds: int [Q].
    answers / correct: given answers and whether each choice equals it (None without answers).
    """

    nll: list
    nll_stderr: list
    choice: np.ndarray
    runner_up: np.ndarray
    margin: np.ndarray
    margin_stderr: np.ndarray
    p_flip: np.ndarray
    decided: np.ndarray
    samples: np.ndarray
    forward_passes: np.ndarray
    rounds: np.ndarray
    confidence: float
    adaptive: bool
    coupled: bool
    max_samples: int
    first_samples: int
    estimator: str
    p_best: list = dataclasses.field(default_factory=list)
    answers: np.ndarray | None = None
    info: dict = dataclasses.field(default_factory=dict)

    @property
    def correct(self) -> np.ndarray | None:
        return None if self.answers is None else self.choice == self.answers

    @property
    def accuracy(self) -> float | None:
        return None if self.answers is None else float(self.correct.mean())

    @property
    def accuracy_stderr(self) -> float | None:
        """sqrt(acc (1 - acc) / (Q - 1)): the error from the sample of questions (lm-eval's)."""
        if self.answers is None or len(self.choice) < 2:
            return None
        a = self.accuracy
        return math.sqrt(a * (1 - a) / (len(self.choice) - 1))

    @property
    def accuracy_mc_stderr(self) -> float:
        """sqrt(sum_q max_j p_best (1 - p_best)) / Q: a bound on the Monte Carlo error of the
        accuracy that needs no answers (module docstring)."""
        return mc_stderr(self.p_best)

    @property
    def fraction_decided(self) -> float:
        return float(self.decided.mean())

    def summary(self) -> dict:
        """Floats for a report: questions, fraction decided, forward passes per question (mean,
        median, max), expected flips and, with answers, accuracy with both SEs."""
        out = {"questions": int(len(self.choice)), "fraction_decided": self.fraction_decided,
               "forward_passes_per_question_mean": float(self.forward_passes.mean()),
               "forward_passes_per_question_median": float(np.median(self.forward_passes)),
               "forward_passes_per_question_max": int(self.forward_passes.max()),
               "samples_per_option_mean": float(self.samples.mean()),
               "expected_flips": float(self.p_flip.sum()), "confidence": self.confidence,
               "adaptive": self.adaptive, "coupled": self.coupled, "first_samples": self.first_samples,
               "max_samples": self.max_samples, "estimator": self.estimator}
        out["accuracy_mc_stderr"] = self.accuracy_mc_stderr
        if self.answers is not None:
            out.update(accuracy=self.accuracy, accuracy_stderr=self.accuracy_stderr)
        return out


def looks(first_samples: int, max_samples: int) -> int:
    """Rounds a question can get: 1 + ceil(log2(max / first)) (each round doubles the samples)."""
    return 1 + max(0, math.ceil(math.log2(max_samples / first_samples) - 1e-12))


def decision_level(confidence: float, num_options: int, num_looks: int) -> float:
    """One-sided level of each test: (1 - confidence) / ((n - 1) looks) (Bonferroni)."""
    return (1.0 - confidence) / (max(1, num_options - 1) * max(1, num_looks))


def check_settings(confidence, num_samples, max_samples) -> None:
    """ValueError for a confidence outside (0, 1) or sample counts that are not integers >= 2 with
    max_samples >= num_samples."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating)) or \
            not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must be a number in (0, 1), e.g. 0.95")
    for name, v in (("num_samples", num_samples), ("max_samples", max_samples)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
            raise ValueError(f"{name}={v!r} must be an integer >= 2 (samples per option)")
        validation.check_budget(int(v), name)
    if max_samples < num_samples:
        raise ValueError(f"max_samples={max_samples} is below num_samples={num_samples}")


def _margins(samples_NxS, exact_N, se_method, min_samples):
    """(chosen, runner-up, margins [n] vs every option (0 for the chosen), their SEs raw [n], dof,
    means [n], SEs [n]) of one question's coupled samples."""
    n = samples_NxS.shape[0]
    est = lk.Estimate("options", samples_NxS, forward_passes=0, exact={"x": exact_N}, se_method=se_method,
                      min_samples=min_samples)
    mean = est.mean
    order = np.argsort(mean, kind="stable")
    c = int(order[0])
    diff = lk.Estimate("margin", samples_NxS - samples_NxS[c], forward_passes=0, exact={"x": exact_N - exact_N[c]},
                       se_method=se_method, min_samples=min_samples)
    return c, int(order[1]) if n > 1 else c, diff.mean, diff.stderr_raw, diff.dof, mean, est.stderr, diff.stderr


def _decide(margin, se_raw, dof, chosen, alpha):
    """True when every rival's margin is significant: margin / se > t_{1-alpha, dof}."""
    q = scipy.stats.t.ppf(1 - alpha, max(dof, 1))
    rivals = np.arange(len(margin)) != chosen
    m, s = margin[rivals], se_raw[rivals]
    return bool(np.all((s > 0) & (m > q * s)) or (np.all(s == 0) and np.all(m > 0)))


BEST_DRAWS = 4096  # normal draws per question for p_best


def best_probabilities(samples_NxS, exact_N, stderr_N, seed: int) -> np.ndarray:
    """float64 [N]: P(option n has the smallest NELBO with unlimited samples) under the normal law
    of the mean NELBOs: means ``samples.mean + exact``, correlations of the coupled samples,
    variances ``stderr_N**2`` (module docstring). Ties are broken at random; ``seed`` fixes the
    draws."""
    N, S = samples_NxS.shape
    mean = samples_NxS.mean(axis=1) + exact_N
    rng = np.random.default_rng(seed)
    if S > 1:
        cov = np.atleast_2d(np.cov(samples_NxS))
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
        with np.errstate(divide="ignore", invalid="ignore"):
            corr = np.where(np.outer(sd, sd) > 0, cov / np.outer(sd, sd), 0.0)
        np.fill_diagonal(corr, 1.0)
        cov = corr * np.outer(stderr_N, stderr_N)
        w, v = np.linalg.eigh(cov)
        w = np.where(w > 1e-12 * max(float(w.max()), 1e-300), w, 0.0)  # rounding of a singular covariance
        z = rng.standard_normal((BEST_DRAWS, N)) @ (v * np.sqrt(w)).T
    else:
        z = np.zeros((BEST_DRAWS, N))
    draws = mean + z
    ties = rng.random((BEST_DRAWS, N))  # exactly equal draws (identical options): a random winner
    tied = np.isclose(draws, draws.min(axis=1, keepdims=True), rtol=1e-9, atol=1e-9)  # float rounding of equal rows
    order = np.argmin(np.where(tied, ties, np.inf), axis=1)
    return np.bincount(order, minlength=N) / BEST_DRAWS


CHOICE_QUERY = "a multiple-choice question (responses to a prompt)"


def mc_stderr(p_best: list) -> float:
    """sqrt(sum_q max_j p (1 - p)) / Q over questions' :func:`best_probabilities`."""
    if not len(p_best):
        return float("nan")
    v = [float(np.max(p * (1 - p))) for p in p_best]
    return float(np.sqrt(np.sum(v)) / len(v))


@scoring.guarded(CHOICE_QUERY, prompt=True)
def choose(run, prompts, choices, *, answers=None, confidence: float = 0.95, num_samples: int | None = None,
           max_samples: int | None = None, adaptive: bool = True, coupled: bool = True, seed: int | None = None) -> Choices:
    """Pick the most likely option of each question (module docstring); ``run`` an
    :class:`infodiff.scoring.Run`. ``prompts``: Q strings; ``choices``: Q lists of >= 2 strings;
    ``answers``: optional Q option indices. ``num_samples``: the first round's samples per option
    (default :func:`default_samples`: k_dce 32; the whole budget with ``adaptive=False``);
    ``max_samples``: the cap per option (default :func:`default_samples`: k_dce 128). Same seed, same questions ->
    same decisions. Raises TypeError / ValueError for malformed questions, answers out of range,
    bad settings, or options of one question that need different numbers of windows."""
    prompts = list(prompts) if not isinstance(prompts, str) else prompts
    if isinstance(choices, (str, bytes)) or not hasattr(choices, "__iter__"):
        raise TypeError("choices: expected a list with one list of option strings per question")
    choices = [list(c) if not isinstance(c, str) else c for c in choices]
    for i, c in enumerate(choices):
        if isinstance(c, str) or len(c) < 2:
            raise ValueError(f"choices[{i}] must be a list of at least 2 option strings, got {c!r:.80}")
    Q = len(choices)
    d_first, d_cap = default_samples(run.process)
    first = d_first if num_samples is None else num_samples
    cap = (max(d_cap, first) if max_samples is None else max_samples) if adaptive else first
    if not adaptive and max_samples is not None and max_samples != first:
        raise ValueError("max_samples applies to adaptive=True only (adaptive=False draws num_samples once)")
    check_settings(confidence, first, cap)
    if answers is not None:
        answers = list(answers)
        if len(answers) != Q:
            raise ValueError(f"{len(answers)} answers but {Q} questions")
        for i, (a, c) in enumerate(zip(answers, choices)):
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a < len(c):
                raise ValueError(f"answers[{i}]={a!r} must be an option index in [0, {len(c)})")
        answers = np.asarray(answers, np.int64)
    p_ids, p_changed = windows.encode_rows(prompts, "prompts", run.tokenizer, nonempty=False)
    if len(p_ids) != Q:
        raise ValueError(f"{len(p_ids)} prompts but {Q} questions")
    ctx = windows.prompt_contexts(p_ids, run.tokenizer)
    options, changed = [], []
    for i, c in enumerate(choices):
        ids, ch = windows.encode_rows(c, f"choices[{i}] option", run.tokenizer)
        options.append(ids)
        changed.append(_sum_dicts([p_changed[i], *ch]))
    run.last_changed = changed
    run.last_context = np.asarray([len(c) for c in ctx], np.int64)
    res = choose_tokens(run, ctx, options, answers=answers, confidence=confidence, num_samples=first,
                        max_samples=cap, adaptive=adaptive, coupled=coupled, seed=seed)
    res.info["prompt_tokens"] = np.asarray(run.last_context, np.int64)
    return res


@scoring.guarded(CHOICE_QUERY, prompt=True)
def choose_tokens(run, contexts, options, *, answers=None, confidence=0.95, num_samples: int, max_samples: int,
                  adaptive=True, coupled=True, seed=None) -> Choices:
    """:func:`choose` on token ids: ``contexts`` Q int arrays (each already ending with whatever
    joins it to its options), or per question a list of one context per option (lm-eval's
    partial-evaluation tasks, e.g. Winogrande, change the context and keep the continuation), ``options`` Q lists of >= 2 non-empty int arrays; ``num_samples`` /
    ``max_samples`` given (:func:`choose` resolves its defaults; the lm-eval model its model_args). The lm-eval model calls it with its own
    tokenization (:mod:`infodiff.harness`)."""
    Q, first, cap = len(options), int(num_samples), int(max_samples)
    ctx = contexts
    L = run.seq_len
    key = jax.random.fold_in(run.key(seed), CHOICE_STREAM)
    num_looks = looks(first, cap)
    out = {k: [None] * Q for k in ("nll", "nll_stderr", "p_best")}
    vec = {k: np.zeros(Q, t) for k, t in (("choice", np.int64), ("runner_up", np.int64), ("margin", float),
                                          ("margin_stderr", float), ("p_flip", float), ("decided", bool),
                                          ("samples", np.int64), ("forward_passes", np.int64), ("rounds", np.int64))}
    context_seen = np.zeros(Q, np.int64)
    for n in sorted({len(c) for c in options}):
        qs = [q for q in range(Q) if len(options[q]) == n]
        first_ctx = [L - max(windows.first_piece(len(o), L) for o in options[q]) for q in qs]
        wins = [windows.response_windows([_context(ctx[q], j) for q in qs], [options[q][j] for q in qs], L, first_ctx)
                for j in range(n)]
        for j in range(1, n):
            if not np.array_equal(wins[j].row_W, wins[0].row_W):
                bad = next(i for i in range(len(qs)) if (wins[j].row_W == i).sum() != (wins[0].row_W == i).sum())
                raise ValueError(f"choices[{qs[bad]}] has options that need different numbers of windows of the "
                                 f"model's length {L} (option 0: {len(options[qs[bad]][0])} tokens, option {j}: "
                                 f"{len(options[qs[bad]][j])}); use options of at most {L} tokens")
        context_seen[qs] = wins[0].context_R
        alpha = decision_level(confidence, n, num_looks)
        samples = [[] for _ in qs]      # per question: arrays [n, S_round]
        exact = [np.zeros(n) for _ in qs]
        passes = np.zeros(len(qs), np.int64)
        active = np.arange(len(qs))
        drawn, r = 0, 0
        gkey = jax.random.fold_in(key, n)
        while len(active):
            S = first if r == 0 else min(drawn, cap - drawn)
            sel = np.flatnonzero(np.isin(wins[0].row_W, active))
            local = np.searchsorted(active, wins[0].row_W[sel])
            # calls of one shape: samples in pieces of `first`, windows padded (repeats, dropped) to
            # the rows of a full call, so that each round reuses one compiled program
            full = lk.chunk_shape(run.process.chunk_order, len(wins[0].row_W), first, max(1, run.batch_size // n),
                                  run.process.passes_per_sample(wins[0].target_WxL[:1]))[0]
            padded = np.concatenate([sel, np.repeat(sel[:1], max(0, full - len(sel)))])
            pieces = []
            for k, s0 in enumerate(range(0, S, first)):
                ests = lk.coupled_nll(run.denoiser, [w.x_WxL[padded] for w in wins],
                                      jax.random.fold_in(jax.random.fold_in(gkey, r), k),
                                      target_NxBxL=[w.target_WxL[padded] for w in wins],
                                      pad_NxBxL=[w.pad_WxL[padded] for w in wins], coupled=coupled,
                                      process=run.process, num_samples=min(first, S - s0), batch_size=run.batch_size)
                pieces.append([windows.sum_windows(_rows(e, len(sel)), local, len(active)) for e in ests])
            for a_i, qi in enumerate(active):
                samples[qi].append(np.concatenate([np.stack([e.samples[a_i] for e in ests]) for ests in pieces], 1))
                if r == 0:
                    exact[qi] = np.array([sum(np.asarray(v)[a_i] for v in e.exact.values()) for e in pieces[0]],
                                         np.float64)
                passes[qi] += int(sum(e.info["forward_passes_per_row"][a_i] for ests in pieces for e in ests))
            drawn += S
            still = []
            for qi in active:
                c, ru, m, se_raw, dof, *_ = _margins(np.concatenate(samples[qi], 1), exact[qi], run.process.se_method,
                                                     run.process.min_samples)
                if not _decide(m, se_raw, dof, c, alpha) and drawn < cap:
                    still.append(qi)
            active = np.asarray(still, np.int64)
            r += 1
        for qi, q in enumerate(qs):
            s = np.concatenate(samples[qi], 1)
            c, ru, m, se_raw, dof, mean, se, diff_se = _margins(s, exact[qi], run.process.se_method,
                                                                run.process.min_samples)
            out["nll"][q], out["nll_stderr"][q] = mean, se
            vec["choice"][q], vec["runner_up"][q] = c, ru
            vec["margin"][q], vec["margin_stderr"][q] = m[ru], diff_se[ru]
            vec["decided"][q] = _decide(m, se_raw, dof, c, alpha)
            out["p_best"][q] = best_probabilities(s, exact[qi], se, seed=q)
            vec["p_flip"][q] = 1.0 - out["p_best"][q][c]
            vec["samples"][q], vec["forward_passes"][q], vec["rounds"][q] = s.shape[1], passes[qi], len(samples[qi])
    return Choices(out["nll"], out["nll_stderr"], confidence=float(confidence), adaptive=bool(adaptive),
                   coupled=bool(coupled), max_samples=int(cap), first_samples=int(first),
                   estimator=run.process.estimator, p_best=out["p_best"], answers=answers,
                   info={"bound": "nelbo", "context_per_question": context_seen}, **vec)


def _context(c, j):
    """Option j's context: ``c`` itself, or ``c[j]`` when ``c`` is a list of per-option contexts."""
    return c[j] if isinstance(c, (list, tuple)) else c


def _rows(est, n):
    """The Estimate of the first n rows (the rest: padding)."""
    return dataclasses.replace(est, samples=est.samples[:n], exact={k: np.asarray(v)[:n] for k, v in est.exact.items()})


def _sum_dicts(ds):
    out: dict = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out
