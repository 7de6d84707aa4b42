"""Oracle cases: data with exact likelihoods, and the estimators to check against them.

An :class:`OracleCase` holds items ``x`` with their exact ``-log p`` (and, with a prompt, the
exact conditional and log-ratio), a list of :class:`OracleEstimator` (a process, the exact
denoiser it needs and its own PRNG key) and a sampler check. :func:`infodiff.tasks.oracle_case`
builds the case of a config; :func:`infodiff.evaluation.run.evaluate_oracle` runs any case.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import numpy as np

from infodiff import likelihood as lk
from infodiff import oracles
from infodiff.processes import poisson
from infodiff.processes import score_entropy as se

__all__ = ["OracleEstimator", "OracleCase", "names", "text_case", "poisson_case"]


@dataclasses.dataclass
class OracleEstimator:
    process: Any
    denoiser: Any
    key: jax.Array
    conditional: bool = True
    ratio: bool = True


@dataclasses.dataclass
class OracleCase:
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


def _steps(spec) -> list[int]:
    parts = [spec] if isinstance(spec, (str, int)) else list(spec)
    return [int(e) for p in parts for e in str(p).split(",") if e.strip()]


def _load_or_make_oracle(config, out_dir):
    d = config.data
    if d.path:  # the generation keys (seed, seq_len, ...) are not read (infodiff/config_usage.py)
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


def _text_items(config, orc, rng, check: bool):
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


def text_case(config, schedule, kind: str) -> OracleCase:
    """Masked (``kind='masked'``: every estimator of ``eval.estimators``) or score-entropy
    (``'sedd'``: every graph x lam sampling of ``eval.graphs`` / ``eval.lambda_samplings``, plus
    the samplers' total variation on a small tabular law) with a tabular or Markov oracle."""
    ev = config.eval
    if int(ev.num_sequences) < 1:
        raise ValueError(f"config.eval.num_sequences must be >= 1; got {ev.num_sequences}")
    if kind == "masked":
        est_names = names(ev.estimators, lk.ESTIMATORS, "eval.estimators", "estimator")
    else:
        graphs = names(ev.graphs, se.GRAPHS, "eval.graphs", "graph")
        samplings = names(ev.lambda_samplings, se.LAMBDA_SAMPLING, "eval.lambda_samplings", "lambda sampling")
        steps_list = _steps(ev.sampler_steps)
        methods = names(ev.sampler_methods, ("euler", "tweedie"), "eval.sampler_methods", "sampler") if steps_list else []
    orc, source = _load_or_make_oracle(config, ev.output_dir)
    rng = np.random.default_rng(ev.seed)
    x, P = _text_items(config, orc, rng, check=(kind == "masked"))
    L = x.shape[1]
    R = L - P
    key = jax.random.PRNGKey(ev.seed)
    V = orc.vocab_size
    case = OracleCase(name=config.data.name, x=x, truth_x=-orc.log_prob(x), estimators=[],
                      process_info={"name": kind, "schedule": schedule.name,
                                    "eps": getattr(schedule, "eps", None)},
                      units={"item": "sequence", "nll": "nats per sequence"},
                      info={"table": source, "alphabet": orc.alphabet, "order": getattr(orc, "order", None)},
                      prompt_len=P if R > 0 else 0)
    if case.prompt_len:
        target = np.zeros(x.shape, bool)
        target[:, P:] = True
        case.truth_c = -orc.cond_log_prob(x, target)
        if kind == "masked":
            # One alternative response per prompt, y' ~ p(. | x), shared by every estimator.
            case.y_alt = (orc.sample_response(rng, x[:, :P], R) if config.data.name == "markov"
                          else orc.sample_response(rng, x[:, :P]))
            x_alt = np.concatenate([x[:, :P], case.y_alt], axis=1)
            case.truth_r = orc.cond_log_prob(x, target) - orc.cond_log_prob(x_alt, target)
    if kind == "masked":
        for i, name in enumerate(est_names):
            case.estimators.append(OracleEstimator(lk.masked_process(name, schedule, V), orc,
                                                   jax.random.fold_in(key, i)))
        return case
    lam_max = schedule.lambda_max
    case.info["lam_max"] = lam_max
    for i, graph in enumerate(graphs):
        for j, samp in enumerate(samplings):
            proc = se.ScoreEntropyProcess(graph=graph, vocab_size=V, noise_law=samp, lam_max=lam_max)
            case.estimators.append(OracleEstimator(
                proc, se.OracleScore(orc, graph), jax.random.fold_in(jax.random.fold_in(key, i), j),
                conditional=(graph == "absorb"), ratio=False))

    def samplers():
        if not (steps_list and config.data.name == "tabular" and V**L <= 100_000):
            return []
        allx = np.array(np.unravel_index(np.arange(V**L), (V,) * L)).T
        p_true = np.exp(orc.log_prob(allx))
        n = int(ev.num_generate)
        floor = []
        for r in range(3):  # TV of an exact sample of the same size: the Monte Carlo floor
            idx = np.ravel_multi_index(orc.sample(np.random.default_rng(ev.seed + 7 + r), n).T, (V,) * L)
            floor.append(0.5 * np.abs(np.bincount(idx, minlength=V**L) / n - p_true).sum())
        tv = {}
        for graph in graphs:
            for method in methods:
                tvs = []
                for steps in steps_list:
                    gen = np.asarray(se.sample(se.OracleScore(orc, graph), graph,
                                               jax.random.fold_in(key, 10_000 + steps), n, L, V, steps,
                                               method=method, lam_max=lam_max))
                    idx = np.ravel_multi_index(gen.T, (V,) * L)
                    tvs.append(float(0.5 * np.abs(np.bincount(idx, minlength=V**L) / n - p_true).sum()))
                tv[f"{graph}:{method}"] = tvs
        return [{"steps": steps_list, "tv": tv, "num_generate": n, "tv_of_exact_sample": float(np.mean(floor))}]

    case.samplers = samplers
    return case


def _oracle_proposal(config, th, dist, x_counts, x, scaling) -> tuple[tuple, str | None]:
    """(loc, scale, clip) of the oracle's log-SNR proposal and a note when it is not the one the
    config asks for. ``eval.proposal='auto'`` fits the proposal to the spread of the sampled
    examples (:func:`poisson.suggest_logistic`); a law with one atom has none. There
    -log p(x) = 0 and the exact denoiser returns x at every SNR, so the sampled integrand is 0;
    what remains is the lattice-rounding tail above the proposal's top (the ``recon`` term), 0
    only once the lattice is resolved. So the proposal is suggest_logistic's v2 recipe with the
    plateau [a_hi - 1, a_hi], a_hi = log(E X / spacing^2) + 2 (its top, a_hi + 6, lies above the
    resolution of the lattice; the paper's (-1, 5, 4) ends at alpha 19 and gave 3.2 nats for a
    point mass at 10^6), with a one-line note. A law with several atoms whose sample happens to
    hold one value is a ValueError naming the file (or law) and what to change."""
    ev, d = config.eval, config.data
    mean = x.mean(0)
    if str(ev.proposal) not in ("auto", "auto_v1") or ((x.var(0) > 0) & (mean > 0)).any():
        return th.poisson_proposal(config, x, scaling, "eval"), None
    source = f"pmf file {str(d.path)!r}" if d.path else f"config.data.distribution={dist.name!r}"
    atoms = np.asarray(dist.support)[np.asarray(dist.probs) > 0]
    value = ", ".join(str(int(v)) for v in np.asarray(x_counts)[0])
    if len(atoms) != 1:
        raise ValueError(f"{source}: all {len(x)} sampled examples are count {value}, so eval.proposal="
                         f"{str(ev.proposal)!r} has no spread to fit the log-SNR proposal to; raise "
                         "config.eval.num_examples or give --config.eval.proposal=paper")
    if not (mean > 0).any():  # every coordinate 0 on a lattice from 0: the loss is 0 at any SNR
        prop, why = (-1.0, 5.0, 4.0), "the paper's (the loss of x = 0 is 0 at every SNR)"
    else:
        a_hi = float(np.median(np.log(mean[mean > 0] / scaling.spacing**2))) + 2.0
        a_lo, scale = a_hi - 1.0, 2.0
        loc = 0.5 * (a_lo + a_hi) + 0.5 * scale
        clip = max((loc - (a_lo - 10.0)) / scale, (a_hi + 6.0 - loc) / scale)
        prop, why = (loc, scale, clip), f"its top, log-SNR {loc + clip * scale:.1f}, lies where the lattice is resolved"
    note = (f"{source} has one atom (count {value}, probability 1): -log p(x) = 0 and the exact denoiser is exact "
            f"at every SNR, so eval.proposal={str(ev.proposal)!r} has no spread to fit; using (loc, scale, clip) = "
            f"({prop[0]:.2f}, {prop[1]:.2f}, {prop[2]:.2f}): {why}")
    from absl import logging

    logging.warning("%s", note)
    return prop, note


def poisson_case(config, task_helpers) -> OracleCase:
    """The exact posterior mean of ``data.distribution`` (``data.dim`` iid coordinates, scaled to
    [low, high]) as the denoiser: the Monte Carlo NLL of ``eval.num_examples`` fresh samples
    against their exact -log p(x), and the increment and paper samplers' total variation / W1 to
    the true pmf at each of ``eval.sampler_steps``. ``task_helpers`` is :mod:`infodiff.tasks`
    (synthetic law, sampling, proposal)."""
    ev, d = config.eval, config.data
    th = task_helpers
    dist = th.oracle_distribution(config)
    dim = th.synthetic_dim(config, dist)
    scaling = poisson.CountScaling(int(dist.max_count), float(d.low), float(d.high))
    orc = dist.oracle(scaling, dim=(dim if dist.dim == 1 else None))
    rng = np.random.default_rng(int(ev.seed))
    x_counts = th.synthetic_sample(config, dist, rng, int(ev.num_examples))
    x = scaling.scale(x_counts)
    if dist.dim == 1:
        exact = -np.sum([dist.log_prob(x_counts[:, j]) for j in range(dim)], axis=0)
    else:
        exact = -dist.log_prob(x_counts)
    h = th.synthetic_entropy(config, dist)
    key = jax.random.key(int(ev.seed))
    prop, prop_note = _oracle_proposal(config, th, dist, x_counts, x, scaling)
    process = th.poisson_estimation_process(config, scaling, prop, jax.random.fold_in(key, 0))
    case = OracleCase(name=dist.name, x=x, truth_x=exact,
                      estimators=[OracleEstimator(process, orc, key, conditional=False, ratio=False)],
                      process_info={"name": "poisson", "sampler": str(ev.sampler), "proposal": list(prop),
                                    **({"proposal_note": prop_note} if prop_note else {}),
                                    "se_method": process.se_method, "channel_defensive": process.z_defensive},
                      units={"item": "example", "nll": "nats per example"},
                      info={"distribution": dist.name, "pmf_file": (os.path.abspath(str(d.path)) if d.path else None),
                            "dim": dim,
                            "support_size": int(len(dist.probs)), "max_count": int(dist.max_count),
                            "truncated_mass": float(dist.truncated_mass), "exact_entropy_nats": h})
    K1 = int(dist.max_count) + 1
    if dist.dim == 1:
        p_full = np.zeros(K1)
        p_full[np.asarray(dist.support)[:, 0]] = dist.probs
        encode = lambda g: g[:, 0]  # noqa: E731
    else:
        p_full = np.zeros(K1 * K1)
        sup = np.asarray(dist.support)
        p_full[sup[:, 0] * K1 + sup[:, 1]] = dist.probs
        encode = lambda g: g[:, 0] * K1 + g[:, 1]  # noqa: E731

    def samplers():
        steps_list = _steps(ev.sampler_steps)
        if not steps_list:
            return []
        tv = {"increment": [], "paper": []}
        w1 = {"increment": [], "paper": []}
        for i, T in enumerate(steps_list):
            gammas = poisson.log_spaced_gammas(float(ev.gamma_min), float(ev.gamma_max) or
                                               64.0 * scaling.high / scaling.spacing**2, T)
            for name, fn in (("increment", poisson.increment_sampler), ("paper", poisson.paper_sampler)):
                gen = fn(orc, jax.random.fold_in(key, 100 + 2 * i + (name == "paper")), int(ev.num_generate),
                         dim, gammas, scaling, decision=str(ev.decision))
                tv[name].append(float(poisson.total_variation(encode(gen), p_full)))
                w1[name].append(th.synthetic_w1(config, dist, gen, int(ev.seed) + 7)["wasserstein1"])
        # E[TV] of an exact sample of this size (MC over 20 reference draws)
        ref_rng = np.random.default_rng(int(ev.seed) + 99)
        floor = float(np.mean([poisson.total_variation(
            encode(th.synthetic_sample(config, dist, ref_rng, int(ev.num_generate))[:, :dist.dim]), p_full)
            for _ in range(20)]))
        return [{"steps": steps_list, "tv": tv, "w1": w1, "num_generate": int(ev.num_generate),
                 "tv_of_exact_sample": floor}]

    case.samplers = samplers
    return case
