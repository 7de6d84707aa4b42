"""Tasks: what is trained, built from a config (the only reader of ``config.process.name``).

A :class:`Task` bundles everything :func:`infodiff.training.train` needs that depends on the
process and the data: the network (``model``, ``init_params``), the loss (``loss_fn``, whose
per-example part is the one small method ``loss_B``), the metrics, the deterministic training
stream and fixed validation batches, data validation, checkpoint metadata, log lines, and
``denoiser(params)``: the eval-mode object the likelihood estimators use.

* ``masked`` (:class:`MaskedTask`): text int32 [B, L], ids in [0, V); ``masked.diffusion_loss``
  of the DCE objective ``process.objective`` (MD4 / RADD); denoiser :class:`Denoiser`.
* ``sedd`` (:class:`SeddTask`): text int32 [B, L]; sigma(t) x score entropy (SEDD Eq. 3);
  denoiser :class:`ScoreModel`.
* ``poisson`` (:class:`PoissonTask`): counts int32 [B, D] in [0, K]; ``poisson.diffusion_loss``
  on the scaled counts (ItDPDM); denoiser :class:`count_denoisers.CountDenoiser`.

Every loss is a one-sample Monte Carlo estimate per example (nats per sequence / example); the
differentiated scalar is ``mean_b loss_b / L`` (or ``/ D``): nats per token / dimension, so
``optim.grad_clip`` means the same at every size. Metrics: ``loss`` (nats per example) and
``bpc = loss / (L ln 2)`` or ``bpd = loss / (D ln 2)``.

Data (``make_task(config, data=...)``): a text corpus (``.train`` / ``.valid`` token streams,
``.name``, ``.checksums``; default :func:`load_text_corpus`) or a
:class:`infodiff.data.counts.CountDataset` (default :func:`load_count_data`), loaded on first use.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from infodiff import schedules as schedules_lib
from infodiff.data import counts as counts_lib
from infodiff.data import text as text_data
from infodiff.denoisers import NoParams
from infodiff.validation import validate_token_stream
from infodiff.networks import count_denoisers as cd
from infodiff.networks.text_denoisers import Denoiser, ScoreModel
from infodiff.networks.transformer import ATTENTIONS, Transformer
from infodiff.processes import base, masked, poisson, score_entropy

__all__ = [
    "PROCESSES",
    "process_name",
    "Task",
    "MaskedTask",
    "SeddTask",
    "PoissonTask",
    "make_task",
    "load_text_corpus",
    "synthetic_entropy",
    "synthetic_w1",
    "poisson_estimation_process",
    "oracle_case",
    "make_transformer",
    "compute_dtype",
    "make_mask_spec",
    "score_param",
    "check_sedd_eval_config",
    "load_count_data",
    "synthetic_distribution",
    "synthetic_dim",
    "synthetic_sample",
    "make_scaling",
    "make_count_model",
    "poisson_proposal",
    "oracle_distribution",
    "empirical_prior_logits",
    "check_counts",
]

PROCESSES = ("masked", "sedd", "poisson")
_LN2 = math.log(2.0)

ApplyFn = Callable[[jax.Array, jax.Array], jax.Array]


def process_name(config: ml_collections.ConfigDict) -> str:
    """``config.process.name``, one of ``PROCESSES``; ValueError naming it otherwise."""
    name = config.process.name
    if name not in PROCESSES:
        raise ValueError(f"config.process.name={name!r}; choose from {PROCESSES}")
    return name


# ---------------------------------------------------------------------------------------------
# Text: data, network, objectives
# ---------------------------------------------------------------------------------------------
def load_text_corpus(config: ml_collections.ConfigDict) -> text_data.TextCorpus:
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


def _text_valid_batches(valid: np.ndarray, config: ml_collections.ConfigDict) -> np.ndarray:
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


def compute_dtype(model_config: ml_collections.ConfigDict) -> jnp.dtype:
    """The text transformer's matmul dtype, ``model_config.dtype``: 'float32' or 'bfloat16';
    'float16' only with ``model_config.allow_float16 = True`` (read only then:
    infodiff/config_usage.py).

    Raises:
      ValueError: one line naming the value: 'float16' without the opt-in (its gradients
        underflow: there is no loss scaling; bfloat16 has float32's exponent range), or any
        other name (e.g. 'int8', 'float64').
    """
    name = str(model_config.dtype)
    if name in ("float32", "bfloat16"):
        return jnp.dtype(name)
    if name == "float16":
        if bool(model_config.get("allow_float16", False)):
            return jnp.dtype(name)
        raise ValueError("config.model.dtype='float16' is refused: without loss scaling (not implemented) small "
                         "gradients underflow in float16; use 'bfloat16', or set config.model.allow_float16=True "
                         "to run float16 anyway")
    raise ValueError(f"config.model.dtype={name!r}; choose 'float32' or 'bfloat16' "
                     "('float16' with config.model.allow_float16=True)")


def score_param(config: ml_collections.ConfigDict) -> str:
    """A SEDD run's ``config.process.score_param`` (default 'direct'); ValueError if unknown."""
    return score_entropy.check_score_param(config.process.get("score_param", "direct"))


def make_transformer(config: ml_collections.ConfigDict) -> Transformer:
    """The text network described by ``config.model`` / ``config.data``.

    ``vocab_size = config.data.vocab_size`` real tokens (the MASK id is ``vocab_size``),
    ``seq_len = config.data.seq_len``, compute dtype :func:`compute_dtype` of ``config.model``
    (parameters, optimiser state, outputs and losses are float32 whatever it is), attention
    ``config.model.attention`` ('einsum', the default, or 'dot_product':
    ``jax.nn.dot_product_attention``; same parameters); output ``log_softmax``, or raw
    ``logits`` for a SEDD run with ``score_param='direct'``.

    Raises:
      ValueError: a dtype :func:`compute_dtype` refuses; unknown attention or score_param.
    """
    m = config.model
    attention = str(m.get("attention", "einsum"))
    if attention not in ATTENTIONS:
        raise ValueError(f"config.model.attention={attention!r}; choose from {ATTENTIONS}")
    output = "log_softmax"
    if process_name(config) == "sedd" and score_param(config) == "direct":
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
        dtype=compute_dtype(m),
        output=output,
        attention=attention,
    )


def schedule_from_config(p: ml_collections.ConfigDict) -> schedules_lib.Schedule:
    """The noise schedule of ``config.process``: ``eps`` for the schedules that take one,
    ``sigma_min`` / ``sigma_max`` for 'geometric' (the other keys are not read:
    infodiff/config_usage.py). ValueError naming an unknown schedule."""
    if str(p.schedule) == "geometric":
        return schedules_lib.get_schedule("geometric", sigma_min=p.get("sigma_min", None),
                                          sigma_max=p.get("sigma_max", None))
    return schedules_lib.get_schedule(p.schedule, eps=p.get("eps", None))


def make_mask_spec(config: ml_collections.ConfigDict) -> masked.MaskSpec:
    """The training objective of a masked run's ``config.process`` as a :class:`masked.MaskSpec`.

    ``exact_boundaries=False``: for ``t_dce`` this is MD4's continuous-time (``finite_T=0``) or
    discrete-time (``finite_T=T``) diffusion loss (MD4 Eq. 5 / Eq. 4); the objectives
    ``k_dce``, ``lambda_dce`` and ``time_free`` ignore it.

    Raises:
      ValueError: not a masked run; unknown objective or schedule, invalid eps / finite_T,
        finite_T > 0 with an objective other than t_dce.
    """
    p = config.process
    if process_name(config) != "masked":
        raise ValueError(f"config.process.name={p.name!r}: a mask spec is for 'masked' runs")
    if int(p.finite_T) > 0 and p.objective != "t_dce":
        # A key this objective does not read is an error, not silence (infodiff/config_usage.py).
        raise ValueError(f"config.process.finite_T={p.finite_T} is read only by objective 't_dce' (MD4's "
                         f"discrete-time ELBO), not by {p.objective!r}: set finite_T=0 or objective='t_dce'")
    return masked.MaskSpec(
        name=p.objective,
        schedule=schedule_from_config(p),
        finite_T=int(p.finite_T),
        # read only where the objective draws a continuous time (infodiff/config_usage.py)
        antithetic=bool(p.antithetic) if p.objective in ("t_dce", "lambda_dce") else False,
        exact_boundaries=False,
    )


def check_sedd_eval_config(config: ml_collections.ConfigDict) -> None:
    """Validate a SEDD run's ``eval.*`` settings up front (training and evaluate.py), so that a
    typo fails in seconds rather than after training or after the whole I-MDSE pass.

    Raises ValueError naming the key and value: eval.estimator != 'imdse', an unknown
    eval.lambda_sampling or eval.sampler, eval.num_samples < 2, eval.sample_steps < 1, an
    unknown process.graph or process.score_param.
    """
    ev = config.eval
    if ev.get("estimator", "imdse") != "imdse":
        raise ValueError(f"config.eval.estimator={ev.estimator!r}: a score-entropy (sedd) model "
                         "is evaluated with 'imdse'")
    ls = ev.get("lambda_sampling", None)
    if ls is not None and ls not in score_entropy.LAMBDA_SAMPLING:
        raise ValueError(f"config.eval.lambda_sampling={ls!r}; choose from {score_entropy.LAMBDA_SAMPLING}")
    if int(ev.get("num_generate", 0)) > 0 and ev.get("sampler", "tweedie") not in ("euler", "tweedie"):
        raise ValueError(f"config.eval.sampler={ev.sampler!r}; choose 'euler' or 'tweedie'")
    if int(ev.get("num_samples", 2)) < 2:
        raise ValueError(f"config.eval.num_samples={ev.num_samples} must be >= 2 to report a standard error")
    if int(ev.get("num_generate", 0)) > 0 and int(ev.get("sample_steps", 1)) < 1:
        raise ValueError(f"config.eval.sample_steps={ev.sample_steps} must be >= 1")
    score_entropy.check_graph(config.process.graph)
    score_param(config)


def synthetic_distribution(config: ml_collections.ConfigDict):
    """The :class:`count_synthetic.CountDistribution` ``config.data.distribution`` truncated at
    ``config.data.max_count``; ValueError naming an unknown distribution."""
    from infodiff.data import count_synthetic as cs  # scipy; imported when needed

    name = str(config.data.distribution)
    if name not in cs.NAMES:
        raise ValueError(f"config.data.distribution={name!r}; choose from {tuple(cs.NAMES)}")
    return cs.get_distribution(name, max_count=int(config.data.max_count))


def oracle_distribution(config: ml_collections.ConfigDict):
    """The law of the Poisson oracle mode (configs/oracle_poisson.py): the pmf file
    ``data.path`` ({count: probability}, :func:`count_synthetic.load_pmf`) or the built-in
    ``data.distribution`` ('' = 'zip'); ``data.max_count`` 0 = the law's own (50 for a built-in
    law, the largest count of a file). ValueError when both a file and a name are given."""
    from infodiff.data import count_synthetic as cs

    d = config.data
    path, name, K = str(d.path), str(d.distribution), int(d.max_count)
    if path and name:
        raise ValueError(f"config.data.path={path!r} and config.data.distribution={name!r}: give one "
                         "(a pmf file or a built-in law), not both")
    if path:
        return cs.load_pmf(path, max_count=K)
    name = name or "zip"
    if name not in cs.NAMES:
        raise ValueError(f"config.data.distribution={name!r}; choose from {tuple(cs.NAMES)}")
    return cs.get_distribution(name, max_count=K or 50)


def synthetic_dim(config: ml_collections.ConfigDict, dist) -> int:
    """Coordinates per example: data.dim iid copies of a 1-D law, or the law's own D (2-D laws)."""
    return int(config.data.dim) if dist.dim == 1 else int(dist.dim)


def synthetic_sample(config: ml_collections.ConfigDict, dist, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` examples of the synthetic law: int64 [n, D] (D = :func:`synthetic_dim`)."""
    if dist.dim == 1:
        return np.asarray(dist.sample(rng, n, dim=int(config.data.dim)), np.int64).reshape(n, -1)
    return np.asarray(dist.sample(rng, n), np.int64).reshape(n, dist.dim)


def synthetic_entropy(config, dist) -> float:
    """Exact entropy in nats per example (data.dim x the 1-D entropy for iid copies)."""
    return float(dist.entropy) * (int(config.data.dim) if dist.dim == 1 else 1)


def synthetic_w1(config, dist, gen_NxD: np.ndarray, seed: int) -> dict:
    """Wasserstein-1 of generated samples to the true law, and its sampling-noise floor.

    1-D laws: exact W1 between each coordinate's empirical law and the true pmf
    (scipy.stats.wasserstein_distance with the pmf as weights), averaged over coordinates;
    ``w1_noise_floor`` = mean W1 of 5 exact samples of the same size (what a perfect sampler gets).
    2-D laws: ``count_synthetic.wasserstein1`` (exact optimal assignment, Euclidean) between up to
    3,000 generated samples and as many fresh samples of the law; ``w1_noise_floor`` is the same
    distance between two independent true samples of that size."""
    import scipy.stats

    from infodiff.data import count_synthetic as cs

    if dist.dim == 1:
        sup, pr = np.asarray(dist.support, np.float64)[:, 0], np.asarray(dist.probs, np.float64)
        w = [float(scipy.stats.wasserstein_distance(gen_NxD[:, d].astype(np.float64), sup, None, pr))
             for d in range(gen_NxD.shape[1])]
        rng = np.random.default_rng(seed)
        floor = [float(scipy.stats.wasserstein_distance(
            np.asarray(dist.sample(rng, len(gen_NxD)), np.float64).reshape(-1), sup, None, pr)) for _ in range(5)]
        return {"wasserstein1": float(np.mean(w)), "w1_noise_floor": float(np.mean(floor)),
                "w1_kind": "exact vs pmf, mean over coordinates; floor = mean W1 of 5 exact samples "
                           "of the same size"}
    n = min(3000, len(gen_NxD))
    rng = np.random.default_rng(seed)
    ref, ref2 = (synthetic_sample(config, dist, rng, n) for _ in range(2))
    return {"wasserstein1": float(cs.wasserstein1(gen_NxD[:n], ref)),
            "w1_noise_floor": float(cs.wasserstein1(ref2, ref)),
            "w1_kind": f"exact assignment vs {n} true samples"}


def load_count_data(config: ml_collections.ConfigDict) -> counts_lib.CountDataset:
    """The count data of ``config.data`` as a :class:`counts.CountDataset`.

    ``data.name``: ``'digits'``, ``'fashion_mnist'``, ``'randhie'``, ``'chorales'`` (window
    ``data.window``) or ``'synthetic'``: ``data.dim`` independent coordinates drawn from
    ``count_synthetic.get_distribution(data.distribution)`` with ``np.random.default_rng(
    [data.seed, i])`` for split i (train / valid / test sizes ``data.num_train / num_valid /
    num_test``); ``max_count`` is the largest support point.

    Raises: ValueError for an unknown data name or distribution.
    """
    d = config.data
    name = str(d.name)
    if name == "synthetic":
        dist = synthetic_distribution(config)
        dim = synthetic_dim(config, dist)
        sizes = (int(d.num_train), int(d.num_valid), int(d.num_test))
        splits = {}
        for i, (k, n) in enumerate(zip(counts_lib.SPLIT_NAMES, sizes)):
            rng = np.random.default_rng([int(d.seed), i])
            splits[k] = synthetic_sample(config, dist, rng, n).astype(np.int32)
        return counts_lib.make_dataset(f"synthetic:{d.distribution}", splits, (dim,), int(dist.max_count),
                                       f"{d.distribution} truncated at {dist.max_count}, {dim} coordinates, "
                                       f"seed {d.seed}")
    if name in ("digits", "fashion_mnist", "randhie"):
        return counts_lib.load_counts(name, d.cache_dir or None)
    if name == "chorales":
        return counts_lib.load_chorales(d.path or None, window=int(d.window))
    raise ValueError(f"config.data.name={name!r}; choose from {counts_lib.NAMES + ('synthetic',)}")


def make_scaling(config: ml_collections.ConfigDict, data: counts_lib.CountDataset) -> poisson.CountScaling:
    """``CountScaling(data.max_count, data.low, data.high)`` (default [1, 2], docs/poisson.md §1)."""
    return poisson.CountScaling(int(data.max_count), float(config.data.low), float(config.data.high))


def make_count_model(config: ml_collections.ConfigDict, data: counts_lib.CountDataset,
                     scaling: poisson.CountScaling):
    """The network of ``config.model`` (``arch`` 'mlp' | 'conv' | 'seqconv', ``head``, sizes)."""
    m = config.model
    kw = dict(head=str(m.head), emb_dim=int(m.emb_dim))
    if m.arch == "mlp":
        kw.update(hidden=int(m.hidden), num_layers=int(m.num_layers))
    else:
        kw.update(channels=int(m.channels), num_blocks=int(m.num_blocks))
    return cd.make_count_model(str(m.arch), data.event_shape, scaling.lattice(), scaling.low,
                               scaling.high, **kw)


def poisson_proposal(config: ml_collections.ConfigDict, train_scaled_NxD: np.ndarray,
                     scaling: poisson.CountScaling, section: str = "process") -> tuple[float, float, float]:
    """(loc, scale, clip) of the truncated-logistic log-SNR proposal of ``config.<section>``.

    ``proposal='paper'``: ItDPDM's (-1, 5, 4) (App. B.2); ``'auto'``:
    :func:`poisson.suggest_logistic` (recipe 'v2', chosen by the exact per-draw variance and
    tail weight, docs/poisson.md §3.5) on (at most 20,000 rows of) the scaled training data;
    ``'auto_v1'``: the same with the previous recipe 'v1' (older results);
    ``'manual'``: ``loc, scale, clip`` from the section. Raises ValueError otherwise.
    """
    s = config[section]
    kind = str(s.proposal)
    if kind == "paper":
        return -1.0, 5.0, 4.0
    if kind in ("auto", "auto_v1"):
        x = train_scaled_NxD[: 20000]
        recipe = "v1" if kind == "auto_v1" else "v2"
        return tuple(float(v) for v in poisson.suggest_logistic(x, scaling.spacing, recipe=recipe))
    if kind == "manual":
        return float(s.loc), float(s.scale), float(s.clip)
    raise ValueError(f"config.{section}.proposal={kind!r}; choose 'paper', 'auto', 'auto_v1' or 'manual'")


def empirical_prior_logits(train_NxD: np.ndarray, num_levels: int, pseudo: float = 0.5) -> np.ndarray:
    """float32 [D, K] log of the per-coordinate histogram of the training counts (+ ``pseudo``).

    Used to initialise the categorical head's ``prior_logits`` so the denoiser starts at the
    exact posterior mean of the independent-marginals model."""
    x = np.asarray(train_NxD, np.int64)
    D = x.shape[1]
    flat = (np.arange(D)[None, :] * num_levels + x).reshape(-1)
    h = np.bincount(flat, minlength=D * num_levels).reshape(D, num_levels) + float(pseudo)
    return np.log(h / h.sum(1, keepdims=True)).astype(np.float32)


def check_counts(arr: np.ndarray, max_count: int, name: str) -> None:
    """Raise ValueError naming the first value (and its index) that is not a count in
    [0, max_count]."""
    poisson.validate_counts(arr, name)
    if arr.size and arr.max() > max_count:
        idx = tuple(int(i) for i in np.argwhere(arr > max_count)[0])
        raise ValueError(f"{name}{list(idx)} = {arr[idx]} exceeds max_count = {max_count}")


# ---------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------
class Task:
    """What :func:`infodiff.training.train` trains (build with :func:`make_task`).

    Attributes:
      config: the run's config.
      name: the process ('masked' | 'sedd' | 'poisson').
      model: the flax module.
      data: the corpus / count data set (loaded on first use).
      dim: L or D, the per-example size that ``loss_fn`` and ``metrics`` divide by.
      metric: 'bpc' or 'bpd' (bits per character / dimension).
      rate_name, items_per_step: the throughput logged (``tokens_per_s`` with B L tokens per step,
        or ``examples_per_s`` with B examples).
    """

    name: str
    metric: str
    rate_name: str
    model: Any

    def __init__(self, config: ml_collections.ConfigDict, data: Any = None):
        self.config = config
        self._data = data

    # ---- the network ----
    def init_params(self, key: jax.Array) -> Any:
        """Fresh parameters of ``model`` (jit-able; deterministic in ``key``)."""
        raise NotImplementedError

    def network(self, params: Any, key: jax.Array, train: bool) -> tuple[jax.Array, ApplyFn]:
        """``(loss_key, apply_fn)``: the network as ``apply_fn(z, t) -> output`` with ``params``
        (train mode: dropout from a key split off ``key``) and the key left for ``loss_B``."""
        raise NotImplementedError

    def denoiser(self, params: Any):
        """The eval-mode denoiser / score model with ``params`` that the estimators use."""
        raise NotImplementedError

    # ---- the loss ----
    def loss_B(self, apply_fn: ApplyFn, batch: jax.Array, key: jax.Array, *, train: bool) -> jax.Array:
        """Per-example one-sample Monte Carlo loss, float32 [B] nats (the process integrand)."""
        raise NotImplementedError

    def loss_fn(self, params: Any, batch: jax.Array, key: jax.Array, train: bool) -> tuple[jax.Array, jax.Array]:
        """``(mean_b loss_B / dim, loss_B)``: the differentiated scalar (nats per token / dim)
        and the per-example losses (float32 [B], nats). Not jitted."""
        loss_key, apply_fn = self.network(params, key, train)
        loss_B = self.loss_B(apply_fn, batch, loss_key, train=train)
        return jnp.mean(loss_B) / batch.shape[1], loss_B

    def metrics(self, loss_B: jax.Array) -> dict:
        """``{'loss': mean nats per example, metric: loss / (dim ln 2)}`` (float32 scalars)."""
        loss = jnp.mean(loss_B)
        return {"loss": loss, self.metric: loss / (self.dim * _LN2)}

    # ---- data ----
    @property
    def batch_size(self) -> int:
        return int(self.config.train.batch_size)

    def check_data(self) -> None:
        """ValueError naming the first invalid value of the training / validation data."""
        raise NotImplementedError

    def train_batch(self, step: int, rows: slice = slice(None)) -> np.ndarray:
        """The training batch of ``step``, a pure function of ``(config.seed, step)``, or only its
        ``rows`` (one process's share; only those are read)."""
        raise NotImplementedError

    def valid_batches(self) -> np.ndarray:
        """Fixed validation batches [nb, B, ...] spread over the validation split."""
        raise NotImplementedError

    def meta(self) -> dict:
        """Checkpoint metadata of the task: ``data`` (name, checksums) and extras."""
        return {"data": {"name": str(self.data.name), "checksums": dict(self.data.checksums)}}

    def result_extras(self) -> dict:
        """Task-specific entries of :func:`training.train`'s result."""
        return {}

    # ---- log lines: (format, *args) ----
    def start_log(self, num_params: int, mesh, start_step: int, end_step: int) -> tuple:
        raise NotImplementedError

    def train_log(self, step: int, num_steps: int, avg: dict, eta: float) -> tuple:
        raise NotImplementedError

    def valid_log(self, step: int, out: dict) -> tuple:
        raise NotImplementedError

    def progress_postfix(self, avg: dict) -> dict:
        """What the tqdm bar shows after the step count."""
        return {self.metric: f"{avg[self.metric]:.4f}"}


    # ---- evaluation (infodiff.evaluation.run) ----
    def check_eval_config(self) -> None:
        """ValueError naming an invalid ``eval.*`` value, before any work."""
        ev = self.config.eval
        if int(ev.num_samples) < 2:
            raise ValueError(f"config.eval.num_samples={ev.num_samples} must be >= 2 to report a standard error")
        if "batch_size" in ev and int(ev.batch_size) < 1:
            raise ValueError(f"config.eval.batch_size={ev.batch_size} must be >= 1 (rows per denoiser call)")
        if int(ev.get("num_generate", 0)) < 0:
            raise ValueError(f"config.eval.num_generate={ev.num_generate} must be >= 0")
        if int(ev.get("num_generate", 0)) > 0 and int(ev.get("sample_steps", 1)) < 1:
            raise ValueError(f"config.eval.sample_steps={ev.sample_steps} must be >= 1")
        for key in ("max_sequences", "max_examples"):
            if key in ev and int(ev[key]) < 0:
                raise ValueError(f"config.eval.{key}={ev[key]} must be >= 0 (0: the whole split)")

    def eval_keys(self, seed: int) -> tuple:
        """(likelihood key, sampling key) of ``eval.seed``."""
        return jax.random.PRNGKey(seed), jax.random.PRNGKey(seed + 1)

    def eval_items(self) -> tuple:
        """``(x, data_info, subset)``: the items of ``eval.split`` the likelihood is estimated on,
        a dict describing them for the report, and whether they are a random subset."""
        raise NotImplementedError

    def estimation_process(self, key=None):
        """The Process whose Monte Carlo estimate is reported (``eval.*`` settings)."""
        raise NotImplementedError

    def process_info(self, process) -> dict:
        """The report's ``process`` entry."""
        return {"name": self.name, "estimator": process.estimator}

    units: dict = {}

    @property
    def train_loss_is_nll(self) -> bool:
        """Whether the training ``loss`` in metrics.jsonl is in nats per item like the validation
        loss; False for a training weighting that is not a likelihood (training curves say so)."""
        return True

    @property
    def uniform_nll(self) -> float | None:
        """NLL (nats per example) of the uniform distribution over the data's support: the
        reference of the divergence guard and of the report's warning (None: no finite support)."""
        return None

    # Whether a healthy run's loss stays within a small multiple of the larger of the uniform
    # model's and the untrained network's (the divergence guard's loss rule, training/guard.py).
    loss_is_bounded = True

    def generate(self, denoiser, key) -> dict:
        """``eval.num_generate`` samples: ``{'samples' (JSON list), 'array', 'sampler',
        'sample_steps'}`` or {}."""
        return {}

    def eval_extras(self, est, x, generated: dict, workdir: str) -> tuple[dict, list]:
        """(extra report entries, paths of the plots written)."""
        return {}, []


class _TextTask(Task):
    """Shared by the masked and SEDD tasks: a transformer on character text."""

    metric = "bpc"
    rate_name = "tokens_per_s"

    def __init__(self, config, data=None):
        super().__init__(config, data)
        self.model = make_transformer(config)
        self.seq_len = int(config.data.seq_len)
        self.vocab_size = int(config.data.vocab_size)

    @functools.cached_property
    def data(self):
        return load_text_corpus(self.config) if self._data is None else self._data

    @property
    def dim(self) -> int:
        return self.seq_len

    @property
    def items_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def uniform_nll(self) -> float:
        """``L ln V`` nats per sequence."""
        return self.seq_len * math.log(self.vocab_size)

    def init_params(self, key):
        z_1xL = jnp.zeros((1, self.seq_len), jnp.int32)
        t_1 = jnp.zeros((1,), jnp.float32)
        return self.model.init(key, z_1xL, t_1)["params"]

    def network(self, params, key, train):
        model = self.model
        if train:
            k_loss, k_drop = jax.random.split(key)
            return k_loss, lambda z, t: model.apply({"params": params}, z, t, train=True, rngs={"dropout": k_drop})
        return key, lambda z, t: model.apply({"params": params}, z, t, train=False)

    def check_data(self):
        corpus, V, L = self.data, self.vocab_size, self.seq_len
        validate_token_stream(corpus.train, V, "training data (corpus.train)")
        validate_token_stream(corpus.valid, V, "validation data (corpus.valid)")
        if len(corpus.train) < L:
            raise ValueError(f"training split has {len(corpus.train)} tokens < seq_len={L}")

    def train_batch(self, step, rows=slice(None)):
        c = self.config
        return text_data.train_batch(self.data.train, self.seq_len, self.batch_size, int(c.seed), step,
                                     aligned=bool(c.data.get("aligned", False)), rows=rows)

    def valid_batches(self):
        return _text_valid_batches(self.data.valid, self.config)

    @property
    def objective(self) -> str:
        raise NotImplementedError

    def start_log(self, num_params, mesh, start_step, end_step):
        return ("model: %d params, %d devices (%s), batch %d x %d, steps %d -> %d, objective %s",
                num_params, mesh.devices.size, mesh.devices.flat[0].platform, self.batch_size,
                self.seq_len, start_step, end_step, self.objective)

    def train_log(self, step, num_steps, avg, eta):
        return ("step %d/%d: loss %.3f nats/seq, bpc %.4f, grad_norm %.3f, lr %.2e, "
                "%.0f tokens/s, %.2f steps/s, ETA %.0fs",
                step, num_steps, avg["loss"], avg["bpc"], avg["grad_norm"], avg["lr"],
                avg["tokens_per_s"], avg["steps_per_s"], eta)

    def valid_log(self, step, out):
        return "step %d valid (EMA): loss %.4f nats/seq, bpc %.4f", step, out["loss"], out["bpc"]

    def progress_postfix(self, avg):
        return {"bpc": f"{avg['bpc']:.3f}"}


    @property
    def units(self):
        return {"item": "sequence", "nll": "nats per sequence", "bits": "bits per character",
                "tokens_per_item": self.seq_len}

    @property
    def schedule_obj(self):
        p = self.config.process
        return schedule_from_config(p)

    def eval_items(self):
        ev = self.config.eval
        if int(ev.max_sequences) < 0:
            raise ValueError(f"config.eval.max_sequences={ev.max_sequences} must be >= 0 (0: the whole split)")
        corpus, L = self.data, self.seq_len
        chunks = text_data.eval_chunks(corpus.split(ev.split), L)
        total = len(chunks)
        subset = bool(ev.max_sequences) and int(ev.max_sequences) < total
        if subset:
            rng = np.random.default_rng(ev.seed)
            chunks = chunks[np.sort(rng.choice(total, int(ev.max_sequences), replace=False))]
        info = {"name": corpus.name, "split": str(ev.split),
                "checksum": corpus.checksums.get("valid" if ev.split in ("valid", "validation") else ev.split),
                "item_size": L, "num_items": int(len(chunks)), "total_items": int(total),
                "unigram_entropy_bits_per_char": text_data.unigram_entropy_bits(corpus.train)}
        return chunks, info, subset

    def _decoded(self, gen, sampler, steps):
        return {"samples": [text_data.decode(np.asarray(row)) for row in gen], "array": np.asarray(gen),
                "sampler": sampler, "sample_steps": steps}


class MaskedTask(_TextTask):
    """Masked (absorbing) diffusion on text: the DCE objective ``config.process.objective``
    (:func:`make_mask_spec`); an unbiased estimate of (or, for continuous ``t_dce``, a bound on)
    -log p(x) in nats per sequence. ``denoiser``: :class:`Denoiser`."""

    name = "masked"

    def __init__(self, config, data=None):
        super().__init__(config, data)
        self.spec = make_mask_spec(config)
        if self.spec.name not in masked.OBJECTIVES:
            raise ValueError(f"config.process.objective={self.spec.name!r} is an estimator, not a "
                             f"training objective; choose from {masked.OBJECTIVES}")
        self.process = masked.MaskedProcess(self.spec, self.vocab_size)

    @property
    def objective(self):
        return str(self.config.process.objective)

    def loss_B(self, apply_fn, batch, key, *, train):
        return base.training_loss(self.process, NoParams(apply_fn), None, batch, key)

    def denoiser(self, params):
        return Denoiser(model=self.model, params=params)


    def check_eval_config(self):
        super().check_eval_config()
        if self.config.eval.estimator not in masked.ESTIMATORS:
            raise ValueError(f"config.eval.estimator={self.config.eval.estimator!r}; choose from {masked.ESTIMATORS}")

    def estimation_process(self, key=None):
        from infodiff import likelihood

        return likelihood.masked_process(str(self.config.eval.estimator), self.schedule_obj, self.vocab_size)

    def process_info(self, process):
        p = self.config.process
        return {"name": "masked", "schedule": p.schedule, "eps": p.get("eps", None),
                "objective": str(p.objective)}

    def generate(self, denoiser, key):
        ev = self.config.eval
        n_gen, L = int(ev.get("num_generate", 4)), self.seq_len
        if n_gen <= 0:
            return {}
        sched, steps, V = self.schedule_obj, int(ev.get("sample_steps", L)), self.vocab_size

        @jax.jit
        def run(params, key):
            den = lambda z, t: denoiser.apply_params(params, z, t)  # noqa: E731
            return masked.ancestral_sample(den, key, n_gen, L, V, sched, steps)

        return self._decoded(run(denoiser.params, key), "MD4 ancestral sampler", steps)


class SeddTask(_TextTask):
    """Score-entropy discrete diffusion (SEDD) on text, graph ``config.process.graph``.

    Loss: SEDD's continuous-time DSE objective per sequence, ``t ~ U[0, 1)`` (antithetic
    across the batch if ``process.antithetic``), lam = lambda(t), z ~ p_{lam|0}(. | x),
    loss = sigma(t) * score_entropy (= l_DSE, SEDD Eq. 3 / docs/discrete_diffusion.md §3.1): an unbiased estimate of
    ``int_0^1 DSE dt``, the diffusion term of the I-MDSE bound (the prior KL is not included).
    The network is conditioned on lam. ``denoiser``: :class:`ScoreModel`. The ``eval.*``
    settings are validated at construction (:func:`check_sedd_eval_config`).
    """

    name = "sedd"

    def __init__(self, config, data=None):
        check_sedd_eval_config(config)
        super().__init__(config, data)
        p = config.process
        self.graph = score_entropy.check_graph(p.graph)
        self.score_param = score_param(config)
        self.schedule = schedule_from_config(p)
        self.antithetic = bool(p.get("antithetic", True))
        # SEDD's objective: t ~ U[0, 1) (antithetic), weight sigma(t) (SEDD Eq. 3).
        self.process = score_entropy.ScoreEntropyProcess(
            graph=self.graph, vocab_size=self.vocab_size, noise_law="time", schedule=self.schedule,
            antithetic=self.antithetic, clean_prefix_prob=float(p.get("clean_prefix_prob", 0.0)))

    @property
    def objective(self):
        return f"sedd:{self.graph}"

    def loss_B(self, apply_fn, batch, key, *, train):
        graph, sp = self.graph, self.score_param

        def log_score(params, z, lam):
            del params
            return score_entropy.log_score_from_output(graph, sp, apply_fn(z, lam), z, lam)

        return base.training_loss(self.process, log_score, None, batch, key)

    def denoiser(self, params):
        return ScoreModel(model=self.model, params=params, graph=self.graph, score_param=self.score_param)


    def check_eval_config(self):
        check_sedd_eval_config(self.config)
        super().check_eval_config()

    def estimation_process(self, key=None):
        ls = self.config.eval.get("lambda_sampling", None) or score_entropy.DEFAULT_LAMBDA_SAMPLING[self.graph]
        return score_entropy.ScoreEntropyProcess(graph=self.graph, vocab_size=self.vocab_size, noise_law=ls,
                                                 lam_max=self.schedule_obj.lambda_max)

    def process_info(self, process):
        return {"name": "sedd", "graph": self.graph, "score_param": self.score_param,
                "lambda_sampling": process.noise_law, "lam_max": process.lam_max}

    def generate(self, denoiser, key):
        ev = self.config.eval
        n_gen, L = int(ev.get("num_generate", 4)), self.seq_len
        if n_gen <= 0:
            return {}
        steps, method = int(ev.get("sample_steps", L)), ev.get("sampler", "tweedie")
        gen = score_entropy.sample(denoiser, self.graph, key, n_gen, L, self.vocab_size, steps,
                                   method=method, lam_max=self.schedule_obj.lambda_max)
        return self._decoded(gen, f"SEDD {method} sampler", steps)


class PoissonTask(Task):
    """Poisson diffusion (ItDPDM, arXiv 2505.05082) on count data.

    Loss per example (docs/poisson.md §3.2-3.3): ``e^alpha / q(alpha) sum_d l(x_d, xhat(z, alpha))`` on the
    scaled counts (:func:`make_scaling`), ``alpha`` from the truncated-logistic proposal
    (:func:`poisson_proposal`), ``process.weighting`` 'likelihood' (training) — 'paper' drops
    the gamma factor (ItDPDM Alg. 1; not a likelihood). Validation always uses likelihood
    weighting. With a categorical head and ``model.init_prior`` the ``prior_logits`` start at
    the training marginals (:func:`empirical_prior_logits`). ``denoiser``:
    :class:`count_denoisers.CountDenoiser`.
    """

    name = "poisson"
    metric = "bpd"
    rate_name = "examples_per_s"
    # The Poisson ELBO of a young network can sit 40x above its untrained value and 10^4-10^6x
    # above the uniform model's on a healthy run (softplus head): no loss rule, finiteness only.
    loss_is_bounded = False

    @functools.cached_property
    def data(self) -> counts_lib.CountDataset:
        return load_count_data(self.config) if self._data is None else self._data

    @functools.cached_property
    def scaling(self) -> poisson.CountScaling:
        return make_scaling(self.config, self.data)

    @functools.cached_property
    def model(self):
        return make_count_model(self.config, self.data, self.scaling)

    @functools.cached_property
    def _train_NxD(self) -> np.ndarray:
        return self.data.flat("train")

    @functools.cached_property
    def proposal(self) -> tuple[float, float, float]:
        """(loc, scale, clip) of the training log-SNR proposal."""
        return poisson_proposal(self.config, self.scaling.scale(self._train_NxD), self.scaling)

    @functools.cached_property
    def _prior_logits(self) -> np.ndarray | None:
        m = self.config.model
        if m.head == "categorical" and bool(m.init_prior):
            return empirical_prior_logits(self._train_NxD, self.data.max_count + 1)
        return None

    @property
    def dim(self) -> int:
        return self.data.dim

    @property
    def items_per_step(self) -> int:
        return self.batch_size

    @property
    def uniform_nll(self) -> float:
        """``D ln(K + 1)`` nats per example (counts 0..K, ``data.max_count``)."""
        return self.dim * math.log(self.data.max_count + 1)

    def init_params(self, key):
        D = self.dim
        params = self.model.init(key, jnp.zeros((1, D), jnp.float32), jnp.zeros((1,), jnp.float32))["params"]
        if self._prior_logits is not None:
            params = dict(params, prior_logits=jnp.asarray(self._prior_logits))
        return params

    def network(self, params, key, train):
        model = self.model
        return key, lambda z, a: model.apply({"params": params}, z.astype(jnp.float32), a)

    def loss_B(self, apply_fn, batch, key, *, train):
        loc, scale, clip = self.proposal
        weighting = str(self.config.process.weighting) if train else "likelihood"
        process = poisson.PoissonProcess(loc=loc, scale=scale, clip=clip, weighting=weighting)
        return base.training_loss(process, NoParams(apply_fn), None, self.scaling.scale(batch), key)

    def denoiser(self, params):
        return cd.CountDenoiser(self.model, params)

    def check_data(self):
        check_counts(self._train_NxD, self.data.max_count, "training data")
        check_counts(self.data.flat("valid"), self.data.max_count, "validation data")
        self.proposal  # noqa: B018  (a bad process.proposal fails here, before any work)

    def train_batch(self, step, rows=slice(None)):
        idx = counts_lib.batch_iterator_indices(len(self._train_NxD), self.batch_size, int(self.config.seed), step)
        return self._train_NxD[idx[rows]]

    def valid_batches(self):
        valid_NxD, B = self.data.flat("valid"), self.batch_size
        if len(valid_NxD) < B:
            raise ValueError(f"validation split has {len(valid_NxD)} examples < batch_size {B}")
        nb = max(1, min(int(self.config.train.eval_batches), len(valid_NxD) // B))
        vidx = np.linspace(0, len(valid_NxD) - 1, nb * B).round().astype(np.int64)
        return valid_NxD[vidx].reshape(nb, B, self.dim)

    def meta(self):
        return dict(super().meta(), proposal=list(self.proposal))

    def result_extras(self):
        return {"proposal": list(self.proposal)}

    def start_log(self, num_params, mesh, start_step, end_step):
        return ("poisson %s: %d params, D=%d, K=%d levels, batch %d, steps %d -> %d, "
                "proposal (loc, scale, clip) = (%.2f, %.2f, %.2f), %s",
                self.data.name, num_params, self.dim, self.data.max_count + 1, self.batch_size,
                start_step, end_step, *self.proposal, mesh.devices.flat[0].platform)

    @property
    def train_loss_is_nll(self):
        return str(self.config.process.weighting) == "likelihood"  # 'paper': ItDPDM Alg. 1

    def train_log(self, step, num_steps, avg, eta):
        if self.train_loss_is_nll:
            return ("step %d/%d: loss %.4f nats/example, %.4f bits/dim, grad_norm %.3f, lr %.2e, "
                    "%.1f steps/s, ETA %.0fs", step, num_steps, avg["loss"], avg["bpd"],
                    avg["grad_norm"], avg["lr"], avg["steps_per_s"], eta)
        # ItDPDM Alg. 1 weighting (no gamma factor): not a likelihood
        return ("step %d/%d: loss %.4f (paper weighting: NOT nats; see valid), grad_norm %.3f, "
                "lr %.2e, %.1f steps/s, ETA %.0fs", step, num_steps, avg["loss"], avg["grad_norm"],
                avg["lr"], avg["steps_per_s"], eta)

    def valid_log(self, step, out):
        return "step %d valid (EMA): loss %.4f nats/example, %.4f bits/dim", step, out["loss"], out["bpd"]


    @property
    def units(self):
        return {"item": "example", "nll": "nats per example", "bits": "bits per dimension",
                "tokens_per_item": self.dim}

    def eval_keys(self, seed):
        key = jax.random.key(seed)
        return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)

    def eval_items(self):
        ev, data = self.config.eval, self.data
        split = data.flat(str(ev.split))
        check_counts(split, data.max_count, f"{ev.split} data")
        total = len(split)
        subset = int(ev.max_examples) > 0 and int(ev.max_examples) < total
        if subset:
            rng = np.random.default_rng(int(ev.seed))
            split = split[np.sort(rng.choice(total, int(ev.max_examples), replace=False))]
        self._eval_counts = split
        info = {"name": data.name, "split": str(ev.split),
                "checksum": data.checksums.get("valid" if ev.split in ("valid", "validation") else str(ev.split)),
                "event_shape": list(data.event_shape), "item_size": data.dim, "max_count": data.max_count,
                "num_items": int(len(split)), "total_items": int(total),
                "scaling": [self.scaling.low, self.scaling.high]}
        return self.scaling.scale(split), info, subset

    def estimation_process(self, key=None):
        ev = self.config.eval
        section = "eval" if str(ev.proposal) != "train" else "process"
        prop = poisson_proposal(self.config, self.scaling.scale(self._train_NxD), self.scaling, section)
        return poisson_estimation_process(self.config, self.scaling, prop, key)

    def process_info(self, process):
        ev = self.config.eval
        return {"name": "poisson", "sampler": process.sampler, "proposal": [process.loc, process.scale, process.clip],
                "se_method": process.se_method, "channel_defensive": process.z_defensive, "high_snr_guard": str(ev.high_snr_guard) or None, "alpha_lo": process.alpha_lo,
                "alpha_top": process.alpha_top, "recon_included": process.scaling is not None}

    def generate(self, denoiser, key):
        ev = self.config.eval
        n_gen = int(ev.num_generate)
        if n_gen <= 0:
            return {}
        gmax = float(ev.gamma_max) or 64.0 * self.scaling.high / self.scaling.spacing**2
        gammas = poisson.log_spaced_gammas(float(ev.gamma_min), gmax, int(ev.sample_steps))
        gen = poisson.increment_sampler(denoiser, key, n_gen, self.dim, gammas, self.scaling,
                                        decision=str(ev.decision))
        return {"samples": gen[:min(n_gen, 16)].tolist(), "array": gen, "sampler": "increment",
                "sample_steps": int(ev.sample_steps), "gamma_range": [float(gammas[0]), float(gammas[-1])]}

    def eval_extras(self, est, x, generated, workdir):
        from infodiff.evaluation import plots

        data, ev = self.data, self.config.eval
        extras, paths = {}, []
        dist = None
        if data.name.startswith("synthetic"):
            dist = synthetic_distribution(self.config)
            counts = self._eval_counts
            h = synthetic_entropy(self.config, dist)
            if dist.dim == 1:
                exact = -np.sum([dist.log_prob(counts[:, j]) for j in range(counts.shape[1])], axis=0)
            else:
                exact = -dist.log_prob(counts)
            gap = est.mean - exact  # paired: model NLL(x) - (-log p(x)) on the same examples
            extras.update(exact_entropy_nats_per_example=h, exact_entropy_bits_per_dim=h / (data.dim * _LN2),
                          truncated_mass=float(dist.truncated_mass), test_exact_nll_nats=float(exact.mean()),
                          gap_paired_nats=float(gap.mean()),
                          gap_paired_stderr=float(gap.std(ddof=1) / math.sqrt(len(gap))))
        gen = generated.get("array")
        if gen is not None:
            if dist is not None:
                extras.update(synthetic_w1(self.config, dist, gen, int(ev.seed) + 7))
                extras["num_generated"] = int(len(gen))
            else:
                extras["generated_mean_count"] = float(gen.mean())
                extras["test_mean_count"] = float(data.flat("test").mean())
            png = os.path.join(workdir, "samples.png")
            plots.count_samples_png(png, data, gen if dist is not None or data.name == "randhie" else gen[:32], dist)
            paths.append(png)
        return extras, paths

def poisson_estimation_process(config, scaling, prop, key=None):
    """The :class:`poisson.PoissonProcess` of ``config.eval`` (sampler, guard) with proposal
    ``prop`` = (loc, scale, clip); a 'qmc' offset is drawn from ``key`` as
    :func:`likelihood.poisson_nll` does."""
    ev = config.eval
    guard = str(ev.high_snr_guard) or None
    eps_z = float(ev.get("channel_defensive", 0.0))
    offset = 0.5
    if str(ev.sampler) == "qmc" and key is not None:
        offset = float(jax.random.uniform(jax.random.fold_in(key, 2), ()))
    return poisson.estimation_process(int(ev.num_samples), str(ev.sampler), *prop, high_snr_guard=guard,
                                      alpha_guard=(float(ev.alpha_guard) if guard else None),
                                      scaling=scaling, qmc_offset=offset,
                                      channel_defensive=eps_z,
                                      channel_shift=float(ev.get("channel_shift", 2.0)) if eps_z > 0 else 2.0)


def oracle_case(config):
    """The exact-oracle case of an oracle config (``eval.mode='oracle'``):
    :class:`infodiff.evaluation.oracle_cases.OracleCase`."""
    import sys

    from infodiff.evaluation import oracle_cases

    name = process_name(config)
    if name == "poisson":
        return oracle_cases.poisson_case(config, sys.modules[__name__])
    p = config.process
    return oracle_cases.text_case(config, schedule_from_config(p), name)


def make_task(config: ml_collections.ConfigDict, *, data: Any = None) -> Task:
    """The task of ``config`` (``config.process.name``: 'masked', 'sedd' or 'poisson').

    Args:
      config: a run config (``configs/masked_text.py``, ``sedd_*_text.py``, ``poisson_*.py``).
      data: optional data overriding the config's: a text corpus (``.train``, ``.valid``,
        ``.name``, ``.checksums``) for masked / SEDD, a :class:`counts.CountDataset` for Poisson.
        Loaded from the config on first use otherwise.

    Raises:
      ValueError: unknown process name; invalid process / model / (SEDD) eval settings, naming
        the key.
    """
    if str(config.get("eval", {}).get("mode", "network")) == "oracle":
        raise ValueError("this is an oracle config (eval.mode='oracle'): nothing is trained; run "
                         "`python evaluate.py --config <it>`")
    name = process_name(config)
    if name == "masked":
        return MaskedTask(config, data)
    if name == "sedd":
        return SeddTask(config, data)
    return PoissonTask(config, data)
