"""Training loop for masked-diffusion denoisers on character text (data parallel, resumable).

The setup follows MD4 (Shi et al., "Simplified and Generalized Masked Diffusion for Discrete
Data", arXiv 2406.04329, §6 / App. on text8): a bidirectional transformer trained on the
one-sample Monte Carlo diffusion loss, AdamW with linear warmup then cosine decay, global-norm
gradient clipping, and an exponential moving average (EMA) of the parameters used for
evaluation. The loss is any of the DCE objectives of :mod:`infodiff.processes.masked`
(``config.process.objective``); every one of them is (an unbiased estimate of, or for
continuous-time ``t_dce`` a bound on) -log p(x) in nats per sequence, so ``bpc = loss / (L ln 2)``.

Determinism and resumption
--------------------------
* The data stream is a pure function of ``(config.seed, step)``
  (:func:`infodiff.data.text.train_batch`), so the data position saved with a checkpoint is
  simply the step.
* The randomness of step ``s`` (masks, times, dropout) is ``fold_in(train_key, s)``.
* Therefore a run interrupted at any checkpoint and resumed produces bit-identical parameters to
  an uninterrupted run (tested in ``tests/test_training.py``).

Parallelism
-----------
A 1-D :class:`jax.sharding.Mesh` named ``'data'`` over all local devices; batches are placed
with ``NamedSharding(mesh, P('data'))`` and the train state is replicated (``P()``); XLA inserts
the gradient all-reduce. One device is the same code path with a 1-element mesh.

Workdir layout
--------------
::

    <workdir>/config.json          the config of the latest (re)start
    <workdir>/metrics.jsonl        one JSON object per log / eval event
    <workdir>/checkpoints/<step>/  orbax: 'state' (TrainState), 'meta' (JSON: step, seed,
                                   data_position, config, data checksums)
"""

from __future__ import annotations

import dataclasses
import logging as logging_std
import json
import math
import os
import signal
import threading
import time
from typing import Any, Callable, Mapping

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from infodiff import schedules as schedules_lib
from infodiff.data import text as text_data
from infodiff.networks.transformer import Transformer, count_params
from infodiff.processes import masked
from infodiff.processes import score_entropy

__all__ = [
    "RESUMABLE_KEYS",
    "ConfigMismatchError",
    "Denoiser",
    "TrainState",
    "make_mesh",
    "make_model",
    "make_denoiser",
    "make_mask_spec",
    "make_lr_schedule",
    "make_optimizer",
    "init_train_state",
    "abstract_train_state",
    "make_loss_fn",
    "make_train_step",
    "load_checkpoint",
    "make_eval_step",
    "step_key",
    "check_tokens",
    "check_batch_divisible",
    "config_differences",
    "train_and_evaluate",
]

# Config keys that may differ between a checkpoint and the config that resumes it: they change
# how long the run is and how often it logs / evaluates / saves, not what it computes.
# (Caveat: train.num_steps sets the length of the cosine decay, so changing it changes the
# learning rate of every step after the warmup.)
RESUMABLE_KEYS = (
    "train.num_steps",
    "train.log_every",
    "train.eval_every",
    "train.eval_batches",
    "train.ckpt_every",
    "train.keep_checkpoints",
    "data.cache_dir",
    "experiment",
)
# Whole sections that never affect training (they configure evaluate.py).
# Evaluation-only settings; the experiment sections (toy data sizes are also guarded by the
# data checksums stored in every checkpoint).
RESUMABLE_PREFIXES = ("eval.", "toy.", "variance.", "ood.")

_LN2 = math.log(2.0)
_CKPT_DIR = "checkpoints"


def _log(fn: Callable, msg: str, *args) -> None:
    """absl log call that first clears any live tqdm bar (so lines do not interleave)."""
    with tqdm.tqdm.external_write_mode():
        fn(msg, *args)


logging.ABSLLogger.register_frame_to_skip(__file__, "_log")  # report the caller's line


def load_config_corpus(config: ml_collections.ConfigDict):
    """The corpus of ``config.data``: the embedded one, or a text8 file (``data.path``).

    Raises ValueError if ``data.name`` is 'text8' and no ``data.path`` is given (rather than
    silently training on the embedded corpus).
    """
    if config.data.get("name", "text") == "text8" and not config.data.path:
        raise ValueError(
            "config.data.name is 'text8' but config.data.path is empty: pass "
            "--config.data.path=/path/to/text8"
        )
    return text_data.load_corpus(config.data.path or None, config.data.cache_dir or None)


_NOISY = ("/orbax/", "/jax/", "/jaxlib/", "/flax/", "/etils/", "/tensorstore/")


class _QuietLibraries(logging_std.Filter):
    """Drop sub-WARNING absl records emitted from library code (orbax logs every save step)."""

    def filter(self, record: logging_std.LogRecord) -> bool:
        if record.levelno >= logging_std.WARNING:
            return True
        path = record.pathname.replace(os.sep, "/")
        return not any(s in path for s in _NOISY)


def quiet_library_logs() -> None:
    """Hide INFO chatter of orbax / jax / flax (absl and std logging); warnings still show."""
    logging_std.getLogger("absl").addFilter(_QuietLibraries())
    for name in ("jax", "orbax", "flax", "etils"):  # libraries that use std logging
        logging_std.getLogger(name).setLevel(logging_std.WARNING)


class ConfigMismatchError(ValueError):
    """The config of a resumed run differs from the checkpoint's in a non-resumable key."""


# ---------------------------------------------------------------------------------------------
# Model, denoiser, objective, optimizer
# ---------------------------------------------------------------------------------------------
def _dtype(name: str):
    try:
        return jnp.dtype(name)
    except TypeError:
        raise ValueError(f"config.model.dtype={name!r} is not a dtype (use 'float32' or 'bfloat16')") from None


def make_model(config: ml_collections.ConfigDict) -> Transformer:
    """The denoiser network described by ``config.model`` / ``config.data``.

    Returns a :class:`infodiff.networks.transformer.Transformer` with
    ``vocab_size = config.data.vocab_size`` real tokens (the MASK id is ``vocab_size``),
    ``seq_len = config.data.seq_len`` and compute dtype ``config.model.dtype`` ('float32' or
    'bfloat16'; parameters are always float32).

    Raises:
      ValueError: unknown dtype name.
    """
    m = config.model
    output = "log_softmax"
    if is_sedd(config) and _score_param(config) == "direct":
        output = "logits"
    return Transformer(
        vocab_size=int(config.data.vocab_size),
        seq_len=int(config.data.seq_len),
        num_layers=int(m.num_layers),
        num_heads=int(m.num_heads),
        width=int(m.width),
        mlp_ratio=int(m.mlp_ratio),
        dropout=float(m.dropout),
        time_conditioning=bool(m.time_conditioning),
        dtype=_dtype(m.dtype),
        output=output,
    )


# ---------------------------------------------------------------------------------------------
# Score-entropy (SEDD) models
# ---------------------------------------------------------------------------------------------
SCORE_PARAMS = ("direct", "mean")


def is_sedd(config: ml_collections.ConfigDict) -> bool:
    """True for ``config.process.name == 'sedd'`` (score-entropy diffusion)."""
    return config.process.name == "sedd"


def _score_param(config) -> str:
    sp = config.process.get("score_param", "direct")
    if sp not in SCORE_PARAMS:
        raise ValueError(f"config.process.score_param={sp!r}; choose from {SCORE_PARAMS}")
    return sp


def log_score_from_output(graph: str, score_param: str, out_BxLxV: jax.Array, z_BxL: jax.Array,
                          lam_B: jax.Array) -> jax.Array:
    """Network output -> SEDD log-scores [B, L, V] (float32).

    ``direct`` (SEDD): absorb ``log s = logits - log V + log a(lam)`` (SEDD's "scale by sigma",
    with -log V instead of -log(V - 1) so that a zero-initialised head gives sum_v c_v = 1);
    uniform ``log s = logits`` (entry z_i unused). ``mean`` (x0-prediction, normalised):
    absorb ``log s = log_softmax + log a(lam)`` (RADD); uniform the exact posterior-to-score map
    :func:`score_entropy.uniform_log_score_from_mean`. Source: spec §5.2.
    """
    V = out_BxLxV.shape[-1]
    if graph == "absorb":
        log_c = out_BxLxV - math.log(V) if score_param == "direct" else out_BxLxV
        return score_entropy.absorb_log_score_from_mean(log_c, lam_B)
    if score_param == "direct":
        return out_BxLxV.astype(jnp.float32)
    return score_entropy.uniform_log_score_from_mean(out_BxLxV, z_BxL, lam_B)


@dataclasses.dataclass(frozen=True, eq=False)
class ScoreModel:
    """``score_model(z_BxL, lam_B) -> log-scores [B, L, V]``: a SEDD network in eval mode.

    The network is conditioned on the noise level lam = 1 - exp(-sigma_bar(t)) in [0, 1]
    (passed as its time input). ``graph``: 'absorb' | 'uniform'; ``score_param``: 'direct' |
    'mean' (:func:`log_score_from_output`). Frozen, hashed by identity (a static jit argument).
    """

    model: Transformer
    params: Any
    graph: str
    score_param: str

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def __call__(self, z_BxL: jax.Array, lam_B: jax.Array) -> jax.Array:
        return self.apply_params(self.params, z_BxL, lam_B)

    def apply_params(self, params: Any, z_BxL: jax.Array, lam_B: jax.Array) -> jax.Array:
        out = self.model.apply({"params": params}, z_BxL, lam_B, train=False)
        return log_score_from_output(self.graph, self.score_param, out, z_BxL, lam_B)


def make_score_model(config: ml_collections.ConfigDict, model: Transformer, params: Any) -> ScoreModel:
    """Wrap a SEDD network (``config.process.graph``, ``score_param``) as a :class:`ScoreModel`."""
    return ScoreModel(model=model, params=params,
                      graph=score_entropy.check_graph(config.process.graph),
                      score_param=_score_param(config))


def check_sedd_eval_config(config: ml_collections.ConfigDict) -> None:
    """Validate a SEDD run's ``eval.*`` settings up front (train.py and evaluate.py), so that a
    typo fails in seconds rather than after training or after the whole I-MDSE pass.

    Raises ValueError naming the key and value: eval.estimator != 'imdse', an unknown
    eval.lambda_sampling or eval.sampler, eval.num_samples < 2, eval.sample_steps < 1.
    """
    ev = config.eval
    if ev.get("estimator", "imdse") != "imdse":
        raise ValueError(f"config.eval.estimator={ev.estimator!r}: a score-entropy (sedd) model "
                         "is evaluated with 'imdse'")
    ls = ev.get("lambda_sampling", None)
    if ls is not None and ls not in score_entropy.LAMBDA_SAMPLING:
        raise ValueError(f"config.eval.lambda_sampling={ls!r}; choose from {score_entropy.LAMBDA_SAMPLING}")
    if ev.get("sampler", "tweedie") not in ("euler", "tweedie"):
        raise ValueError(f"config.eval.sampler={ev.sampler!r}; choose 'euler' or 'tweedie'")
    if int(ev.get("num_samples", 2)) < 2:
        raise ValueError(f"config.eval.num_samples={ev.num_samples} must be >= 2 to report a standard error")
    if int(ev.get("num_generate", 0)) > 0 and int(ev.get("sample_steps", 1)) < 1:
        raise ValueError(f"config.eval.sample_steps={ev.sample_steps} must be >= 1")
    score_entropy.check_graph(config.process.graph)
    _score_param(config)


def _antithetic_uniform(key: jax.Array, n: int) -> jax.Array:
    u0 = jax.random.uniform(key, ())
    return jnp.mod(u0 + jnp.arange(n, dtype=jnp.float32) / n, 1.0)


def sedd_loss(config: ml_collections.ConfigDict, apply_fn: Callable, x_BxL: jax.Array,
              key: jax.Array) -> jax.Array:
    """SEDD's continuous-time DSE objective per sequence: float32 [B] nats.

    ``t ~ U[0, 1)`` (antithetic across the batch if ``process.antithetic``), lam = lambda(t),
    z ~ p_{lam|0}(. | x), loss = sigma(t) * score_entropy (= l_DSE, SEDD Eq. 3 / spec §3.1): an
    unbiased estimate of ``int_0^1 DSE dt``, the diffusion term of the I-MDSE bound (the prior
    KL is not included). ``apply_fn(z, lam) -> network output``. lam is clipped to
    [1e-7, 1 - 2^-24] so that t = 0 (nothing noised) cannot produce 0 * inf and lam rounding to
    1 in float32 (geometric schedule) keeps a(lam) finite.
    """
    p = config.process
    graph = score_entropy.check_graph(p.graph)
    sched = schedules_lib.get_schedule(p.schedule, eps=p.get("eps", None))
    V = int(config.data.vocab_size)
    B = x_BxL.shape[0]
    k_t, k_z = jax.random.split(key)
    t = _antithetic_uniform(k_t, B) if p.get("antithetic", True) else jax.random.uniform(k_t, (B,))
    lam = jnp.clip(sched.mask_prob(t), 1e-7, score_entropy.LAM_ONE)
    sigma = sched.sigma(t)
    z = score_entropy.corrupt(graph, k_z, x_BxL, lam, V)
    log_s = log_score_from_output(graph, _score_param(config), apply_fn(z, lam), z, lam)
    return sigma * score_entropy.score_entropy(graph, log_s, x_BxL, z, lam)


@dataclasses.dataclass(frozen=True, eq=False)
class Denoiser:
    """``denoiser(z_BxL, t_B) -> logprobs_BxLxV``: the network in eval mode (no dropout).

    Attributes:
      model: the :class:`Transformer`.
      params: its parameter pytree.
      vocab_size: V (property); the MASK id is V.

    Frozen, compared and hashed by identity, so it can be a static ``jax.jit`` argument or be
    closed over; the parameters are traced as constants when closed over inside ``jit``.
    """

    model: Transformer
    params: Any

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def __call__(self, z_BxL: jax.Array, t_B: jax.Array) -> jax.Array:
        """z_BxL int [B, L] ids in [0, V] (V = MASK), t_B float32 [B] in [0, 1] ->
        float32 [B, L, V] log-probabilities over the V real tokens."""
        return self.apply_params(self.params, z_BxL, t_B)

    def apply_params(self, params: Any, z_BxL: jax.Array, t_B: jax.Array) -> jax.Array:
        """The same with explicit ``params``, so jitted callers pass them as arguments
        (rather than baking them into the compiled program as constants)."""
        return self.model.apply({"params": params}, z_BxL, t_B, train=False)


def make_denoiser(model: Transformer, params: Any) -> Denoiser:
    """Wrap ``model`` and ``params`` as a jittable :class:`Denoiser` (eval mode)."""
    return Denoiser(model=model, params=params)


def make_mask_spec(config: ml_collections.ConfigDict) -> masked.MaskSpec:
    """The training objective of ``config.process`` as a :class:`masked.MaskSpec`.

    ``exact_boundaries=False``: for ``t_dce`` this is MD4's continuous-time (``finite_T=0``) or
    discrete-time (``finite_T=T``) diffusion loss (MD4 Eq. 5 / Eq. 4); the objectives
    ``k_dce``, ``lambda_dce`` and ``time_free`` ignore it.

    Raises:
      ValueError: unknown objective or schedule, invalid eps / finite_T.
    """
    p = config.process
    if p.name != "masked":
        raise ValueError(f"config.process.name={p.name!r}: this trainer supports 'masked' and 'sedd'")
    return masked.MaskSpec(
        name=p.objective,
        schedule=schedules_lib.get_schedule(p.schedule, eps=p.eps),
        finite_T=int(p.finite_T),
        antithetic=bool(p.antithetic),
        exact_boundaries=False,
    )


def make_lr_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """Learning rate as a function of the step (0-based): float32 scalar.

    Linear warmup from 0 to ``optim.lr`` over ``optim.warmup_steps`` steps, then
    ``optim.decay = 'cosine'``: cosine decay to ``optim.lr * optim.min_lr_ratio`` at step
    ``train.num_steps`` (``optax.warmup_cosine_decay_schedule``; if the run is shorter than the
    warmup the cosine part is never reached), or ``'constant'``: ``optim.lr`` after warmup.

    Raises:
      ValueError: unknown decay, negative warmup, lr <= 0.
    """
    o = config.optim
    lr, warmup = float(o.lr), int(o.warmup_steps)
    if not lr > 0:
        raise ValueError(f"config.optim.lr must be > 0; got {lr}")
    if warmup < 0:
        raise ValueError(f"config.optim.warmup_steps must be >= 0; got {warmup}")
    if o.decay == "cosine":
        # optax requires decay_steps > warmup_steps; a run that ends inside the warmup never
        # sees the cosine part, so its length is irrelevant there.
        decay_steps = max(int(config.train.num_steps), warmup + 1)
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=lr,
            warmup_steps=warmup,
            decay_steps=decay_steps,
            end_value=lr * float(o.min_lr_ratio),
        )
    if o.decay == "constant":
        if warmup == 0:
            return optax.constant_schedule(lr)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup]
        )
    raise ValueError(f"config.optim.decay={o.decay!r}; choose 'cosine' or 'constant'")


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """``clip_by_global_norm(optim.grad_clip) -> adamw(schedule, b1, b2, eps, weight_decay)``.

    Weight decay (decoupled, AdamW) applies only to parameters with ndim >= 2 (kernels and the
    embedding), not to biases and LayerNorm scales. ``grad_clip <= 0`` disables clipping.
    The schedule is :func:`make_lr_schedule`.
    """
    o = config.optim
    parts = []
    if float(o.grad_clip) > 0:
        parts.append(optax.clip_by_global_norm(float(o.grad_clip)))
    parts.append(
        optax.adamw(
            learning_rate=make_lr_schedule(config),
            b1=float(o.b1),
            b2=float(o.b2),
            eps=float(o.eps),
            weight_decay=float(o.weight_decay),
            mask=lambda params: jax.tree.map(lambda x: x.ndim >= 2, params),
        )
    )
    return optax.chain(*parts)


# ---------------------------------------------------------------------------------------------
# State and sharding
# ---------------------------------------------------------------------------------------------
@flax.struct.dataclass
class TrainState:
    """Everything that changes during training (a pytree; checkpointed as one item).

    Attributes:
      step: int32 scalar, number of optimizer updates applied so far.
      params: model parameters (float32 pytree).
      ema_params: exponential moving average of ``params`` (same structure), used for eval.
      opt_state: optax state of :func:`make_optimizer`.
    """

    step: jax.Array
    params: Any
    ema_params: Any
    opt_state: Any


def make_mesh(devices: Any = None) -> Mesh:
    """1-D data-parallel mesh with axis name ``'data'`` (default: all local devices)."""
    devs = list(jax.local_devices() if devices is None else devices)
    return Mesh(np.array(devs), ("data",))


def check_batch_divisible(batch_size: int, mesh: Mesh) -> None:
    """Raise ValueError unless ``batch_size`` is a positive multiple of the mesh size."""
    n = mesh.devices.size
    if batch_size < 1 or batch_size % n:
        raise ValueError(
            f"batch size {batch_size} must be a positive multiple of the number of devices "
            f"({n}: {[d.platform + ':' + str(d.id) for d in mesh.devices.flat]}) for data "
            f"parallelism; change config.train.batch_size"
        )


def init_train_state(
    config: ml_collections.ConfigDict,
    model: Transformer,
    optimizer: optax.GradientTransformation,
    key: jax.Array,
    mesh: Mesh | None = None,
) -> TrainState:
    """Fresh :class:`TrainState` at step 0 (``ema_params = params``), replicated on ``mesh``.

    Computed under ``jax.jit`` (op-by-op initialisation is several times slower to run).
    """
    L = int(config.data.seq_len)

    def init(key):
        z_1xL = jnp.zeros((1, L), jnp.int32)
        t_1 = jnp.zeros((1,), jnp.float32)
        params = model.init(key, z_1xL, t_1)["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            ema_params=jax.tree.map(jnp.copy, params),
            opt_state=optimizer.init(params),
        )

    out_shardings = NamedSharding(mesh, P()) if mesh is not None else None
    return jax.jit(init, out_shardings=out_shardings)(key)


def abstract_train_state(
    config: ml_collections.ConfigDict,
    model: Transformer,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
) -> TrainState:
    """Shapes, dtypes and (replicated) shardings of the train state, without computing it."""
    repl = NamedSharding(mesh, P())
    shapes = jax.eval_shape(lambda k: init_train_state(config, model, optimizer, k), jax.random.key(0))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=repl), shapes)


def step_key(train_key: jax.Array, step: int) -> jax.Array:
    """The PRNG key of training step ``step``: ``fold_in(train_key, step)``."""
    return jax.random.fold_in(train_key, step)


def _ema_decay(decay: float, step: jax.Array) -> jax.Array:
    # Warm-started EMA: the effective decay min(decay, (1 + s) / (10 + s)) (as
    # tf.train.ExponentialMovingAverage with num_updates) keeps the average from being dominated
    # by the initialisation in short runs; it equals `decay` after ~10 / (1 - decay) steps.
    s = step.astype(jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + s) / (10.0 + s))


def _seq_metrics(loss_B: jax.Array, L: int) -> dict:
    loss = jnp.mean(loss_B)
    return {"loss": loss, "bpc": loss / (L * _LN2)}


def make_loss_fn(
    config: ml_collections.ConfigDict, model: Transformer
) -> Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """The training loss ``loss_fn(params, x_BxL, key) -> (loss, loss_B)`` (train mode).

    ``key`` is split into the mask/time key and the dropout key. ``loss_B`` float32 [B] is
    :func:`masked.diffusion_loss` (nats per sequence) of the objective :func:`make_mask_spec`;
    ``loss`` = mean_b loss_B / L (nats per token, the quantity that is differentiated). Not jitted.
    """
    if is_sedd(config):
        def sedd_loss_fn(params, x_BxL, key):
            k_loss, k_drop = jax.random.split(key)

            def apply_fn(z_BxL, lam_B):
                return model.apply({"params": params}, z_BxL, lam_B, train=True, rngs={"dropout": k_drop})

            loss_B = sedd_loss(config, apply_fn, x_BxL, k_loss)
            return jnp.mean(loss_B) / x_BxL.shape[1], loss_B

        return sedd_loss_fn
    spec = make_mask_spec(config)
    V = int(config.data.vocab_size)

    def loss_fn(params, x_BxL, key):
        k_loss, k_drop = jax.random.split(key)

        def denoiser(z_BxL, t_B):
            return model.apply({"params": params}, z_BxL, t_B, train=True, rngs={"dropout": k_drop})

        loss_B = masked.diffusion_loss(denoiser, x_BxL, k_loss, spec, V)
        # Differentiate nats per token so that grad_clip has the same meaning at every L.
        return jnp.mean(loss_B) / x_BxL.shape[1], loss_B

    return loss_fn


def make_train_step(
    config: ml_collections.ConfigDict,
    model: Transformer,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
) -> Callable[[TrainState, jax.Array, jax.Array], tuple[TrainState, dict]]:
    """Jitted ``train_step(state, x_BxL, key) -> (new_state, metrics)``.

    Args (of the returned function):
      state: :class:`TrainState`, replicated on ``mesh`` (donated: do not reuse it).
      x_BxL: int32 [B, L] clean tokens in [0, V), B a multiple of the mesh size; it is
        placed with ``NamedSharding(mesh, P('data'))``.
      key: PRNG key of this step (:func:`step_key`); split into mask/time and dropout keys.

    One step: ``loss = mean_b diffusion_loss(...)_b / L`` (nats per token, objective
    :func:`make_mask_spec`), gradient, clip + AdamW update, EMA update with decay
    ``min(optim.ema_decay, (1+s)/(10+s))`` via ``optax.incremental_update``.

    Returns metrics (float32 scalars, replicated): ``loss`` (nats/seq), ``bpc``
    (bits/char = loss / (L ln 2)), ``grad_norm`` (global norm before clipping), ``lr`` (the
    learning rate used by this update).
    """
    schedule = make_lr_schedule(config)
    ema_decay = float(config.optim.ema_decay)
    repl = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P("data"))
    loss_fn = make_loss_fn(config, model)

    def step_fn(state: TrainState, x_BxL, key):
        (_, loss_B), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, x_BxL, key)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        d = _ema_decay(ema_decay, state.step)
        ema = optax.incremental_update(params, state.ema_params, step_size=1.0 - d)
        metrics = _seq_metrics(loss_B, x_BxL.shape[1])
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        new_state = TrainState(step=state.step + 1, params=params, ema_params=ema, opt_state=opt_state)
        return new_state, metrics

    return jax.jit(
        step_fn,
        in_shardings=(repl, batch_sharding, repl),
        out_shardings=(repl, repl),
        donate_argnums=(0,),
    )


def make_eval_step(
    config: ml_collections.ConfigDict, model: Transformer, mesh: Mesh
) -> Callable[[Any, jax.Array, jax.Array], dict]:
    """Jitted ``eval_step(params, x_BxL, key) -> metrics``: the training objective, no dropout.

    Args (of the returned function): params (replicated), x_BxL int32 [B, L] (sharded over
    'data'), key (PRNG key). Returns ``{'loss': nats/seq, 'bpc': bits/char}``, float32 scalars
    averaged over the batch (one Monte Carlo mask per sequence).
    """
    repl = NamedSharding(mesh, P())
    if is_sedd(config):
        def eval_fn(params, x_BxL, key):
            apply_fn = lambda z, lam: model.apply({"params": params}, z, lam, train=False)  # noqa: E731
            return _seq_metrics(sedd_loss(config, apply_fn, x_BxL, key), x_BxL.shape[1])
    else:
        spec = make_mask_spec(config)
        V = int(config.data.vocab_size)

        def eval_fn(params, x_BxL, key):
            loss_B = masked.diffusion_loss(make_denoiser(model, params), x_BxL, key, spec, V)
            return _seq_metrics(loss_B, x_BxL.shape[1])

    return jax.jit(eval_fn, in_shardings=(repl, NamedSharding(mesh, P("data")), repl), out_shardings=repl)


# ---------------------------------------------------------------------------------------------
# Validation of inputs and configs
# ---------------------------------------------------------------------------------------------
def check_tokens(tokens: np.ndarray, vocab_size: int, name: str = "tokens") -> None:
    """Raise ValueError naming the offending value if any token is outside [0, vocab_size)."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids; got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        pos = int(np.flatnonzero(arr.reshape(-1) == bad)[0])
        raise ValueError(
            f"{name} contains token id {bad} (first at flat index {pos}) outside "
            f"[0, {vocab_size}) = [0, config.data.vocab_size); the MASK id {vocab_size} and other "
            f"values must not appear in data"
        )


def _flatten(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_json_dict(config: ml_collections.ConfigDict) -> dict:
    return json.loads(config.to_json_best_effort(sort_keys=True))


def config_differences(saved: Mapping, new: Mapping, ignore_new_keys: bool = False) -> list[str]:
    """Dotted keys whose values differ between two config dicts, excluding resumable keys.

    ``ignore_new_keys=True`` (evaluation of an existing run) skips keys that ``saved`` does not
    have at all: options added to the config files after the run was trained, which
    configs/saved_run.py fills in from the current defaults. Resuming training stays strict.
    """
    a, b = _flatten(saved), _flatten(new)
    diff = []
    for k in sorted(set(a) | set(b)):
        if k in RESUMABLE_KEYS or k.startswith(RESUMABLE_PREFIXES):
            continue
        if ignore_new_keys and k not in a:
            continue
        if a.get(k, "<missing>") != b.get(k, "<missing>"):
            diff.append(k)
    return diff


# ---------------------------------------------------------------------------------------------
# Checkpointing
# ---------------------------------------------------------------------------------------------
def _checkpoint_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=max(1, int(keep)), create=True)
    return ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), _CKPT_DIR), options=options, item_names=("state", "meta")
    )


def _save(mngr: ocp.CheckpointManager, state: TrainState, meta: dict) -> bool:
    step = int(jax.device_get(state.step))
    if mngr.latest_step() is not None and mngr.latest_step() >= step:
        return False
    meta = dict(meta, step=step, data_position=step)
    saved = mngr.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        force=True,
    )
    if saved:
        _log(logging.info, "checkpoint: saving step %d (async)", step)
    return saved


def load_checkpoint(
    workdir: str,
    config: ml_collections.ConfigDict | None = None,
    step: int | None = None,
    mesh: Mesh | None = None,
) -> tuple[TrainState, dict]:
    """Restore ``(state, meta)`` from ``<workdir>/checkpoints``.

    Args:
      workdir: the training workdir.
      config: the run's config; default: the config stored in the checkpoint's metadata.
      step: which checkpoint (default: the latest).
      mesh: device mesh for the (replicated) state; default all local devices.

    Returns:
      state: :class:`TrainState` (``state.ema_params`` are the evaluation parameters).
      meta: dict with ``step``, ``data_position`` (= step), ``seed``, ``config`` (JSON dict)
        and ``data`` (corpus name and split checksums).

    Raises:
      FileNotFoundError: no checkpoint (or not that step) in ``workdir``.
      CheckpointError: the checkpoint's files cannot be read (names the step and older ones).
    """
    directory = os.path.join(os.path.abspath(workdir), _CKPT_DIR)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoints in {workdir!r} (expected {directory})")
    mngr = ocp.CheckpointManager(directory, item_names=("state", "meta"),
                                 options=ocp.CheckpointManagerOptions(create=False))
    try:
        steps = mngr.all_steps()
        if not steps or (step is not None and step not in steps):
            raise FileNotFoundError(
                f"checkpoint step {step if step is not None else 'latest'} not found in {directory} "
                f"(available: {sorted(steps)})"
            )
        step = max(steps) if step is None else int(step)
        try:
            meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        except Exception as e:  # orbax / tensorstore raise plain Exception for corrupt data
            raise CheckpointError(step, directory, steps, e) from e
        if config is None:
            config = ml_collections.ConfigDict(meta["config"])
        mesh = make_mesh() if mesh is None else mesh
        abstract = abstract_train_state(config, make_model(config), make_optimizer(config), mesh)
        try:
            state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))).state
        except Exception as e:  # orbax / tensorstore raise plain Exception for corrupt data
            raise CheckpointError(step, directory, steps, e) from e
    finally:
        mngr.close()
    return state, meta


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read (truncated or corrupted files)."""

    def __init__(self, step, directory, steps, cause):
        older = sorted(x for x in steps if x < step)
        hint = (f"; older checkpoints: {older} (delete {os.path.join(directory, str(step))} to fall back "
                f"to step {older[-1]})" if older else "")
        super().__init__(f"checkpoint step {step} in {directory} cannot be read "
                         f"({type(cause).__name__}: {cause}){hint}")


class _StopFlag:
    """SIGINT/SIGTERM -> set a flag the loop polls (save and exit); a second SIGINT raises."""

    def __init__(self):
        self.signum = None
        self._old = {}

    def _handler(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        logging.warning("received %s: saving a checkpoint and stopping", signal.Signals(signum).name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def _truncate_metrics(path: str, last_step: int) -> None:
    """Drop records after `last_step` (logged after the checkpoint a run resumes from, e.g.
    before a SIGKILL), so every step appears once in metrics.jsonl. Atomic rewrite."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            if int(json.loads(line).get("step", 0)) <= last_step:
                keep.append(line)
        except (ValueError, AttributeError):
            continue  # a torn last line from a crash
    if len(keep) != len(lines):
        with open(path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)


def saved_config(workdir: str) -> dict:
    """The config (JSON dict) a run in `workdir` last (re)started with. FileNotFoundError if
    `workdir` is not a training run."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir!r} a training workdir?")
    with open(path) as f:
        return json.load(f)


def summarise_window(window: list, steps_window: int, t_window: float, rate_name: str,
                     items_per_step: int, step: int, num_steps: int,
                     mngr: ocp.CheckpointManager) -> tuple[dict, float]:
    """Average the metrics of the steps since the last log line (host floats), add
    ``steps_per_s`` and ``rate_name`` (items per second), and return ``(avg, eta_seconds)``.
    Raises FloatingPointError naming the step and the last checkpoint if the loss is not finite.
    Shared by the masked/SEDD and Poisson training loops."""
    host = jax.device_get(window)
    avg = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    dt = max(time.time() - t_window, 1e-9)
    avg["steps_per_s"] = steps_window / dt
    avg[rate_name] = steps_window * items_per_step / dt
    if not math.isfinite(avg["loss"]):
        raise FloatingPointError(f"non-finite training loss {avg['loss']} at step {step}; "
                                 f"last finite checkpoint: {mngr.latest_step()}")
    return avg, (num_steps - step) / max(avg["steps_per_s"], 1e-9)


def _append_jsonl(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def _eval_batches(valid: np.ndarray, config: ml_collections.ConfigDict) -> np.ndarray:
    """Fixed validation batches int32 [nb, B, L]: `eval_batches * B` chunks evenly spread over
    the whole validation split (so every part of it is represented)."""
    B, L = int(config.train.batch_size), int(config.data.seq_len)
    chunks_NxL = text_data.eval_chunks(valid, L)
    want = int(config.train.eval_batches) * B
    nb = min(int(config.train.eval_batches), chunks_NxL.shape[0] // B)
    if nb < 1:
        raise ValueError(
            f"the validation split has {chunks_NxL.shape[0]} chunks of length {L}, fewer than one "
            f"batch of {B}; use a larger corpus or a smaller train.batch_size"
        )
    idx = np.linspace(0, chunks_NxL.shape[0] - 1, min(want, nb * B)).round().astype(np.int64)
    return chunks_NxL[idx].reshape(nb, B, L)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------
def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    corpus: Any = None,
    stop_at_step: int | None = None,
    mesh: Mesh | None = None,
) -> dict:
    """Train (or resume) a masked-diffusion denoiser and evaluate it on validation batches.

    Args:
      config: a config with the schema of ``configs/masked_text.py``.
      workdir: output directory (created); holds ``config.json``, ``metrics.jsonl`` and
        ``checkpoints/``. If it already has checkpoints, the latest is restored and training
        continues from its step (bit-identical to an uninterrupted run).
      corpus: optional object with ``.train`` / ``.valid`` uint8/int token streams, ``.name``
        and ``.checksums`` (a :class:`infodiff.data.text.TextCorpus`); default
        ``text_data.load_corpus(config.data.path or None, config.data.cache_dir or None)``.
      stop_at_step: optional; stop (saving a checkpoint) once this step is reached even if
        ``train.num_steps`` is larger, as an interruption would (for tests and time-sliced jobs).
      mesh: optional device mesh (default :func:`make_mesh` over all local devices).

    Per step ``s``: batch ``train_batch(corpus.train, L, B, config.seed, s)``, key
    ``fold_in(train_key, s)``. Every ``train.log_every`` steps: the mean train metrics over the
    window, tokens/s and ETA are logged (absl) and appended to ``metrics.jsonl`` as
    ``{"step", "split": "train", "metrics", "wall_time" (s since this call started), "time"
    (unix seconds)}``; every ``train.eval_every`` steps and
    at the end: validation on ``train.eval_batches`` fixed batches with the EMA parameters and
    fixed keys (``split: "valid"``). Checkpoints every ``train.ckpt_every`` steps and at the end
    (async, ``train.keep_checkpoints`` kept). SIGINT / SIGTERM: save a checkpoint at the current
    step and return (``interrupted`` set); a second SIGINT raises KeyboardInterrupt (a
    checkpoint is still saved).

    Returns:
      dict: ``step`` (final step), ``train`` (last logged train metrics), ``valid`` (last
      validation metrics), ``num_params``, ``interrupted`` (signal name or None),
      ``wall_time`` (s), ``workdir``.

    Raises:
      ValueError: empty ``workdir``; data tokens outside [0, vocab_size) (names the value);
        batch size not a multiple of the device count; bad config values.
      ConfigMismatchError (a ValueError): resuming with a config that differs from the
        checkpoint's in a non-resumable key (names the keys; see ``RESUMABLE_KEYS``).
      FloatingPointError: non-finite training loss.
    """
    if not workdir:
        raise ValueError("a workdir is required (train.py --workdir=DIR): where checkpoints and metrics go")
    workdir = os.path.abspath(os.fspath(workdir))
    t_start = time.time()
    tr = config.train
    B, L, V = int(tr.batch_size), int(config.data.seq_len), int(config.data.vocab_size)
    num_steps = int(tr.num_steps)
    if num_steps < 0:
        raise ValueError(f"config.train.num_steps must be >= 0; got {num_steps}")
    for name in ("log_every", "eval_every", "ckpt_every"):
        if int(tr[name]) < 1:
            raise ValueError(f"config.train.{name} must be >= 1; got {tr[name]}")
    end_step = num_steps if stop_at_step is None else min(num_steps, int(stop_at_step))
    if is_sedd(config):
        check_sedd_eval_config(config)

    mesh = make_mesh() if mesh is None else mesh
    check_batch_divisible(B, mesh)

    # ---- data ----
    if corpus is None:
        corpus = load_config_corpus(config)
    check_tokens(corpus.train, V, "training data (corpus.train)")
    check_tokens(corpus.valid, V, "validation data (corpus.valid)")
    if len(corpus.train) < L:
        raise ValueError(f"training split has {len(corpus.train)} tokens < seq_len={L}")
    valid_batches_NxBxL = _eval_batches(corpus.valid, config)
    os.makedirs(workdir, exist_ok=True)

    # ---- model, optimizer, state ----
    model = make_model(config)
    optimizer = make_optimizer(config)
    base = jax.random.key(int(config.seed))
    init_key, train_key, eval_key = (jax.random.fold_in(base, i) for i in range(3))
    abstract_state = abstract_train_state(config, model, optimizer, mesh)
    num_params = count_params(abstract_state.params)
    train_step = make_train_step(config, model, optimizer, mesh)
    eval_step = make_eval_step(config, model, mesh)
    batch_sharding = NamedSharding(mesh, P("data"))

    config_dict = _config_json_dict(config)
    data_info = {"name": str(corpus.name), "checksums": dict(corpus.checksums)}
    meta = {"seed": int(config.seed), "config": config_dict, "data": data_info}

    # ---- resume ----
    mngr = _checkpoint_manager(workdir, int(tr.keep_checkpoints))
    latest = mngr.latest_step()
    if latest is not None:
        saved_meta = mngr.restore(latest, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        diff = config_differences(saved_meta.get("config", {}), config_dict)
        if diff:
            detail = "; ".join(
                f"{k}: checkpoint={_flatten(saved_meta['config']).get(k, '<missing>')!r} "
                f"new={_flatten(config_dict).get(k, '<missing>')!r}"
                for k in diff
            )
            mngr.close()
            raise ConfigMismatchError(
                f"cannot resume from {workdir}/{_CKPT_DIR}/{latest}: the config differs in "
                f"{diff} ({detail}). Only {list(RESUMABLE_KEYS)} and eval.* may change on resume; "
                f"use a new --workdir for a different experiment"
            )
        if saved_meta.get("data", {}).get("checksums") not in (None, data_info["checksums"]):
            mngr.close()
            raise ConfigMismatchError(
                f"cannot resume from {workdir}: the checkpoint was trained on data with checksums "
                f"{saved_meta['data']['checksums']}, the current corpus has {data_info['checksums']}"
            )
        state = mngr.restore(
            latest, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        ).state
        _log(logging.info, "resumed from checkpoint step %d in %s", int(state.step), workdir)
    else:
        state = init_train_state(config, model, optimizer, init_key, mesh)
    start_step = int(jax.device_get(state.step))

    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    _truncate_metrics(metrics_path, start_step)

    _log(
        logging.info,
        "model: %d params, %d devices (%s), batch %d x %d, steps %d -> %d, objective %s",
        num_params, mesh.devices.size, mesh.devices.flat[0].platform, B, L, start_step, end_step,
        config.process.get("objective", f"{config.process.name}:{config.process.get('graph', '')}"),
    )

    def run_eval(step: int) -> dict:
        sums: dict = {}
        for i, xb in enumerate(valid_batches_NxBxL):
            m = eval_step(state.ema_params, jax.device_put(xb, batch_sharding), jax.random.fold_in(eval_key, i))
            for k, v in jax.device_get(m).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        out = {k: v / len(valid_batches_NxBxL) for k, v in sums.items()}
        _append_jsonl(metrics_path, {"step": step, "split": "valid", "metrics": out,
                                     "wall_time": time.time() - t_start, "time": time.time()})
        _log(logging.info, "step %d valid (EMA): loss %.4f nats/seq, bpc %.4f", step, out["loss"], out["bpc"])
        return out

    last_train: dict = {}
    last_valid: dict = {}
    interrupted = None
    window: list = []
    prev_metrics = None
    t_window, steps_window = time.time(), 0
    step = start_step
    # disable=None: a live bar with ETA on a terminal, none when stderr is redirected (the log
    # lines carry tokens/s and ETA too).
    pbar = tqdm.tqdm(total=num_steps, initial=start_step, desc="train", unit="step",
                     dynamic_ncols=True, mininterval=1.0, smoothing=0.1, disable=None)
    try:
        with _StopFlag() as stop:
            try:
                while step < end_step:
                    if stop.signum is not None:
                        interrupted = signal.Signals(stop.signum).name
                        break
                    x_BxL = jax.device_put(
                        text_data.train_batch(corpus.train, L, B, int(config.seed), step,
                                              aligned=bool(config.data.get("aligned", False))), batch_sharding
                    )
                    state, metrics = train_step(state, x_BxL, step_key(train_key, step))
                    if prev_metrics is not None:  # keep at most one step in flight
                        jax.block_until_ready(prev_metrics)
                    prev_metrics = metrics
                    window.append(metrics)
                    step += 1
                    steps_window += 1
                    pbar.update(1)

                    if step % int(tr.log_every) == 0 or step == end_step:
                        avg, eta = summarise_window(window, steps_window, t_window, "tokens_per_s",
                                                    B * L, step, num_steps, mngr)
                        _log(
                            logging.info,
                            "step %d/%d: loss %.3f nats/seq, bpc %.4f, grad_norm %.3f, lr %.2e, "
                            "%.0f tokens/s, %.2f steps/s, ETA %.0fs",
                            step, num_steps, avg["loss"], avg["bpc"], avg["grad_norm"], avg["lr"],
                            avg["tokens_per_s"], avg["steps_per_s"], eta,
                        )
                        _append_jsonl(metrics_path, {"step": step, "split": "train", "metrics": avg,
                                                     "wall_time": time.time() - t_start, "time": time.time()})
                        pbar.set_postfix(bpc=f"{avg['bpc']:.3f}", refresh=False)
                        last_train = avg
                        window, steps_window = [], 0
                        t_window = time.time()

                    if step % int(tr.eval_every) == 0 and step < num_steps:
                        last_valid = run_eval(step)
                        t_window = time.time()
                    if step % int(tr.ckpt_every) == 0 or step == end_step:
                        _save(mngr, state, meta)
                if stop.signum is not None and interrupted is None:
                    interrupted = signal.Signals(stop.signum).name
            except KeyboardInterrupt:
                interrupted = "KeyboardInterrupt"
                _log(logging.warning, "KeyboardInterrupt at step %d: saving a checkpoint", step)
                try:
                    _save(mngr, state, meta)
                    mngr.wait_until_finished()
                except Exception as e:  # e.g. interrupted while the state was donated
                    _log(logging.error, "could not save at the interrupt (%s); latest checkpoint: %s",
                         e, mngr.latest_step())
                raise
        if interrupted is None and step == num_steps:
            last_valid = run_eval(step)  # final validation (the in-loop one skips the last step)
        _save(mngr, state, meta)
    finally:
        pbar.close()
        mngr.wait_until_finished()
        mngr.close()

    result = {
        "step": int(step),
        "train": last_train,
        "valid": last_valid,
        "num_params": int(num_params),
        "interrupted": interrupted,
        "wall_time": time.time() - t_start,
        "workdir": workdir,
    }
    _log(logging.info, "done at step %d (%s): %s", step, interrupted or "completed", json.dumps(
        {"train_bpc": last_train.get("bpc"), "valid_bpc": last_valid.get("bpc")}))
    return result
