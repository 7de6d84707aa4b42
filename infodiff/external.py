"""Score a model trained outside infodiff with the library's estimators: :func:`from_function`.

    run = infodiff.from_function(logprobs_fn, vocab_size=V, mask_id=V, seq_len=L, encode=tok)
    run.nll(texts); run.conditional_nll(prompts, responses); run.log_ratio(prompts, a, b)
    run.nll_interval(texts)

``logprobs_fn`` is the denoiser of a masked (absorbing) diffusion model (MD4, MDLM, RADD): given
int32 ids [B, L] with ``mask_id`` at the masked positions (and, if ``time_conditioned``, float32
times [B]) it returns the **log-probabilities** [B, L, vocab_size] of the clean token at every
position (``log_softmax`` of the logits; they are checked, not normalised here). Every -log p is
then the model's NELBO (an upper bound on its own -log p, equal to it for an exact denoiser), the
same estimators and windows as a trained run (:mod:`infodiff.scoring`, docs/scoring.md).

Ids. The library's masked convention (:mod:`infodiff.processes.masked`) is V real tokens
0..V-1 and the MASK id V. ``mask_id == vocab_size`` is that convention. ``mask_id <
vocab_size`` is a mask inside the model's vocabulary (a [MASK] token of a tokenizer): the model
must put probability 0 on it (its logit -inf before the softmax); its column is dropped and
the ids above it shift down by one inside the library (V = vocab_size - 1 real tokens), and
``logprobs_fn`` always sees and returns the model's own ids.

Paths. A function JAX can trace (detected with :func:`jax.eval_shape`, or ``jax_function=True``)
runs inside the estimators' jitted programs; any other (NumPy, PyTorch behind NumPy) is called
on the host through :func:`jax.pure_callback` with writable C-contiguous int32 NumPy arrays
(``vmap_method='broadcast_all'``: under a ``vmap`` it gets the batch dimensions flattened
into B). Both paths see the same draws, so they give the same numbers to float rounding.

Checks. One probe call at :func:`from_function` (two rows: all masked, and half masked) checks
the output: shape [B, L, vocab_size], a float dtype, no NaN or +inf, each position's
log-probabilities summing to 1 (|logsumexp| <= 1e-3; 2e-2 for 16-bit floats), probability at most
1e-6 on ``mask_id``; any failure is one ValueError. A host function (NumPy, PyTorch) is checked
the same way on **every** call (a function whose output stops summing to 1 later is refused, not
scored): the ValueError names the call's number and its rows. An exception of the user's function
in any later call is re-raised as itself (its type and message) with a note saying which call
failed, not as JAX's callback error. A JAX function is traced: its output's shape is checked at
every trace, and the estimators refuse non-finite values (FloatingPointError).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from infodiff import schedules
from infodiff import scoring

__all__ = ["ExternalDenoiser", "ExternalTask", "ExternalRun", "from_function", "make_tokenizer", "DEFAULT_BATCH_SIZE"]

DEFAULT_BATCH_SIZE = 256  # rows per estimator call, the text configs' eval.batch_size
TEXT8_SIZE = 27  # the text configs' vocabulary (a-z and space), MASK id 27
MASK_MASS_MAX = 1e-6  # probability a denoiser may put on the mask id (float rounding of exp(-inf))


@dataclasses.dataclass(frozen=True, eq=False)
class ExternalDenoiser:
    """``denoiser(z_BxL, t_B) -> logprobs_BxLxV`` of a user's function in the library's ids
    (V real tokens, MASK = V; module docstring). Hashed by identity (a static jit argument).

    Attributes: ``fn`` (the user's function), ``model_vocab`` (its vocab_size), ``mask_id`` (its
    mask id), ``time_conditioned``, ``jax_function`` (traced, or a host callback), ``params``
    (None: nothing to pass to jit; else a pytree that ``fn`` takes first, ``fn(params, z[, t])``,
    passed to jit as an argument: a released network's weights, :mod:`infodiff.pretrained`)."""

    fn: Callable
    model_vocab: int
    mask_id: int
    time_conditioned: bool
    jax_function: bool
    params: Any = None
    calls: dict = dataclasses.field(default_factory=lambda: {"n": 0, "failure": None, "lock": threading.Lock()},
                                    repr=False)  # the host calls so far and the first one that failed

    @property
    def vocab_size(self) -> int:
        """V: the real tokens (the model's vocabulary less an in-vocabulary mask)."""
        return self.model_vocab - int(self.mask_id < self.model_vocab)

    def __call__(self, z_BxL, t_B):
        return self.apply_params(self.params, z_BxL, t_B)

    def apply_params(self, params, z_BxL, t_B):
        """int32 [B, L] ids in [0, V] (V = MASK), float32 [B] times -> float32 [B, L, V]
        log-probabilities over the V real tokens."""
        z = jnp.asarray(z_BxL, jnp.int32)
        t = jnp.asarray(t_B, jnp.float32)
        z_model = to_model_ids(z, self.vocab_size, self.mask_id)
        if self.jax_function:
            lead = () if self.params is None else (params,)
            out = self.fn(*lead, *((z_model, t) if self.time_conditioned else (z_model,)))
        else:
            shape = jax.ShapeDtypeStruct(z.shape + (self.model_vocab,), jnp.float32)
            args = (z_model, t) if self.time_conditioned else (z_model,)
            out = jax.pure_callback(self._host, shape, *args, vmap_method="broadcast_all")
        if tuple(out.shape) != z.shape + (self.model_vocab,):
            raise ValueError(f"logprobs_fn returned shape {tuple(out.shape)} for ids of shape {tuple(z.shape)}; "
                             f"expected {z.shape + (self.model_vocab,)}")
        out = jnp.asarray(out).astype(jnp.float32)
        if self.mask_id < self.model_vocab:
            out = jnp.concatenate([out[..., :self.mask_id], out[..., self.mask_id + 1:]], axis=-1)
        return out

    def _host(self, z, t=None):
        """The host side of the callback: batch dimensions flattened into B, fresh writable
        arrays (a function may convert them in place, e.g. torch.from_numpy)."""
        z = np.array(z, np.int32, order="C")
        lead, L = z.shape[:-1], z.shape[-1]
        args = (z.reshape(-1, L),)
        B = args[0].shape[0]
        if t is not None:
            args += (np.array(np.broadcast_to(t, lead), np.float32).reshape(-1),)
        with self.calls["lock"]:
            self.calls["n"] += 1
            n = self.calls["n"]
        where = f"logprobs_fn's call {n} after from_function (rows 0-{B - 1} of ids [{B}, {L}])"
        try:
            try:
                out = self.fn(*args)
            except Exception as e:
                e.add_note(f"infodiff: raised in {where}")
                raise
            if not isinstance(out, np.ndarray) and hasattr(out, "__array__"):
                out = np.asarray(out)
            check_output(out, B, L, self.model_vocab, self.mask_id, where=where)
        except Exception as e:  # noqa: BLE001 - kept, and re-raised as itself by the Run (ExternalRun.guard)
            e.infodiff_host_call = where  # JAX's log of it is dropped inside the guard (_KeptFailureFilter)
            with self.calls["lock"]:
                if self.calls["failure"] is None:
                    self.calls["failure"] = e
            raise
        return np.asarray(out, np.float32).reshape(lead + (L, self.model_vocab))

    def take_failure(self) -> BaseException | None:
        """The first exception of a host call since the last take (then forgotten), or None."""
        with self.calls["lock"]:
            e, self.calls["failure"] = self.calls["failure"], None
        return e


def to_model_ids(z, V: int, mask_id: int):
    """Library ids (real 0..V-1, MASK V) -> the model's (MASK ``mask_id``; real ids at or above
    an in-vocabulary mask shifted up by one). Works on NumPy and JAX arrays."""
    xp = jnp if isinstance(z, jax.Array) else np
    if mask_id == V:
        return z
    return xp.where(z == V, mask_id, z + (z >= mask_id)).astype(z.dtype)


def from_model_ids(ids, vocab: int, mask_id: int, where: str) -> np.ndarray:
    """The model's token ids of a text (``vocab`` = its vocab_size) -> library ids (int32 [n]).
    Raises ValueError for an id outside [0, vocab) or equal to ``mask_id``, naming ``where``."""
    x = np.asarray(ids)
    if x.ndim != 1 or (x.size and not np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"{where} must be a sequence of integer token ids; got {x.dtype} of shape {x.shape}")
    bad = (x < 0) | (x >= vocab) | (x == mask_id)
    if bad.any():
        v = int(x[np.flatnonzero(bad)[0]])
        why = "the mask id" if v == mask_id else f"outside [0, {vocab})"
        raise ValueError(f"{where} holds token id {v}, {why}: a text must encode to the model's real tokens")
    x = x.astype(np.int32)
    return x if mask_id == vocab else (x - (x > mask_id)).astype(np.int32)


class ExternalTask(scoring.ScorerTask):
    """The task side of a :class:`scoring.Run` over an external denoiser (masked diffusion, the
    linear schedule): ``name``, ``seq_len``, ``vocab_size`` (V), ``tokenizer``, ``schedule_obj``,
    ``scoring_process``, ``order_model`` (:func:`infodiff.orders.nll_interval`) and
    ``process_info``."""

    name = "masked"

    def __init__(self, denoiser: ExternalDenoiser, seq_len: int, tokenizer: scoring.Tokenizer):
        self.external = denoiser
        self.seq_len, self.vocab_size, self.tokenizer = int(seq_len), denoiser.vocab_size, tokenizer
        self.schedule_obj = schedules.LinearSchedule()

    def denoiser(self, params=None) -> ExternalDenoiser:
        return self.external

    def scoring_process(self, estimator: str):
        from infodiff.tasks.masked import scoring_process

        return scoring_process(estimator, self.schedule_obj, self.vocab_size)

    def order_model(self, params=None) -> dict:
        return {"denoiser": self.external, "time_conditioned": self.external.time_conditioned,
                "schedule": self.schedule_obj}

    def process_info(self, process) -> dict:
        info = {"name": self.name, "schedule": self.schedule_obj.name, "eps": self.schedule_obj.eps,
                "objective": None, "external": True}
        return {**info, **self.source}  # a released checkpoint: its kind and path


class _KeptFailureFilter(logging.Filter):
    """Drops JAX's "jax.pure_callback failed" traceback of an exception that a host call kept
    (``ExternalDenoiser._host``): the guard re-raises that exception itself, so the traceback on
    stderr would only repeat it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return getattr(exc, "infodiff_host_call", None) is None


_JAX_CALLBACK_LOGGER = "jax._src.callback"


class ExternalRun(scoring.Run):
    """A :class:`infodiff.scoring.Run` over a user's function: every public method, and every
    query that calls the network from outside the Run (:meth:`guard`), re-raises a failure of the
    function as itself."""

    @contextlib.contextmanager
    def guard(self, what: str, *, prompt: bool = False):
        """Re-raise the first exception of the user's function in a host call (or of its per-call
        check) as itself (its type and message, a note naming the call), not as the
        JaxRuntimeError that JAX's callback turns it into."""
        self.denoiser.take_failure()  # forget one of an earlier method that was caught by its caller
        quiet, log = _KeptFailureFilter(), logging.getLogger(_JAX_CALLBACK_LOGGER)
        log.addFilter(quiet)
        try:
            yield
        except Exception as e:
            failure = self.denoiser.take_failure()
            if failure is None or failure is e:
                raise
            raise failure from None
        finally:
            log.removeFilter(quiet)


for _name in ("nll", "conditional_nll", "log_ratio", "nll_interval", "conditional_nll_interval", "window_nll"):
    setattr(ExternalRun, _name, scoring.guarded(_name)(getattr(scoring.Run, _name)))


def make_tokenizer(encode, separator, vocab: int, mask_id: int, name: str = "custom") -> scoring.Tokenizer:
    """The Run's :class:`scoring.Tokenizer` (ids in the library's convention); it also takes a
    text as a sequence of the model's token ids (``from_ids``)."""
    sep = None if separator is None else tuple(int(i) for i in from_model_ids(list(separator), vocab, mask_id,
                                                                              "separator"))
    if encode is None:
        if mask_id != TEXT8_SIZE or vocab - int(mask_id < vocab) != TEXT8_SIZE:
            raise ValueError(f"pass encode= (str -> token ids, your tokenizer): the text8 alphabet is the default only "
                             f"for ids 0..{TEXT8_SIZE - 1} with mask_id={TEXT8_SIZE}; got vocab_size={vocab}, "
                             f"mask_id={mask_id}")
        return scoring.TEXT8 if sep is None else dataclasses.replace(scoring.TEXT8, separator=sep)
    if not callable(encode):
        raise TypeError(f"encode must be a function str -> token ids; got {type(encode).__name__}")

    def encode_ids(text: str) -> tuple[np.ndarray, dict]:
        return from_model_ids(list(encode(text)), vocab, mask_id, f"encode({text[:30]!r})"), {}

    def from_ids(ids) -> np.ndarray:
        return from_model_ids(ids, vocab, mask_id, "a token-id sequence")

    return scoring.Tokenizer(name, "token", encode_ids, separator=sep or (), cleans=False, from_ids=from_ids)


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"


def _probe_inputs(V: int, mask_id: int, L: int):
    """Two rows in the model's ids: all masked, and every other position masked (fixed
    tokens); times 1 and 0.5."""
    z = np.full((2, L), V, np.int32)
    z[1, 1::2] = np.random.default_rng(0).integers(0, V, size=z[1, 1::2].shape)
    return to_model_ids(z, V, mask_id), np.array([1.0, 0.5], np.float32)


def check_output(out, B: int, L: int, model_vocab: int, mask_id: int, where: str = "the probe call") -> None:
    """The checks of every host call and of the probe call (module docstring): shape, dtype,
    finiteness, logsumexp normalisation, mass on ``mask_id``. Raises ValueError naming the value
    and ``where`` (the call and its rows)."""
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise ValueError(f"{where}: logprobs_fn returned a {type(out).__name__}, not an array of log-probabilities "
                         f"[B, L, vocab_size]")
    want = (B, L, model_vocab)
    if tuple(out.shape) != want:
        hint = (f"; drop the mask column, or pass vocab_size={model_vocab + 1} with mask_id={mask_id} inside it"
                if tuple(out.shape) == (B, L, model_vocab + 1) else "")
        raise ValueError(f"{where}: logprobs_fn returned shape {tuple(out.shape)} for ids of shape {(B, L)}; expected {want} "
                         f"(log-probabilities over vocab_size={model_vocab} ids){hint}")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"{where}: logprobs_fn returned dtype {out.dtype}; expected float log-probabilities")
    a = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    if np.isnan(a).any() or np.isposinf(a).any():
        b, l, v = np.argwhere(np.isnan(a) | np.isposinf(a))[0]
        raise ValueError(f"{where}: logprobs_fn returned {a[b, l, v]} at [{b}, {l}, {v}]; log-probabilities must be finite "
                         "or -inf")
    with np.errstate(divide="ignore", over="ignore"):
        m = np.max(a, axis=-1, keepdims=True)
        lse = (m + np.log(np.sum(np.exp(a - np.where(np.isfinite(m), m, 0.0)), axis=-1, keepdims=True)))[..., 0]
    tol = 1e-3 if jnp.finfo(out.dtype).bits >= 32 else 2e-2
    if not np.all(np.abs(lse) <= tol):
        b, l = np.argwhere(~(np.abs(lse) <= tol))[0]
        raise ValueError(f"{where}: logprobs_fn's output is not log-probabilities: logsumexp over the last axis is "
                         f"{lse[b, l]:.4g} at [{b}, {l}] (0 expected); return log_softmax(logits, axis=-1)")
    if mask_id < model_vocab:
        p = np.exp(a[..., mask_id])
        if np.max(p) > MASK_MASS_MAX:
            b, l = np.unravel_index(np.argmax(p), p.shape)
            raise ValueError(f"{where}: logprobs_fn puts probability {p[b, l]:.3g} on mask_id={mask_id} at [{b}, {l}]; a "
                             "masked diffusion denoiser predicts clean tokens only: set the mask logit to -inf "
                             "before log_softmax")


def _trace_error(fn, args) -> Exception | None:
    """None if JAX can trace ``fn`` on arrays like ``args``, else the exception."""
    try:
        jax.eval_shape(fn, *[jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in args])
        return None
    except Exception as e:  # noqa: BLE001 - any failure to trace means: call it on the host
        return e


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {value!r}")
    if value < low:
        raise ValueError(f"{name}={value} must be >= {low}")
    return int(value)


def from_function(logprobs_fn: Callable, *, vocab_size: int, mask_id: int, seq_len: int,
                  encode: Callable[[str], Any] | None = None, separator=None, estimator: str = "k_dce",
                  num_samples: int = scoring.DEFAULT_INPUT_SAMPLES, batch_size: int = DEFAULT_BATCH_SIZE,
                  seed: int = 0, time_conditioned: bool = False, jax_function: bool | None = None,
                  params=None, tokenizer_name: str = "custom") -> scoring.Run:
    """A :class:`infodiff.scoring.Run` over a masked diffusion denoiser defined outside infodiff
    (module docstring): every method of a trained run (``nll``, ``conditional_nll``,
    ``log_ratio``, ``nll_interval``, ``conditional_nll_interval``).

    Args:
      logprobs_fn: ``fn(x_BxL int32[, t_B float32]) -> log-probabilities [B, L, vocab_size]``
        of the clean tokens; masked positions hold ``mask_id``; t (``time_conditioned``) is the
        time of the linear schedule (the masking probability, MD4's alpha_t = 1 - t).
      vocab_size: the model's number of ids (its output's last axis).
      mask_id: its mask id: ``vocab_size`` (the library's convention) or an id inside the
        vocabulary that the model never predicts.
      seq_len: L, the model's window: longer texts are scored in windows (docs/scoring.md).
      encode: str -> sequence of the model's token ids; default the text8 alphabet (a-z and
        space, cleaned) when vocab_size is 27 with mask_id 27, else required.
      separator: ids put between a prompt and its response; default none (text8: one space).
      estimator: one of ``scoring.SCORING_ESTIMATORS``; num_samples per window; batch_size rows
        per estimator call; seed: every method's default seed.
      jax_function: True (trace and jit), False (host callback), None (detect).
      params: None, or a pytree (a network's weights) that ``logprobs_fn`` takes first,
        ``logprobs_fn(params, x[, t])``; it is passed to the estimators' jitted programs as an
        argument, not baked in as constants (needs a function JAX can trace).
      tokenizer_name: the name of ``encode`` in reports (e.g. a tokenizer.json's path).
    Returns: a Run with ``workdir`` and ``checkpoint_step`` None and ``config.eval`` holding
      ``seed``, ``estimator``, ``input_samples``, ``batch_size``.
    Raises:
      TypeError: a non-callable function or encode, non-integer sizes; ValueError: sizes out of
      range, an unknown estimator, a function that fails or returns bad output on the probe
      batch (module docstring), jax_function=True for a function JAX cannot trace.
    """
    import ml_collections

    if not callable(logprobs_fn):
        raise TypeError(f"logprobs_fn must be a function of int32 ids [B, L]; got {type(logprobs_fn).__name__}")
    model_vocab = _check_int(vocab_size, "vocab_size", 2)
    mask_id = _check_int(mask_id, "mask_id", 0)
    if mask_id > model_vocab:
        raise ValueError(f"mask_id={mask_id} must be vocab_size={model_vocab} (the library's convention: ids 0.."
                         f"{model_vocab - 1} are tokens) or an id below it")
    L = _check_int(seq_len, "seq_len", 1)
    batch_size = _check_int(batch_size, "batch_size", 1)
    seed = _check_int(seed, "seed", 0)
    for name, v in (("time_conditioned", time_conditioned), ("jax_function", jax_function)):
        if not isinstance(v, bool) and not (name == "jax_function" and v is None):
            raise TypeError(f"{name} must be True or False{' or None' if name == 'jax_function' else ''}; got {v!r}")
    V = model_vocab - int(mask_id < model_vocab)
    tokenizer = make_tokenizer(encode, separator, model_vocab, mask_id, tokenizer_name)
    if params is not None:
        if jax_function is False:
            raise ValueError("params= needs a function JAX can trace (jax_function=True or None)")
        user_fn, logprobs_fn = logprobs_fn, (lambda *a: user_fn(params, *a))
    z, t = _probe_inputs(V, mask_id, L)
    args = (z, t) if time_conditioned else (z,)
    call = f"logprobs_fn(int32 [2, {L}]{', float32 t [2]' if time_conditioned else ''})"
    if jax_function is not False:
        err = _trace_error(logprobs_fn, args)
        if jax_function and err is not None:
            raise ValueError(f"jax_function=True but JAX cannot trace {call} ({_first_line(err)}); pass "
                             "jax_function=False to call it on the host") from err
        jax_function = err is None
    try:
        out = logprobs_fn(*(tuple(jnp.asarray(a) for a in args) if jax_function else args))
    except Exception as e:  # noqa: BLE001 - a user's function: say which call failed, in one line
        raise ValueError(f"{call} failed on a probe batch ({_first_line(e)}); it must take "
                         f"{'(x, t)' if time_conditioned else 'x alone'} (time_conditioned={time_conditioned})") from e
    if not isinstance(out, jax.Array) and not isinstance(out, np.ndarray) and hasattr(out, "__array__"):
        out = np.asarray(out)
    check_output(out, 2, L, model_vocab, mask_id)
    den = ExternalDenoiser(logprobs_fn if params is None else user_fn, model_vocab, mask_id, bool(time_conditioned),
                           bool(jax_function), params)
    task = ExternalTask(den, L, tokenizer)
    process = task.scoring_process(str(estimator))
    scoring.warn_few_samples(num_samples, process, "num_samples")
    config = ml_collections.ConfigDict({"eval": {"seed": seed, "estimator": str(estimator),
                                                 "input_samples": int(num_samples), "batch_size": batch_size}})
    return ExternalRun(None, config, task, den, process, None, num_samples, batch_size, tokenizer=tokenizer)
