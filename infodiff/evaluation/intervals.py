"""The report blocks of the model's own likelihood over generation orders (infodiff/orders.py,
docs/report.md): the ``interval`` and ``sampler_likelihood`` blocks of a split's report, the
totals of an input report and the interval fields of its rows.

The NELBO that every other number of a report is bounds the trained network's -log p from above;
the ``interval`` block brackets that -log p itself: the mixture over generation orders
p_U(x) = E_sigma p(x | sigma) (RADD, arXiv 2406.03736, §3), with ``lower`` from TUBE and
``upper`` from importance-weighted orders (orders.py's module docstring).
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np
from absl import logging

from infodiff import orders

__all__ = ["WHAT", "ROW_FIELDS", "split_blocks", "block", "row_fields"]

LN2 = math.log(2.0)
WHAT = {"any_order": "-log p_U(x), the trained network's own -log p: the mixture over generation orders "
                     "(the NELBO is an upper bound on it)",
        "ancestral": "-log p(x) of the T-step ancestral sampler (eval.sample_steps): the mixture over its reveal plans",
        "policy": "-log p(x) of the deterministic unmasking sampler {}: exact (one path)"}
ROW_FIELDS = ("lower", "upper", "iw", "iw_stderr", "tube", "tube_stderr", "ess", "pareto_k", "exact")
_STREAM = {"interval": 0x1D1, "sampler": 0x1D2}  # fold_in of the NELBO's key: independent draws


def _what(oi: orders.OrderInterval) -> str:
    return WHAT.get(oi.what) or WHAT["policy"].format(oi.what)


def block(oi: orders.OrderInterval, units_B: np.ndarray, wall_time_s: float, count: str = "items",
          nelbo_total_stderr: float | None = None) -> dict:
    """The report block of ``oi`` (rows: the items, ``nelbo`` filled): the total over items as a
    mean per item, nats, and per unit (``units_B`` characters per item, float [B]) in bits;
    ``settings``; exact rows, the median Kish ESS, the largest Pareto k-hat (null when none was
    fitted: K < 25) and the rows above 0.7, the rows whose lower end was clipped at 0, forward
    passes, wall time (s). ``nelbo_total_stderr``: the NELBO's SE of the sum, as the rest of the
    report gives it (:meth:`likelihood.Estimate.total`; default the rows' SEs in quadrature)."""
    t = oi.total()
    if nelbo_total_stderr is not None and "nelbo" in t:
        t["nelbo_stderr"] = float(nelbo_total_stderr)
    n, units = t["rows"], float(np.sum(units_B))
    keys = ("lower", "upper", "iw", "iw_stderr", "tube", "tube_stderr", "nelbo", "nelbo_stderr")
    k_hat = oi.pareto_k[np.isfinite(oi.pareto_k)]
    ess = oi.ess[np.isfinite(oi.ess)]
    return {
        "settings": {"what": _what(oi), "sampler": oi.what, "orders": oi.orders, "pilot_orders": oi.pilot_orders,
                     "proposal": oi.proposal, "level": oi.level, **oi.settings},
        count: n, **{k: t[k] / n for k in keys if k in t},
        "bits": {k: t[k] / (units * LN2) for k in keys if k in t},
        "exact_rows": t["exact_rows"],
        "ess_median": float(np.median(ess)) if len(ess) else None,
        "pareto_k_max": float(k_hat.max()) if len(k_hat) else None,
        "rows_pareto_k_above_0_7": int(np.sum(k_hat > 0.7)),
        "rows_lower_clipped": t["rows_lower_clipped"],
        "forward_passes": t["forward_passes"], "wall_time_s": float(wall_time_s)}


def split_blocks(task, params, x_BxL, est, key, settings: dict, batch_size: int) -> dict:
    """``{"interval": block, "sampler_likelihood": block}`` (those ``settings`` ask for:
    :func:`infodiff.tasks.masked.order_settings`) of the items ``x_BxL`` with their NELBO
    Estimate ``est`` (per item, Monte Carlo SE) beside them."""
    model = task.order_model(params)
    L = x_BxL.shape[1]
    out = {}
    need = 2 * settings["orders"] * L * len(x_BxL) if settings["interval"] else 0
    if need > 20 * est.forward_passes * len(x_BxL):
        logging.warning("the interval takes about %d forward passes, %.0fx the NELBO's %d; "
                        "--config.eval.max_sequences=N evaluates a random subset of N items",
                        need, need / max(1, est.forward_passes * len(x_BxL)), est.forward_passes * len(x_BxL))
    common = dict(schedule=model["schedule"], batch_size=batch_size, progress=True)
    if settings["interval"]:
        t0 = time.time()
        oi = orders.nll_interval(model["denoiser"], x_BxL, jax.random.fold_in(key, _STREAM["interval"]),
                                 num_orders=settings["orders"], proposal=settings["proposal"], level=settings["level"],
                                 time_conditioned=model["time_conditioned"], **common)
        oi.nelbo, oi.nelbo_stderr = est.mean, est.stderr
        out["interval"] = block(oi, np.full(len(x_BxL), L), time.time() - t0, nelbo_total_stderr=est.total()[1])
    if settings["sampler"]:
        t0 = time.time()
        s = settings["sampler"]
        kw = dict(num_steps=settings["sample_steps"], num_plans=settings["orders"], level=settings["level"]) \
            if s == "ancestral" else {}
        oi = orders.sampler_nll(model["denoiser"], x_BxL, jax.random.fold_in(key, _STREAM["sampler"]), sampler=s,
                                **kw, **common)
        oi.nelbo, oi.nelbo_stderr = est.mean, est.stderr
        out["sampler_likelihood"] = block(oi, np.full(len(x_BxL), L), time.time() - t0,
                                          nelbo_total_stderr=est.total()[1])
    return out


def row_fields(oi: orders.OrderInterval, b: int) -> dict:
    """Row ``b``'s interval fields for rows.jsonl / rows.csv (``interval_forward_passes``: the
    row's own ``forward_passes`` is the NELBO's)."""
    d = {k: getattr(oi, k)[b].item() for k in ROW_FIELDS}
    d["interval_forward_passes"] = int(oi.forward_passes[b])
    return d
