"""``infodiff.load_pretrained(path)``: a released checkpoint as the same :class:`~infodiff.scoring.Run`
that :func:`infodiff.load_run` gives for a trained run, scored with each model's own process.

* Masked models with a mean parametrisation (MDLM; ``output == 'logits'``): the library's masked
  diffusion through :func:`infodiff.external.from_function` (estimator k-DCE by default). The
  denoiser sees the masking probability t (linear schedule) and the network its total noise
  sigma = -log(1 - t): MDLM's log-linear schedule, sigma(t) = -log(1 - (1 - eps) t), is the same
  masking law re-timed, and the masked NELBO does not depend on the timing (MDLM Sec. 3.2; the
  integral runs over all masking probabilities in (0, 1], no truncation at eps and no prior term).
  A time-conditioned network is not defined beyond its schedule's end, masking probability
  1 - eps: above it, it is given sigma(1) = -log(eps).
* SEDD (``output == 'log_score'``): I-MDSE (arXiv 2510.24088 Thm 3.2) with the checkpoint's graph,
  noise levels lam = 1 - exp(-sigma) up to its schedule's end, lam_max = 1 - exp(-sigma(1))
  (log-linear: 1 - eps), plus the exact prior term at lam_max; the diffusion term integrates from
  lam = 0 (SEDD's own loss starts at t = eps and leaves out the prior).
* BD3-LM (``info['block_size']``): the masked process per block
  (:class:`infodiff.processes.block.BlockProcess`), -log p(x) = sum_b -log p(x^b | x^{<b}), the
  network given its two-copy input [z, z] (:func:`infodiff.pretrained.bd3lm.network_input`); for
  a time-free network also the exact block likelihood (``Run.exact_nll``).
* duo (``output == 'logits'`` with ``info['graph'] == 'uniform'``): uniform-state diffusion's continuous-time NELBO
  (UDLM arXiv 2412.10193; :mod:`infodiff.processes.uniform_state`, equal to duo's
  ``DUO_BASE.nll_per_token`` integrand) over lam = 1 - alpha_t in (0, lam_max], lam_max = 1 - eps
  (duo's log-linear schedule alpha_t = 1 - (1 - eps) t), the network at sigma = -log(1 - lam),
  plus the exact prior term at lam_max; the truncation term is 0 (the integral starts at lam = 0).

``run.apply(x_BxL, sigma_B)`` is the source network's raw output (float32 [B, L, V]) and
``run.loaded`` the :class:`~infodiff.pretrained.base.Loaded`. Texts are encoded with the
checkpoint's tokenizer (:mod:`infodiff.pretrained.tokenizer`); every method that takes texts also
takes sequences of the model's token ids.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np

from infodiff import external, orders, scoring
from infodiff import pretrained as registry
from infodiff.pretrained import native
from infodiff.pretrained import tokenizer as tok_lib
from infodiff.pretrained.base import Loaded, PretrainedError
from infodiff.processes import block as block_lib
from infodiff.processes import score_entropy
from infodiff.processes import uniform_state

__all__ = ["load_pretrained", "from_config", "DTYPES", "SeddScoreModel", "SeddPretrainedTask", "DuoPretrainedTask",
           "BlockPretrainedTask",
           "lam_max_of", "MDLM_EPS"]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
MDLM_EPS = 1e-3  # MDLM's log-linear schedule: masking probability (1 - eps) t (noise_schedule.LogLinearNoise)


def lam_max_of(noise: dict) -> float:
    """The noise level lam = 1 - exp(-sigma(1)) at the end of a SEDD schedule (``noise`` of its
    config: 'loglinear' with eps (default 1e-3, SEDD's LogLinearNoise), or 'geometric' with
    sigma_max). Raises PretrainedError for another type."""
    kind = str(noise.get("type", "loglinear"))
    if kind == "loglinear":
        return 1.0 - float(noise.get("eps", 1e-3))
    if kind == "geometric":
        return -math.expm1(-float(noise["sigma_max"]))
    raise PretrainedError(f"config.json noise.type={kind!r}: SEDD's schedules are 'loglinear' and 'geometric'")


@dataclasses.dataclass(frozen=True, eq=False)
class SeddScoreModel:
    """A released SEDD network as the library's score model: ``(params, z_BxL, lam_B) -> log-scores
    [B, L, V]`` over the V real tokens (absorb: the mask column dropped; MASK = V as in the
    library), or a released duo network as the uniform-state denoiser (log x_theta [B, L, V]). The
    network's time input is sigma = -log(1 - lam). A per-position lam (the uniform
    graph or duo with a prompt or pads) has no input in the released network: :class:`WholeWindowRun`
    refuses such calls up front (ValueError); called directly, the output is NaN there, which the
    estimators refuse (FloatingPointError), so such a call never gives a number."""

    loaded: Loaded
    params: Any
    graph: str
    vocab_size: int

    def __call__(self, z_BxL, lam_B):
        return self.apply_params(self.params, z_BxL, lam_B)

    def apply_params(self, params, z_BxL, lam):
        lam = jnp.asarray(lam, jnp.float32)
        if lam.ndim == 2:
            return jnp.full(z_BxL.shape + (self.vocab_size,), jnp.nan, jnp.float32)
        out = self.loaded.apply(params, jnp.asarray(z_BxL, jnp.int32), -jnp.log1p(-lam))
        return out[..., : self.vocab_size]


class SeddPretrainedTask(scoring.ScorerTask):
    """The task side of a Run over a released SEDD network (as :class:`external.ExternalTask` for
    masked models): ``name``, ``seq_len``, ``vocab_size``, ``tokenizer``, ``scoring_process``,
    ``process_info``."""

    name = "sedd"

    def __init__(self, model: SeddScoreModel, seq_len: int, tokenizer: scoring.Tokenizer, lam_max: float):
        self.model, self.seq_len, self.tokenizer = model, int(seq_len), tokenizer
        self.vocab_size, self.graph, self.lam_max = model.vocab_size, model.graph, float(lam_max)

    def denoiser(self, params=None) -> SeddScoreModel:
        return self.model

    def scoring_process(self, estimator: str):
        if estimator != "imdse":
            raise ValueError(f"estimator {estimator!r}: a SEDD checkpoint scores text with 'imdse'")
        return score_entropy.ScoreEntropyProcess(graph=self.graph, vocab_size=self.vocab_size,
                                                 noise_law=score_entropy.DEFAULT_LAMBDA_SAMPLING[self.graph],
                                                 lam_max=self.lam_max)

    def process_info(self, process) -> dict:
        return {"name": self.name, "graph": self.graph, "lambda_sampling": process.noise_law,
                "lam_max": process.lam_max, "external": True, **self.source}


class DuoPretrainedTask(SeddPretrainedTask):
    """The task side of a Run over a released duo network: the uniform-state process's NELBO
    (estimator 'udlm'); the network (a :class:`SeddScoreModel` wrapping it: ``(z_BxL, lam_B) ->
    log x_theta``, the same noise-level input) is mean-parametrised."""

    name = "duo"

    def scoring_process(self, estimator: str):
        if estimator != "udlm":
            raise ValueError(f"estimator {estimator!r}: a duo checkpoint scores text with 'udlm' (the uniform-state "
                             "NELBO)")
        return uniform_state.UniformStateProcess(vocab_size=self.vocab_size, lam_max=self.lam_max)

    def process_info(self, process) -> dict:
        return {"name": self.name, "process": "uniform_state", "estimator": process.estimator,
                "lam_max": process.lam_max, "parametrisation": "mean (x_theta)",
                "recon": "the truncation term at lam = 0: exactly 0 (alpha_0 = 1)", "external": True, **self.source}


class WholeWindowRun(scoring.Run):
    """A :class:`~infodiff.scoring.Run` over a released network that takes one noise level per row
    (SEDD's uniform graph, duo): it scores whole windows of L tokens only. A prompt, a padded last
    window, a log-ratio or a multiple-choice question is refused up front (ValueError, one line
    saying why and what to do), before any forward pass; ``why`` names the network."""

    why = "a released network with one noise level per row"

    def _refuse(self, what: str):
        raise ValueError(f"{what}: {self.why} takes one noise level per row, so it scores whole windows of "
                         f"{self.seq_len} tokens only (no prompt, no padding); give run.nll texts whose token "
                         "count is a multiple of that, or use an absorbing-state checkpoint (sedd absorb, mdlm)")

    def window_nll(self, win, num_rows, key, num_samples, **kw):
        if not np.asarray(win.target_WxL).all():
            prompt = win.context_R is not None and np.asarray(win.context_R).any()
            self._refuse("a prompt" if prompt else "a padded window (a text whose token count is not a multiple "
                         "of the window)")
        if self.process.pad_id is None:  # no pads here (checked above); a process without a pad token
            win = dataclasses.replace(win, pad_WxL=None)
        return super().window_nll(win, num_rows, key, num_samples, **kw)

    def log_ratio(self, *args, **kwargs):
        self._refuse("a log-ratio of responses to a prompt")

    def guard(self, what: str, *, prompt: bool = False):
        if prompt:
            self._refuse(what)
        return super().guard(what, prompt=prompt)


class BlockPretrainedTask(external.ExternalTask):
    """The task side of a Run over a released BD3-LM network: the block process
    (:class:`infodiff.processes.block.BlockProcess`, blocks of the checkpoint's ``block_size``) over
    the masked process of :class:`infodiff.external.ExternalTask`; for a time-free network (the
    released ones) the exact block likelihood (``Run.exact_nll``,
    :func:`infodiff.orders.exact_block_nll`); no whole-sequence interval."""

    name = "block"
    exact_likelihood = True  # Run.exact_nll asks the task; a time-conditioned network is refused there

    def __init__(self, base: external.ExternalTask, block_size: int):
        super().__init__(base.external, base.seq_len, base.tokenizer)
        self.block_size = block_lib.check_block_size(int(block_size), self.seq_len, "config.json block_size")
        self.time_free = not base.external.time_conditioned

    def scoring_process(self, estimator: str):
        return block_lib.BlockProcess(super().scoring_process(estimator), self.block_size)

    def order_model(self, params=None) -> dict:
        raise ValueError("a bd3lm checkpoint's likelihood is per block: use Run.exact_nll (time-free networks) or "
                         "Run.nll (the block NELBO); the whole-sequence interval does not apply")

    def exact_nll(self, denoiser, x_BxL, *, target_BxL=None, pad_BxL=None, progress=False) -> dict:
        """:func:`~infodiff.orders.exact_block_nll` (ValueError for a time-conditioned network:
        its any-order likelihood is not a function of the network's conditionals alone)."""
        if not self.time_free:
            raise ValueError("no exact block likelihood for a time-conditioned bd3lm network: its conditionals "
                             "depend on the noise level, so no single any-order model is defined; use Run.nll")
        return orders.exact_block_nll(denoiser, x_BxL, self.block_size, target_BxL=target_BxL, pad_BxL=pad_BxL,
                                         vocab_size=self.vocab_size)

    def process_info(self, process) -> dict:
        return {**super().process_info(process), "name": self.name, "block_size": self.block_size,
                "exact": "subset recursion per block" if self.time_free else "none (time-conditioned)"}


def _encode(tok, path):
    if tok is None:
        def missing(text):
            raise PretrainedError(f"no tokenizer.json beside {str(path)!r}: pass tokenizer=PATH, or give texts as "
                                  "token-id sequences")
        return missing
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def load_pretrained(path, kind: str | None = None, *, tokenizer=None, estimator: str | None = None,
                    num_samples: int | None = None, batch_size: int | None = None,
                    seed: int | None = None, dtype=jnp.float32, mesh=None) -> scoring.Run:
    """A released checkpoint in directory ``path`` as a :class:`~infodiff.scoring.Run` (module docstring).

    Args:
      path: directory with config.json and the weights (docs/pretrained.md).
      kind: override the kind detected from config.json (must agree with it).
      tokenizer: a tokenizer.json or a directory holding one (default: beside the weights; without
        one, texts must be given as token-id sequences).
      estimator: masked models: one of ``scoring.SCORING_ESTIMATORS`` (default 'k_dce'); SEDD: 'imdse'.
      num_samples: Monte Carlo samples per window (default: masked 32, SEDD the I-MDSE estimator's
        ``min_samples``, 128 absorb / 512 uniform graph, the fewest with a calibrated SE; an exported
        infodiff run: its ``eval.input_samples``); batch_size: rows per estimator call (default 256;
        an exported run: its ``eval.batch_size``); seed: the default seed of every method (0; an
        exported run: its ``eval.seed``); dtype: weights and compute (float32 or bfloat16).
      mesh: a :func:`infodiff.parallel.make_mesh` mesh: the weights split over its 'fsdp' axis
        (:func:`infodiff.pretrained.shard`), for a model larger than one device's memory.
    Raises:
      PretrainedError (a ValueError; one line): wrong directory, unknown kind, tensors that do not
      match the config, a tokenizer that is not the model's.
    """
    loaded = registry.load(path, kind, dtype, mesh=mesh)
    if loaded.kind == native.MODEL_TYPE:  # an exported infodiff run: its own task, as load_run builds it
        if tokenizer is not None:
            raise PretrainedError("tokenizer= is not taken by an exported infodiff run: it has its own")
        return _native_run(loaded, path, estimator, num_samples, batch_size, seed)
    batch_size = external.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    seed = 0 if seed is None else seed
    real_vocab = loaded.vocab_size - int(0 <= loaded.mask_id < loaded.vocab_size)
    tok_path = tok_lib.find(path, tokenizer)
    tok = None if tok_path is None else tok_lib.load(tok_path, real_vocab)
    name = tok_lib.name_of(tok_path) if tok_path is not None else "token ids"
    # a mean-parametrised network over a uniform-state graph (duo) is scored by the uniform-state process
    uniform_mean = loaded.output == "logits" and loaded.info.get("graph") == "uniform"
    if loaded.output == "logits" and not uniform_mean:
        t_conditioned = loaded.time_conditioned
        # raw logits -> the denoiser's log-probabilities, where the port says how (LLaDA, Dream)
        arch = registry.architectures()[loaded.kind]
        post = getattr(arch, "logprobs", None)
        # z_BxL -> the network's input, where the port says how (BD3-LM's two copies [z, z])
        pre = getattr(arch, "network_input", lambda x: x)

        def logprobs(params, x_BxL, t_B=None):
            if not t_conditioned:
                out = loaded.apply(params, pre(x_BxL), jnp.zeros(x_BxL.shape[:1], jnp.float32))
                return out if post is None else post(out, loaded.mask_id)
            sigma = -jnp.log1p(-jnp.minimum(t_B, 1.0 - MDLM_EPS))  # the schedule's end: sigma(1)
            return loaded.apply(params, pre(x_BxL), sigma)

        run = external.from_function(logprobs, vocab_size=loaded.vocab_size, mask_id=loaded.mask_id,
                                     seq_len=loaded.max_seq_len, encode=_encode(tok, path),
                                     estimator=estimator or "k_dce",
                                     num_samples=num_samples or scoring.DEFAULT_INPUT_SAMPLES, batch_size=batch_size,
                                     seed=seed, time_conditioned=t_conditioned, jax_function=True,
                                     params=loaded.params, tokenizer_name=name)
        if "block_size" in loaded.info:  # BD3-LM: the masked process per block, the exact block likelihood
            run.task = BlockPretrainedTask(run.task, loaded.info["block_size"])
            run.process = run.task.scoring_process(estimator or "k_dce")
    elif loaded.output == "log_score" or uniform_mean:
        model = SeddScoreModel(loaded, loaded.params, loaded.info["graph"], real_vocab)
        # the library's ids: real tokens 0..V-1, V the absorbing state (none under the uniform graph)
        tokenizer_obj = external.make_tokenizer(_encode(tok, path), None, real_vocab, real_vocab, name)
        task_cls, est = ((SeddPretrainedTask, "imdse") if loaded.output == "log_score" else (DuoPretrainedTask, "udlm"))
        task = task_cls(model, loaded.max_seq_len, tokenizer_obj, lam_max_of(loaded.info["noise"]))
        process = task.scoring_process(estimator or est)
        num_samples = num_samples or process.min_samples
        scoring.warn_few_samples(num_samples, process, "num_samples")
        config = ml_collections.ConfigDict({"eval": {"seed": int(seed), "estimator": est,
                                                     "input_samples": int(num_samples), "batch_size": int(batch_size)}})
        whole = loaded.info["graph"] == "uniform"  # one noise level per row: whole windows only
        run_cls = WholeWindowRun if whole else scoring.Run
        run = run_cls(None, config, task, model, process, None, num_samples, batch_size, tokenizer=tokenizer_obj)
        if whole:
            run.why = f"the released {loaded.kind} ({loaded.info['graph']}) network"
    else:
        raise PretrainedError(f"{loaded.kind}: output {loaded.output!r} is neither 'logits' nor 'log_score'")
    run.loaded = loaded
    run.task.source = {"kind": loaded.kind, "checkpoint": str(path)}
    run.apply = functools.partial(loaded.apply, loaded.params)  # (x_BxL, sigma_B) -> raw output
    run.pretrained_path = str(path)
    return run


def _native_run(loaded: Loaded, path, estimator, num_samples, batch_size, seed) -> scoring.Run:
    """The Run of an exported infodiff run (:mod:`infodiff.pretrained.native`): its task, process,
    denoiser and tokenizer as :func:`infodiff.load_run` builds them, with the exported parameters."""
    task = loaded.info["task"]
    ev = task.config.eval
    process = task.scoring_process(str(estimator or ev.estimator))
    S = num_samples or ev.get("input_samples", scoring.DEFAULT_INPUT_SAMPLES)
    scoring.warn_few_samples(S, process, "num_samples")
    config = ml_collections.ConfigDict(task.config.to_dict())
    config.eval.seed = int(seed) if seed is not None else int(ev.seed)
    den = task.denoiser(loaded.params)
    run = scoring.Run(None, config, task, den, process, loaded.info["checkpoint_step"], S,
                      batch_size or int(ev.batch_size), tokenizer=task.tokenizer or scoring.TEXT8)
    run.loaded, run.pretrained_path = loaded, str(path)
    run.apply = functools.partial(loaded.apply, loaded.params)
    return run


def from_config(config) -> scoring.Run:
    """The Run of evaluate.py's ``--pretrained`` config (infodiff/pretrained/cli_config.py). Raises
    ValueError (one line) for a bad ``pretrained.dtype`` and what :func:`load_pretrained` raises."""
    p, ev = config.pretrained, config.eval
    dtype = str(p.dtype)
    if dtype not in DTYPES:
        raise ValueError(f"config.pretrained.dtype={dtype!r}; choose from {', '.join(DTYPES)}")
    return load_pretrained(str(p.path), str(p.kind) or None, tokenizer=str(p.tokenizer) or None,
                           estimator=str(ev.estimator) or None, num_samples=int(ev.input_samples) or None,
                           batch_size=int(ev.batch_size), seed=int(ev.seed), dtype=DTYPES[dtype])
