"""Tasks: what is trained and evaluated, built from a config through the process registry.

Each process registers one :class:`Registration` (``tasks/masked.py``, ``tasks/sedd.py``,
``tasks/poisson.py``; shared text parts in ``tasks/text.py``): its :class:`Task` class (network,
loss, data stream, eval-mode denoiser, eval extras, report fields), the config keys it reads only
under a condition, its oracle case builder and the user files it scores. :data:`REGISTRY` maps
``config.process.name`` to the registration; :func:`registration` is the only reader of that
key, and nothing else compares process names.

A :class:`Task` bundles everything :func:`infodiff.training.train` needs that depends on the
process and the data: the network (``model``, ``init_params``), the loss (``loss_fn``, whose
per-example part is the one small method ``loss_B``), the metrics, the deterministic training
stream and fixed validation batches, data validation, checkpoint metadata, log lines, and
``denoiser(params)``: the eval-mode object the likelihood estimators use.

Every loss is a one-sample Monte Carlo estimate per example (nats per sequence / example); the
differentiated scalar is ``mean_b loss_b / L`` (or ``/ D``): nats per token / dimension, so
``optim.grad_clip`` means the same at every size. Metrics: ``loss`` (nats per example) and
``bpc = loss / (L ln 2)`` or ``bpd = loss / (D ln 2)``.

Adding a process: its maths in ``processes/<name>.py``, a ``tasks/<name>.py`` that calls
:func:`register` (every module of this package is imported), and its config file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from infodiff import config_rules
from infodiff.validation import check_num_samples

__all__ = [
    "Task",
    "Registration",
    "REGISTRY",
    "PROCESSES",
    "register",
    "registration",
    "conditional_keys",
    "Figure",
    "process_name",
    "make_task",
    "oracle_case",
    "OracleCase",
    "OracleEstimator",
    "INPUT_FORMATS",
    "ContractCase",
    "repo_config",
    "CalibrationCase",
    # re-exported from the process modules
    "TextTask", "MaskedTask", "SeddTask", "PoissonTask",
    "load_text_corpus", "make_transformer", "compute_dtype", "schedule_from_config", "make_mask_spec",
    "score_param", "check_sedd_eval_config", "load_count_data", "synthetic_distribution", "synthetic_dim",
    "synthetic_sample", "synthetic_entropy", "synthetic_w1", "make_scaling", "make_count_model",
    "poisson_proposal", "poisson_estimation_process", "oracle_distribution", "empirical_prior_logits",
    "check_counts",
]

LN2 = math.log(2.0)
# What evaluate.py --config.eval.input=FILE scores for a process: 'text' (.txt / .jsonl through
# infodiff.scoring, windows with padding) or 'counts' (.npy); each input kind of a format is a
# Query of infodiff.evaluation.queries (Query.input_format).
INPUT_FORMATS = ("text", "counts")

ApplyFn = Callable[[jax.Array, jax.Array], jax.Array]


# ---------------------------------------------------------------------------------------------
# The generic task
# ---------------------------------------------------------------------------------------------
class Task:
    """What :func:`infodiff.training.train` trains (build with :func:`make_task`).

    Attributes:
      config: the run's config.
      name: the process (its registration's name).
      model: the flax module.
      data: the corpus / count data set (loaded on first use).
      dim: L or D, the per-example size that ``loss_fn`` and ``metrics`` divide by.
      metric: 'bpc' or 'bpd' (bits per character / dimension).
      rate_name, items_per_step: the throughput logged (``tokens_per_s`` with B L tokens per step,
        or ``examples_per_s`` with B examples).

    What the evaluation, the scorer and the harness read of a task, with the default of a task
    that has none of it (a text task sets the first four; a masked one the order members; a
    count task ``scaling``):
      seq_len: L, the model's length in tokens (None: not a token model).
      vocab_size: V real tokens (None: not a token model).
      tokenizer: how user strings become ids (:class:`infodiff.data.tokenizers.Tokenizer`;
        None: the task reads no text).
      schedule_obj: the masking schedule (:mod:`infodiff.schedules`; None: none).
      scaling: the count scaling (:class:`infodiff.processes.poisson.CountScaling`; None: no counts).
      order_settings(): the any-order likelihood settings of ``config.eval`` (None: none).
      order_model(params): what :func:`infodiff.orders.nll_interval` needs (None: the process
        has no any-order conditionals).
      exact_likelihood: True where ``exact_nll`` gives the network's own likelihood exactly
        (block diffusion, per block by the subset recursion); such a process's likelihood is
        per block, so the whole-sequence interval does not apply.
    """

    name: str
    metric: str
    rate_name: str
    model: Any
    seq_len: int | None = None
    vocab_size: int | None = None
    tokenizer: Any = None
    schedule_obj: Any = None
    scaling: Any = None
    exact_likelihood: bool = False

    def __init__(self, config: ml_collections.ConfigDict, data: Any = None):
        self.config = config
        self.name = registration(config).name
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
        return {"loss": loss, self.metric: loss / (self.dim * LN2)}

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

    @property
    def metric_label(self) -> str:
        """The name of ``metric`` in log lines and on the progress bar (text: 'bpb' for bytes)."""
        return self.metric

    def progress_postfix(self, avg: dict) -> dict:
        """What the tqdm bar shows after the step count: the loss (nats per item) and bits per
        token / byte / dimension of ``avg`` (a step's or a window's metrics)."""
        return {"loss": f"{float(avg['loss']):.4g}", self.metric_label: f"{float(avg[self.metric]):.4f}"}

    # ---- evaluation (infodiff.evaluation.run) ----
    def check_eval_config(self) -> None:
        """ValueError naming an invalid ``eval.*`` value, before any work."""
        ev = self.config.eval
        check_num_samples(ev.num_samples, "config.eval.num_samples")
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

    def scoring_process(self, estimator: str):
        """The Process that scores a user's text files (:func:`infodiff.scoring.load_run`) with
        ``estimator``; it must support padding (rows of different lengths). Raises ValueError
        naming the run's process where user text is not scored."""
        raise ValueError(f"config.process.name={self.name!r}: scoring your own text is not implemented "
                         "for this process")

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

    def eval_extras(self, est, x, generated: dict) -> tuple[dict, list[Figure]]:
        """(extra report entries, the figures to draw)."""
        return {}, []

    def order_settings(self) -> dict | None:
        """The any-order likelihood settings (``infodiff.tasks.masked.order_settings``), validated;
        None for a process without any-order conditionals."""
        return None

    def order_model(self, params: Any) -> dict | None:
        """``{'denoiser', 'time_conditioned', 'schedule'}`` for :func:`infodiff.orders.nll_interval`
        with ``params``; None for a process without any-order conditionals (not masked), whatever
        ``params`` (None included: callers ask that way whether there are any)."""
        return None

    def exact_nll(self, denoiser, x_BxL, *, target_BxL=None, pad_BxL=None, progress=False) -> dict:
        """The network's own -log p per row exactly (``{'nll', 'best_order_nll', 'forward_passes'}``);
        read only where ``exact_likelihood``."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure a task asks the evaluation to draw into the run's directory:
    ``infodiff.evaluation.plots.FIGURES[kind](path, *args)`` with ``path = workdir/name``."""

    name: str
    kind: str
    args: tuple = ()


# ---------------------------------------------------------------------------------------------
# Oracle cases: data with exact likelihoods, and the estimators to check against them
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class OracleEstimator:
    """One estimator of an oracle case: a process, the exact denoiser it needs and its own PRNG
    key; ``conditional`` / ``ratio``: whether it also estimates -log p(y | x) / the log-ratio."""

    process: Any
    denoiser: Any
    key: jax.Array
    conditional: bool = True
    ratio: bool = True


@dataclasses.dataclass
class OracleCase:
    """Items ``x`` [N, L] with their exact ``-log p`` (float64 [N], nats) and, with a prompt of
    ``prompt_len`` tokens, the exact conditional and log-ratio (``y_alt``: one alternative
    response per prompt); the estimators; the sampler checks ``samplers()`` and the case's figures
    ``plots(results, out_dir)``. Built by a registration's ``oracle_case``; run by
    :func:`infodiff.evaluation.run.evaluate_oracle`."""

    name: str
    x: np.ndarray
    truth_x: np.ndarray
    estimators: list
    process_info: dict
    units: dict
    info: dict
    prompt_len: int = 0
    truth_c: np.ndarray | None = None
    y_alt: np.ndarray | None = None
    truth_r: np.ndarray | None = None
    samplers: Callable[[], list] = list
    plots: Callable[[dict, str], list] = lambda results, out_dir: []


# ---------------------------------------------------------------------------------------------
# Contract material: what the test suite checks of every registration
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ContractCase:
    """One estimator of a process with an exact denoiser, for the contract tests
    (``tests/test_processes.py``): the estimate is within 4 SE of ``truth`` (unless
    ``process.infinite_variance``), the training loss under ``train_process`` has mean
    ``train_truth`` (None: ``truth``), the noise never reads the data, sliced calls agree.

    Attributes:
      name: the test id, ``'<registration>:<estimator>'``.
      process: the estimation Process.
      train_process: the training Process (None: no training law to compare).
      denoiser: the exact (oracle) denoiser / score.
      x: items [N, L] (int32 tokens or float32 scaled counts).
      truth: float64 [N] exact -log p(x), nats.
      train_truth: float64 [N] what the training loss estimates (truth minus the exact terms it
        omits), or None: ``truth``.
      num_samples: Monte Carlo samples of the estimate.
      slow: whether the 4-SE estimate check is left out of the fast tier.
    """

    name: str
    process: Any
    train_process: Any
    denoiser: Any
    x: np.ndarray
    truth: np.ndarray
    train_truth: np.ndarray | None
    num_samples: int
    slow: bool = False


@dataclasses.dataclass
class CalibrationCase:
    """One SE-calibration check (``tests/test_calibration.py``): ``estimate()`` returns
    ``(Estimate over N independent cases, float64 [N] exact values)``, built lazily (heavy).

    Attributes:
      name: the test id and the printed label.
      estimate: ``() -> (likelihood.Estimate, truth_N)``.
      xfail: a known under-coverage, the reason (a strict xfail), or None.
    """

    name: str
    estimate: Callable[[], tuple[Any, np.ndarray]]
    xfail: str | None = None


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Registration:
    """What the rest of the library needs to know about one process.

    Attributes:
      name: ``config.process.name`` of its runs.
      task: the :class:`Task` class, called as ``task(config, data)`` (network, loss, data
        stream, eval-mode denoiser, estimation process, eval extras, ``process_info``).
      oracle_case: ``oracle_case(config) -> OracleCase`` for its oracle configs
        (``eval.mode='oracle'``).
      conditional: the config keys its runs read only under a condition
        (:class:`config_rules.Conditional`; checked by :mod:`infodiff.config_usage`).
      input_format: the user files ``evaluate.py --config.eval.input=FILE`` scores, one of
        :data:`INPUT_FORMATS`.
      contract_cases: ``() -> list[ContractCase]``: its estimators against exact oracles (built
        lazily: importing the registry stays cheap).
      calibration_cases: ``() -> list[CalibrationCase]``: its SE-calibration checks.
      tiny_config: ``() -> ConfigDict``: a few-step tiny training run (bit-identical resume
        test), its data built from the config alone; None: not trained.
    """

    name: str
    task: Callable[[ml_collections.ConfigDict, Any], Task]
    oracle_case: Callable[[ml_collections.ConfigDict], OracleCase]
    conditional: tuple[config_rules.Conditional, ...] = ()
    input_format: str = "text"
    contract_cases: Callable[[], list[ContractCase]] = list
    calibration_cases: Callable[[], list[CalibrationCase]] = list
    tiny_config: Callable[[], ml_collections.ConfigDict] | None = None


REGISTRY: dict[str, Registration] = {}


def register(reg: Registration) -> Registration:
    """Add ``reg`` to :data:`REGISTRY` under ``reg.name`` (replacing one of that name) and return
    it. Raises ValueError for an ``input_format`` outside :data:`INPUT_FORMATS`."""
    if reg.input_format not in INPUT_FORMATS:
        raise ValueError(f"Registration({reg.name!r}).input_format={reg.input_format!r}; choose from {INPUT_FORMATS}")
    REGISTRY[reg.name] = reg
    return reg


def registration(config: ml_collections.ConfigDict) -> Registration:
    """The registration of ``config.process.name`` (the only reader of that key).

    Raises ValueError naming the value and the registered names."""
    name = config.process.name
    reg = REGISTRY.get(name) if isinstance(name, str) else None
    if reg is None:
        raise ValueError(f"config.process.name={name!r}; choose from {tuple(REGISTRY)}")
    return reg


def repo_config(module: str, overrides: dict) -> ml_collections.ConfigDict:
    """``infodiff/configs/<module>.py``'s ``get_config()`` with ``overrides`` ({'section.key':
    value}) applied: the registrations' ``tiny_config``."""
    import importlib

    config = importlib.import_module(f"infodiff.configs.{module}").get_config()
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        config[section][key] = value
    return config


def process_name(config: ml_collections.ConfigDict) -> str:
    """``config.process.name`` checked against :data:`REGISTRY` (ValueError otherwise)."""
    return registration(config).name


def __getattr__(name: str):
    if name == "PROCESSES":  # the registered names, test-only registrations included
        return tuple(REGISTRY)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def conditional_keys(config: ml_collections.ConfigDict) -> tuple[config_rules.Conditional, ...]:
    """The keys ``config``'s process reads only under a condition (its registration's
    ``conditional``); () for a config without a registered process (an experiment's, or a bad
    name, which the run itself refuses)."""
    process = config.get("process", None)
    if not isinstance(process, ml_collections.ConfigDict) or "name" not in process:
        return ()
    try:
        return registration(config).conditional
    except ValueError:
        return ()


def make_task(config: ml_collections.ConfigDict, *, data: Any = None) -> Task:
    """The task of ``config`` (its registration's ``task``).

    Args:
      config: a run config (``configs/masked_text.py``, ``sedd_*_text.py``, ``poisson_*.py``).
      data: optional data overriding the config's: a text corpus (``.train``, ``.valid``,
        ``.name``, ``.checksums``) for text processes, a :class:`counts.CountDataset` for Poisson.
        Loaded from the config on first use otherwise.

    Raises:
      ValueError: an oracle config; unknown process name; invalid process / model / eval
        settings, naming the key.
    """
    if str(config.get("eval", {}).get("mode", "network")) == "oracle":
        raise ValueError("this is an oracle config (eval.mode='oracle'): nothing is trained; run "
                         "`python evaluate.py --config <it>`")
    return registration(config).task(config, data)


def oracle_case(config: ml_collections.ConfigDict) -> OracleCase:
    """The exact-oracle case of an oracle config (``eval.mode='oracle'``): its registration's
    ``oracle_case``."""
    return registration(config).oracle_case(config)


# Every module of this package is imported, so each process's registration runs (a new process
# is a new file here: nothing to add to this file); their helpers stay importable from here.
def _import_registrations() -> None:
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


from infodiff.tasks.text import (  # noqa: E402
    TextTask, compute_dtype, load_text_corpus, make_transformer, schedule_from_config)
from infodiff.tasks.masked import MaskedTask, make_mask_spec  # noqa: E402
from infodiff.tasks.sedd import SeddTask, check_sedd_eval_config, score_param  # noqa: E402
from infodiff.tasks.poisson import (  # noqa: E402
    PoissonTask, check_counts, empirical_prior_logits, load_count_data, make_count_model, make_scaling,
    oracle_distribution, poisson_estimation_process, poisson_proposal, synthetic_dim, synthetic_distribution,
    synthetic_entropy, synthetic_sample, synthetic_w1)

_import_registrations()  # any other process of this package
