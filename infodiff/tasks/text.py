"""The text task shared by the masked and SEDD processes: corpus, transformer, windows, and the
text oracles (a tabular or Markov law with exact likelihoods).

Data (``make_task(config, data=...)``): a text corpus (``.train`` / ``.valid`` token streams,
``.name``, ``.checksums``; default :func:`load_text_corpus`), int32 [B, L] ids in [0, V).
"""

from __future__ import annotations

import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from infodiff import config_rules as cr
from infodiff import oracles
from infodiff import schedules as schedules_lib
from infodiff.data import text as text_data
from infodiff.data import text_bytes
from infodiff.networks.transformer import ATTENTIONS, Transformer
from infodiff.tasks import OracleCase, Task
from infodiff.validation import validate_token_stream

__all__ = ["TextTask", "load_text_corpus", "compute_dtype", "make_transformer", "schedule_from_config",
           "RULES", "names", "steps_list", "text_oracle", "text_oracle_items", "check_num_sequences",
           "text_oracle_case"]


def load_text_corpus(config: ml_collections.ConfigDict) -> text_data.TextCorpus:
    """The corpus of ``config.data``: the embedded one, or a text8 file (``data.path``); ``data.name``
    'bytes': the embedded corpus as raw UTF-8 bytes (:mod:`infodiff.data.text_bytes`).

    Raises ValueError if ``data.name`` is 'text8' and no ``data.path`` is given (rather than
    silently training on the embedded corpus), or 'bytes' with a ``data.path`` or a
    ``data.vocab_size`` other than 256.
    """
    if is_bytes(config):
        if config.data.get("path", ""):
            raise ValueError(f"config.data.path={config.data.path!r} is set but config.data.name is 'bytes' (the "
                             "embedded corpus as UTF-8 bytes): clear data.path")
        if int(config.data.vocab_size) != text_bytes.VOCAB_SIZE:
            raise ValueError(f"config.data.vocab_size={config.data.vocab_size} with data.name 'bytes': set it to 256 "
                             "(the byte values; the mask id is 256)")
        return text_bytes.load_corpus(config.data.cache_dir or None)
    if config.data.get("name", "text") == "text8" and not config.data.path:
        raise ValueError(
            "config.data.name is 'text8' but config.data.path is empty: pass "
            "--config.data.path=/path/to/text8"
        )
    return text_data.load_corpus(config.data.path or None, config.data.cache_dir or None)


def is_bytes(config) -> bool:
    """Whether ``config.data`` is byte-level text (``data.name == 'bytes'``): 256 byte values, bits per byte."""
    return str(config.data.get("name", "text")) == "bytes"


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
    'float16' only with ``model_config.allow_float16 = True`` (read only then: :data:`RULES`).

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


def make_transformer(config: ml_collections.ConfigDict, output: str = "log_softmax") -> Transformer:
    """The text network described by ``config.model`` / ``config.data``.

    ``vocab_size = config.data.vocab_size`` real tokens (the MASK id is ``vocab_size``),
    ``seq_len = config.data.seq_len``, compute dtype :func:`compute_dtype` of ``config.model``
    (parameters, optimiser state, outputs and losses are float32 whatever it is), attention
    ``config.model.attention`` ('einsum', the default, or 'dot_product':
    ``jax.nn.dot_product_attention``; same parameters); ``output`` 'log_softmax' or raw
    'logits' (the process's task chooses: :meth:`TextTask.network_output`).

    Raises:
      ValueError: a dtype :func:`compute_dtype` refuses; unknown attention.
    """
    m = config.model
    attention = str(m.get("attention", "einsum"))
    if attention not in ATTENTIONS:
        raise ValueError(f"config.model.attention={attention!r}; choose from {ATTENTIONS}")
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


# Keys a text process's runs read only under a condition (infodiff/config_usage.py).
RULES: tuple[cr.Conditional, ...] = (
    cr.Conditional("model.allow_float16", "model.dtype = 'float16'", cr.equals("model.dtype", "float16")),
    cr.Conditional("eval.sampler", "eval.num_generate > 0", lambda c: int(cr.get(c, "eval.num_generate", 0)) > 0,
                   cr.NETWORK),
    # masked runs also read sample_steps as the ancestral sampler's T of eval.sampler_likelihood
    cr.Conditional("eval.sample_steps", "eval.num_generate > 0 or eval.sampler_likelihood = 'ancestral'",
                   lambda c: int(cr.get(c, "eval.num_generate", 0)) > 0
                   or cr.get(c, "eval.sampler_likelihood") == "ancestral", cr.NETWORK),
    # text oracles: a table file, or the generation keys
    *cr.keys(("data.seed", "data.temperature", "data.seq_len", "data.num_support", "data.order",
              "data.generated_alphabet"), "data.path is empty (a generated table)",
             lambda c: not cr.get(c, "data.path"), cr.ORACLE),
    cr.Conditional("data.alphabet", "data.path is set (a table file)", lambda c: bool(cr.get(c, "data.path")),
                   cr.ORACLE),
    *cr.keys(("eval.num_samples", "eval.max_sequences", "eval.split", "eval.num_generate", "eval.sample_steps"),
             "eval.input is not set (in input mode the budget is eval.input_samples)", cr.NO_INPUT, cr.NETWORK),
)


class TextTask(Task):
    """Shared by the masked and SEDD tasks: a transformer on character text."""

    metric = "bpc"
    rate_name = "tokens_per_s"

    def __init__(self, config, data=None):
        super().__init__(config, data)
        self.model = make_transformer(config, self.network_output())
        self.seq_len = int(config.data.seq_len)
        self.vocab_size = int(config.data.vocab_size)

    def network_output(self) -> str:
        """The transformer's output, 'log_softmax' (default) or 'logits'."""
        return "log_softmax"

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
        return ("step %d/%d: loss %.3f nats/seq, %s %.4f, grad_norm %.3f, lr %.2e, "
                "%.0f tokens/s, %.2f steps/s, ETA %.0fs",
                step, num_steps, avg["loss"], self.metric_label, avg["bpc"], avg["grad_norm"], avg["lr"],
                avg["tokens_per_s"], avg["steps_per_s"], eta)

    def valid_log(self, step, out):
        return "step %d valid (EMA): loss %.4f nats/seq, %s %.4f", step, out["loss"], self.metric_label, out["bpc"]

    @property
    def metric_label(self) -> str:
        """'bpb' (bits per byte) for a byte-level run, else 'bpc': what the log lines call ``metric``
        (metrics.jsonl keeps the key 'bpc', bits per token, for every text run)."""
        return "bpb" if is_bytes(self.config) else "bpc"

    @property
    def units(self):
        return {"item": "sequence", "nll": "nats per sequence", "bits": f"bits per {self.tokenizer.unit}",
                "tokens_per_item": self.seq_len}

    @functools.cached_property
    def tokenizer(self):
        """How user strings become ids (:class:`infodiff.data.tokenizers.Tokenizer`): ``BYTES`` for a byte run
        (``data.name == 'bytes'``), else ``TEXT8`` (the corpus's cleaning)."""
        from infodiff.data import tokenizers

        return tokenizers.BYTES if is_bytes(self.config) else tokenizers.TEXT8

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
                "checksum": corpus.checksums.get(text_data.split_key(ev.split)),
                "item_size": L, "num_items": int(len(chunks)), "total_items": int(total),
                "unigram_entropy_bits_per_char": text_data.unigram_entropy_bits(corpus.train, self.vocab_size)}
        return chunks, info, subset

    def _decoded(self, gen, sampler, steps):
        decode = text_bytes.decode if is_bytes(self.config) else text_data.decode
        return {"samples": [decode(np.asarray(row)) for row in gen], "array": np.asarray(gen),
                "sampler": sampler, "sample_steps": steps}


# ---------------------------------------------------------------------------------------------
# Text oracles (configs/oracle_tabular.py, oracle_markov.py, oracle_sedd_tabular.py)
# ---------------------------------------------------------------------------------------------
def names(spec, allowed, key: str, what: str = "name") -> list[str]:
    """A tuple (or a comma-separated string) of names, each checked against ``allowed`` before any
    work. ValueError naming ``config.<key>`` and the bad name otherwise."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    items = [e.strip() for p in parts for e in str(p).split(",") if e.strip()]
    if not items:
        raise ValueError(f"config.{key} is empty; choose one or more of {tuple(allowed)}")
    bad = [e for e in items if e not in allowed]
    if bad:
        raise ValueError(f"unknown {what} {bad[0]!r} in config.{key}; choose from {tuple(allowed)}")
    return items


def steps_list(spec) -> list[int]:
    """Step counts of a tuple or a comma-separated string ('20,100'), as ints."""
    parts = [spec] if isinstance(spec, (str, int)) else list(spec)
    return [int(e) for p in parts for e in str(p).split(",") if e.strip()]


def text_oracle(config, out_dir):
    """(oracle, source path): the table file ``data.path`` ('tabular' or 'markov'), or a law
    generated from ``data.seed`` and written to ``out_dir/generated_<name>.json``."""
    d = config.data
    if d.path:  # the generation keys (seed, seq_len, ...) are not read (RULES)
        orc = oracles.load_oracle(d.name, d.path, alphabet=d.get("alphabet", "") or None)
        return orc, os.path.abspath(d.path)
    rng = np.random.default_rng(d.seed)
    if d.name == "tabular":
        orc = oracles.random_tabular(rng, "ACGT", d.seq_len, d.num_support, d.temperature)
    elif d.name == "markov":
        orc = oracles.random_markov(rng, d.generated_alphabet, d.order, d.temperature)
    else:
        raise ValueError(f"config.data.name={d.name!r}: an oracle config needs 'tabular' or 'markov'")
    os.makedirs(out_dir, exist_ok=True)
    source = os.path.join(os.path.abspath(out_dir), f"generated_{d.name}.json")
    with open(source, "w") as f:
        json.dump(orc.to_json(), f, indent=1)
    return orc, source


def text_oracle_items(config, orc, rng, check: bool):
    """(x int [N, P + R], P): ``eval.num_sequences`` sequences of the oracle, a prompt of P
    tokens (Markov: ``data.prompt_len`` + ``data.response_len``; tabular: ``data.prompt_len``
    of its fixed length). ``check``: ValueError naming a prompt length out of range."""
    d, ev = config.data, config.eval
    if d.name == "markov":
        P, R = int(d.prompt_len), int(d.response_len)
        if check and (P < 0 or R < 1):
            raise ValueError(f"need data.prompt_len >= 0 and data.response_len >= 1; got {P}, {R}")
        return orc.sample(rng, ev.num_sequences, length=P + R), P
    x = orc.sample(rng, ev.num_sequences)
    P = int(d.get("prompt_len", 0))
    if check and not 0 <= P < x.shape[1]:
        raise ValueError(f"config.data.prompt_len={P} must be in [0, {x.shape[1] - 1}] for sequences "
                         f"of length {x.shape[1]}")
    return x, P


def check_num_sequences(config) -> None:
    """ValueError unless ``eval.num_sequences`` >= 1 (an oracle config's item count)."""
    ev = config.eval
    if int(ev.num_sequences) < 1:
        raise ValueError(f"config.eval.num_sequences must be >= 1; got {ev.num_sequences}")


def text_oracle_case(config, name: str, check_prompt: bool) -> tuple[OracleCase, object, jax.Array]:
    """(case, oracle, key): the items of a text oracle config with their exact -log p(x) and,
    with a prompt, the exact conditional -log p(y | x) and one alternative response per prompt,
    y' ~ p(. | x) (drawn after the items), with the exact log p(y | x) - log p(y' | x), shared by
    every estimator (``case.estimators`` empty, for the process to fill); ``key`` is the
    estimators' root key. ``name``: the process, for the report; ``check_prompt``:
    refuse a prompt length out of range (ValueError) rather than scoring without a prompt."""
    ev = config.eval
    schedule = schedule_from_config(config.process)
    orc, source = text_oracle(config, ev.output_dir)
    rng = np.random.default_rng(ev.seed)
    x, P = text_oracle_items(config, orc, rng, check=check_prompt)
    R = x.shape[1] - P
    case = OracleCase(name=config.data.name, x=x, truth_x=-orc.log_prob(x), estimators=[],
                      process_info={"name": name, "schedule": schedule.name,
                                    "eps": getattr(schedule, "eps", None)},
                      units={"item": "sequence", "nll": "nats per sequence"},
                      info={"table": source, "alphabet": orc.alphabet, "order": getattr(orc, "order", None)},
                      prompt_len=P if R > 0 else 0)
    if case.prompt_len:
        target = response_mask(x, P)
        case.truth_c = -orc.cond_log_prob(x, target)
        case.y_alt = (orc.sample_response(rng, x[:, :P], R) if config.data.name == "markov"
                      else orc.sample_response(rng, x[:, :P]))
        x_alt = np.concatenate([x[:, :P], case.y_alt], axis=1)
        case.truth_r = orc.cond_log_prob(x, target) - orc.cond_log_prob(x_alt, target)
    return case, orc, jax.random.PRNGKey(ev.seed)


def response_mask(x, P: int) -> np.ndarray:
    """bool like ``x``: True at the response positions (from ``P`` on)."""
    target = np.zeros(x.shape, bool)
    target[:, P:] = True
    return target
