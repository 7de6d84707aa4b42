"""Monte Carlo likelihood estimation with standard errors, for every process.

    -log p(x)                  nll(denoiser, x, key, process=... | estimator=...)
    -log p(y | x)              conditional_nll(denoiser, prompt_BxP, response_BxR, key, ...)
    log p(y|x) - log p(y'|x)   log_ratio(denoiser, prompt, y, y_alt, key, coupled=True)

One driver (:func:`estimate`) runs any :class:`infodiff.processes.base.Process` -- masked
(:class:`~infodiff.processes.masked.MaskedProcess`), score entropy
(:class:`~infodiff.processes.score_entropy.ScoreEntropyProcess`) or Poisson
(:class:`~infodiff.processes.poisson.PoissonProcess`) -- over a denoiser (a trained network or
an exact oracle, :mod:`infodiff.denoisers`) and returns one result type, :class:`Estimate`:
per-sample values, standard error, forward passes and the terms {diffusion, prior, recon,
total}. Without ``process`` the masked process of ``estimator`` is used: 't_dce', 'lambda_dce'
(infinite variance, flagged), 'k_dce', 'time_free', 'stratified', 'neyman' (the default: lowest
variance per forward pass; exact enumeration when every mask subset fits the budget)
(docs/discrete_diffusion.md §6). ``imdse_nll`` (SEDD) and ``poisson_nll`` are thin wrappers
that build their process. The coupled log-ratio (arXiv 2510.24088 Eq. 18) shares every
noise draw between the two inputs.

Units: nats per sequence (per example for Poisson), the sum over the target positions. Each
per-sample value is computed in float32 on the device and every Monte Carlo sum, mean and
variance is accumulated in float64 on the host.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from infodiff import denoisers
from infodiff import interrupts
from infodiff import parallel
from infodiff import schedules as schedules_lib
from infodiff.processes import base
from infodiff.processes import masked
from infodiff.processes import poisson
from infodiff.processes import score_entropy as se
from infodiff import validation
from infodiff.validation import validate_tokens

__all__ = ["Estimate", "estimate", "slice_rows", "in_slices", "SLICE_TOKENS", "nll", "conditional_nll", "paired_conditional_nll", "paired_nll", "coupled_nll", "log_ratio",
           "masked_process", "imdse_nll", "imdse_conditional_nll", "poisson_nll", "ESTIMATORS",
           "TERMS"]

TERMS = ("diffusion", "prior", "recon", "total")


def __getattr__(name: str):
    if name == "ESTIMATORS":  # the masked estimators: the registered mask laws (masking.LAWS)
        return tuple(masked.LAWS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SE_METHODS = {
    "iid": "std(samples, ddof=1) / sqrt(S) over the S i.i.d. Monte Carlo samples",
    "exact": "no Monte Carlo term (every term computed exactly): SE 0",
    "strata_pairs": "samples (2h, 2h+1) are 2 draws of stratum h: SE = sqrt(sum_h (f_2h - f_2h+1)^2) / S",
}
T_SCALING = ("every SE is Student-t scaled, SE = raw SE x t_{0.975, dof} / 1.96, so that +-1.96 SE "
             "is the 95% t-interval (per item dof = S - 1: factor 1.07 at S = 32, 1.01 at 128; a "
             "split's SE pools the items' variances, dof = B (S - 1), factor ~1)")
DEFAULT_MIN_SAMPLES = base.DEFAULT_MIN_SAMPLES  # below a process's min_samples the SE is flagged (Estimate.few_samples)
Z975 = 1.959963984540054


def _stderr_iid(samples_BxS: np.ndarray) -> np.ndarray:
    S = samples_BxS.shape[1]
    if S < 2:
        return np.full(samples_BxS.shape[0], np.nan)
    return samples_BxS.std(axis=1, ddof=1) / math.sqrt(S)


def _stderr_strata_pairs(samples_BxS: np.ndarray) -> np.ndarray:
    """Stratified sampling with 2 draws per stratum (docs/poisson.md "How the standard error is
    computed"): Var(mean) = (1/S^2) sum_h 2 sigma_h^2 and (f_2h - f_2h+1)^2 / 2 estimates
    sigma_h^2 without bias, so SE = sqrt(sum_h (f_2h - f_2h+1)^2) / S. float64 [B]."""
    S = samples_BxS.shape[1]
    if S < 2 or S % 2:
        return np.full(samples_BxS.shape[0], np.nan)
    d = samples_BxS[:, 0::2] - samples_BxS[:, 1::2]
    return np.sqrt(np.sum(d * d, axis=1)) / S


# se_method -> (raw SE float64 [B] from samples [B, S], degrees of freedom of each item's SE)
_STDERR = {"iid": (_stderr_iid, lambda S: S - 1), "strata_pairs": (_stderr_strata_pairs, lambda S: S // 2)}


def t_factor(dof) -> float:
    """t_{0.975, dof} / 1.96 (NaN for dof < 1). ``scipy.special.stdtrit`` is what
    ``scipy.stats.t.ppf`` computes, without the 0.5 s import of scipy.stats."""
    if dof is None or dof < 1:
        return float("nan")
    return float(scipy.special.stdtrit(dof, 0.975)) / Z975



@dataclasses.dataclass
class Estimate:
    """Per-sequence Monte Carlo estimates of -log p (or of a log-ratio), nats.

    samples: float64 [B, S] one-sample estimates of the Monte Carlo part of the ``diffusion``
      term (S = 0 when everything was computed exactly).
    exact: {name: float64 [B]} terms computed without Monte Carlo error: 'prior', 'recon', and
      'diffusion' for the part of the diffusion integral that was enumerated exactly.
    forward_passes: denoiser evaluations per sequence (S x passes per sample, plus any exact
      term's passes; 2 x for a ratio).
    infinite_variance: the estimator's variance is infinite: ``stderr`` is not trustworthy.
    se_method: how the raw SE is computed, a key of ``SE_METHODS`` (default 'iid'); ``stderr``
      is it Student-t scaled (``T_SCALING``).
    min_samples: the fewest samples at which this estimator's SE was measured to be calibrated
      (tests/test_calibration.py); fewer are flagged by ``few_samples``.
    info: process-specific facts for reports (e.g. Poisson's alpha range).

    ``mean`` = Monte Carlo mean + sum of the exact terms; ``stderr`` = raw SE (``se_method``) x
    t_{0.975, dof} / 1.96 (the exact terms add no error).
    """

    estimator: str
    samples: np.ndarray
    forward_passes: int
    infinite_variance: bool = False
    exact: dict = dataclasses.field(default_factory=dict)
    info: dict = dataclasses.field(default_factory=dict)
    se_method: str = "iid"
    min_samples: int = DEFAULT_MIN_SAMPLES

    def __post_init__(self):
        if self.samples.shape[1] == 0:
            self.se_method = "exact"
        if self.se_method not in SE_METHODS:
            raise ValueError(f"unknown se_method {self.se_method!r}; choose from {tuple(SE_METHODS)}")

    @property
    def num_samples(self) -> int:
        return self.samples.shape[1]

    @property
    def is_exact(self) -> bool:
        """True when no term has Monte Carlo error (SE 0, e.g. every mask subset enumerated)."""
        return self.num_samples == 0

    @property
    def mc_mean(self) -> np.ndarray:
        """float64 [B] mean of the Monte Carlo samples (0 when there are none)."""
        if self.num_samples == 0:
            return np.zeros(self.samples.shape[0])
        return self.samples.mean(axis=1)

    @property
    def diffusion(self) -> np.ndarray:
        """float64 [B] the diffusion (time- or SNR-integral) term: Monte Carlo mean plus any
        exactly enumerated part."""
        return self.mc_mean + self.exact.get("diffusion", 0.0)

    @property
    def prior(self) -> np.ndarray:
        """float64 [B] the exact prior term (0 where the process has none)."""
        return self.exact.get("prior", np.zeros(self.samples.shape[0]))

    @property
    def recon(self) -> np.ndarray:
        """float64 [B] the exact reconstruction term (0 where the process has none)."""
        return self.exact.get("recon", np.zeros(self.samples.shape[0]))

    @property
    def mean(self) -> np.ndarray:
        """float64 [B] the estimated total per sequence (nats)."""
        out = self.mc_mean
        for v in self.exact.values():
            out = out + v
        return out

    @property
    def terms(self) -> dict:
        """{'diffusion', 'prior', 'recon', 'total'}: float64 [B] each (nats)."""
        return {"diffusion": self.diffusion, "prior": self.prior, "recon": self.recon,
                "total": self.mean}

    @property
    def per_sample_std(self) -> np.ndarray:
        """float64 [B] standard deviation of one Monte Carlo sample (nats; 0 if exact)."""
        if self.is_exact:
            return np.zeros(self.samples.shape[0])
        if self.num_samples < 2:
            return np.full(self.samples.shape[0], np.nan)
        return self.samples.std(axis=1, ddof=1)

    @property
    def stderr_raw(self) -> np.ndarray:
        """float64 [B] the unscaled SE of ``mean`` by ``se_method`` (nats; 0 if exact)."""
        if self.is_exact:
            return np.zeros(self.samples.shape[0])
        return _STDERR[self.se_method][0](self.samples)

    @property
    def dof(self) -> int:
        """Degrees of freedom of each item's SE (S - 1 for i.i.d. samples; 0 if exact)."""
        return 0 if self.is_exact else int(_STDERR[self.se_method][1](self.num_samples))

    @property
    def stderr(self) -> np.ndarray:
        """float64 [B] standard error of ``mean`` (nats): ``stderr_raw`` x t_{0.975, dof} / 1.96,
        so that +-1.96 SE is the Student-t 95% interval."""
        if self.is_exact:
            return np.zeros(self.samples.shape[0])
        return self.stderr_raw * t_factor(self.dof)

    def pooled_stderr(self) -> float:
        """SE of the sum over the B items: their raw variances pooled, t-scaled with
        dof = B x item dof (a factor ~1)."""
        se = float(np.sqrt(np.sum(self.stderr_raw**2)))
        return se if self.is_exact else se * t_factor(len(self.mean) * self.dof)

    @property
    def few_samples(self) -> bool:
        """True when the SE rests on fewer samples than ``min_samples``: heavy-tailed per-sample
        values make the sample SE too small there (docs/discrete_diffusion.md §6.10)."""
        return 0 < self.num_samples < self.min_samples

    @property
    def se_description(self) -> str:
        return SE_METHODS[self.se_method]

    @property
    def variance_per_forward_pass(self) -> np.ndarray:
        """float64 [B]: Var(one sample) x forward passes per sample (variance at a budget of one pass)."""
        if self.is_exact:
            return np.zeros(self.samples.shape[0])
        return self.per_sample_std**2 * (self.forward_passes / self.num_samples)

    def total(self):
        """(sum of means, its stderr) over the batch, nats (e.g. a corpus NLL); see
        :meth:`pooled_stderr`."""
        return float(self.mean.sum()), self.pooled_stderr()

    def split_mean(self, subset: bool = False) -> dict:
        """The mean over the B sequences (a split's NLL) with ONE standard-error convention.

        ``stderr_mc`` = :meth:`pooled_stderr` / B, the Monte Carlo error given these sequences;
        ``stderr_data_and_mc`` = std over sequences of the per-sequence estimates / sqrt(B).
        ``stderr`` is ``stderr_mc`` when the whole split was evaluated (``subset=False``: the
        split's NLL is then a fixed number and only the Monte Carlo error remains) and the larger
        of the two for a random subset (the sampling of sequences adds error; with heavy-tailed
        values the spread can come out below the MC error, hence the max). Returns floats:
        ``mean``, ``stderr``, ``stderr_kind``, ``stderr_mc``, ``stderr_data_and_mc``, ``terms``
        (mean of each term), ``num_sequences``.
        """
        means = self.mean
        B = len(means)
        se_mc = self.pooled_stderr() / B
        se_data = float(means.std(ddof=1) / math.sqrt(B)) if B > 1 else float("nan")
        se = max(se_data, se_mc) if subset else se_mc
        kind = ("data+mc (random subset of the split; at least the mc SE)" if subset
                else "mc (every item of the split)")
        return {"mean": float(means.mean()), "stderr": se, "stderr_kind": kind, "stderr_mc": se_mc,
                "stderr_data_and_mc": se_data,
                "terms": {k: float(v.mean()) for k, v in self.terms.items()}, "num_sequences": B}

    def summary(self) -> dict:
        return {
            "estimator": self.estimator,
            "mean": self.mean.tolist(),
            "stderr": self.stderr.tolist(),
            "terms": {k: v.tolist() for k, v in self.terms.items()},
            "num_samples": self.num_samples,
            "forward_passes": self.forward_passes,
            "infinite_variance": self.infinite_variance,
            "se_method": self.se_method,
            "exact": self.is_exact,
            "few_samples": self.few_samples,
        }


# ---------------------------------------------------------------------------------------------
# The Monte Carlo driver
# ---------------------------------------------------------------------------------------------
# Rows of one denoiser evaluation inside a driver call, by backend: the forward's rows/s on a
# CPU fall ~3x from 32 to 256 rows of L = 64 (the attention's working set leaves the cache), so
# a call of eval.batch_size rows runs as lax.map over slices of about this many tokens. Backends
# not listed evaluate a call in one piece. The slicing never changes the random draws.
SLICE_TOKENS = {"cpu": 2048}


def slice_rows(seq_len: int, backend: str | None = None) -> int:
    """Rows per denoiser evaluation for sequences of ``seq_len`` tokens on ``backend`` (default
    JAX's); 0 = the whole call at once."""
    tokens = SLICE_TOKENS.get(backend or jax.default_backend(), 0)
    return max(1, tokens // max(1, int(seq_len))) if tokens else 0


def in_slices(fn, rows: int, *args_R, mesh=None):
    """``fn(*args_R)`` for a row-wise ``fn`` whose arguments are pytrees with leading dimension
    R, evaluated by ``lax.map`` over slices of ``rows`` rows (the last slice filled by wrapping
    around and trimmed). The same values as one evaluation, to float rounding. With a ``mesh``
    (:func:`infodiff.parallel.rows_mesh`) every slice is split over all its devices (``rows``,
    or R when 0, rounded up to a multiple of the device count)."""
    R = jax.tree.leaves(args_R)[0].shape[0]
    if mesh is None and (not rows or R <= rows):
        return fn(*args_R)
    split = lambda a: a
    if mesh is not None:
        d = int(mesh.devices.size)
        whole = -(-R // d) * d
        rows = min(rows * d, whole) if rows else whole
        spec = lambda a: NamedSharding(mesh, P(tuple(mesh.axis_names), *([None] * (a.ndim - 1))))
        split = lambda tree: jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, spec(a)), tree)
    n = -(-R // rows)
    if n * rows == R:
        take = lambda a: a.reshape((n, rows) + a.shape[1:])
    else:
        idx = jnp.arange(n * rows) % R
        take = lambda a: a[idx].reshape((n, rows) + a.shape[1:])
    out = jax.lax.map(lambda a: split(fn(*split(a))), jax.tree.map(take, args_R))
    return out.reshape((n * rows,) + out.shape[2:])[:R]


@functools.partial(jax.jit, static_argnames=("process", "apply_fn", "num_samples", "per", "rows", "mesh"))
def _chunk_values(process, apply_fn, params, key, s0, xs_NxBxL, target_BxL, num_samples, per, rows=0, mesh=None):
    """S draws per row, shared by every x in xs (coupling). float32 [N, B, S]. A target of
    shape [N, B, L] (a pair whose two inputs score different positions) draws each input's
    noise from the same key on its own target (common random numbers where the targets agree).
    The noise is drawn for the whole call; the denoiser runs in slices of ``rows`` rows
    (:func:`in_slices`; 0 = at once), split over the devices of ``mesh`` if given (the result
    then whole on every device)."""
    N, B = xs_NxBxL.shape[:2]
    R = B * num_samples * per
    sample_R = (s0 + (jnp.arange(R) // per) % num_samples).astype(jnp.int32)
    per_input = target_BxL.ndim == 3
    if not per_input:
        tgt = jnp.repeat(target_BxL, num_samples * per, axis=0)  # [R, L]
        noise = process.draw_noise(key, tgt, sample_R)
    integrand = lambda x, nz, t: process.integrand(apply_fn, params, x, nz, t)
    outs = []
    for n in range(N):
        if per_input:
            tgt = jnp.repeat(target_BxL[n], num_samples * per, axis=0)
            noise = process.draw_noise(key, tgt, sample_R)
        x = jnp.repeat(xs_NxBxL[n], num_samples * per, axis=0)
        v = in_slices(integrand, rows, x, noise, tgt, mesh=mesh)
        outs.append(v.reshape(B, num_samples, per).sum(axis=-1))
    out = jnp.stack(outs)
    if mesh is not None:
        out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, P()))
    return out


def chunk_shape(order: str, B: int, S: int, batch_size: int, per: int) -> tuple[int, int]:
    """(rows, samples) per denoiser call so that rows x samples x per <= batch_size.

    'rows' fills a call with as many sequences as fit, 'samples' with as many samples of one
    sequence. The grouping fixes which random draws go together, so it is part of each
    process's random stream (kept per process so that published numbers reproduce)."""
    budget = max(1, batch_size // per)
    if order == "rows":
        s_chunk = max(1, min(S, budget // max(1, min(B, budget))))
    else:
        s_chunk = max(1, min(S, budget))
    return max(1, min(B, budget // s_chunk)), s_chunk


def estimate(process, denoiser, xs_NxBxL, target_BxL, key, num_samples: int, batch_size: int,
             independent: bool = False, progress: bool = False, desc: str = "",
             rows_per_slice: int | None = None) -> np.ndarray:
    """The driver: Monte Carlo values float64 [N, B, S] of ``process.integrand``.

    ``target_BxL`` is bool [B, L], shared by the N inputs, or [N, B, L] (one per input).

    Calls of a fixed shape (the last chunk padded and trimmed: one compilation) of
    ``chunk_shape(process.chunk_order, ...)`` rows x samples; chunk (b0, s0) uses the key
    ``fold_in(fold_in(key, b0), s0)``. The N inputs share every noise draw, or with
    ``independent`` each gets its own (``fold_in(chunk_key, 1_000_003 + n)``). ``progress``
    shows a tqdm bar with ETA. For a ``row_wise`` process the denoiser runs in slices of
    ``rows_per_slice`` rows inside each call (default :func:`slice_rows` of the backend; 0 = at
    once): speed only, the draws are those of the whole call. Inside
    :func:`infodiff.parallel.rows_mesh` the rows of each call are split over every device of
    every process (each slice ``rows_per_slice`` rows per device) and the values gathered: the
    same draws, so the same numbers to float rounding. A SIGINT that arrives during the
    loop (:mod:`infodiff.interrupts`) stops it between calls. Raises ValueError for a
    ``rows_per_slice`` that is not an integer >= 0 or that slices a process that is not row-wise,
    FloatingPointError naming the sequence if a value is not finite.
    """
    N, B = xs_NxBxL.shape[:2]
    apply_fn, params = denoisers.split(denoiser)
    if rows_per_slice is None:
        rows_per_slice = slice_rows(xs_NxBxL.shape[-1]) if process.row_wise else 0
    if isinstance(rows_per_slice, bool) or not isinstance(rows_per_slice, (int, np.integer)) or rows_per_slice < 0:
        raise ValueError(f"rows_per_slice must be an integer >= 0 (0 = no slices); got {rows_per_slice!r}")
    if rows_per_slice and not process.row_wise:
        raise ValueError(f"rows_per_slice={rows_per_slice}: the {type(process).__name__} is not row-wise (its "
                         "noise is shared by all rows of a call); use 0 or leave it unset")
    mesh = parallel.current_rows_mesh() if process.row_wise else None
    interrupts_before = interrupts.count()
    per = process.passes_per_sample(target_BxL)
    b_chunk, s_chunk = chunk_shape(process.chunk_order, B, num_samples, batch_size, per)
    out = np.zeros((N, B, num_samples), np.float64)
    bar = None
    if progress and jax.process_index() == 0:  # one bar in a multi-process run, on a terminal
        from infodiff import progress as progress_lib  # progress bar with ETA on long evaluations

        n_calls = math.ceil(B / b_chunk) * math.ceil(num_samples / s_chunk) * (N if independent else 1)
        bar = progress_lib.bar(n_calls, desc or f"{process.estimator} ({B} seq x {num_samples} MC)", "batch")
    shown = (0.0, 0)  # the bar's running (nats, tokens)
    try:
        for b0 in range(0, B, b_chunk):
            b1 = min(B, b0 + b_chunk)
            rows = np.arange(b0, b0 + b_chunk) % B
            for s0 in range(0, num_samples, s_chunk):
                s1 = min(num_samples, s0 + s_chunk)
                k = jax.random.fold_in(jax.random.fold_in(key, b0), s0)
                groups = [(k, slice(None))]
                if independent:
                    groups = [(jax.random.fold_in(k, 1_000_003 + n), slice(n, n + 1)) for n in range(N)]
                for kn, sel in groups:
                    tgt = target_BxL[sel][:, rows] if target_BxL.ndim == 3 else target_BxL[rows]
                    vals = _chunk_values(process, apply_fn, params, kn, s0, xs_NxBxL[sel][:, rows],
                                         tgt, s_chunk, per, int(rows_per_slice), mesh)
                    out[sel, b0:b1, s0:s1] = np.asarray(vals, np.float64)[:, : b1 - b0, : s1 - s0]
                    interrupts.raise_if_new(interrupts_before)
                    if bar is not None:
                        bar.update(1)
            if bar is not None and not bar.disable:  # rows b0:b1 done: the running mean so far
                shown = _progress_postfix(bar, out[0, b0:b1], (target_BxL if target_BxL.ndim == 2
                                                               else target_BxL[0])[b0:b1], b1, shown)
    finally:  # closed before an error or Ctrl-C is reported below it
        if bar is not None:
            bar.close()
    if not np.all(np.isfinite(out)):
        bad = np.argwhere(~np.isfinite(out))[0]
        raise FloatingPointError(
            f"non-finite per-sample value {out[tuple(bad)]} for sequence {bad[1]} (sample {bad[2]}): "
            f"the denoiser {process.denoiser_inputs} returned -inf/NaN (or <= 0) where the data "
            "has mass")
    return out


def _progress_postfix(bar, new_BxS: np.ndarray, target_BxL: np.ndarray, b1: int,
                      shown: tuple = (0.0, 0)) -> tuple:
    """The bar's postfix after rows ``.. b1`` are scored: the Monte Carlo part of -log p of the
    rows so far, nats per sequence and bits per scored token (display only; the exact terms are
    added after). ``new_BxS`` / ``target_BxL``: the rows just scored; ``shown``: (nats, tokens)
    of the rows before them. Returns the running (nats, tokens)."""
    nats = shown[0] + float(new_BxS.mean(axis=1).sum())
    target = np.asarray(target_BxL)
    tokens = shown[1] + (int(target.sum()) if target.dtype == bool else 0)
    post = {"nats/seq": f"{nats / max(b1, 1):.4g}"}
    if tokens:
        post["bits/token"] = f"{nats / (tokens * math.log(2.0)):.4f}"
    bar.set_postfix(post, refresh=False)
    return nats, tokens


# ---------------------------------------------------------------------------------------------
# Public estimators
# ---------------------------------------------------------------------------------------------
def masked_process(estimator: str, schedule=None, vocab_size: int = 0) -> masked.MaskedProcess:
    """The masked process of an estimator name (unbiased boundaries; default linear schedule,
    eps 1e-4). Raises ValueError for an unknown name."""
    if estimator not in masked.LAWS:
        raise ValueError(f"unknown estimator {estimator!r}; choose from {tuple(masked.LAWS)}")
    schedule = schedule or schedules_lib.LinearSchedule()
    spec = masked.MaskSpec(name=estimator, schedule=schedule, exact_boundaries=True)
    return masked.MaskedProcess(spec, int(vocab_size))


def _check_common(num_samples, batch_size):
    for name, v in (("num_samples", num_samples), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an integer; got {v!r}")
    validation.check_num_samples(num_samples)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")


def _pad(pad_BxL, x_BxL, process):
    """The bool [B, L] pad mask (None if none), checked: a process with a ``pad_id``, the data's
    shape."""
    if pad_BxL is None:
        return None
    if process.pad_id is None:
        raise NotImplementedError(f"padding (pad_BxL) needs a process with a pad token; the {type(process).__name__} "
                                  f"({process.estimator}) scores every position of a fixed-length input: drop pad_BxL")
    pad = np.asarray(pad_BxL)
    if pad.dtype != bool or pad.shape != np.shape(x_BxL):
        raise ValueError(f"pad_BxL must be bool with the data's shape {np.shape(x_BxL)}; got {pad.dtype} {pad.shape}")
    return pad


def _mask_pads(x, pad, target, process):
    """x with ``process.pad_id`` at the pads; ValueError if a pad is a target position."""
    if pad is None:
        return x
    if np.any(pad & target):
        b, l = np.argwhere(pad & target)[0]
        raise ValueError(f"position [{b}, {l}] is both a pad and a target position")
    return np.where(pad, process.pad_id, x).astype(x.dtype)


def _target(target_BxL, shape, pad=None):
    if target_BxL is None and pad is not None:
        return ~pad
    if target_BxL is None:
        return np.ones(shape, bool)
    target = np.asarray(target_BxL)
    if target.shape != tuple(shape) or target.dtype != bool:
        raise ValueError(f"target_BxL must be bool with shape {tuple(shape)}; got {target.dtype} {target.shape}")
    return target


def _warn_infinite(process) -> None:
    if process.infinite_variance:
        warnings.warn(
            f"{process.estimator} has infinite variance here (docs/discrete_diffusion.md §6.2): its "
            "standard error is not reliable; prefer a finite-variance estimator for reported numbers",
            RuntimeWarning, stacklevel=3)


def _resolve_process(denoiser, process, estimator, schedule, vocab_size):
    if process is not None:
        if schedule is not None or estimator is not None:
            raise ValueError("give either process= or estimator=/schedule= (the masked process), not both")
        return process
    return masked_process(estimator or DEFAULT_ESTIMATOR, schedule, denoisers.vocab_size_of(denoiser, vocab_size))


DEFAULT_ESTIMATOR = "neyman"  # lowest variance per pass measured (benchmarks/estimator_variance.py)
DEFAULT_PASSES = 128          # default Monte Carlo budget: forward passes per sequence


def default_num_samples(process, target_BxL) -> int:
    """DEFAULT_PASSES passes per sequence: that many samples for one-pass estimators;
    max(min_samples, DEFAULT_PASSES / n) rounds of n passes for stratified, and twice min_samples
    at least for neyman (whose pilot and enumerated strata come out of the same budget)."""
    per = process.passes_per_sample(target_BxL)
    if per <= 1:
        return DEFAULT_PASSES
    return max(process.min_samples * (2 if process.needs_plan else 1), -(-DEFAULT_PASSES // per))


def nll(denoiser, x_BxL, key, *, process=None, estimator: str | None = None, num_samples: int | None = None,
        batch_size: int = 1024, target_BxL=None, pad_BxL=None, schedule=None, vocab_size: int | None = None,
        progress: bool = False, check_normalised: bool = True) -> Estimate:
    """Estimate -log p(x) (or -log p(x[target] | x[rest])) per sequence, in nats.

    Args:
      denoiser: a network or an oracle (:mod:`infodiff.denoisers`) with the inputs of the
        process (masked: (z_BxL int32, t_B float32) -> logprobs_BxLxV, normalised over V).
      x_BxL: the data: int [B, L] tokens in [0, V) (masked, SEDD) or float [B, D] scaled counts
        (Poisson).
      key: PRNG key, or an integer seed (``jax.random.key(seed)``); results are a pure function
        of it (and of batch_size, which groups draws).
      process: a Process (:mod:`infodiff.processes.base`); default the masked process of
        ``estimator`` ('t_dce' | 'lambda_dce' | 'k_dce' | 'time_free' | 'stratified' | 'neyman'
        (default: the lowest variance per pass, docs/discrete_diffusion.md §6.9)) with
        ``schedule`` (t_dce's law, and the map from mask fraction to time for time-conditioned
        denoisers; default linear, eps 1e-4) and ``vocab_size`` (default denoiser.vocab_size).
      num_samples: Monte Carlo samples S per sequence (>= 2); a sample costs 1 forward pass, n
        (the target count) for 'stratified' and 'neyman'. Default (None): 128 passes per
        sequence, at least 8 rounds of n passes for stratified and 16 for neyman
        (:func:`default_num_samples`). neyman stays within S n passes per sequence, pilot and
        enumerated strata included, and reports the samples of its Monte Carlo part (S' < S).
      batch_size: rows per denoiser call.
      target_BxL: optional bool [B, L]: positions whose likelihood is estimated; the others are
        context and never noised. Default: all positions (all but the pads).
      pad_BxL: optional bool [B, L], masked process only: positions absent from the sequence
        (a text shorter than the model's length). They hold the mask token throughout and are
        never scored, so the estimate is of the marginal likelihood of the other positions
        (docs/discrete_diffusion.md §7.3).
        Their values in ``x_BxL`` are ignored; they must not be target positions.
      progress: show a progress bar with ETA (tqdm) on stderr.
      check_normalised: masked process: check on the first rows that the denoiser returns
        normalised log-probabilities (:func:`validation.check_normalised`, one extra call);
        False skips it (e.g. for a deliberately unnormalised model).
    Returns: Estimate (samples float64 [B, S], exact terms, forward passes).
    Raises: TypeError/ValueError for bad data (non-integer, wrongly shaped or out-of-vocabulary
      tokens; counts off the lattice; an empty batch; a length other than the denoiser's
      ``seq_len``), a key that is neither a key nor an integer, an unnormalised masked denoiser,
      a target of the wrong shape, num_samples < 2;
      NotImplementedError for a target the process cannot condition on; FloatingPointError if
      the denoiser gives a non-finite value.
    Source: arXiv 2510.24088 Eqs. 13, 15-17; docs/discrete_diffusion.md §6, docs/poisson.md §3.
    """
    key = validation.as_key(key)
    validation.check_batch(x_BxL)
    process = _resolve_process(denoiser, process, estimator, schedule, vocab_size)
    pad = _pad(pad_BxL, x_BxL, process)
    x = process.validate(x_BxL if pad is None else np.where(pad, 0, np.asarray(x_BxL)))
    validation.check_seq_len(x, denoiser)
    target = _target(target_BxL, x.shape, pad)
    x = _mask_pads(x, pad, target, process)
    if num_samples is None:
        num_samples = default_num_samples(process, target)
    _check_common(num_samples, batch_size)
    process.check_target(target)
    apply_fn, params = denoisers.split(denoiser)
    if check_normalised and process.checks_normalised:
        validation.check_normalised(apply_fn, params, x, target, process.vocab_size)
    _warn_infinite(process)
    process, S, pilot_passes = _planned(process, denoiser, x, target, key, int(num_samples), int(batch_size))
    if process.passes_per_sample(target) == 0:  # every term exact (e.g. all mask subsets enumerated)
        vals, S = np.zeros((1, x.shape[0], 0)), 0
    else:
        vals = estimate(process, denoiser, x[None], target, key, S, int(batch_size), progress=progress)
    exact = process.exact_terms(apply_fn, params, x, target, int(batch_size))
    return _estimate_of(process, vals[0], S * process.passes_per_sample(target) + pilot_passes, exact)


def _estimate_of(process, samples_BxS, mc_passes: int, exact: dict) -> Estimate:
    """The Estimate of ``process`` (every process fact it carries, in one place): ``mc_passes``
    forward passes per sequence of the Monte Carlo part and its pilot, plus the exact terms'
    ``process.extra_passes()``."""
    return Estimate(process.estimator, samples_BxS, forward_passes=int(mc_passes) + process.extra_passes(),
                    infinite_variance=process.infinite_variance, exact=exact,
                    se_method=process.se_method, min_samples=int(process.min_samples))


PILOT_KEY = 0x70110  # fold_in constant of the pilot stage's key


def _planned(process, denoiser, x, target, key, num_samples, batch_size, independent=False):
    """A two-stage process (``needs_plan``, e.g. neyman) with its pilot run on an independent
    key and kept out of the estimate. ``x`` is [B, L], or [2, B, L] for a pair (the plan then
    minimises the variance of the difference). Returns (process, Monte Carlo samples to draw,
    pilot forward passes per sequence, both inputs of a pair counted)."""
    if not process.needs_plan:
        return process, num_samples, 0
    stage = process.pilot_stage(target, num_samples)
    pilot_vals, pilot_passes = None, 0
    if stage is not None:
        pilot, s_pilot, k = stage
        xs = (x if x.ndim == 3 else x[None])[:, :k]
        v = estimate(pilot, denoiser, xs, target[:k], jax.random.fold_in(key, PILOT_KEY), int(s_pilot),
                     batch_size, independent=independent)
        pilot_vals = v[0] if len(v) == 1 else v[1] - v[0]
        # per sequence of the batch (the first k were piloted), both inputs of a pair counted
        pilot_passes = -(-len(v) * k * int(s_pilot) * pilot.passes_per_sample(target[:k]) // target.shape[0])
    planned, S = process.plan(pilot_vals, target, num_samples)
    return planned, S, pilot_passes


def _concat(prompt_BxP, response_BxR, V):
    p = validate_tokens(prompt_BxP, V, name="prompt")
    r = validate_tokens(response_BxR, V, name="response")
    if p.shape[0] != r.shape[0]:
        raise ValueError(f"prompt and response batch sizes differ: {p.shape} vs {r.shape}")
    if r.shape[1] < 1:
        raise ValueError("response must have at least one token")
    x = np.concatenate([p, r], axis=1)
    target = np.zeros(x.shape, bool)
    target[:, p.shape[1]:] = True
    return x, target


def _vocab(denoiser, process, vocab_size):
    if process is not None and process.vocab_size is not None:
        return int(process.vocab_size)
    return denoisers.vocab_size_of(denoiser, vocab_size)


def conditional_nll(denoiser, prompt_BxP, response_BxR, key, **kwargs) -> Estimate:
    """Estimate -log p(response | prompt) per pair, nats per response.

    Only response positions are noised; the prompt is always visible (Cor. 4.3 / Eq. 17 for
    'time_free'; Eq. 16 for 'lambda_dce'). The denoiser sees [prompt; response] of length
    P + R. Keyword arguments as in :func:`nll`. Raises ValueError for mismatched batch sizes,
    an empty response or bad tokens.
    """
    V = _vocab(denoiser, kwargs.get("process"), kwargs.get("vocab_size"))
    x, target = _concat(prompt_BxP, response_BxR, V)
    kwargs["vocab_size"] = V
    return nll(denoiser, x, key, target_BxL=target, **kwargs)


def paired_conditional_nll(denoiser, prompt_BxP, response_BxR, alt_response_BxR, key, *,
                           coupled: bool = True, process=None, estimator: str | None = None,
                           num_samples: int | None = None, batch_size: int = 1024, schedule=None,
                           vocab_size: int | None = None) -> tuple[Estimate, Estimate]:
    """-log p(y | x) and -log p(y' | x) per triple, nats per response, as two Estimates.

    coupled=True (arXiv 2510.24088 Eq. 18): sample s of both uses the same noise (mask
    positions, weight, time), so their difference has the variance of common random numbers;
    coupled=False draws independent noise. Each Estimate counts its own forward passes.
    y and y' must have the same length R (the noise is shared position by position); for
    responses of different lengths use :func:`paired_nll` with pads (as ``infodiff.scoring``
    does). Raises ValueError naming both shapes.
    """
    key = validation.as_key(key)
    validation.check_batch(prompt_BxP, "prompt")
    V = _vocab(denoiser, process, vocab_size)
    ya = np.asarray(response_BxR)
    yb = np.asarray(alt_response_BxR)
    if ya.shape != yb.shape:
        raise ValueError(
            f"coupled ratio needs responses of equal shape; got {ya.shape} and {yb.shape} "
            "(pad both to a common length, or use paired_nll with pads)"
        )
    xa, target = _concat(prompt_BxP, ya, V)
    xb, _ = _concat(prompt_BxP, yb, V)
    process = _resolve_process(denoiser, process, estimator, schedule, V)
    return _coupled(process, denoiser, [xa, xb], target, key, coupled, num_samples, batch_size)


def paired_nll(denoiser, xa_BxL, xb_BxL, key, *, target_a_BxL, target_b_BxL, pad_a_BxL=None, pad_b_BxL=None,
               coupled: bool = True, process=None, estimator: str | None = None, num_samples: int | None = None,
               batch_size: int = 1024, schedule=None, vocab_size: int | None = None) -> tuple[Estimate, Estimate]:
    """-log p(xa[target_a] | rest) and -log p(xb[target_b] | rest) per row (nats), coupled as in
    :func:`paired_conditional_nll`, for two inputs whose targets and pads (:func:`nll`) may differ,
    e.g. a prompt with responses of different lengths, each padded to a common width. Where the
    targets differ the noise of both comes from the same key drawn on each target; an estimator
    with several passes per sample (stratified, neyman) needs equal targets (ValueError).
    :func:`coupled_nll` with N = 2."""
    return coupled_nll(denoiser, [xa_BxL, xb_BxL], key, target_NxBxL=[target_a_BxL, target_b_BxL],
                       pad_NxBxL=[pad_a_BxL, pad_b_BxL], coupled=coupled, process=process, estimator=estimator,
                       num_samples=num_samples, batch_size=batch_size, schedule=schedule, vocab_size=vocab_size)


def coupled_nll(denoiser, xs_NxBxL, key, *, target_NxBxL, pad_NxBxL=None, coupled: bool = True, process=None,
                estimator: str | None = None, num_samples: int | None = None, batch_size: int = 1024,
                schedule=None, vocab_size: int | None = None) -> tuple[Estimate, ...]:
    """-log p(xs[n][target_n] | rest) per input n and row (nats) for N >= 2 inputs of the same rows
    (e.g. the answer options of a multiple-choice question), every Monte Carlo sample drawn with the
    same noise for all N (coupled; arXiv 2510.24088 Eq. 18 for N = 2), so the differences' noise
    is small; ``coupled=False`` gives each input its own draws. Targets and pads (:func:`nll`) may
    differ between inputs (per-input-target estimators: k_dce, t_dce, time_free). ``batch_size``
    is shared by the N inputs. Returns N Estimates [B]. Raises ValueError for N < 2, inputs of
    different shapes, or an estimator that needs equal targets (or a pilot plan, N > 2)."""
    key = validation.as_key(key)
    process = _resolve_process(denoiser, process, estimator, schedule, vocab_size)
    N = len(xs_NxBxL)
    pads = [None] * N if pad_NxBxL is None else list(pad_NxBxL)
    if N < 2 or len(target_NxBxL) != N or len(pads) != N:
        raise ValueError(f"coupled_nll needs N >= 2 inputs with one target (and pad) each; got {N} inputs, "
                         f"{len(target_NxBxL)} targets, {len(pads)} pads")
    xs, ts = [], []
    for x, t, p_ in zip(xs_NxBxL, target_NxBxL, pads):
        validation.check_batch(x)
        pad = _pad(p_, x, process)
        xv = process.validate(x if pad is None else np.where(pad, 0, np.asarray(x)))
        validation.check_seq_len(xv, denoiser)
        tv = _target(t, xv.shape, pad)
        xs.append(_mask_pads(xv, pad, tv, process))
        ts.append(tv)
    for x in xs[1:]:
        if x.shape != xs[0].shape:
            raise ValueError(f"paired inputs differ in shape: {xs[0].shape} and {x.shape}")
    target = ts[0] if all(np.array_equal(ts[0], t) for t in ts[1:]) else np.stack(ts)
    if target.ndim == 3 and not process.per_input_targets:
        raise ValueError(f"the {process.estimator} estimator needs the same target positions in both inputs of a "
                         "pair; use k_dce, t_dce or time_free for responses of different lengths")
    if N > 2 and process.needs_plan:
        raise ValueError(f"the {process.estimator} estimator plans its samples on a pair; for {N} coupled inputs "
                         "use k_dce, t_dce or time_free")
    return _coupled(process, denoiser, xs, target, key, coupled, num_samples, batch_size)


def _coupled(process, denoiser, xs_list, target, key, coupled, num_samples, batch_size):
    """The coupled / decoupled estimates of N inputs (target [B, L], or [N, B, L])."""
    N = len(xs_list)
    t0 = target if target.ndim == 2 else target[0]
    if num_samples is None:
        num_samples = default_num_samples(process, t0)
    _check_common(num_samples, batch_size)
    for t in (target if target.ndim == 3 else [target]):
        process.check_target(t)
    _warn_infinite(process)
    xs = np.stack(xs_list)
    bs = int(batch_size) // N or 1
    process, S, pilot_passes = _planned(process, denoiser, xs, target, key, int(num_samples), bs,
                                        independent=not coupled)
    if process.passes_per_sample(target) == 0:
        vals, S = np.zeros((N, xs.shape[1], 0)), 0
    else:
        vals = estimate(process, denoiser, xs, target, key, S, bs, independent=not coupled)
    apply_fn, params = denoisers.split(denoiser)
    mc_passes = S * process.passes_per_sample(target) + pilot_passes // N
    return tuple(_estimate_of(process, vals[i], mc_passes,
                              process.exact_terms(apply_fn, params, xi, target if target.ndim == 2 else target[i],
                                                  int(batch_size)))
                 for i, xi in enumerate(xs_list))


def log_ratio(denoiser, prompt_BxP, response_BxR, alt_response_BxR, key, *, coupled: bool = True,
              process=None, estimator: str | None = None, num_samples: int | None = None,
              batch_size: int = 1024, schedule=None, vocab_size: int | None = None) -> Estimate:
    """Estimate log p(y | x) - log p(y' | x) per triple, in nats.

    coupled=True (arXiv 2510.24088 Eq. 18): every Monte Carlo sample uses the same noise for
    y and y' (same masked positions, weight and time for the masked process), so the variance
    from the noise draw cancels (common random numbers). coupled=False draws independent noise
    for the two terms (for comparison). Either way each sample costs 2 forward passes (2 n for
    the stratified estimator). y and y' must have the same length R; ValueError naming both
    shapes otherwise. Returns an Estimate whose samples are per-sample differences (and whose
    exact terms are the differences of the two exact terms).
    """
    ea, eb = paired_conditional_nll(denoiser, prompt_BxP, response_BxR, alt_response_BxR, key,
                                    coupled=coupled, process=process, estimator=estimator,
                                    num_samples=num_samples, batch_size=batch_size,
                                    schedule=schedule, vocab_size=vocab_size)
    # log p(ya|x) - log p(yb|x) = NLL(yb) - NLL(ya)
    name = f"{ea.estimator}:{'coupled' if coupled else 'decoupled'}"
    exact = {k: eb.exact[k] - ea.exact[k] for k in ea.exact}
    return Estimate(name, eb.samples - ea.samples, forward_passes=ea.forward_passes + eb.forward_passes,
                    infinite_variance=ea.infinite_variance, exact=exact, se_method=ea.se_method,
                    min_samples=ea.min_samples)


# ---------------------------------------------------------------------------------------------
# Thin wrappers: score entropy (I-MDSE) and Poisson
# ---------------------------------------------------------------------------------------------
def imdse_nll(score_model, x_BxL, key, *, graph: str, lam_max: float, num_samples: int | None = None,
              lambda_sampling: str | None = None, batch_size: int = 1024, target_BxL=None,
              vocab_size: int | None = None, progress: bool = False) -> Estimate:
    """I-MDSE estimate of -log p(x) (or -log p(x[target] | x[rest])) per sequence, in nats.

    ``-log p(x) = int_0^T mdse(x, t) dt + KL(p_{T|0}(. | x) || p_T)`` (arXiv 2510.24088
    Thm 3.2, Eq. 11), written in the noise level lam = 1 - exp(-sigma_bar)
    (docs/discrete_diffusion.md §1.5, §4.1): the :class:`ScoreEntropyProcess` with
    ``noise_law = lambda_sampling`` ('defensive' default for absorb, 'importance' for uniform:
    the lowest measured variance; 'uniform' is SEDD's t ~ U, log-divergent variance, flagged).
    The prior is exact (``Estimate.prior``): KL to the uniform law (uniform graph) or to the
    model's own factorised prior at T (absorb, one extra pass per sequence); 0 at lam_max = 1.

    Args:
      score_model: ``(z_BxL int32, lam_B float32) -> log-scores [B, L, V]`` or a network with
        ``apply_params`` / ``params`` (:mod:`infodiff.denoisers`).
      x_BxL: int [B, L] tokens in [0, V). graph: 'absorb' | 'uniform'.
      lam_max: noise level at the end time T (schedule.lambda_max; 1 - eps for loglinear).
      num_samples: S >= 2; default the process's ``min_samples`` (128 absorb, 512 uniform graph:
        the fewest with a calibrated SE). target_BxL: optional bool [B, L]; the other
        positions stay clean (under the uniform graph the score model sees them at lam = 0).
    Returns: Estimate (samples [B, S] of the diffusion term, exact 'prior' [B]).
    Raises: ValueError for bad tokens, an unknown graph/sampling, a score model declaring
      another graph (``.graph``), lam_max outside (0, 1], num_samples < 2;
      FloatingPointError if the score model
      produces a non-finite value.
    """
    se.check_graph(graph)
    se.check_model_graph(score_model, graph)
    if lambda_sampling is None:
        lambda_sampling = se.DEFAULT_LAMBDA_SAMPLING[graph]
    if lambda_sampling not in se.LAMBDA_SAMPLING:
        raise ValueError(f"unknown lambda_sampling {lambda_sampling!r}; choose from {se.LAMBDA_SAMPLING}")
    V = denoisers.vocab_size_of(score_model, vocab_size)
    process = se.ScoreEntropyProcess(graph=graph, vocab_size=V, noise_law=lambda_sampling,
                                     lam_max=float(lam_max))
    if num_samples is None:
        num_samples = process.min_samples
    return nll(score_model, x_BxL, key, process=process, num_samples=num_samples,
               batch_size=batch_size, target_BxL=target_BxL, progress=progress)


def imdse_conditional_nll(score_model, prompt_BxP, response_BxR, key, **kwargs) -> Estimate:
    """-log p(response | prompt) per pair by I-MDSE (either graph), nats per response.

    Only response positions are noised; the prompt stays clean (under the uniform graph the
    score model is told so by lam = 0 at its positions). Keyword arguments as in
    :func:`imdse_nll`. Raises ValueError for mismatched batch sizes, an empty response or bad
    tokens.
    """
    V = denoisers.vocab_size_of(score_model, kwargs.get("vocab_size"))
    x, target = _concat(prompt_BxP, response_BxR, V)
    kwargs["vocab_size"] = V
    return imdse_nll(score_model, x, key, target_BxL=target, **kwargs)


def poisson_nll(denoiser, x_BxD, key, num_samples: int = 100, sampler: str = "stratified",
                loc: float = -1.0, scale: float = 5.0, clip: float = 4.0,
                alpha_min: float = -28.0, alpha_max: float = 37.0, batch_size: int = 1024,
                high_snr_guard: str | None = None, alpha_guard: float | None = None,
                scaling=None, qmc_random_offset: bool = True, channel_defensive: float = 0.3,
                channel_shift: float = 2.0) -> Estimate:
    """Estimate -log P(x) per example (nats) with the Poisson-diffusion likelihood identity.

        -log P(x) = int e^alpha E_{z ~ Pois(e^alpha x)} sum_d l(x_d, xhat(z, alpha)_d) dalpha
    (arXiv 2505.05082 Eq. 17/19; docs/poisson.md §2.3, §3.2). The diffusion term is estimated by
      'stratified' (default): S / 2 equal-probability strata of the truncated logistic(loc,
                  scale, clip), 2 independent draws in each, weight e^alpha/q; SE from the
                  within-pair differences ('strata_pairs', docs/poisson.md §3.5);
      'logistic': S iid draws alpha ~ truncated logistic(loc, scale, clip), weight e^alpha/q,
                  the sample SE ('iid'; the default before the SE calibration of §3.5);
      'qmc':      S stratified truncated-logistic points (random common offset per call if
                  qmc_random_offset, else midpoints), same weights; SE from adjacent pairs;
      'grid':     S / 2-node uniform grid on [alpha_min, alpha_max], 2 channel draws per node,
                  trapezoid weights x e^alpha, so that the mean is the trapezoid sum; SE from the
                  pairs (warns: not calibrated, §3.5).
    The SE method is ``Estimate.se_method``. Per-example SEs of 1-D data were measured
    calibrated with 'stratified' at S = 1000, not at 200 (docs/poisson.md §3.5).
    with one fresh z per (example, alpha), drawn (``channel_defensive`` = eps > 0, default 0.3)
    from the defensive mixture (1 - eps) Pois(lam) + eps/2 Pois(lam (1 -+ s)), s = channel_shift /
    sqrt(lam) (eps / D per coordinate), times its exact importance weight: unbiased (checked per
    log-SNR against exact sums), it samples the rare channel draws that make the plain draw's
    values heavy-tailed and so calibrates the per-example SE at the law's mode; it can double the
    variance in a law's far tail (docs/poisson.md §3.5). 0 = the plain draw of earlier versions.
    Exact terms (:class:`PoissonProcess`): ``prior`` below
    alpha_lo is exact for the constant denoiser c = denoiser(0, alpha_lo); ``recon`` above
    alpha_top is the exact integral of the lattice-rounding denoiser (needs `scaling`).

    High-SNR guard (docs/poisson.md §3.4): high_snr_guard="round" replaces the denoiser by lattice rounding
    x̂ = round_lattice(z / gamma) for alpha >= alpha_guard. Valid because the combined map is
    still a denoiser (a function of (z, gamma) only), so Eq. 18 still bounds the entropy; its
    contribution above alpha_guard is computed exactly, so MC draws there are zeroed (no MC
    noise from huge weights). We chose the fixed-threshold switch over docs/poisson.md §3.4's per-level
    "min over the dataset" because the latter selects the denoiser using the test data.

    Args:
      denoiser: (z_BxD float32 counts, alpha_B float32) -> xhat_BxD float32 > 0, or an object with
        apply_params(params, z, alpha) and params.
      x_BxD: float [B, D] scaled data >= 0 (e.g. CountScaling.scale(counts)); validated.
      key: PRNG key (the result is a pure function of key, x, the arguments and batch_size).
      num_samples: S >= 2 alpha values per example (one forward pass each; even for
        'stratified', 'qmc' and 'grid').
      loc, scale, clip: truncated-logistic proposal (default ItDPDM's -1, 5, 4).
      alpha_min, alpha_max: grid range (sampler='grid'; default ItDPDM's [-28, 37]).
      batch_size: rows per denoiser call.
      high_snr_guard: None or 'round'. alpha_guard: switch point (required for 'round').
      scaling: CountScaling whose lattice the data lie on (rounding tail / guard). Without it
        recon_tail = 0 and is flagged as not included.
    Every reported total is the PRL integral of one well-defined combined denoiser (c below
    alpha_lo, the given denoiser up to alpha_top, lattice rounding above), so it bounds the
    entropy in expectation over the data (Eq. 18) and equals -log P(x) for the exact posterior
    mean up to O(gamma_lo) + O(exp(-c gamma_top)).
    Returns: :class:`infodiff.likelihood.Estimate` (samples [B, S] of the diffusion term; terms
      diffusion / prior / recon / total, float64; ``info``: alpha_lo, alpha_top, dim,
      recon_included).
    Raises: ValueError for bad data, unknown sampler / guard, num_samples < 2, batch_size < 1,
      guard without scaling or alpha_guard; FloatingPointError if the denoiser produced a
      non-finite loss (e.g. xhat <= 0 where x > 0).
    """
    key = validation.as_key(key)
    validation.check_batch(x_BxD)
    validation.check_num_samples(num_samples)
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size = {batch_size!r} must be an integer >= 1")
    offset = 0.5
    if sampler == "qmc" and qmc_random_offset:
        offset = float(jax.random.uniform(jax.random.fold_in(key, 2), ()))
    process = poisson.estimation_process(int(num_samples), sampler, loc, scale, clip, alpha_min, alpha_max,
                                 high_snr_guard, alpha_guard, scaling, offset,
                                 channel_defensive=channel_defensive, channel_shift=channel_shift)
    est = nll(denoiser, x_BxD, key, process=process, num_samples=int(num_samples), batch_size=int(batch_size))
    est.info.update(alpha_lo=process.alpha_lo, alpha_top=process.alpha_top, dim=int(np.shape(x_BxD)[1]),
                    recon_included=scaling is not None, sampler=sampler)
    return est


