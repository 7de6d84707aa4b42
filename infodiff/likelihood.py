"""Monte Carlo likelihood estimators for masked and score-entropy diffusion, with standard errors.

    -log p(x)          nll(denoiser, x_BxL, key, estimator=...)
    -log p(y | x)      conditional_nll(denoiser, prompt_BxP, response_BxR, key, ...)
    log p(y|x) - log p(y'|x)   log_ratio(denoiser, prompt, y, y_alt, key, coupled=True)

A denoiser is any function (z_BxL int32, t_B float32) -> logprobs_BxLxV over the V real tokens
(mask id V): a trained network (`infodiff.training.make_denoiser`) or an exact oracle
(`infodiff.oracles`). Estimators (shared/specs/masked_and_score_entropy.md §6; arXiv
2510.24088): 't_dce' (time integral, Eq. 13 in t), 'lambda_dce' (Eq. 13 in lambda; infinite
variance -- its standard error is flagged as unreliable), 'k_dce' (any-order autoregressive
form), 'time_free' (Thm 4.1 / Eq. 15; conditional Eq. 17; m = L included) and
'stratified' (ours: one m-subset per mask count m = 1..n, n forward passes per sample; see
`infodiff.processes.masked`). The coupled log-ratio (Eq. 18) shares every mask between the
two terms.

Score-entropy diffusion (SEDD, absorbing and uniform graphs): `imdse_nll` and
`imdse_conditional_nll` estimate -log p(x) by the I-MDSE identity (arXiv 2510.24088 Thm 3.2),
the time integral of the denoising score entropy plus the prior KL, from a score model
(z_BxL, lam_B) -> log-scores; see `infodiff.processes.score_entropy`.

Units: nats per sequence (the sum over the target positions), unless a function says otherwise.
Each per-sample value is computed in float32 on the device and every Monte Carlo sum,
mean and variance is accumulated in float64 on the host.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from infodiff import schedules as schedules_lib
from infodiff.oracles import validate_tokens
from infodiff.processes import masked

__all__ = ["Estimate", "nll", "conditional_nll", "paired_conditional_nll", "log_ratio", "ESTIMATORS",
           "ScoreEntropyEstimate", "imdse_nll", "imdse_conditional_nll"]

ESTIMATORS = masked.ESTIMATORS


@dataclasses.dataclass
class Estimate:
    """Per-sequence Monte Carlo estimates.

    samples: float64 [B, S] one-sample estimates (nats per sequence); their mean over S is
      `mean` and stderr = std(samples, ddof=1) / sqrt(S).
    num_samples: S Monte Carlo samples per sequence.
    forward_passes: denoiser evaluations per sequence (S, or 2 S for a ratio; times n for the
      stratified estimator, whose one sample uses n passes).
    """

    estimator: str
    samples: np.ndarray
    forward_passes: int
    infinite_variance: bool = False

    @property
    def num_samples(self) -> int:
        return self.samples.shape[1]

    @property
    def mean(self) -> np.ndarray:
        """float64 [B] estimated value per sequence (nats)."""
        return self.samples.mean(axis=1)

    @property
    def per_sample_std(self) -> np.ndarray:
        """float64 [B] standard deviation of one Monte Carlo sample (nats)."""
        if self.num_samples < 2:
            return np.full(self.samples.shape[0], np.nan)
        return self.samples.std(axis=1, ddof=1)

    @property
    def stderr(self) -> np.ndarray:
        """float64 [B] standard error of `mean` (nats)."""
        return self.per_sample_std / math.sqrt(self.num_samples)

    @property
    def variance_per_forward_pass(self) -> np.ndarray:
        """float64 [B]: Var(one sample) x forward passes per sample (variance at a budget of one pass)."""
        return self.per_sample_std**2 * (self.forward_passes / self.num_samples)

    def total(self):
        """(sum of means, its stderr) over the batch, nats (e.g. a corpus NLL)."""
        return float(self.mean.sum()), float(np.sqrt(np.sum(self.stderr**2)))

    def summary(self) -> dict:
        return {
            "estimator": self.estimator,
            "mean": self.mean.tolist(),
            "stderr": self.stderr.tolist(),
            "num_samples": self.num_samples,
            "forward_passes": self.forward_passes,
            "infinite_variance": self.infinite_variance,
        }


def _vocab_size(denoiser, vocab_size):
    v = vocab_size if vocab_size is not None else getattr(denoiser, "vocab_size", None)
    if v is None:
        raise ValueError("vocab_size is required (the denoiser has no .vocab_size attribute)")
    return int(v)


def _spec(estimator: str, schedule) -> masked.MaskSpec:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose from {ESTIMATORS}")
    schedule = schedule or schedules_lib.LinearSchedule()
    return masked.MaskSpec(name=estimator, schedule=schedule, exact_boundaries=True)


@dataclasses.dataclass(frozen=True)
class _NoParams:
    """Adapter: a denoiser without separate parameters as fn(params, z, t)."""

    denoiser: object

    def __call__(self, params, z_BxL, t_B):
        del params
        return self.denoiser(z_BxL, t_B)


def _split_denoiser(denoiser):
    """(static fn(params, z, t), params): a network's parameters are passed to jit as
    arguments, not compiled in as constants; oracles carry no parameters."""
    if hasattr(denoiser, "apply_params") and hasattr(denoiser, "params"):
        return denoiser.apply_params, denoiser.params
    return _NoParams(denoiser), None


@functools.partial(jax.jit, static_argnames=("apply_fn", "spec", "vocab_size", "num_samples", "per"))
def _chunk_values(apply_fn, params, spec, vocab_size, num_samples, key, xs_NxBxL, target_BxL,
                  per=1):
    """S draws per row; the SAME masks are applied to every x in xs (coupling).

    Returns float32 [N, B, S]: weight * masked CE for each of the N inputs.
    """
    N, B, L = xs_NxBxL.shape
    # Rows per Monte Carlo sample `per`: 1, or n (one per stratum m = 1..n) for 'stratified'.
    tgt = jnp.repeat(target_BxL, num_samples * per, axis=0)  # [B*S*per, L]
    mask, t, w = masked.draw_masks(spec, key, tgt)
    outs = []
    for n in range(N):
        x = jnp.repeat(xs_NxBxL[n], num_samples * per, axis=0)
        z = masked.corrupt(x, mask, vocab_size)
        logprobs = apply_fn(params, z, t)
        if logprobs.shape != (x.shape[0], L, vocab_size):
            raise ValueError(
                f"the denoiser returned shape {logprobs.shape}, expected {(x.shape[0], L, vocab_size)} "
                f"(vocab_size={vocab_size} does not match the denoiser?)")
        ce = masked.masked_cross_entropy(logprobs, x, mask)
        # No mask -> no contribution, even where the weight is infinite (t = 0 exactly).
        outs.append(jnp.where(mask.any(-1), w * ce, 0.0).reshape(B, num_samples, per).sum(axis=-1))
    return jnp.stack(outs)


def rows_per_sample(spec, target_BxL) -> int:
    """Forward passes per Monte Carlo sample: n (the common target count) for 'stratified',
    else 1. Needs a concrete target array for 'stratified'; raises ValueError if its rows
    have different target counts."""
    if spec.name != "stratified":
        return 1
    counts = np.unique(np.asarray(target_BxL).sum(axis=-1))
    if len(counts) != 1 or counts[0] < 1:
        raise ValueError(
            "the stratified estimator needs the same number (>= 1) of target positions in every "
            f"row; got counts {counts.tolist()}"
        )
    return int(counts[0])


def _run(denoiser, xs_NxBxL, target_BxL, key, spec, vocab_size, num_samples, batch_size,
         independent: bool, progress: bool = False):
    """Host loop over chunks of rows and samples; float64 accumulation. -> float64 [N, B, S]."""
    N, B, L = xs_NxBxL.shape
    apply_fn, params = _split_denoiser(denoiser)
    per = rows_per_sample(spec, target_BxL)
    # Samples per call so that (rows x samples x per) fits batch_size.
    budget = max(1, batch_size // per)
    s_chunk = max(1, min(num_samples, budget // max(1, min(B, budget))))
    b_chunk = max(1, min(B, budget // s_chunk))
    out = np.zeros((N, B, num_samples), np.float64)
    # Every call has the same shape (the last chunk is padded and trimmed): one compilation.
    bar = None
    if progress:
        import tqdm  # progress bar with ETA on long evaluations

        n_calls = math.ceil(B / b_chunk) * math.ceil(num_samples / s_chunk) * (N if independent else 1)
        bar = tqdm.tqdm(total=n_calls, desc=f"{spec.name} ({B} seq x {num_samples} MC)", unit="batch")
    for b0 in range(0, B, b_chunk):
        b1 = min(B, b0 + b_chunk)
        rows = np.arange(b0, b0 + b_chunk) % B
        for s0 in range(0, num_samples, s_chunk):
            s1 = min(num_samples, s0 + s_chunk)
            k = jax.random.fold_in(jax.random.fold_in(key, b0), s0)
            if independent:
                for n in range(N):
                    kn = jax.random.fold_in(k, 1_000_003 + n)
                    vals = _chunk_values(apply_fn, params, spec, vocab_size, s_chunk, kn,
                                         xs_NxBxL[n:n + 1, rows], target_BxL[rows], per=per)
                    out[n, b0:b1, s0:s1] = np.asarray(vals[0], np.float64)[: b1 - b0, : s1 - s0]
            else:
                vals = _chunk_values(apply_fn, params, spec, vocab_size, s_chunk, k,
                                     xs_NxBxL[:, rows], target_BxL[rows], per=per)
                out[:, b0:b1, s0:s1] = np.asarray(vals, np.float64)[:, : b1 - b0, : s1 - s0]
            if bar is not None:
                bar.update(N if independent else 1)
    if bar is not None:
        bar.close()
    if not np.all(np.isfinite(out)):
        bad = np.argwhere(~np.isfinite(out))[0]
        raise FloatingPointError(
            f"non-finite per-sample value {out[tuple(bad)]} for sequence {bad[1]}: the denoiser "
            "returned -inf/NaN log-probability for a true token"
        )
    return out


def _check_common(num_samples, batch_size):
    for name, v in (("num_samples", num_samples), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an integer; got {v!r}")
    if int(num_samples) < 2:
        raise ValueError(f"num_samples must be >= 2 to report a standard error; got {num_samples}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")


def _tokens_and_target(x_BxL, target_BxL, V, num_samples, batch_size):
    """Validated (tokens int [B, L], target bool [B, L]; all True if None) and MC settings."""
    x = validate_tokens(x_BxL, V)
    _check_common(num_samples, batch_size)
    if target_BxL is None:
        return x, np.ones(x.shape, bool)
    target = np.asarray(target_BxL)
    if target.shape != x.shape or target.dtype != bool:
        raise ValueError(f"target_BxL must be bool with shape {x.shape}; got {target.dtype} {target.shape}")
    return x, target


def _warn_lambda(estimator, schedule=None):
    """Flag the estimators with infinite variance: lambda_dce always; t_dce when the
    schedule reaches lambda = 0 at t = 0 (weight ~ 1/t, e.g. loglinear or eps = 0)."""
    sched = schedule or schedules_lib.LinearSchedule()
    if estimator == "lambda_dce" or (estimator == "t_dce" and sched.lambda_min <= 0.0):
        warnings.warn(
            f"{estimator} has infinite variance here (spec §6.2): its standard error is not "
            "reliable; prefer k_dce, stratified or time_free for reported numbers",
            RuntimeWarning,
            stacklevel=3,
        )
        return True
    return False


def nll(denoiser, x_BxL, key, *, estimator: str = "time_free", num_samples: int = 128,
        batch_size: int = 1024, target_BxL=None, schedule=None, vocab_size: int | None = None,
        progress: bool = False) -> Estimate:
    """Estimate -log p(x) (or -log p(x[target] | x[rest])) per sequence, in nats.

    Args:
      denoiser: (z_BxL int32, t_B float32) -> logprobs_BxLxV (normalised over V real tokens).
      x_BxL: int [B, L] token ids in [0, V).
      key: PRNG key; results are a pure function of it.
      estimator: 't_dce' | 'lambda_dce' | 'k_dce' | 'time_free' | 'stratified'.
      num_samples: Monte Carlo samples S per sequence (>= 2).
      batch_size: rows per denoiser call (memory knob; results do not depend on it only up
        to the grouping of random draws, which is fixed by (key, B, batch_size)).
      target_BxL: optional bool [B, L]: positions whose likelihood is estimated; the others
        are context and never masked. Default: all positions.
      schedule: Schedule for t_dce (and to map mask fractions to times for time-conditioned
        denoisers). Default linear with eps = 1e-4.
      vocab_size: V (default: denoiser.vocab_size).
      progress: show a progress bar with ETA (tqdm) on stderr.
    Returns: Estimate with samples float64 [B, S].
    Raises: TypeError/ValueError for non-integer, wrongly shaped or out-of-vocabulary x, a
      target of the wrong shape, num_samples < 2; FloatingPointError if the denoiser gives
      a non-finite value.
    Source: arXiv 2510.24088 Eqs. 13, 15-17; shared/specs/masked_and_score_entropy.md §6.
    """
    V = _vocab_size(denoiser, vocab_size)
    x, target = _tokens_and_target(x_BxL, target_BxL, V, num_samples, batch_size)
    inf_var = _warn_lambda(estimator, schedule)
    spec = _spec(estimator, schedule)
    vals = _run(denoiser, x[None], target, key, spec, V, int(num_samples), int(batch_size), False,
                progress=progress)
    per = rows_per_sample(spec, target)
    return Estimate(estimator, vals[0], forward_passes=int(num_samples) * per,
                    infinite_variance=inf_var)


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


def conditional_nll(denoiser, prompt_BxP, response_BxR, key, **kwargs) -> Estimate:
    """Estimate -log p(response | prompt) per pair, nats per response.

    Only response positions are masked; the prompt is always visible (Cor. 4.3 / Eq. 17 for
    'time_free'; Eq. 16 for 'lambda_dce'). The denoiser sees [prompt; response] of length
    P + R. Keyword arguments as in `nll`. Raises ValueError for mismatched batch sizes, an
    empty response or bad tokens.
    """
    V = _vocab_size(denoiser, kwargs.get("vocab_size"))
    x, target = _concat(prompt_BxP, response_BxR, V)
    kwargs["vocab_size"] = V
    return nll(denoiser, x, key, target_BxL=target, **kwargs)


def paired_conditional_nll(denoiser, prompt_BxP, response_BxR, alt_response_BxR, key, *,
                           coupled: bool = True, estimator: str = "time_free",
                           num_samples: int = 128, batch_size: int = 1024, schedule=None,
                           vocab_size: int | None = None) -> tuple[Estimate, Estimate]:
    """-log p(y | x) and -log p(y' | x) per triple, nats per response, as two Estimates.

    coupled=True (arXiv 2510.24088 Eq. 18): sample s of both uses the same mask (positions,
    weight, time), so their difference has the variance of common random numbers;
    coupled=False draws independent masks. Each Estimate counts its own forward passes.
    y and y' must have the same length R (masks are shared position by position); pad both
    to a common length yourself if your data differ. Raises ValueError naming both shapes.
    """
    V = _vocab_size(denoiser, vocab_size)
    ya = np.asarray(response_BxR)
    yb = np.asarray(alt_response_BxR)
    if ya.shape != yb.shape:
        raise ValueError(
            f"coupled ratio needs responses of equal shape; got {ya.shape} and {yb.shape} "
            "(pad both to a common length)"
        )
    xa, target = _concat(prompt_BxP, ya, V)
    xb, _ = _concat(prompt_BxP, yb, V)
    _check_common(num_samples, batch_size)
    inf_var = _warn_lambda(estimator, schedule)
    spec = _spec(estimator, schedule)
    vals = _run(denoiser, np.stack([xa, xb]), target, key, spec, V, int(num_samples),
                int(batch_size) // 2 or 1, independent=not coupled)
    fp = int(num_samples) * rows_per_sample(spec, target)
    return (Estimate(estimator, vals[0], forward_passes=fp, infinite_variance=inf_var),
            Estimate(estimator, vals[1], forward_passes=fp, infinite_variance=inf_var))


def log_ratio(denoiser, prompt_BxP, response_BxR, alt_response_BxR, key, *, coupled: bool = True,
              estimator: str = "time_free", num_samples: int = 128, batch_size: int = 1024,
              schedule=None, vocab_size: int | None = None) -> Estimate:
    """Estimate log p(y | x) - log p(y' | x) per triple, in nats.

    coupled=True (arXiv 2510.24088 Eq. 18): every Monte Carlo sample uses the same mask
    (same masked positions, same weight, same time) for y and y', so the variance from the
    mask draw cancels (common random numbers). coupled=False draws independent masks for the
    two terms (for comparison). Either way each sample costs 2 forward passes (2 n for the
    stratified estimator).

    Unequal lengths: y and y' must have the same length R (the masks are shared position by
    position); pad both to a common length yourself if your data differ. Raises ValueError
    naming both shapes otherwise. Returns Estimate whose samples are per-sample differences.
    """
    ea, eb = paired_conditional_nll(denoiser, prompt_BxP, response_BxR, alt_response_BxR, key,
                                    coupled=coupled, estimator=estimator, num_samples=num_samples,
                                    batch_size=batch_size, schedule=schedule, vocab_size=vocab_size)
    # log p(ya|x) - log p(yb|x) = NLL(yb) - NLL(ya)
    name = f"{estimator}:{'coupled' if coupled else 'decoupled'}"
    return Estimate(name, eb.samples - ea.samples, forward_passes=ea.forward_passes + eb.forward_passes,
                    infinite_variance=ea.infinite_variance)


# ---------------------------------------------------------------------------------------------
# Score-entropy diffusion: the I-MDSE likelihood
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ScoreEntropyEstimate(Estimate):
    """I-MDSE estimate: ``-log p(x) = integral of mdse + KL(p_{T|0} || pi)`` per sequence.

    samples: float64 [B, S] one-sample estimates of the diffusion (integral) term, nats.
    prior: float64 [B] the prior / KL term, computed exactly (no Monte Carlo error), nats.
    ``mean`` = diffusion mean + prior; ``stderr`` is the Monte Carlo error of the diffusion term.
    """

    prior: np.ndarray | None = None

    @property
    def diffusion(self) -> np.ndarray:
        """float64 [B] the Monte Carlo estimate of the time integral of the DSE (nats)."""
        return self.samples.mean(axis=1)

    @property
    def mean(self) -> np.ndarray:
        return self.diffusion + (0.0 if self.prior is None else self.prior)

    def summary(self) -> dict:
        out = super().summary()
        out["diffusion"] = self.diffusion.tolist()
        out["prior"] = (np.zeros_like(self.diffusion) if self.prior is None else self.prior).tolist()
        return out


@functools.partial(jax.jit, static_argnames=("apply_fn", "graph", "vocab_size", "num_samples",
                                             "lam_max", "sampling"))
def _imdse_chunk(apply_fn, params, graph, vocab_size, num_samples, lam_max, sampling, key,
                 x_BxL, target_BxL):
    """float32 [B, S]: (1 / q(lam)) * score_entropy / (1 - lam), lam ~ q on (0, lam_max]."""
    from infodiff.processes import score_entropy as se

    B, L = x_BxL.shape
    x = jnp.repeat(x_BxL, num_samples, axis=0)
    tgt = jnp.repeat(target_BxL, num_samples, axis=0)
    k_lam, k_z = jax.random.split(key)
    lam, w = se.sample_lambda(k_lam, (B * num_samples,), lam_max, sampling)
    lam = se.clip_lam(lam)  # u = 1 with lam_max = 1 would give 1 / (1 - lam) = inf
    z = se.corrupt(graph, k_z, x, lam, vocab_size, tgt)
    log_s = apply_fn(params, z, lam)
    if log_s.shape != (x.shape[0], L, vocab_size):
        raise ValueError(f"the score model returned shape {log_s.shape}, expected "
                         f"{(x.shape[0], L, vocab_size)} (vocab_size={vocab_size} mismatch?)")
    ent = se.score_entropy(graph, log_s, x, z, lam, tgt)
    return (w * ent / (1.0 - lam)).reshape(B, num_samples)


@functools.partial(jax.jit, static_argnames=("apply_fn", "vocab_size", "lam_max"))
def _absorb_prior(apply_fn, params, vocab_size, lam_max, x_BxL, target_BxL):
    """float32 [B]: (1 - lam_max) * sum_{target} -log c(x_i | targets masked), c normalised."""
    from infodiff.processes import score_entropy as se

    z = jnp.where(target_BxL, vocab_size, x_BxL).astype(jnp.int32)
    lam = jnp.full((x_BxL.shape[0],), lam_max, jnp.float32)
    log_c = se.absorb_mean_from_log_score(apply_fn(params, z, lam), lam)
    log_c = jax.nn.log_softmax(log_c, axis=-1)
    ce = -jnp.take_along_axis(log_c, x_BxL[..., None], axis=-1)[..., 0]
    return (1.0 - lam_max) * jnp.sum(jnp.where(target_BxL, ce, 0.0), axis=-1)


def imdse_nll(score_model, x_BxL, key, *, graph: str, lam_max: float, num_samples: int = 128,
              lambda_sampling: str | None = None, batch_size: int = 1024, target_BxL=None,
              vocab_size: int | None = None, progress: bool = False) -> ScoreEntropyEstimate:
    """I-MDSE estimate of -log p(x) (or -log p(x[target] | x[rest])) per sequence, in nats.

    ``-log p(x) = int_0^T mdse(x, t) dt + KL(p_{T|0}(. | x) || p_T)`` (arXiv 2510.24088
    Thm 3.2, Eq. 11), written in the noise level lam = 1 - exp(-sigma_bar) (spec §1.5):
    ``int_0^{lam_max} score_entropy(x, z_lam, lam) / (1 - lam) d lam``, z_lam ~ p_{lam|0}(.|x).
    Each Monte Carlo sample draws lam ~ q (``lambda_sampling``: 'importance' lam = lam_max u^2,
    or 'defensive', a 0.9 / 0.1 mixture of uniform and 'importance', both with finite variance;
    'uniform' lam = lam_max u, the t-DSE of a loglinear schedule, whose variance diverges
    logarithmically and is flagged; see :func:`score_entropy.sample_lambda`; default
    'defensive' for absorb, 'importance' for uniform, the lowest measured variance, RESULTS.md)
    and one noised z, and evaluates the model once.

    Prior term (exact, reported separately as ``Estimate.prior``):
      uniform: KL(p_{lam_max|0} || uniform), closed form (0 at lam_max = 1);
      absorb: KL(p_{lam_max|0} || p^theta_T) with the model's prior at T,
        p^theta_T = prod_i [lam_max MASK + (1 - lam_max) c(. | all targets masked)_i] (c the
        normalised model conditional; one extra forward pass per sequence), i.e.
        (1 - lam_max) sum_i -log c(x_i | ...); 0 at lam_max = 1. With the exact score it
        exceeds the true KL(p_{T|0} || p_T) only through sets of >= 2 surviving tokens:
        O((1 - lam_max)^2).
    With the exact score (an oracle) the estimate is unbiased for -log p(x) up to that term;
    with a network it is the model's DSE bound.

    Args:
      score_model: ``(z_BxL int32, lam_B float32) -> log-scores [B, L, V]`` (see
        :mod:`infodiff.processes.score_entropy`), or an object with ``apply_params(params, z,
        lam)`` and ``params`` (parameters are passed to jit as arguments).
      x_BxL: int [B, L] tokens in [0, V).
      graph: 'absorb' | 'uniform'.
      lam_max: noise level at the end time T (schedule.lambda_max; 1 - eps for loglinear).
      num_samples: Monte Carlo samples S per sequence (>= 2).
      target_BxL: optional bool [B, L]: positions whose likelihood is estimated (the rest is a
        clean prompt). Only for 'absorb' (a uniform-graph score of the jointly noised sequence
        does not give conditional scores).
    Returns: ScoreEntropyEstimate (samples [B, S] of the diffusion term, prior [B]).
    Raises: ValueError for bad tokens, an unknown graph/sampling, a score model declaring
      another graph (``.graph``), lam_max outside (0, 1], num_samples < 2; NotImplementedError for a uniform-graph conditional; FloatingPointError
      if the score model produces a non-finite value.
    """
    from infodiff.processes import score_entropy as se

    se.check_graph(graph)
    se._check_model_graph(score_model, graph)
    if lambda_sampling is None:
        lambda_sampling = se.DEFAULT_LAMBDA_SAMPLING[graph]
    if lambda_sampling not in se.LAMBDA_SAMPLING:
        raise ValueError(f"unknown lambda_sampling {lambda_sampling!r}; choose from {se.LAMBDA_SAMPLING}")
    if not 0.0 < float(lam_max) <= 1.0:
        raise ValueError(f"lam_max must be in (0, 1]; got {lam_max}")
    V = _vocab_size(score_model, vocab_size)
    x, target = _tokens_and_target(x_BxL, target_BxL, V, num_samples, batch_size)
    if graph == "uniform" and not target.all():
        raise NotImplementedError(
            "conditional likelihood with the uniform graph: a score model of the jointly "
            "noised sequence does not give scores with a clean prompt; use graph='absorb'")
    apply_fn, params = _split_denoiser(score_model)
    B, L = x.shape
    S = int(num_samples)
    s_chunk = max(1, min(S, int(batch_size)))
    b_chunk = max(1, min(B, int(batch_size) // s_chunk))
    out = np.zeros((B, S), np.float64)
    bar = None
    if progress:
        import tqdm

        bar = tqdm.tqdm(total=math.ceil(B / b_chunk) * math.ceil(S / s_chunk),
                        desc=f"I-MDSE {graph} ({B} seq x {S} MC)", unit="batch")
    for b0 in range(0, B, b_chunk):
        b1 = min(B, b0 + b_chunk)
        rows = np.arange(b0, b0 + b_chunk) % B
        for s0 in range(0, S, s_chunk):
            s1 = min(S, s0 + s_chunk)
            k = jax.random.fold_in(jax.random.fold_in(key, b0), s0)
            vals = _imdse_chunk(apply_fn, params, graph, V, s_chunk, float(lam_max), lambda_sampling,
                                k, jnp.asarray(x[rows]), jnp.asarray(target[rows]))
            out[b0:b1, s0:s1] = np.asarray(vals, np.float64)[: b1 - b0, : s1 - s0]
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    if not np.all(np.isfinite(out)):
        bad = np.argwhere(~np.isfinite(out))[0]
        raise FloatingPointError(f"non-finite I-MDSE sample {out[tuple(bad)]} for sequence {bad[0]}")
    prior = np.zeros(B, np.float64)
    if float(lam_max) < 1.0:
        if graph == "uniform":
            prior[:] = [se.prior_kl_uniform(lam_max, V, int(n)) for n in target.sum(axis=1)]
        else:
            n = min(B, int(batch_size))
            for b0 in range(0, B, n):  # fixed shape (last chunk padded): one compilation
                rows = np.arange(b0, b0 + n) % B
                vals = _absorb_prior(apply_fn, params, V, float(lam_max), jnp.asarray(x[rows]),
                                     jnp.asarray(target[rows]))
                prior[b0:b0 + n] = np.asarray(vals, np.float64)[: min(n, B - b0)]
    name = f"imdse_{graph}:{lambda_sampling}"
    passes = S + (1 if (graph == "absorb" and float(lam_max) < 1.0) else 0)
    return ScoreEntropyEstimate(name, out, forward_passes=passes,
                                infinite_variance=(lambda_sampling == "uniform"), prior=prior)


def imdse_conditional_nll(score_model, prompt_BxP, response_BxR, key, **kwargs) -> ScoreEntropyEstimate:
    """-log p(response | prompt) per pair by I-MDSE (absorbing graph), nats per response.

    Only response positions are noised; the prompt stays clean. Keyword arguments as in
    :func:`imdse_nll` (graph must be 'absorb'). Raises ValueError for mismatched batch sizes,
    an empty response or bad tokens.
    """
    V = _vocab_size(score_model, kwargs.get("vocab_size"))
    x, target = _concat(prompt_BxP, response_BxR, V)
    kwargs["vocab_size"] = V
    return imdse_nll(score_model, x, key, target_BxL=target, **kwargs)
