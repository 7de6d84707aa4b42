"""The ``neyman`` mask law (ours): a stratified estimator whose passes go to the mask counts m in
proportion to a_m = sigma_m / m (Neyman allocation, Cochran, *Sampling Techniques*, 1977, §5.5),
planned from a pilot run, with the cheap strata enumerated exactly (``processes/masked.py``'s
docstring describes the three stages).

The law is registered in :data:`infodiff.processes.masking.LAWS`; its plan
(:class:`NeymanPlan`) is the ``plan`` field of the ``MaskSpec``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax.numpy as jnp
import numpy as np

from infodiff.processes.masking import MaskLaw, common_target_count, frac_time, masked_ce, register_law, subset_mask

__all__ = ["NeymanPlan", "Neyman", "check_plan", "pilot_rounds", "neyman_plan", "stratum_masks",
           "enumerated_strata", "PILOT_DRAWS_POOLED", "PILOT_SHARE_MAX", "NEYMAN_BLOCK_MAX", "NEYMAN_MIN_SAMPLES"]


@dataclasses.dataclass(frozen=True)
class NeymanPlan:
    """The allocation of the `neyman` estimator for rows with n target positions (hashable).

    pilot: True for the pilot stage: sample s of a row draws one uniform m-subset with
      m = (s mod (n - 1)) + 1 and weight 1 (the per-stratum values C_m themselves).
    counts: n_m uniform m-subsets per sample for m = 1..n (0 for enumerated strata, >= 1
      otherwise); rows = sum n_m passes per sample; num_samples: the samples S' to draw.
    enumerated: the strata m computed exactly by enumerating their C(n, m) subsets.
    Built by :func:`neyman_plan`; see the module docstring.
    """

    n: int
    pilot: bool = False
    counts: tuple = ()
    num_samples: int = 0
    enumerated: tuple = ()

    @property
    def rows(self) -> int:
        return int(sum(self.counts))

    @property
    def exact(self) -> bool:
        """Every stratum enumerated: no Monte Carlo term."""
        return not self.pilot and self.rows == 0

    def enumeration_passes(self) -> int:
        return int(sum(math.comb(self.n, m) for m in self.enumerated))


def _draw_neyman(plan: NeymanPlan, key, target_BxL, sample_B):
    """Masks of the `neyman` estimator (module docstring): pilot or planned rows."""
    B = target_BxL.shape[0]
    n = plan.n
    if plan.pilot:
        if sample_B is None:
            raise ValueError("the neyman pilot needs each row's sample index (sample_R)")
        m_B = (sample_B % max(n - 1, 1) + 1).astype(jnp.int32)
        w_B = jnp.ones((B,), jnp.float32)
    else:
        R = plan.rows
        if R < 1:
            raise ValueError("this neyman plan enumerates every stratum: there is nothing to sample")
        counts = np.asarray(plan.counts, np.int64)
        m_table = np.repeat(np.arange(1, n + 1), counts)              # [R] stratum of row j
        w_table = 1.0 / (m_table * counts[m_table - 1])               # 1 / (m n_m)
        j_B = jnp.arange(B) % R
        m_B = jnp.asarray(m_table, jnp.int32)[j_B]
        w_B = jnp.asarray(w_table, jnp.float32)[j_B]
    mask = subset_mask(key, target_BxL, m_B) & target_BxL
    return mask, m_B, w_B


def check_plan(plan: NeymanPlan, target_BxL) -> None:
    """ValueError unless the plan was built for the rows' common target count n."""
    n = common_target_count(target_BxL, "neyman")
    if plan.n != n:
        raise ValueError(f"this neyman plan was built for n = {plan.n} target positions per row, but the "
                         f"rows have n = {n}: build the plan for these rows (masked.neyman_plan(..., n={n}, ...)) "
                         "or let likelihood.nll plan it (MaskSpec(name='neyman') without a plan)")


PILOT_DRAWS_POOLED = 32  # pilot draws per stratum, pooled over the sequences (at least 2 each)
PILOT_SHARE_MAX = 0.25   # the pilot never costs more than this share of the budget
NEYMAN_BLOCK_MAX = 4     # a sample spans up to this many stratified rounds (n rows each) ...
NEYMAN_MIN_SAMPLES = 32  # ... while keeping at least this many samples for the standard error


def pilot_rounds(num_sequences: int, n: int, budget: int) -> tuple[int, int]:
    """(r, k): r pilot draws per stratum on each of the first k sequences, r k >= PILOT_DRAWS_POOLED (32) pooled
    draws per stratum (r >= 2 for a within-sequence variance; k = min(B, 16)).
    (0, 0) (no pilot: equal allocation) when the pilot's r (n - 1) k / B passes per sequence
    would exceed PILOT_SHARE_MAX of the per-sequence ``budget``."""
    B = max(int(num_sequences), 1)
    k = min(B, PILOT_DRAWS_POOLED // 2)
    r = max(2, -(-PILOT_DRAWS_POOLED // k))
    cost = lambda r: r * (n - 1) * k / B  # noqa: E731
    while r > 2 and cost(r) > PILOT_SHARE_MAX * budget:
        r -= 1
    return (r, k) if cost(r) <= PILOT_SHARE_MAX * budget else (0, 0)


def _integer_allocation(a_K: np.ndarray, R: int) -> np.ndarray:
    """int64 [K] counts n_k >= 1 with sum R (R >= K), as close to R a_k / sum a as the floor
    of one allows (greedy on the largest shortfall)."""
    K = len(a_K)
    ideal = R * (a_K / a_K.sum() if a_K.sum() > 0 else np.full(K, 1.0 / K))
    counts = np.maximum(1, np.floor(ideal)).astype(np.int64)
    while counts.sum() > R:
        k = int(np.argmax(np.where(counts > 1, counts - ideal, -np.inf)))
        counts[k] -= 1
    while counts.sum() < R:
        counts[int(np.argmax(ideal - counts))] += 1
    return counts


def neyman_plan(pilot_BxS, n: int, num_samples: int, enumerate_strata: bool = True,
                pilot_passes: int = 0) -> NeymanPlan:
    """The neyman allocation for rows with n target positions and a budget of S n passes.

    Args:
      pilot_BxS: float [B, S_p] pilot values (sample s is stratum m = s mod (n-1) + 1), or None
        (no pilot: equal allocation over m = 1..n-1).
      n: target positions per row; num_samples: S, the budget in stratified rounds (n passes).
      enumerate_strata: False keeps only m = n exact (for measuring the allocation alone).
      pilot_passes: passes per sequence the pilot already spent (taken from the budget).
    Returns: a NeymanPlan within the budget of S n passes per sequence. Every stratum is
    enumerated when 2^n - 1 <= S n (exact, SE 0); otherwise m = n is, plus each stratum m whose
    C(n, m) passes lower the variance at the remaining budget P (enumerate if
    (A - a_m)^2 / (P - c_m) < A^2 / P, A = sum of a over the sampled strata; greedy from the
    cheapest, keeping 2 rounds for the Monte Carlo part), a_m = sigma_m / m with sigma_m^2 the
    within-sequence pilot variance pooled over sequences. A sample has R = block n rows
    (block = min(4, S // 32), at least 1) split as n_m >= 1 proportional to a_m (Neyman
    allocation); S' = max(2, P // R) samples are drawn.
    """
    budget = int(num_samples) * n
    if n == 1 or (enumerate_strata and 2**n - 1 <= budget):
        return NeymanPlan(n, enumerated=tuple(range(1, n + 1)))
    a = np.ones(n - 1)
    if pilot_BxS is not None:
        v = np.asarray(pilot_BxS, np.float64)
        r = v.shape[1] // (n - 1)
        v = v[:, : r * (n - 1)].reshape(v.shape[0], r, n - 1)
        a = np.sqrt(np.mean(v.var(axis=1, ddof=1), axis=0)) / np.arange(1, n)
    enumerated = [n]
    A, P = float(a.sum()), budget - int(pilot_passes) - 1  # m = n costs one pass
    for m in sorted(range(1, n), key=lambda m: (math.comb(n, m), m)):
        c = math.comb(n, m)
        if not enumerate_strata or c > P - 2 * n:
            break
        if A > 0 and (A - a[m - 1]) ** 2 * P < A**2 * (P - c):
            enumerated.append(m)
            A -= a[m - 1]
            P -= c
    rest = [m for m in range(1, n) if m not in enumerated]
    if not rest:
        return NeymanPlan(n, enumerated=tuple(range(1, n + 1)))
    block = max(1, min(NEYMAN_BLOCK_MAX, int(num_samples) // NEYMAN_MIN_SAMPLES))
    R = max(block * n, len(rest))
    counts = np.zeros(n, np.int64)
    counts[np.array(rest) - 1] = _integer_allocation(np.array([a[m - 1] for m in rest]), R)
    return NeymanPlan(n, counts=tuple(int(c) for c in counts), num_samples=max(2, P // R),
                      enumerated=tuple(sorted(enumerated)))


def stratum_masks(target_BxL, m: int) -> np.ndarray:
    """Every m-subset of each row's target positions: bool [B, C(n, m), L]."""
    target = np.asarray(target_BxL, bool)
    B, L = target.shape
    n = common_target_count(target, "enumeration")
    idx_BxN = np.argsort(~target, axis=1, kind="stable")[:, :n]
    combos_KxM = np.array(list(itertools.combinations(range(n), m)), np.int64)
    K = len(combos_KxM)
    out = np.zeros((B, K, L), bool)
    pos = idx_BxN[:, combos_KxM]  # [B, K, m]
    out[np.arange(B)[:, None, None], np.arange(K)[None, :, None], pos] = True
    return out


def enumerated_strata(apply_fn, params, x_BxL, target_BxL, strata, spec,
                      vocab_size: int, batch_size: int) -> np.ndarray:
    """sum_{m in strata} (1/m) mean_{|S| = m} C_S per row, float64 [B] nats: the strata of the
    stratified identity -log p = sum_m (1/m) E_{|S|=m}[C_S] computed exactly (every subset of
    the target positions; time t(lambda = m / n) for time-conditioned denoisers). Calls of a
    fixed shape (``batch_size`` rows, last padded)."""
    x = np.asarray(x_BxL)
    B, L = x.shape
    n = common_target_count(target_BxL, "enumeration")
    out = np.zeros(B, np.float64)
    for m in strata:
        masks = stratum_masks(target_BxL, m)
        K = masks.shape[1]
        rows = max(1, min(int(batch_size), B * K))
        xr = np.repeat(x, K, axis=0)
        mr = masks.reshape(B * K, L)
        t = float(spec.schedule.t_from_lambda(jnp.float32(m / n)))
        ce = np.zeros(B * K, np.float64)
        for r0 in range(0, B * K, rows):
            sel = np.arange(r0, r0 + rows) % (B * K)
            vals = masked_ce(apply_fn, params, jnp.asarray(xr[sel]), jnp.asarray(mr[sel]),
                              jnp.full((rows,), t, jnp.float32), int(vocab_size))
            k = min(rows, B * K - r0)
            ce[r0:r0 + k] = np.asarray(vals, np.float64)[:k]
        if not np.all(np.isfinite(ce)):
            b = int(np.argwhere(~np.isfinite(ce))[0, 0]) // K
            raise FloatingPointError(f"non-finite cross-entropy for sequence {b} in the enumerated "
                                     f"stratum m = {m}: the denoiser returned -inf/NaN where the data has mass")
        out += ce.reshape(B, K).mean(axis=1) / m
    return out


class Neyman(MaskLaw):
    """The neyman estimator: pilot, plan (enumerated strata + Neyman-allocated rows), draw."""

    name = "neyman"
    min_samples = 8
    one_pass = False
    per_input_targets = False

    def draw(self, spec, keys, target_BxL, n_B, sample_B):
        if spec.plan is None:
            raise ValueError("the neyman estimator needs a plan: run it through likelihood.nll, "
                             "which runs the pilot (or pass MaskSpec(plan=neyman_plan(...)))")
        mask, m_B, w = _draw_neyman(spec.plan, keys.mask, target_BxL, sample_B)
        return mask, frac_time(spec, m_B, n_B), w

    def passes_per_sample(self, spec, target_BxL) -> int:
        """R for a plan (1 for its pilot), the common target count n before planning."""
        if spec.plan is not None:
            check_plan(spec.plan, target_BxL)
            return 1 if spec.plan.pilot else spec.plan.rows
        return common_target_count(target_BxL, self.name)

    def needs_plan(self, spec) -> bool:
        return spec.plan is None

    def pilot_stage(self, spec, target_BxL, num_samples: int):
        """(pilot spec, pilot samples per piloted row, number k of rows piloted: the first k) or
        None when no pilot is needed (everything enumerated) or affordable (equal allocation is
        used). See :func:`pilot_rounds`."""
        n = common_target_count(target_BxL, self.name)
        budget = num_samples * n
        if n == 1 or 2**n - 1 <= budget:
            return None
        r, k = pilot_rounds(target_BxL.shape[0], n, budget)
        if r == 0:
            return None
        return dataclasses.replace(spec, plan=NeymanPlan(n, pilot=True)), r * (n - 1), k

    def plan(self, spec, pilot_BxS, target_BxL, num_samples: int):
        """(the planned spec, the Monte Carlo samples S' to draw) from the pilot values (None:
        no pilot was run); see :func:`neyman_plan`."""
        n = common_target_count(target_BxL, self.name)
        B = np.shape(target_BxL)[0]
        spent = 0 if pilot_BxS is None else -(-np.shape(pilot_BxS)[0] * np.shape(pilot_BxS)[1] // B)
        plan = neyman_plan(pilot_BxS, n, int(num_samples), pilot_passes=spent)
        return dataclasses.replace(spec, plan=plan), plan.num_samples

    def exact_terms(self, spec, apply_fn, params, x_BxL, target_BxL, batch_size, vocab_size) -> dict:
        """{'diffusion': float64 [B]}: the enumerated strata sum_m (1/m) mean_{|S|=m} C_S (nats)."""
        plan = spec.plan
        if plan is None or plan.pilot or not plan.enumerated:
            return {}
        check_plan(plan, target_BxL)
        return {"diffusion": enumerated_strata(apply_fn, params, x_BxL, target_BxL, plan.enumerated,
                                               spec, vocab_size, batch_size)}

    def extra_passes(self, spec) -> int:
        """Forward passes per sequence of the enumerated strata."""
        plan = spec.plan
        if plan is None or plan.pilot:
            return 0
        return plan.enumeration_passes()


register_law(Neyman())
