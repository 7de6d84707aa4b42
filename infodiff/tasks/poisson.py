"""The ``poisson`` process's registration: Poisson diffusion (ItDPDM, arXiv 2505.05082) on counts.

Data: a :class:`infodiff.data.counts.CountDataset` (default :func:`load_count_data`), int32
[B, D] counts in [0, K]; loss ``poisson.diffusion_loss`` on the scaled counts
(:func:`make_scaling`); eval-mode denoiser :class:`count_denoisers.CountDenoiser`; oracle case:
the exact posterior mean of a count law (configs/oracle_poisson.py); user files: ``.npy`` counts.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from infodiff import config_rules as cr
from infodiff.data import counts as counts_lib
from infodiff.denoisers import NoParams
from infodiff.networks import count_denoisers as cd
from infodiff.processes import base, poisson
from infodiff.tasks import (LN2, ContractCase, Figure, OracleCase, OracleEstimator, Registration, Task, register,
                            repo_config)
from infodiff.tasks.text import steps_list

__all__ = ["PoissonTask", "load_count_data", "synthetic_distribution", "oracle_distribution", "synthetic_dim",
           "synthetic_sample", "synthetic_entropy", "synthetic_w1", "make_scaling", "make_count_model",
           "poisson_proposal", "empirical_prior_logits", "check_counts", "poisson_estimation_process",
           "oracle_case", "REGISTRATION"]


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

    ``data.name``: one of ``counts.DATASETS`` (with the ``data.*`` keys its loader takes) or
    ``'synthetic'``: ``data.dim`` independent coordinates drawn from
    ``count_synthetic.get_distribution(data.distribution)`` with ``np.random.default_rng(
    [data.seed, i])`` for split i (train / valid / test sizes ``data.num_train / num_valid /
    num_test``); ``max_count`` is the largest support point.

    Raises: ValueError for an unknown data name or distribution.
    """
    d = config.data
    name = str(d.name)
    if name == counts_lib.SYNTHETIC:
        dist = synthetic_distribution(config)
        dim = synthetic_dim(config, dist)
        sizes = (int(d.num_train), int(d.num_valid), int(d.num_test))
        splits = {}
        for i, (k, n) in enumerate(zip(counts_lib.SPLIT_NAMES, sizes)):
            rng = np.random.default_rng([int(d.seed), i])
            splits[k] = synthetic_sample(config, dist, rng, n).astype(np.int32)
        return counts_lib.make_dataset(f"{counts_lib.SYNTHETIC}:{d.distribution}", splits, (dim,), int(dist.max_count),
                                       f"{d.distribution} truncated at {dist.max_count}, {dim} coordinates, "
                                       f"seed {d.seed}")
    if name not in counts_lib.DATASETS:
        raise ValueError(f"config.data.name={name!r}; choose from {counts_lib.NAMES + (counts_lib.SYNTHETIC,)}")
    # the data.* keys its loader takes (counts.DATASETS); an empty path / cache_dir is the default
    kwargs = {k: (d[k] or None) if isinstance(d[k], str) else d[k] for k in counts_lib.DATASETS[name].reads}
    return counts_lib.load_counts(name, **kwargs)


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
                "checksum": data.checksums.get(counts_lib.split_key(str(ev.split))),
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
        return {"name": self.name, "sampler": process.sampler, "proposal": [process.loc, process.scale, process.clip],
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

    def eval_extras(self, est, x, generated):
        data, ev = self.data, self.config.eval
        extras, figures = {}, []
        dist = None
        if counts_lib.is_synthetic(data.name):
            dist = synthetic_distribution(self.config)
            counts = self._eval_counts
            h = synthetic_entropy(self.config, dist)
            if dist.dim == 1:
                exact = -np.sum([dist.log_prob(counts[:, j]) for j in range(counts.shape[1])], axis=0)
            else:
                exact = -dist.log_prob(counts)
            gap = est.mean - exact  # paired: model NLL(x) - (-log p(x)) on the same examples
            extras.update(exact_entropy_nats_per_example=h, exact_entropy_bits_per_dim=h / (data.dim * LN2),
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
            shown = gen if counts_lib.figure_kind(data.name) == "histogram" else gen[:32]
            figures.append(Figure("samples.png", "count_samples", (data, shown, dist)))
        return extras, figures


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



def _oracle_proposal(config, dist, x_counts, x, scaling) -> tuple[tuple, str | None]:
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
        return poisson_proposal(config, x, scaling, "eval"), None
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


def oracle_case(config, name: str = "poisson") -> OracleCase:
    """The exact posterior mean of ``data.distribution`` (``data.dim`` iid coordinates, scaled to
    [low, high]) as the denoiser: the Monte Carlo NLL of ``eval.num_examples`` fresh samples
    against their exact -log p(x), and the increment and paper samplers' total variation / W1 to
    the true pmf at each of ``eval.sampler_steps``. ``name``: the process's registered name (the
    report's)."""
    ev, d = config.eval, config.data
    dist = oracle_distribution(config)
    dim = synthetic_dim(config, dist)
    scaling = poisson.CountScaling(int(dist.max_count), float(d.low), float(d.high))
    orc = dist.oracle(scaling, dim=(dim if dist.dim == 1 else None))
    rng = np.random.default_rng(int(ev.seed))
    x_counts = synthetic_sample(config, dist, rng, int(ev.num_examples))
    x = scaling.scale(x_counts)
    if dist.dim == 1:
        exact = -np.sum([dist.log_prob(x_counts[:, j]) for j in range(dim)], axis=0)
    else:
        exact = -dist.log_prob(x_counts)
    h = synthetic_entropy(config, dist)
    key = jax.random.key(int(ev.seed))
    prop, prop_note = _oracle_proposal(config, dist, x_counts, x, scaling)
    process = poisson_estimation_process(config, scaling, prop, jax.random.fold_in(key, 0))
    case = OracleCase(name=dist.name, x=x, truth_x=exact,
                      estimators=[OracleEstimator(process, orc, key, conditional=False, ratio=False)],
                      process_info={"name": name, "sampler": str(ev.sampler), "proposal": list(prop),
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
        steps = steps_list(ev.sampler_steps)
        if not steps:
            return []
        tv = {"increment": [], "paper": []}
        w1 = {"increment": [], "paper": []}
        for i, T in enumerate(steps):
            gammas = poisson.log_spaced_gammas(float(ev.gamma_min), float(ev.gamma_max) or
                                               64.0 * scaling.high / scaling.spacing**2, T)
            for name, fn in (("increment", poisson.increment_sampler), ("paper", poisson.paper_sampler)):
                gen = fn(orc, jax.random.fold_in(key, 100 + 2 * i + (name == "paper")), int(ev.num_generate),
                         dim, gammas, scaling, decision=str(ev.decision))
                tv[name].append(float(poisson.total_variation(encode(gen), p_full)))
                w1[name].append(synthetic_w1(config, dist, gen, int(ev.seed) + 7)["wasserstein1"])
        # E[TV] of an exact sample of this size (MC over 20 reference draws)
        ref_rng = np.random.default_rng(int(ev.seed) + 99)
        floor = float(np.mean([poisson.total_variation(
            encode(synthetic_sample(config, dist, ref_rng, int(ev.num_generate))[:, :dist.dim]), p_full)
            for _ in range(20)]))
        return [{"steps": steps, "tv": tv, "w1": w1, "num_generate": int(ev.num_generate),
                 "tv_of_exact_sample": floor}]

    case.samplers = samplers
    return case


def _law_is_1d(config) -> bool:
    """Whether a Poisson config's count law is 1-D (a pmf file always is; an unknown name counts
    as 1-D here and is refused where the law is built)."""
    if cr.ORACLE(config) and cr.get(config, "data.path"):
        return True
    from infodiff.data import count_synthetic as cs

    name = str(cr.get(config, "data.distribution", "") or "zip")
    try:
        return cs.get_distribution(name).dim == 1
    except (KeyError, ValueError):
        return True


_SYNTHETIC = f"data.name = {counts_lib.SYNTHETIC!r}"
_NETWORK = cr.NETWORK
_ORACLE = cr.ORACLE

# Keys a Poisson run reads only under a condition (infodiff/config_usage.py).
RULES: tuple[cr.Conditional, ...] = (
    # data sources (oracle mode reads its law from data.path / distribution / max_count / dim)
    *cr.keys(("data.distribution", "data.max_count", "data.dim"), f"{_SYNTHETIC} or eval.mode = 'oracle'",
             lambda c: _ORACLE(c) or cr.get(c, "data.name") == counts_lib.SYNTHETIC),
    *cr.keys(("data.num_train", "data.num_valid", "data.num_test", "data.seed"), _SYNTHETIC,
             cr.equals("data.name", counts_lib.SYNTHETIC)),
    *counts_lib.RULES,
    cr.Conditional("data.path", "data.name = 'chorales' or eval.mode = 'oracle'",
                   lambda c: _ORACLE(c) or cr.get(c, "data.name") in counts_lib.PATH_NAMES),
    # networks
    *cr.keys(("model.hidden", "model.num_layers"), "model.arch = 'mlp'", cr.equals("model.arch", "mlp")),
    *cr.keys(("model.channels", "model.num_blocks"), "model.arch in ('conv', 'seqconv')",
             cr.equals("model.arch", "conv", "seqconv")),
    # log-SNR proposals and the high-SNR guard
    *cr.keys(("process.loc", "process.scale", "process.clip"), "process.proposal = 'manual'",
             cr.equals("process.proposal", "manual")),
    *cr.keys(("eval.loc", "eval.scale", "eval.clip"), "eval.proposal = 'manual'", cr.equals("eval.proposal", "manual")),
    cr.Conditional("eval.alpha_guard", "eval.high_snr_guard = 'round'", cr.equals("eval.high_snr_guard", "round")),
    cr.Conditional("eval.sampler_steps", "eval.mode = 'oracle'", _ORACLE),
    cr.Conditional("eval.channel_shift", "eval.channel_defensive > 0",
                   lambda c: float(cr.get(c, "eval.channel_defensive", 0.0)) > 0),
    cr.Conditional("model.init_prior", "model.head = 'categorical'", cr.equals("model.head", "categorical")),
    *cr.keys(("eval.max_examples", "eval.split", "eval.num_generate", "eval.sample_steps", "eval.gamma_min",
              "eval.gamma_max", "eval.decision"), "eval.input is not set (network mode)", cr.NO_INPUT, _NETWORK),
    cr.Conditional("data.dim", "the law data.distribution is 1-D (a 2-D law has its own dimension)",
                   lambda c: _law_is_1d(c)),
    *cr.keys(("eval.gamma_min", "eval.gamma_max", "eval.decision", "eval.sample_steps"), "eval.num_generate > 0",
             lambda c: int(cr.get(c, "eval.num_generate", 0)) > 0, _NETWORK),
    *cr.keys(("eval.gamma_min", "eval.gamma_max", "eval.decision"), "eval.sampler_steps is not empty",
             lambda c: len(tuple(cr.get(c, "eval.sampler_steps", ()) or ())) > 0, _ORACLE),
)

# ---- contract material (tests/test_processes.py, the resume test) ----
# A few-step tiny run: configs/poisson_synthetic.py at 256 training items, a 1-layer MLP of 16.
TINY_RUN = {"data.num_train": 256, "data.num_valid": 64, "data.num_test": 64, "model.hidden": 16,
            "model.num_layers": 1, "model.emb_dim": 8, "train.num_steps": 4, "train.batch_size": 32,
            "train.eval_batches": 1, "train.log_every": 2, "train.eval_every": 100,
            "train.ckpt_every": 2, "optim.warmup_steps": 1}


def tiny_config() -> ml_collections.ConfigDict:
    """configs/poisson_synthetic.py at :data:`TINY_RUN`."""
    return repo_config("poisson_synthetic", TINY_RUN)


def contract_cases() -> list[ContractCase]:
    """The logistic log-SNR sampler with the exact posterior of a 1-D zero-inflated Poisson law
    (max count 12) on 4 items; the training law (the same logistic proposal) estimates the NLL."""
    from infodiff.data import count_synthetic as cs

    dist = cs.get_distribution("zip", max_count=12)
    sc = poisson.CountScaling(12, 1.0, 2.0)
    counts = np.asarray(dist.sample(np.random.default_rng(2), 4, dim=1)).reshape(4, 1)
    loc, scale, clip = poisson.suggest_logistic(sc.scale(counts), sc.spacing)
    proc = poisson.estimation_process(4096, "logistic", loc, scale, clip, scaling=sc)
    train = poisson.PoissonProcess(loc=loc, scale=scale, clip=clip)
    return [ContractCase("poisson:logistic", proc, train, dist.oracle(sc, dim=1), sc.scale(counts),
                         -dist.log_prob(counts[:, 0]), None, 4096)]


REGISTRATION = register(Registration(name="poisson", task=PoissonTask, oracle_case=oracle_case,
                                     conditional=RULES, input_format="counts", contract_cases=contract_cases,
                                     tiny_config=tiny_config))
