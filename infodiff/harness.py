"""An lm-evaluation-harness model (``lm-eval`` 0.4.x, ``pip install -e '.[harness]'``) for any
infodiff text run: importing this module registers the model ``infodiff`` (docs/harness.md).

    python -m infodiff.harness --model infodiff --model_args workdir=W[,confidence=0.95,max_samples=128] \\
        --tasks T [--include_path DIR] [--output_path OUT --log_samples]
    python -m infodiff.harness --model infodiff --model_args pretrained=DIR[,tokenizer=PATH] --tasks T
    # a released checkpoint (SEDD, MDLM ...: infodiff.load_pretrained, docs/pretrained.md)
    # or, from Python:
    import infodiff.harness, lm_eval
    lm_eval.simple_evaluate(model="infodiff", model_args="workdir=W", tasks=[...])

lm-eval's own ``lm_eval`` command loads only its built-in models, so ``python -m infodiff.harness``
(installed as ``infodiff-lm-eval``) registers this one and runs lm-eval's command line unchanged.

What each request type returns (every log-probability is minus the network's NELBO, a lower
bound on its log p; :mod:`infodiff.scoring`):

* ``loglikelihood``: log p(continuation | context), the context never masked, tokenized as the
  run tokenizes (text8 runs: cleaned); options with different contexts (Winogrande's partial
  evaluation) are coupled the same way, each with its own context. A continuation that starts with the run's prompt
  separator (text8 and byte runs: the space lm-eval's ``target_delimiter`` puts there) has it
  moved to the context, given and not scored, as :meth:`infodiff.scoring.Run.conditional_nll`
  and ``evaluate.py``'s pairs and choices files join a prompt and a response (so the three give
  the same numbers); the scored part is the rest. The requests of one document (lm-eval's ``doc_id``; the
  answer options of a multiple-choice question) are scored **together**: coupled draws and
  adaptive stopping (:func:`infodiff.choices.choose_tokens`: rounds until the best option beats
  every other at ``confidence``, at most ``max_samples`` per option), one context length for all
  options (that of the longest). A document with a single request gets ``num_samples`` samples.
  ``is_greedy`` is whether the continuation equals the run's greedy decoding (the most confident
  position first, its argmax token; one forward pass per token): computed for single requests
  (lm-eval's ``acc`` of loglikelihood tasks reads it); for a multiple-choice question, which does
  not read it, it is ``False`` (documented, not computed).
* ``loglikelihood_rolling``: log p(document) by non-overlapping windows of the model's length, as
  ``evaluate.py --config.eval.input=FILE.txt`` (the same numbers with the same seed and samples);
  lm-eval's ``word_perplexity`` / ``byte_perplexity`` / ``bits_per_byte`` follow from it. With
  ``interval_orders=K`` each document also gets the interval of the network's own -log p (not
  only its NELBO bound; masked runs), kept in :attr:`InfodiffLM.rolling_records`.
* ``generate_until``: the MD4 ancestral sampler (``eval.sample_steps`` steps) continuing the last
  L - ``max_gen_toks`` context tokens, cut at the first ``until`` string.

After a run, :attr:`InfodiffLM.records` holds each multiple-choice question's decision (margin ±
SE, decided, p_flip, forward passes, every option's value ± SE), :attr:`single_records` each
single request's value ± SE and :attr:`rolling_records` each document's (with ``--output_path``:
``infodiff_choices_<time>.json``, ``infodiff_single_<time>.json``, ``infodiff_rolling_<time>.json``:
a rerun into the same folder adds files, as lm-eval's own results do) and :meth:`InfodiffLM.choice_summary` the fraction decided,
the forward passes per question and the Monte Carlo error of the accuracy,
``sqrt(sum p_flip (1 - p_flip)) / questions`` (:mod:`infodiff.choices`), which lm-eval's
``acc_stderr`` (the sampling of questions) does not include; ``python -m infodiff.harness``
prints it after lm-eval's table and writes it beside lm-eval's results (``--output_path``).
``acc_mutual_info``'s unconditional requests (context "") are scored as their own questions and
left out of the summary.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # the optional extra
    raise ImportError("infodiff.harness needs lm-evaluation-harness: pip install -e '.[harness]' "
                      "(or pip install 'lm-eval>=0.4.13')") from e

from infodiff import choices as choices_lib
from infodiff import cli, files
from infodiff import likelihood as lk
from infodiff import scoring
from infodiff.training import workdir as workdir_lib

__all__ = ["InfodiffLM", "main"]

SINGLE_STREAM = 0x51E  # fold_in of the run's key for single loglikelihood requests


def _as_bool(v, name):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise ValueError(f"model_args {name}={v!r} must be True or False")


@register_model("infodiff")
class InfodiffLM(LM):
    """lm-eval's ``LM`` over an infodiff text run (module docstring).

    model_args: ``workdir`` (a training run; or ``pretrained`` a released checkpoint's directory,
    :func:`infodiff.load_pretrained`, with ``tokenizer`` a tokenizer.json when it is not beside the
    weights; or ``run=`` a :class:`infodiff.scoring.Run` from Python, e.g. :func:`infodiff.from_function`), ``estimator``, ``num_samples`` (single requests
    and rolling windows; default the run's ``eval.input_samples``), ``first_samples`` (the first
    round per option) and ``max_samples`` (the cap per option; both default
    :func:`infodiff.choices.default_samples`: k_dce 32 and 128),
    ``confidence`` (0.95), ``coupled`` (True), ``adaptive`` (True), ``seed`` (the run's
    ``eval.seed``), ``interval_orders`` (0: none; K >= 2: each rolling document's NLL interval over
    generation orders, :meth:`infodiff.scoring.Run.nll_interval`, in :attr:`rolling_records`). lm-eval's ``batch_size`` / ``device`` are accepted and unused (the run's
    ``eval.batch_size`` and JAX's device). Raises ValueError for an unknown argument or value."""

    def __init__(self, workdir: str | None = None, *, run=None, pretrained: str | None = None,
                 tokenizer: str | None = None, estimator: str | None = None,
                 num_samples: int | None = None, first_samples: int | None = None,
                 max_samples: int | None = None, confidence: float = 0.95, coupled=True,
                 adaptive=True, seed: int | None = None, interval_orders: int = 0, batch_size=None,
                 max_batch_size=None, device=None, **unknown):
        super().__init__()

        def as_int(name, v):
            if v is None:
                return None
            try:
                return int(v)
            except (TypeError, ValueError):
                raise ValueError(f"model_args {name}={v!r} must be an integer") from None

        num_samples, first_samples, max_samples, seed, interval_orders = (
            as_int("num_samples", num_samples), as_int("first_samples", first_samples),
            as_int("max_samples", max_samples), as_int("seed", seed), as_int("interval_orders", interval_orders))
        try:
            confidence = float(confidence)
        except (TypeError, ValueError):
            raise ValueError(f"model_args confidence={confidence!r} must be a number in (0, 1)") from None
        if unknown:
            raise ValueError(f"unknown model_args {sorted(unknown)}; the infodiff model takes workdir, pretrained, "
                             "tokenizer, estimator, num_samples, first_samples, max_samples, confidence, coupled, "
                             "adaptive, seed, interval_orders")
        if workdir and pretrained:
            raise ValueError("model_args: give workdir=W (a training run) or pretrained=DIR (a checkpoint), not both")
        if tokenizer and not pretrained:
            raise ValueError("model_args tokenizer= goes with pretrained=DIR (a training run has its own tokenizer)")
        if run is None and pretrained:
            from infodiff.pretrained import run as pretrained_run

            run = pretrained_run.load_pretrained(str(pretrained), tokenizer=tokenizer or None, estimator=estimator,
                                                 num_samples=num_samples, seed=0 if seed is None else int(seed))
        elif run is None:
            if not workdir:
                raise ValueError("model_args: give workdir=W (a training run's directory) or pretrained=DIR (a "
                                 "released checkpoint)")
            run = scoring.load_run(str(workdir), estimator=estimator,
                                   num_samples=None if num_samples is None else int(num_samples))
        elif num_samples is not None:
            run.num_samples = int(num_samples)
        self.run = run
        d_first, d_cap = choices_lib.default_samples(run.process)
        self.first_samples = d_first if first_samples is None else int(first_samples)
        self.max_samples = max(d_cap, self.first_samples) if max_samples is None else int(max_samples)
        self.confidence = float(confidence)
        self.coupled, self.adaptive = _as_bool(coupled, "coupled"), _as_bool(adaptive, "adaptive")
        self.seed = seed if seed is None else int(seed)
        try:
            choices_lib.check_settings(self.confidence, self.first_samples, self.max_samples)
        except ValueError as e:
            raise ValueError(f"model_args: {e} (num_samples here is first_samples)") from None
        self.interval_orders = int(interval_orders)
        self.records: list[dict] = []
        self.rolling_records: list[dict] = []
        self.single_records: list[dict] = []
        self._calls: dict = {}  # per request type: calls so far (the first uses the seed itself)

    # -- tokenization: the run's own, context and continuation split as lm-eval joins them -------
    def _split(self, context: str, continuation: str) -> tuple[np.ndarray, np.ndarray]:
        """(context ids, continuation ids) with ids(context + continuation) = their concatenation
        where the tokenizer allows (text8 cleaning is not always prefix-stable: then each part is
        encoded alone)."""
        enc = self.run.encode
        whole, ctx = enc(context + continuation), enc(context)
        if len(ctx) <= len(whole) and np.array_equal(whole[:len(ctx)], ctx) and len(whole) > len(ctx):
            cont = whole[len(ctx):]
        else:
            cont = enc(continuation)
        sep = np.asarray(self.run.tokenizer.separator, np.int32)
        if len(ctx) and len(sep) and len(cont) > len(sep) and np.array_equal(cont[:len(sep)], sep):
            ctx, cont = np.concatenate([ctx, sep]), cont[len(sep):]  # the run's prompt separator: given
        return ctx, cont

    def _seed_for_call(self, kind: str) -> int:
        """The run's seed (or ``seed``) for the first call of a request type, as ``infodiff.choose`` /
        ``run.nll`` / ``evaluate.py`` use it (same numbers); + n for its (n+1)-th call."""
        seed = self.run.config.eval.seed if self.seed is None else self.seed
        n = self._calls.get(kind, 0)
        self._calls[kind] = n + 1
        return int(seed) + n

    # -- lm-eval's request types ------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        docs: dict = {}
        for i, req in enumerate(requests):
            context, continuation = req.args[0], req.args[1]
            did = (req.task_name, req.doc_id) if req.doc_id is not None else ("", context)
            docs.setdefault(did, []).append((i, context, continuation))
        groups: dict = {}
        for did, members in docs.items():
            contexts = {c for _, c, _ in members}
            if len(members) > 1 and len({y for _, _, y in members}) == 1 and len(contexts) == len(members):
                groups[(*did, None)] = members  # Winogrande: one continuation after each option's context
                continue
            for m in members:  # one question per context (acc_mutual_info adds an unconditional "" one)
                groups.setdefault((*did, m[1]), []).append(m)
        out: list = [None] * len(requests)
        seed = self._seed_for_call("loglikelihood")
        multi = [(g, m) for g, m in groups.items() if len(m) >= 2]
        single = [(g, m[0]) for g, m in groups.items() if len(m) == 1]
        if multi:
            ctx, opts = [], []
            for _, members in multi:
                pieces = [self._split(c, y) for _, c, y in members]
                same = all(np.array_equal(p[0], pieces[0][0]) for p in pieces)
                ctx.append(pieces[0][0] if same else [p[0] for p in pieces])  # Winogrande: per-option contexts
                opts.append([p[1] for p in pieces])
                for (_, c, y), p in zip(members, pieces):
                    if len(p[1]) == 0:
                        raise ValueError(f"loglikelihood: continuation {y!r} is empty after the run's tokenization")
            res = choices_lib.choose_tokens(
                self.run, ctx, opts, confidence=self.confidence, num_samples=self.first_samples,
                max_samples=self.max_samples if self.adaptive else self.first_samples, adaptive=self.adaptive,
                coupled=self.coupled, seed=seed)
            for q, (gid, members) in enumerate(multi):
                for j, (i, _, _) in enumerate(members):
                    out[i] = (-float(res.nll[q][j]), False)
                self.records.append({"task": gid[0], "doc_id": gid[1], "unconditional": gid[2] == "",
                                     "choice": int(res.choice[q]),
                                     "runner_up": int(res.runner_up[q]), "margin": float(res.margin[q]),
                                     "margin_stderr": float(res.margin_stderr[q]), "decided": bool(res.decided[q]),
                                     "p_flip": float(res.p_flip[q]), "samples_per_option": int(res.samples[q]),
                                     "forward_passes": int(res.forward_passes[q]),
                                     "option_nll": [float(v) for v in res.nll[q]],
                                     "option_stderr": [float(v) for v in res.nll_stderr[q]],
                                     "p_best": [float(v) for v in res.p_best[q]]})
        if single:
            pieces = [self._split(c, y) for _, (_, c, y) in single]
            est = self._conditional([p[0] for p in pieces], [p[1] for p in pieces], seed)
            greedy = self._is_greedy([p[0] for p in pieces], [p[1] for p in pieces])
            for k, (gid, (i, _, _)) in enumerate(single):
                out[i] = (-float(est.mean[k]), bool(greedy[k]))
                self.single_records.append({"task": gid[0], "doc_id": gid[1], "loglikelihood": -float(est.mean[k]),
                                            "stderr": float(est.stderr[k]), "samples": int(est.num_samples),
                                            "is_greedy": bool(greedy[k]), "tokens": int(len(pieces[k][1]))})
        return out

    def _conditional(self, ctx, ys, seed) -> lk.Estimate:
        win = scoring.response_windows(ctx, ys, self.run.seq_len)
        return self.run.window_nll(win, len(ys), jax.random.fold_in(self.run.key(seed), SINGLE_STREAM),
                                   self.run.num_samples)

    def _is_greedy(self, ctx, ys) -> np.ndarray:
        """Whether each continuation is the run's greedy decoding given its context (module
        docstring); continuations longer than the model's length are cut into its windows. The
        network is called inside ``run.guard`` (a user's function's error re-raised as itself)."""
        with self.run.guard("a greedy check of a continuation after a prompt (lm-eval's is_greedy)", prompt=True):
            return self._greedy(ctx, ys)

    def _greedy(self, ctx, ys) -> np.ndarray:
        win = scoring.response_windows(ctx, ys, self.run.seq_len)
        model = self.run.task.order_model(self.run.denoiser.params)
        if model is None:
            return np.zeros(len(ys), bool)
        den = model["denoiser"]
        from infodiff import denoisers

        apply_fn, params = denoisers.split(den)
        V = int(self.run.process.vocab_size)
        steps = int(win.target_WxL.sum(axis=1).max())
        ok = np.asarray(_greedy_match(apply_fn, params, jnp.asarray(win.x_WxL), jnp.asarray(win.target_WxL),
                                      jnp.asarray(win.pad_WxL), V=V, steps=steps))
        res = np.ones(len(ys), bool)
        np.logical_and.at(res, win.row_W, ok)
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        ids = [self.run.encode(t) for t in texts]
        nonempty = [i for i, x in enumerate(ids) if len(x)]
        out = [0.0] * len(texts)
        seed = self._seed_for_call("loglikelihood_rolling")
        if nonempty:
            win = scoring.document_windows([ids[i] for i in nonempty], self.run.seq_len)
            est = self.run.window_nll(win, len(nonempty), self.run.key(seed), self.run.num_samples)
            oi = None
            if self.interval_orders:
                oi = self.run.nll_interval([texts[i] for i in nonempty], orders=self.interval_orders,
                                           seed=seed, nelbo=est)
            passes = est.info.get("forward_passes_per_row")
            for k, i in enumerate(nonempty):
                out[i] = -float(est.mean[k])
                rec = {"task": getattr(requests[i], "task_name", None) or "", "doc": i,
                       "tokens": int(len(ids[i])), "bytes": len(texts[i].encode("utf-8")),
                       "nelbo": float(est.mean[k]), "nelbo_stderr": float(est.stderr[k]),
                       "forward_passes": int(passes[k]) if passes is not None else int(est.forward_passes)}
                if oi is not None:
                    rec.update(lower=float(oi.lower[k]), upper=float(oi.upper[k]), level=float(oi.level))
                self.rolling_records.append(rec)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """lm-eval's generation requests (module docstring), the network called inside ``run.guard``."""
        with self.run.guard("generation after a prompt (lm-eval's generate_until)", prompt=True):
            return self._generate_until(requests)

    def _generate_until(self, requests) -> list[str]:
        from infodiff.processes import masked as masked_lib

        task, L = self.run.task, self.run.seq_len
        if task.schedule_obj is None:
            raise ValueError("generate_until needs a masked-diffusion run (the MD4 ancestral sampler)")
        out = []
        den = self.run.denoiser
        steps = int(self.run.config.eval.get("sample_steps", L))
        base = self.run.key(self._seed_for_call("generate_until"))
        for r, req in enumerate(requests):
            context, kw = req.args[0], (req.args[1] if len(req.args) > 1 else {}) or {}
            until = kw.get("until", []) or []
            until = [until] if isinstance(until, str) else list(until)
            gen = int(kw.get("max_gen_toks", L // 2))
            gen = max(1, min(gen, L - 1))
            ctx = self.run.encode(context)[-(L - gen):] if L - gen > 0 else self.run.encode(context)[:0]
            key = jax.random.fold_in(base, r)
            x = masked_lib.ancestral_sample(lambda z, t: den.apply_params(den.params, z, t), key, 1, len(ctx) + gen,
                                            int(self.run.process.vocab_size), task.schedule_obj, steps,
                                            prompt_BxP=jnp.asarray(ctx[None], jnp.int32) if len(ctx) else None)
            text = self._decode(np.asarray(x)[0, len(ctx):])
            for u in until:
                if u and u in text:
                    text = text[:text.index(u)]
            out.append(text)
        return out

    def _decode(self, ids) -> str:
        if self.run.tokenizer.name == "text8":
            from infodiff.data import text as text_data

            return text_data.decode(ids)
        if self.run.tokenizer.unit == "byte":
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        raise ValueError(f"generate_until cannot decode the {self.run.tokenizer.name!r} tokenizer's ids")

    # -- what lm-eval does not report --------------------------------------------------------------
    def rolling_summary(self) -> dict:
        """Per task of ``loglikelihood_rolling`` requests (perplexity tasks): documents, bytes,
        ``bits_per_byte`` as lm-eval defines it (the summed NELBO over the summed UTF-8 bytes,
        / ln 2) with its Monte Carlo error ``bits_per_byte_mc_stderr`` (the documents' draws are
        independent: sqrt of the summed squared SEs, same scaling), the totals ``total_nats`` ±
        ``total_stderr`` and ``forward_passes``. lm-eval's own table prints
        ``bits_per_byte ± N/A``: it has no per-document error for this metric."""
        out = {}
        for task in sorted({r.get("task", "") for r in self.rolling_records}):
            rs = [r for r in self.rolling_records if r.get("task", "") == task]
            nats = float(sum(r["nelbo"] for r in rs))
            se = float(np.sqrt(sum(r["nelbo_stderr"] ** 2 for r in rs)))
            nbytes = int(sum(r["bytes"] for r in rs))
            scale = 1.0 / (max(nbytes, 1) * np.log(2.0))
            out[task] = {"documents": len(rs), "bytes": nbytes, "total_nats": nats, "total_stderr": se,
                         "bits_per_byte": nats * scale, "bits_per_byte_mc_stderr": se * scale,
                         "forward_passes": int(sum(r["forward_passes"] for r in rs)),
                         "samples_per_window": int(self.run.num_samples)}
        return out

    def choice_summary(self, accuracy_by_task: dict | None = None) -> dict:
        """Per task: questions, fraction decided, forward passes per question (mean, median),
        expected flips and the Monte Carlo error of the accuracy (module docstring)."""
        out = {}
        for task in sorted({r["task"] for r in self.records}):
            rs = [r for r in self.records if r["task"] == task and not r["unconditional"]]
            if not rs:
                continue
            p = np.array([r["p_flip"] for r in rs])
            fp = np.array([r["forward_passes"] for r in rs])
            out[task] = {"questions": len(rs), "fraction_decided": float(np.mean([r["decided"] for r in rs])),
                         "forward_passes_per_question_mean": float(fp.mean()),
                         "forward_passes_per_question_median": float(np.median(fp)),
                         "expected_flips": float(p.sum()),
                         "accuracy_mc_stderr": choices_lib.mc_stderr([np.asarray(r["p_best"]) for r in rs]),
                         "confidence": self.confidence, "max_samples": self.max_samples,
                         "first_samples": self.first_samples, "coupled": self.coupled, "adaptive": self.adaptive}
        return out


@functools.partial(jax.jit, static_argnames=("apply_fn", "V", "steps"))
def _greedy_match(apply_fn, params, x_WxL, target_WxL, pad_WxL, *, V, steps):
    """bool [W]: the greedy decoding (reveal the most confident masked target position, with its
    argmax token, one per step; time 1 - j / steps) reproduces x at every target position."""
    W, L = x_WxL.shape
    n = jnp.maximum(target_WxL.sum(axis=1), 1)

    def step(carry, j):
        z, revealed = carry
        t = jnp.clip(1.0 - j / n, 0.0, 1.0).astype(jnp.float32)
        lp = apply_fn(params, z, t).astype(jnp.float32)
        conf = jnp.where(target_WxL & ~revealed, jnp.max(lp, axis=-1), -jnp.inf)
        pick = jnp.argmax(conf, axis=1)
        tok = jnp.argmax(jnp.take_along_axis(lp, pick[:, None, None], axis=1)[:, 0], axis=-1)
        active = jnp.any(target_WxL & ~revealed, axis=1)
        sel = jax.nn.one_hot(pick, L, dtype=bool) & active[:, None]
        z = jnp.where(sel, tok[:, None], z)
        return (z, revealed | sel), None

    z0 = jnp.where(target_WxL | pad_WxL, V, x_WxL)
    (z, _), _ = jax.lax.scan(step, (z0, ~target_WxL), jnp.arange(steps))
    return jnp.all(jnp.where(target_WxL, z == x_WxL, True), axis=1)


def main(argv=None) -> int:
    """``python -m infodiff.harness <lm-eval arguments> [--debug]``: lm-eval's command line with
    the ``infodiff`` model registered; after lm-eval's table, the multiple-choice decisions'
    summary (and, with ``--output_path``, ``infodiff_choices_<time>.json`` there, and the rolling
    and single requests' values). What evaluate.py says in one line is one line here too, exit 1
    (the traceback with ``--debug``): a bad workdir or model_args value, checkpoints that fail
    verification, a full or read-only output folder, a task's target index out of range. A bad
    ``--output_path`` (a file, an unwritable folder) is refused before the run; the files are
    written atomically under names no other run takes (:func:`infodiff.files.atomic_write_new`)."""
    from lm_eval.__main__ import cli_evaluate

    argv = sys.argv[1:] if argv is None else list(argv)
    made: list = []
    orig = InfodiffLM.__init__

    def tracking_init(self, *a, **k):
        orig(self, *a, **k)
        made.append(self)

    InfodiffLM.__init__ = tracking_init
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    sys.argv = ["lm-eval", *argv]
    out = _output_path(argv)
    try:
        folder = _check_output_folder(out) if out else None
        cli_evaluate()
        for lm in made:
            _report(lm, folder)
    except (*cli.user_error_types(), TypeError, IndexError) as e:
        if debug:
            raise
        hint = ("; a task's target (doc_to_target) may be out of range of its choices" if isinstance(e, IndexError)
                else "")
        sys.stdout.flush()
        print(f"{cli.one_line(e)}{hint} (--debug: the traceback)", file=sys.stderr)
        return 1
    finally:
        InfodiffLM.__init__ = orig
    return 0


def _check_output_folder(out: str) -> str:
    """The folder ``--output_path`` names (its parent for a path ending in .json); ValueError
    before the run when it is a file or cannot be written (the nearest existing folder above)."""
    folder = out if not out.endswith(".json") else os.path.dirname(out) or "."
    d = os.path.abspath(folder)
    while not os.path.lexists(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        raise ValueError(f"--output_path {out!r}: {d!r} is a file, not a folder: give a folder (or a .json path in one)")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ValueError(f"--output_path {out!r}: the folder {d!r} is not writable: give a writable folder")
    try:  # the folder made and a file written in it now, not after the run (os.access passes root everywhere)
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".infodiff-write-check-"):
            pass
    except OSError as e:
        raise ValueError(f"--output_path {out!r}: cannot write in {os.path.abspath(folder)!r} "
                         f"({e.strerror or e}): give a writable folder") from None
    return folder


def _write_json(folder: str, name: str, obj) -> str:
    """``folder/<name>_<time>.json``, atomically, never over another run's (a storage fault: one
    StorageError line)."""
    path = os.path.join(folder, name + time.strftime("_%Y-%m-%dT%H-%M-%S.json"))
    with workdir_lib.storage_guard(path):
        os.makedirs(folder, exist_ok=True)
        return files.atomic_write_new(path, json.dumps(obj, indent=1).encode("utf-8"))


def _report(lm: "InfodiffLM", folder: str | None) -> None:
    """Print one model's multiple-choice summary; with an output folder, write its records."""
    summary = lm.choice_summary()
    _print_rolling_summary(lm.rolling_summary())
    for name, recs in (("infodiff_rolling", lm.rolling_records), ("infodiff_single", lm.single_records)):
        if recs and folder:
            _write_json(folder, name, recs)
    if not summary:
        return
    print("\ninfodiff: multiple-choice decisions (Monte Carlo error of acc, beside lm-eval's acc_stderr "
          "from the sample of questions)")
    for task, s in summary.items():
        print(f"  {task}: {s['questions']} questions, {s['fraction_decided']:.1%} decided at confidence "
              f"{s['confidence']}, {s['forward_passes_per_question_mean']:.1f} forward passes per question "
              f"(median {s['forward_passes_per_question_median']:.0f}), acc MC error "
              f"{s['accuracy_mc_stderr']:.4f}, expected flips {s['expected_flips']:.3g}")
    if folder:
        print(f"  written: {_write_json(folder, 'infodiff_choices', {'summary': summary, 'questions': lm.records})}")


def _print_rolling_summary(summary: dict) -> None:
    """After lm-eval's table: each perplexity task's bits per byte ± its Monte Carlo error."""
    if not summary:
        return
    print("\ninfodiff: rolling likelihood (bits per byte of the NELBO, an upper bound; ± its Monte Carlo "
          "error, where lm-eval's table says N/A)")
    for task, s in summary.items():
        print(f"  {task or 'rolling'}: bits_per_byte {s['bits_per_byte']:.4f} ± {s['bits_per_byte_mc_stderr']:.4f} "
              f"(MC), {s['documents']} documents, {s['bytes']} bytes, {s['total_nats']:.2f} ± "
              f"{s['total_stderr']:.2f} nats, {s['forward_passes']} forward passes "
              f"({s['samples_per_window']} samples per window)")


def _output_path(argv) -> str | None:
    for i, a in enumerate(argv):
        if a in ("--output_path", "-o") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--output_path="):
            return a.split("=", 1)[1]
    return None


if __name__ == "__main__":
    sys.exit(main())
