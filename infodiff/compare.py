"""Model vs model: -log p of the same rows under two text runs and their difference, with a
**paired** standard error (docs/scoring.md, "Comparing two runs").

    a, b = infodiff.load_run("runs/long"), infodiff.load_run("runs/short")
    c = infodiff.compare(a, b, texts)
    c.difference, c.stderr_paired, c.stderr_unpaired     # per row, nats: -log p_a - (-log p_b)
    c.total, c.total_stderr_paired, c.se_ratio           # sum over rows; unpaired SE / paired SE

Two separate evaluations add their Monte Carlo noises: the SE of a difference is then
sqrt(se_a^2 + se_b^2) (``stderr_unpaired``). Here both runs score the same windows with the
same key, samples per window and chunk layout (run a's ``batch_size``), so sample s of a window
sees the same noise draw (masks and times) under both networks: common random numbers, as the
coupled log-ratio of arXiv 2510.24088 Eq. 18 shares them between two inputs. The difference's
samples are the per-sample differences d_s = a_s - b_s (summed over a row's windows), and its SE
is their sample SE (Student-t scaled like every SE of the library): ``stderr_paired``. Two
identical runs give d_s = 0 exactly, SE 0.

Draws are shared only where the processes allow (``coupled``): the same process family and
estimator (``Process.estimator``, e.g. ``k_dce``, ``imdse_absorb:defensive``) and the same
model length L (the same windows). Otherwise (``why_not`` says which) run b draws from an
independent key (``fold_in(key, INDEPENDENT_STREAM)``) and the paired SE is the unpaired one.
``same_noise``: the two processes are equal (schedule too), so the noise is identical, not only
drawn from the same random numbers; either way the pairs are i.i.d. over s and the paired SE holds.
Every number is a difference of NELBOs (upper bounds on each network's -log p), not a bound.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
import types

import jax
import numpy as np

from infodiff import likelihood as lk
from infodiff import scoring
from infodiff import validation

__all__ = ["Comparison", "compare", "INDEPENDENT_STREAM"]

INDEPENDENT_STREAM = 0xB0B  # fold_in of the key for run b's draws when the runs cannot share them


@dataclasses.dataclass
class Comparison:
    """-log p_a, -log p_b (nats per row, :class:`infodiff.likelihood.Estimate`, with this
    comparison's draws) and ``paired`` (the Estimate of the per-sample differences a - b; None when
    not ``coupled``). ``why_not``: '' when coupled, else the reason."""

    a: lk.Estimate
    b: lk.Estimate
    paired: lk.Estimate | None
    coupled: bool
    why_not: str
    same_noise: bool
    changed: list = dataclasses.field(default_factory=list)  # per row {character: count} changed by cleaning

    @property
    def difference(self) -> np.ndarray:
        """float64 [N]: -log p_a - (-log p_b), nats (> 0: run b gives the row more probability)."""
        return self.a.mean - self.b.mean

    @property
    def stderr_unpaired(self) -> np.ndarray:
        """float64 [N]: sqrt(se_a^2 + se_b^2), the SE of two independent evaluations."""
        return np.sqrt(self.a.stderr**2 + self.b.stderr**2)

    @property
    def stderr_paired(self) -> np.ndarray:
        """float64 [N]: the SE of the per-sample differences (coupled), else the unpaired SE."""
        return self.paired.stderr if self.coupled else self.stderr_unpaired

    @property
    def total(self) -> float:
        """The sum of the rows' differences, nats."""
        return float(self.difference.sum())

    @property
    def total_stderr_unpaired(self) -> float:
        return math.hypot(self.a.pooled_stderr(), self.b.pooled_stderr())

    @property
    def total_stderr_paired(self) -> float:
        return self.paired.pooled_stderr() if self.coupled else self.total_stderr_unpaired

    @property
    def se_ratio(self) -> float:
        """unpaired / paired SE of the total (NaN when the paired SE is 0: identical runs)."""
        p = self.total_stderr_paired
        return self.total_stderr_unpaired / p if p > 0 else float("nan")

    @property
    def se_ratio_rows(self) -> np.ndarray:
        """float64 [N]: unpaired / paired SE per row (NaN where the paired SE is 0)."""
        p = self.stderr_paired
        return self.stderr_unpaired / np.where(p > 0, p, np.nan)

    def summary(self) -> dict:
        """The totals as plain floats (a report's ``summary``)."""
        ratios = self.se_ratio_rows
        return {"total_difference": self.total, "total_stderr_paired": self.total_stderr_paired,
                "total_stderr_unpaired": self.total_stderr_unpaired, "se_ratio_unpaired_over_paired": self.se_ratio,
                "se_ratio_unpaired_over_paired_median": (float(np.nanmedian(ratios)) if np.isfinite(ratios).any()
                                                         else float("nan")),
                "total_nll_a": float(self.a.mean.sum()), "total_nll_a_stderr": self.a.pooled_stderr(),
                "total_nll_b": float(self.b.mean.sum()), "total_nll_b_stderr": self.b.pooled_stderr(),
                "fraction_resolved_2se": float(np.mean(np.abs(self.difference) > 2 * self.stderr_paired)),
                "fraction_b_more_likely": float(np.mean(self.difference > 0)), "rows": len(self.difference)}


def _alphabet(run) -> tuple:
    """(vocabulary size, tokenizer name, unit, separator): how a run turns text into tokens."""
    t = run.tokenizer
    return int(run.task.vocab_size), t.name, t.unit, tuple(t.separator)


def _same_tokens(ids_a, ids_b, what: str) -> None:
    """ValueError naming the first row the two runs' tokenizers encode differently."""
    for i, (x, y) in enumerate(zip(ids_a, ids_b)):
        if not np.array_equal(x, y):
            raise ValueError(f"{what}[{i}] is tokenized differently by the two runs (a: {len(x)} tokens, b: {len(y)}); "
                             "compare runs with the same vocabulary and cleaning")


def coupling(run_a, run_b) -> tuple[bool, str, bool]:
    """(coupled, why not ('' if coupled), same_noise) of two runs (module docstring)."""
    pa, pb = run_a.process, run_b.process
    fa, fb = f"{type(pa).__name__} {pa.estimator}", f"{type(pb).__name__} {pb.estimator}"
    if fa != fb:
        return False, f"different processes or estimators (a: {fa}, b: {fb}): no shared noise draws", False
    if pa.needs_plan:
        return False, f"{pa.estimator} allocates its samples by each network's own pilot run: no shared draws", False
    if run_a.seq_len != run_b.seq_len:
        return False, (f"different model lengths (a: L = {run_a.seq_len}, b: L = {run_b.seq_len}): the rows are cut "
                       "into different windows"), False
    return True, "", pa == pb


def compare(run_a, run_b, texts=None, *, prompts=None, responses=None, seed: int | None = None,
            num_samples: int | None = None, target_se: float | None = None, max_samples: int | None = None,
            progress: bool = False) -> Comparison:
    """-log p of each row under ``run_a`` and ``run_b`` (:class:`infodiff.scoring.Run`) and their
    difference with its paired SE (module docstring). Rows: ``texts`` (documents, as
    :meth:`Run.nll`) or ``prompts`` and ``responses`` (-log p(response | prompt), as
    :meth:`Run.conditional_nll`). ``seed`` default run a's ``eval.seed``; ``num_samples`` per
    window default the larger of the runs'; with ``target_se`` (nats) rounds of as many samples
    again (key ``fold_in(key, round)``) until every row's paired SE is at most it or
    ``max_samples`` (default run a's) per window are spent (``info['target_se_reached']`` of ``a``).
    Raises ValueError for runs of different vocabularies or cleaning (tokenizers, or any row encoded
    differently), both or neither of texts and responses, and the errors of :meth:`Run.nll` /
    :meth:`Run.conditional_nll`."""
    if _alphabet(run_a) != _alphabet(run_b):
        raise ValueError(f"the runs score text differently (vocabulary size, tokenizer, unit, separator): a "
                         f"{_alphabet(run_a)}, b {_alphabet(run_b)}; compare runs with the same vocabulary and cleaning")
    if (texts is None) == (responses is None) or (responses is None) != (prompts is None):
        raise ValueError("give either texts (documents) or prompts and responses (pairs)")
    tok_a, tok_b = run_a.tokenizer, run_b.tokenizer
    if texts is not None:
        ids, changed = scoring.encode_rows(texts, "texts", tok_a)
        _same_tokens(ids, scoring.encode_rows(texts, "texts", tok_b)[0], "texts")
        wa, wb = (scoring.document_windows(ids, r.seq_len) for r in (run_a, run_b))
    else:
        ids, y_changed = scoring.encode_rows(responses, "responses", tok_a)
        p_ids, p_changed = scoring.encode_rows(prompts, "prompts", tok_a, nonempty=False)
        _same_tokens(ids, scoring.encode_rows(responses, "responses", tok_b)[0], "responses")
        _same_tokens(p_ids, scoring.encode_rows(prompts, "prompts", tok_b, nonempty=False)[0], "prompts")
        if len(p_ids) != len(ids):
            raise ValueError(f"{len(p_ids)} prompts but {len(ids)} responses")
        ctx = scoring.prompt_contexts(p_ids, tok_a)
        changed = [dict(collections.Counter(p) + collections.Counter(y)) for p, y in zip(p_changed, y_changed)]
        wa, wb = (scoring.response_windows(ctx, ids, r.seq_len) for r in (run_a, run_b))
    n = len(ids)
    coupled, why_not, same_noise = coupling(run_a, run_b)
    key = validation.as_key(int(run_a.config.eval.seed) if seed is None else seed, "seed")
    S = (validation.check_num_samples(num_samples, "num_samples") if num_samples is not None
         else max(run_a.num_samples, run_b.num_samples))
    batch = run_a.batch_size

    def draw(k, s):
        ea = run_a.window_nll(wa, n, k, s, batch_size=batch, progress=progress)
        eb = run_b.window_nll(wb, n, k if coupled else jax.random.fold_in(k, INDEPENDENT_STREAM), s,
                              batch_size=batch, progress=progress)
        return ea, eb

    parts = [draw(key, S)]
    out = _comparison(parts, coupled, why_not, same_noise)
    if target_se is not None:
        if not float(target_se) > 0:
            raise ValueError(f"target_se={target_se!r} must be > 0 (nats)")
        cap = int(max_samples or run_a.max_samples)
        while np.max(out.stderr_paired) > float(target_se) and out.a.num_samples < cap:
            parts.append(draw(jax.random.fold_in(key, len(parts)), min(out.a.num_samples, cap - out.a.num_samples)))
            out = _comparison(parts, coupled, why_not, same_noise)
        out.a.info.update(target_se=float(target_se), max_samples=cap,
                          target_se_reached=bool(np.max(out.stderr_paired) <= float(target_se)))
    out.changed = changed
    return out


def _comparison(parts, coupled, why_not, same_noise) -> Comparison:
    """The Comparison of rounds ``parts`` [(a, b), ...] of the same rows."""
    a = scoring.concat_rounds([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    b = scoring.concat_rounds([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    for e in (a, b):
        e.info["bound"] = "nelbo"
    paired = None
    if coupled:
        exact = {k: np.asarray(a.exact.get(k, 0.0)) - np.asarray(b.exact.get(k, 0.0))
                 for k in sorted({*a.exact, *b.exact})}
        paired = lk.Estimate(f"{a.estimator}:paired", a.samples - b.samples, forward_passes=a.forward_passes
                             + b.forward_passes, infinite_variance=a.infinite_variance or b.infinite_variance,
                             exact=exact, info={"bound": "model_difference"}, se_method=a.se_method,
                             min_samples=max(a.min_samples, b.min_samples))
    return Comparison(a, b, paired, coupled, why_not, same_noise)


class _CallableModule(types.ModuleType):
    """Importing ``infodiff.compare`` binds this module to the package's attribute ``compare``
    (Python's import system), which would hide the function of the same name: calling the module
    calls :func:`compare`, so ``infodiff.compare(run_a, run_b, texts)`` works either way."""

    def __call__(self, *args, **kwargs) -> Comparison:
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
