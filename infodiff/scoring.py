"""Score your own text with a trained text run (masked diffusion, or SEDD under the absorbing or
uniform graph): -log p(text), -log p(response | prompt) and coupled log-ratios, each per row with
a standard error (docs/scoring.md).

    run = infodiff.load_run("runs/masked_text")
    est = run.nll(["In the beginning God created the heaven and the earth."])
    est.mean, est.stderr                     # nats per document, float64 [N]
    run.conditional_nll(prompts, responses)  # -log p(response | prompt), nats per response
    run.log_ratio(prompts, a, b)             # log p(a | prompt) - log p(b | prompt), coupled

Every -log p of a trained network is its NELBO: an upper bound on the network's own -log p
(equal to it for an exact denoiser); a log-ratio is a difference of two NELBOs (not a bound).
Every returned Estimate says which: ``est.info["bound"]`` is ``'nelbo'`` (:meth:`Run.nll`,
:meth:`Run.conditional_nll`) or ``'nelbo_difference'`` (:meth:`Run.log_ratio`), the values of
``infodiff.evaluation.report.BOUNDS`` (docs/report.md).

Text is cleaned with the corpus's own rules (:func:`infodiff.data.text.clean_text8`, text8's
alphabet) and fitted to the model's length L without user padding:

* a document is cut into non-overlapping windows of L characters, each scored on its own, the
  same quantity as the test-split report (its bits per character are comparable); the last,
  shorter window is padded;
* a response of R <= L characters is one window: the last L - R characters of the context
  (prompt, then one space) and the response, padded to L; a longer response is scored in pieces
  of L // 2 characters, each given the L - L // 2 characters before it (the chain rule of a model
  with a window of L characters);
* pads hold the process's ``pad_id`` and are never scored (``likelihood.nll(pad_BxL=...)``): the
  mask token (masked, SEDD absorbing graph) or pure noise, lam = 1 (SEDD uniform graph); either
  way a short window's estimate is of the marginal -log p of its characters: with an exact
  denoiser or score it equals the exact value (tests/test_scoring.py).

The windows of a row are independent Monte Carlo estimates; a row's samples are the sums of its
windows' samples, so its SE is that of the sum. The estimator is the task's ``scoring_process``:
one forward pass per sample (masked: k_dce, the text configs' default, t_dce, time_free or
lambda_dce; SEDD: imdse), as rows differ in length. Below the process's ``min_samples`` per
window (k_dce 16, SEDD absorb 128, uniform 512) the per-row SEs are flagged
(``Estimate.few_samples``) and :func:`load_run` logs a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import jax
import numpy as np

from infodiff import likelihood as lk
from infodiff import orders as orders_lib
from infodiff import tasks
from infodiff.data.tokenizers import BYTES, TEXT8, Tokenizer, clean  # noqa: F401  (re-exported)
from infodiff import validation
from infodiff.tasks import masked as masked_task
from infodiff.validation import check_num_samples
from infodiff.windows import (  # noqa: F401  (re-exported)
    Windows, check_nonempty, document_windows, encode_rows, first_piece, prompt_contexts, response_windows,
    sum_windows)

__all__ = ["ScorerTask", "clean", "Tokenizer", "TEXT8", "BYTES", "Windows", "document_windows", "response_windows", "sum_windows", "sum_interval_windows", "Run",
           "load_run", "encode_rows", "prompt_contexts", "concat_rounds",
           "SCORING_ESTIMATORS"]



def __getattr__(name: str):
    if name == "SCORING_ESTIMATORS":  # the mask laws that score rows of different lengths (registry)
        return masked_task.SCORING_ESTIMATORS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_INPUT_SAMPLES = 32  # per window: 2x k_dce's calibrated minimum (tests/test_calibration.py)
DEFAULT_MAX_SAMPLES = 1024  # the bound of a target_se run, per window


class ScorerTask:
    """What a :class:`Run` reads of a task that is not built from a config (a user's function,
    :mod:`infodiff.external`; a released checkpoint, :mod:`infodiff.pretrained`), with the defaults
    of :class:`infodiff.tasks.Task`: no any-order conditionals, no exact likelihood. ``source``:
    where the network came from, added to ``process_info`` (a released checkpoint's kind and path)."""

    name: str = ""
    seq_len: int | None = None
    vocab_size: int | None = None
    tokenizer: Tokenizer | None = None
    schedule_obj = None
    scaling = None
    exact_likelihood = False
    source: dict = {}  # replaced, never mutated

    def order_settings(self) -> dict | None:
        return None

    def order_model(self, params=None) -> dict | None:
        return None

    def process_info(self, process) -> dict:
        return {"name": self.name, **self.source}


def guarded(what: str, *, prompt: bool = False):
    """Decorator: ``fn(run, ...)`` (a query on a :class:`Run`, or a Run method) called inside
    ``run.guard(what, prompt=prompt)`` (:meth:`Run.guard`)."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapped(run, *args, **kwargs):
            with run.guard(what, prompt=prompt):
                return fn(run, *args, **kwargs)

        return wrapped

    return decorate


class Run:
    """A trained text run (masked or SEDD) ready to score strings (:func:`load_run`), or an
    external masked denoiser (:func:`infodiff.external.from_function`: ``workdir`` and
    ``checkpoint_step`` None).

    Attributes: ``workdir``, ``config``, ``task``, ``denoiser``, ``process`` (the estimator),
    ``seq_len`` (L), ``checkpoint_step``, ``checkpoint_sha256`` (its state's SHA-256 written at save), ``num_samples``
    (per window, default
    ``config.eval.input_samples``, else :data:`DEFAULT_INPUT_SAMPLES`), ``batch_size``, ``tokenizer``
    (how strings become ids, :class:`Tokenizer`: :data:`TEXT8` for the text configs); ``last_changed``: per row of the last call,
    {character: count} changed by cleaning; ``last_context``: per row, the prompt's tokens (with
    the joining space), of which ``Estimate.info['context_per_row']`` were seen. ``seed`` (every method) defaults to the run's
    ``eval.seed``, so the API and ``evaluate.py --config.eval.input=FILE`` give the same numbers.
    """

    def __init__(self, workdir, config, task, denoiser, process, checkpoint_step, num_samples, batch_size,
                 max_samples=DEFAULT_MAX_SAMPLES, tokenizer: Tokenizer = TEXT8, checkpoint_sha256=None):
        self.tokenizer = tokenizer
        self.max_samples = int(max_samples)
        self.checkpoint_sha256 = checkpoint_sha256
        self.workdir, self.config, self.task, self.denoiser = workdir, config, task, denoiser
        self.process = process
        self.checkpoint_step = None if checkpoint_step is None else int(checkpoint_step)
        self.seq_len = int(task.seq_len)
        self.num_samples, self.batch_size = int(num_samples), int(batch_size)
        self.last_changed: list = []
        self.last_context = None

    def encode(self, text: str) -> np.ndarray:
        """int32 token ids [n] of one string, as every method scores it (:class:`Tokenizer`)."""
        return np.asarray(self.tokenizer.encode(text)[0], np.int32)

    def key(self, seed: int | None = None):
        """The JAX key of ``seed`` (default the run's ``eval.seed``): every method's draws start here.
        Raises TypeError for a seed that is not an integer."""
        return self._key(seed)

    def _key(self, seed):
        seed = self.config.eval.seed if seed is None else seed
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        return jax.random.key(int(seed))

    def _samples(self, num_samples) -> int:
        if num_samples is None:
            return self.num_samples
        return check_num_samples(num_samples, "num_samples")

    def _until(self, draw, seed, num_samples, target_se, max_samples, bound="nelbo") -> lk.Estimate:
        """``draw(key, S)`` -> per-row Estimate; with ``target_se`` (nats) more rounds, each as
        many samples as drawn so far (key ``fold_in(key, round)``), until every row's SE is at most
        ``target_se`` or the samples reach ``max_samples`` (``info['target_se_reached']``).
        ``info['bound']`` = ``bound`` (what the numbers are, module docstring)."""
        key, S = self._key(seed), self._samples(num_samples)
        est = draw(key, S)
        est.info["bound"] = bound
        if target_se is None:
            return est
        if not float(target_se) > 0:
            raise ValueError(f"target_se={target_se!r} must be > 0 (nats)")
        cap = int(max_samples or self.max_samples)
        parts, r = [est], 0
        while np.max(est.stderr) > float(target_se) and est.num_samples < cap:
            r += 1
            parts.append(draw(jax.random.fold_in(key, r), min(est.num_samples, cap - est.num_samples)))
            est = concat_rounds(parts)
        est.info.update(bound=bound, target_se=float(target_se),
                        target_se_reached=bool(np.max(est.stderr) <= float(target_se)), max_samples=cap)
        return est

    def window_nll(self, win: Windows, num_rows: int, key, num_samples: int, *, batch_size: int | None = None,
                   progress: bool = False) -> lk.Estimate:
        """One draw of -log p per row (nats) from its windows (:func:`sum_windows`), S =
        ``num_samples`` per window from ``key``; ``batch_size`` (default the run's) sets the
        chunk layout, which with the key and the process fixes every draw (``likelihood.estimate``)."""
        est = lk.nll(self.denoiser, win.x_WxL, key, process=self.process, num_samples=num_samples,
                     batch_size=self.batch_size if batch_size is None else int(batch_size),
                     target_BxL=win.target_WxL, pad_BxL=win.pad_WxL, progress=progress)
        out = sum_windows(est, win.row_W, num_rows)
        if win.context_R is not None:
            out.info["context_per_row"] = win.context_R
        return out

    def _nll_windows(self, win: Windows, num_rows: int, seed, num_samples, progress, target_se=None,
                     max_samples=None) -> lk.Estimate:
        def draw(key, S):
            return self.window_nll(win, num_rows, key, S, progress=progress)

        return self._until(draw, seed, num_samples, target_se, max_samples)

    def nll(self, texts, *, seed: int | None = None, num_samples: int | None = None, progress: bool = False,
            target_se: float | None = None, max_samples: int | None = None) -> lk.Estimate:
        """-log p(document) per text, nats (the sum over its windows of L characters): the
        network's NELBO, ``info['bound'] == 'nelbo'``. With
        ``target_se`` (nats), samples are added in rounds until every row's SE is at most it or
        ``max_samples`` per window are spent (every method; ``info['target_se_reached']``).
        Raises TypeError for non-strings, ValueError for a text empty after cleaning."""
        ids, self.last_changed = encode_rows(texts, "texts", self.tokenizer, nonempty=False)
        check_nonempty(ids, "texts", self.tokenizer)
        return self._nll_windows(document_windows(ids, self.seq_len), len(ids), seed, num_samples, progress,
                                 target_se, max_samples)

    def _contexts(self, prompts, n):
        p_ids, p_changed = encode_rows(prompts, "prompts", self.tokenizer, nonempty=False)
        if len(p_ids) != n:
            raise ValueError(f"{len(p_ids)} prompts but {n} responses")
        ctx = prompt_contexts(p_ids, self.tokenizer)
        self.last_context = np.asarray([len(c) for c in ctx], np.int64)
        return ctx, p_changed

    def conditional_nll(self, prompts, responses, *, seed: int | None = None, num_samples: int | None = None,
                        progress: bool = False, target_se: float | None = None,
                        max_samples: int | None = None) -> lk.Estimate:
        """-log p(response | prompt) per pair, nats per response (module docstring for long
        responses and prompts): the network's NELBO, ``info['bound'] == 'nelbo'``. Raises
        ValueError for unequal counts or an empty response."""
        y, y_changed = encode_rows(responses, "responses", self.tokenizer, nonempty=False)
        check_nonempty(y, "responses", self.tokenizer)
        ctx, p_changed = self._contexts(prompts, len(y))
        self.last_changed = [_merge(a, b) for a, b in zip(p_changed, y_changed)]
        return self._nll_windows(response_windows(ctx, y, self.seq_len), len(y), seed, num_samples, progress,
                                 target_se, max_samples)

    def log_ratio(self, prompts, a, b, *, coupled: bool = True, seed: int | None = None,
                  num_samples: int | None = None, target_se: float | None = None,
                  max_samples: int | None = None) -> lk.Estimate:
        """log p(a | prompt) - log p(b | prompt) per triple, nats; coupled (shared noise, arXiv
        2510.24088 Eq. 18) or not: NELBO(b) - NELBO(a), ``info['bound'] == 'nelbo_difference'``
        (not a bound). a and b may differ in length: each is windowed as in
        :meth:`conditional_nll`, and pairs whose window counts differ are refused (ValueError).
        ``info['nll_a']`` / ``info['nll_b']``: the Estimates of -log p(a | prompt) and -log p(b | prompt)
        from the same draws (the ratio's samples are their difference)."""
        ya, ca = encode_rows(a, "a", self.tokenizer, nonempty=False)
        yb, cb = encode_rows(b, "b", self.tokenizer, nonempty=False)
        check_nonempty(ya, "a", self.tokenizer)
        check_nonempty(yb, "b", self.tokenizer)
        if len(ya) != len(yb):
            raise ValueError(f"{len(ya)} a-responses but {len(yb)} b-responses")
        ctx, pc = self._contexts(prompts, len(ya))
        self.last_changed = [_merge(p, _merge(x, z)) for p, x, z in zip(pc, ca, cb)]
        L = self.seq_len
        # one prompt context for both: that of the longer first piece
        first = [L - max(first_piece(len(u), L), first_piece(len(v), L)) for u, v in zip(ya, yb)]
        wa, wb = response_windows(ctx, ya, L, first), response_windows(ctx, yb, L, first)
        if not np.array_equal(wa.row_W, wb.row_W):
            bad = next(i for i in range(len(ya)) if (wa.row_W == i).sum() != (wb.row_W == i).sum())
            raise ValueError(f"a[{bad}] and b[{bad}] need the same number of windows of the model's length {L} "
                             f"(a: {len(ya[bad])} characters, b: {len(yb[bad])}); use responses of at most {L} "
                             "characters, or of similar length")
        def draw(key, S):
            ea, eb = lk.paired_nll(self.denoiser, wa.x_WxL, wb.x_WxL, key, target_a_BxL=wa.target_WxL,
                                   target_b_BxL=wb.target_WxL, pad_a_BxL=wa.pad_WxL, pad_b_BxL=wb.pad_WxL,
                                   coupled=coupled, process=self.process, num_samples=S,
                                   batch_size=self.batch_size)
            ea, eb = (sum_windows(e, wa.row_W, len(ya)) for e in (ea, eb))
            exact = {k: eb.exact[k] - ea.exact[k] for k in ea.exact}
            info = dict(ea.info, forward_passes_per_row=2 * ea.info["forward_passes_per_row"],
                        context_per_row=wa.context_R, nll_a=ea, nll_b=eb)
            return lk.Estimate(f"{ea.estimator}:{'coupled' if coupled else 'decoupled'}", eb.samples - ea.samples,
                               forward_passes=2 * ea.forward_passes, infinite_variance=ea.infinite_variance,
                               exact=exact, info=info, se_method=ea.se_method, min_samples=ea.min_samples)

        return self._until(draw, seed, num_samples, target_se, max_samples, bound="nelbo_difference")


    def __getattr__(self, name):
        if name == "choose":  # Run.choose was a method before multiple choice became a query on a Run
            raise AttributeError("Run.choose is now infodiff.choose(run, prompts, choices, ...) (infodiff.choices)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def guard(self, what: str, *, prompt: bool = False):
        """The context in which a query outside this class (:func:`infodiff.choices.choose`,
        :func:`infodiff.choices.choose_tokens`, the lm-eval model) calls the network: here nothing;
        a run over a user's function re-raises the function's own errors in it
        (:class:`infodiff.external.ExternalRun`), a released network that cannot take a prompt
        refuses ``what`` when ``prompt`` (:class:`infodiff.pretrained.run.WholeWindowRun`)."""
        return contextlib.nullcontext()

    # -- the model's own -log p over generation orders (infodiff/orders.py) --------------------
    def _interval_windows(self, win: Windows, num_rows: int, nelbo: lk.Estimate, seed, orders_, level, proposal,
                          progress):
        model = self.task.order_model(self.denoiser.params)
        oi = orders_lib.nll_interval(model["denoiser"], win.x_WxL, jax.random.fold_in(self._key(seed), INTERVAL_STREAM),
                                 target_BxL=win.target_WxL, pad_BxL=win.pad_WxL, num_orders=orders_, proposal=proposal,
                                 level=level, time_conditioned=model["time_conditioned"], schedule=model["schedule"],
                                 batch_size=self.batch_size, progress=progress)
        out = sum_interval_windows(oi, win.row_W, num_rows)
        out.nelbo, out.nelbo_stderr = nelbo.mean, nelbo.stderr
        return out

    def nll_interval(self, texts, *, orders: int = 16, level: float = 0.95, proposal: str = "uniform",
                     seed: int | None = None, progress: bool = False, nelbo: lk.Estimate | None = None):
        """An interval for the network's own -log p(document) per text (nats; the mixture over
        generation orders, which :meth:`nll`'s NELBO bounds from above): an
        :class:`infodiff.orders.OrderInterval`, rows in input order, over the windows of
        :meth:`nll` (:func:`sum_interval_windows`), ``nelbo`` / ``nelbo_stderr`` from :meth:`nll`
        with the same ``seed`` (or ``nelbo``, an Estimate of these rows already made). ``orders``
        K >= 2 per window and as many pilot orders.
        Raises ValueError for a run that is not masked diffusion, or bad settings."""
        ids, self.last_changed = encode_rows(texts, "texts", self.tokenizer, nonempty=False)
        check_nonempty(ids, "texts", self.tokenizer)
        self._check_interval(orders, level, proposal)
        win = document_windows(ids, self.seq_len)
        if nelbo is None:
            nelbo = self._nll_windows(win, len(ids), seed, None, progress)
        return self._interval_windows(win, len(ids), nelbo, seed, orders, level, proposal, progress)

    def conditional_nll_interval(self, prompts, responses, *, orders: int = 16, level: float = 0.95,
                                 proposal: str = "uniform", seed: int | None = None, progress: bool = False,
                                 nelbo: lk.Estimate | None = None):
        """:meth:`nll_interval` of -log p(response | prompt) per pair, over the windows of
        :meth:`conditional_nll`."""
        y, y_changed = encode_rows(responses, "responses", self.tokenizer, nonempty=False)
        check_nonempty(y, "responses", self.tokenizer)
        self._check_interval(orders, level, proposal)
        ctx, p_changed = self._contexts(prompts, len(y))
        self.last_changed = [_merge(a, b) for a, b in zip(p_changed, y_changed)]
        win = response_windows(ctx, y, self.seq_len)
        if nelbo is None:
            nelbo = self._nll_windows(win, len(y), seed, None, progress)
        return self._interval_windows(win, len(y), nelbo, seed, orders, level, proposal, progress)

    def exact_nll(self, texts, *, progress: bool = False) -> lk.Estimate:
        """The network's own -log p(document) per text, exactly (nats; the sum over its windows of
        L characters): a block-diffusion run with a time-free network, every block by the subset
        recursion (:func:`infodiff.orders.exact_block_nll`). An Estimate per row with SE
        0 and ``info['bound'] == 'exact'`` (``info['best_order_nll']``: the best single order
        within each block, summed). Raises ValueError (one line) for a run that is not block
        diffusion, a time-conditioned network or blocks over ``eval.exact_max_block_size``."""
        if not self.task.exact_likelihood:
            raise ValueError(f"an exact likelihood needs a block-diffusion run (configs/block_text.py); this run's "
                             f"process is {self.task.name!r}: use nll_interval for the interval instead")
        ids, self.last_changed = encode_rows(texts, "texts", self.tokenizer, nonempty=False)
        check_nonempty(ids, "texts", self.tokenizer)
        win = document_windows(ids, self.seq_len)
        ex = self.task.exact_nll(self.denoiser, win.x_WxL, target_BxL=win.target_WxL, pad_BxL=win.pad_WxL,
                                 progress=progress)
        n = len(ids)
        nll, best = np.zeros(n), np.zeros(n)
        np.add.at(nll, win.row_W, ex["nll"])
        np.add.at(best, win.row_W, ex["best_order_nll"])
        passes = np.zeros(n, np.int64)
        np.add.at(passes, win.row_W, ex["forward_passes"])
        est = lk.Estimate("exact block likelihood", np.zeros((n, 0)), forward_passes=int(passes.max()),
                          exact={"diffusion": nll})
        est.info.update(bound="exact", best_order_nll=best, forward_passes_per_row=passes,
                        windows_per_row=np.bincount(win.row_W, minlength=n))
        return est

    def _check_interval(self, orders_, level, proposal):
        """ValueError, before any work: a run that is not masked diffusion, or bad settings."""
        if self.task.exact_likelihood:  # block diffusion: its own likelihood is per block
            raise ValueError("a block-diffusion run's likelihood is per block: use exact_nll (time-free networks) "
                             "or evaluate.py's per-block interval; the whole-sequence interval does not apply")
        # order_model is None for a task without any-order conditionals (params are not read to say so);
        # masked runs have them (MaskedTask, infodiff.external)
        if self.task.order_model(None) is None:
            raise ValueError(f"an NLL interval needs a masked-diffusion run; this run's process is "
                             f"{self.task.name!r}: SEDD networks do not define the any-order conditionals used here")
        if isinstance(orders_, bool) or not isinstance(orders_, (int, np.integer)) or orders_ < 2:
            raise ValueError(f"orders={orders_!r} must be an integer >= 2 (orders per window)")
        if isinstance(level, bool) or not isinstance(level, (float, int, np.floating)) or not 0 < level < 1:
            raise ValueError(f"level={level!r} must be a number in (0, 1), e.g. 0.95")
        if proposal not in orders_lib.PROPOSALS:
            raise ValueError(f"proposal={proposal!r}; choose from {orders_lib.PROPOSALS}")


INTERVAL_STREAM = 0x1D1  # fold_in of a call's key for its interval: draws independent of the NELBO's


def sum_interval_windows(oi, row_W: np.ndarray, num_rows: int):
    """The :class:`infodiff.orders.OrderInterval` of each row from its windows' (independent):
    ``iw`` and ``tube`` summed, their SEs in quadrature, ``lower`` / ``upper`` from those sums at
    ``oi.level`` with the windows' Student-t quantiles (:func:`infodiff.orders.side_quantiles`, as
    for one window: a row of one window keeps its window's numbers); ``ess`` the smallest and
    ``pareto_k`` the largest of its windows, ``exact`` all of them, ``forward_passes`` summed."""

    def add(v):
        out = np.zeros(num_rows, np.float64)
        np.add.at(out, row_W, np.asarray(v, np.float64))
        return out

    def reduce(v, fn, fill):
        out = np.full(num_rows, fill, np.float64)
        fn.at(out, row_W, np.asarray(v, np.float64))
        return out

    iw, tube = add(oi.iw), add(oi.tube)
    iw_se, tube_se = np.sqrt(add(oi.iw_stderr**2)), np.sqrt(add(oi.tube_stderr**2))
    z_lower, z_upper = orders_lib.side_quantiles(oi.orders, oi.pilot_orders, oi.level)
    exact = reduce(oi.exact, np.minimum, 1.0).astype(bool)
    ess = reduce(np.where(np.isnan(oi.ess), np.inf, oi.ess), np.minimum, np.inf)
    ess[np.isinf(ess)] = np.nan
    k_hat = reduce(np.where(np.isnan(oi.pareto_k), -np.inf, oi.pareto_k), np.maximum, -np.inf)
    k_hat[np.isinf(k_hat)] = np.nan
    return dataclasses.replace(oi, lower=np.maximum(0.0, tube - z_lower * tube_se), upper=iw + z_upper * iw_se,
                      iw=iw, iw_stderr=iw_se, tube=tube, tube_stderr=tube_se, ess=ess, pareto_k=k_hat, exact=exact,
                      forward_passes=add(oi.forward_passes).astype(np.int64), best_order=None)


def concat_rounds(parts: list[lk.Estimate]) -> lk.Estimate:
    """One Estimate of independent rounds of the same rows: samples side by side, passes added."""
    e = parts[-1]
    info = dict(e.info, forward_passes_per_row=sum(p.info["forward_passes_per_row"] for p in parts))
    for k in ("nll_a", "nll_b"):  # a ratio's two sides (Run.log_ratio)
        if k in e.info:
            info[k] = concat_rounds([p.info[k] for p in parts])
    return lk.Estimate(e.estimator, np.concatenate([p.samples for p in parts], axis=1),
                       forward_passes=sum(p.forward_passes for p in parts), infinite_variance=e.infinite_variance,
                       exact=e.exact, info=info, se_method=e.se_method, min_samples=e.min_samples)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def warn_few_samples(S, process, name: str) -> None:
    """Check ``S`` samples per window (``name`` in messages); log a one-line warning below the
    process's ``min_samples`` (the per-row SEs are then too small)."""
    check_num_samples(S, name)
    if int(S) < int(process.min_samples):
        from absl import logging

        logging.warning("%s=%d is below the %s estimator's min_samples=%d: the per-row SEs are too small "
                        "(flagged few_samples); use at least %d", name, int(S), process.estimator,
                        int(process.min_samples), int(process.min_samples))


def load_run(workdir: str, *, estimator: str | None = None, num_samples: int | None = None,
             use_ema: bool | None = None, config=None) -> Run:
    """Load a text run (its saved config and newest verified checkpoint); its task's
    ``scoring_process`` (a process that supports pads) scores the rows.

    Args:
      workdir: the training run's directory.
      estimator: default the run's ``eval.estimator``: masked, one of :data:`SCORING_ESTIMATORS`;
        SEDD, 'imdse'.
      num_samples: Monte Carlo samples per window, default ``eval.input_samples`` (32 where the
        run's config predates it). Fewer than the process's ``min_samples`` is allowed but logs
        a one-line warning, and every Estimate says so (``few_samples``).
      use_ema: default ``eval.use_ema``.
      config: a resolved config to use instead of the saved one (evaluate.py passes its own).
    Raises:
      FileNotFoundError: no config.json / checkpoint in ``workdir``; ValueError: a run whose
      process does not score text, or an estimator that needs equal-length rows.
    """
    from infodiff import training  # orbax and the training loop: loaded only when a run is

    import ml_collections

    if config is None:
        if not os.path.isdir(workdir):
            raise FileNotFoundError(f"workdir {workdir!r} does not exist (a training run's directory)")
        config = ml_collections.ConfigDict(training.saved_config(workdir))
    ev = config.eval
    task = tasks.make_task(config)
    process = task.scoring_process(str(estimator or ev.estimator))
    ema = bool(ev.use_ema) if use_ema is None else bool(use_ema)
    params, meta = training.load_params(workdir, task, ema=ema)
    den = task.denoiser(params)
    S = num_samples if num_samples is not None else ev.get("input_samples", DEFAULT_INPUT_SAMPLES)
    name = "num_samples" if num_samples is not None else "config.eval.input_samples"
    warn_few_samples(S, process, name)
    cap = DEFAULT_MAX_SAMPLES
    if float(ev.get("target_se", 0.0) or 0.0) > 0:
        cap = int(ev.get("input_max_samples", DEFAULT_MAX_SAMPLES))
        validation.check_budget(cap, "config.eval.input_max_samples")
        if cap < S:
            raise ValueError(f"config.eval.input_max_samples={cap} is below config.eval.input_samples={S}")
    return Run(workdir, config, task, den, process, meta["step"], S, int(ev.batch_size), cap,
               tokenizer=task.tokenizer, checkpoint_sha256=meta.get("state_sha256"))
