"""Training and evaluation of Poisson-diffusion (ItDPDM) denoisers on count data.

Source: Bhattacharya et al., *ItDPDM*, arXiv 2505.05082 (Alg. 1 training, Eq. 17-19 NLL, Alg. 2
sampler); spec ``shared/specs/poisson.md`` §1-§5. The core (channel, PRL, log-SNR proposals,
NLL estimator, samplers) is :mod:`infodiff.processes.poisson`; this module wires it to data
(:mod:`infodiff.data.counts`, :mod:`infodiff.data.count_synthetic`), networks
(:mod:`infodiff.networks.count_denoisers`), optax / orbax and the report format.

Entry points (dispatched from ``train.py`` / ``evaluate.py`` when ``config.process.name ==
'poisson'``):

* :func:`train_and_evaluate` ``(config, workdir)`` — AdamW + EMA (``training.make_optimizer``),
  orbax checkpoints with bit-identical resume, tqdm progress with ETA, ``metrics.jsonl``,
  periodic validation of the diffusion loss (an unbiased MC estimate of the truncated NLL bound,
  nats / example and bits / dim) with the EMA parameters.
* :func:`evaluate` ``(config, workdir)`` — test NLL with :func:`poisson.poisson_nll` (nats per
  example, bits per dim, standard errors, the tail terms), generated samples (increment sampler,
  spec §4.4) with a PNG, and for synthetic data the exact entropy and the Wasserstein-1 distance of
  generated samples. In oracle mode (``config.eval.mode == 'oracle'``) no network is used: the
  exact posterior mean of a synthetic distribution is the denoiser (MC NLL vs exact entropy, both
  samplers' total variation).

Training objective per step (spec §3.2-3.3): ``loss_b = e^alpha_b / q(alpha_b) sum_d
l(x_bd, xhat(z_b, alpha_b))`` with ``alpha_b`` drawn per example from the truncated logistic
proposal (``process.proposal``: ``'paper'`` = ItDPDM's (-1, 5, 4), ``'auto'`` =
:func:`poisson.suggest_logistic` on the training data, or ``'manual'`` = ``process.loc / scale /
clip``) and ``weighting='likelihood'`` (with the gamma factor; ``'paper'`` drops it as Alg. 1
prints). The gradient is that of ``mean_b loss_b / D`` (nats per dimension).

Determinism: batch ``s`` is :func:`counts.batch_iterator_indices` ``(N, B, seed, s)`` and the key of
step ``s`` is ``fold_in(train_key, s)``, so a resumed run is bit-identical to an uninterrupted one.

Workdir layout: as :mod:`infodiff.training` (``config.json``, ``metrics.jsonl``,
``checkpoints/<step>/{state,meta}``), plus ``report.json``, ``report.txt`` and ``samples.png``
after :func:`evaluate`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from infodiff import training as tr_lib
from infodiff.data import counts as counts_lib
from infodiff.networks import count_denoisers as cd
from infodiff.processes import poisson

__all__ = [
    "load_data",
    "make_scaling",
    "make_model",
    "proposal",
    "empirical_prior_logits",
    "init_state",
    "make_train_step",
    "make_eval_step",
    "train_and_evaluate",
    "load_trained",
    "evaluate",
    "evaluate_network",
    "evaluate_oracle",
    "format_report",
    "write_report",
]

_LN2 = math.log(2.0)
_log = tr_lib._log


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def _synthetic_module():
    from infodiff.data import count_synthetic  # written in parallel (P1); imported lazily

    return count_synthetic


def _synthetic_dist(config):
    cs = _synthetic_module()
    name = str(config.data.distribution)
    if name not in cs.NAMES:
        raise ValueError(f"config.data.distribution={name!r}; choose from {tuple(cs.NAMES)}")
    return cs.get_distribution(name, max_count=int(config.data.max_count))


def _synthetic_dim(config, dist) -> int:
    """Coordinates per example: data.dim iid copies of a 1-D law, or the law's own D (2-D laws)."""
    return int(config.data.dim) if dist.dim == 1 else int(dist.dim)


def _synthetic_sample(config, dist, rng, n) -> np.ndarray:
    if dist.dim == 1:
        return np.asarray(dist.sample(rng, n, dim=int(config.data.dim)), np.int64).reshape(n, -1)
    return np.asarray(dist.sample(rng, n), np.int64).reshape(n, dist.dim)


def _synthetic_entropy(config, dist) -> float:
    """Exact entropy in nats per example (data.dim x the 1-D entropy for iid copies)."""
    return float(dist.entropy) * (int(config.data.dim) if dist.dim == 1 else 1)


def _synthetic_w1(config, dist, gen_NxD: np.ndarray, seed: int) -> dict:
    """Wasserstein-1 of generated samples to the true law, and its sampling-noise floor.

    1-D laws: exact W1 between each coordinate's empirical law and the true pmf
    (scipy.stats.wasserstein_distance with the pmf as weights), averaged over coordinates;
    ``w1_noise_floor`` = mean W1 of 5 exact samples of the same size (what a perfect sampler gets).
    2-D laws: ``count_synthetic.wasserstein1`` (exact optimal assignment, Euclidean) between up to
    3,000 generated samples and as many fresh samples of the law; ``w1_noise_floor`` is the same
    distance between two independent true samples of that size."""
    import scipy.stats

    cs = _synthetic_module()
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
    ref, ref2 = (_synthetic_sample(config, dist, rng, n) for _ in range(2))
    return {"wasserstein1": float(cs.wasserstein1(gen_NxD[:n], ref)),
            "w1_noise_floor": float(cs.wasserstein1(ref2, ref)),
            "w1_kind": f"exact assignment vs {n} true samples"}


def load_data(config: ml_collections.ConfigDict) -> counts_lib.CountDataset:
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
        dist = _synthetic_dist(config)
        dim = _synthetic_dim(config, dist)
        sizes = (int(d.num_train), int(d.num_valid), int(d.num_test))
        splits = {}
        for i, (k, n) in enumerate(zip(counts_lib.SPLIT_NAMES, sizes)):
            rng = np.random.default_rng([int(d.seed), i])
            splits[k] = _synthetic_sample(config, dist, rng, n).astype(np.int32)
        return counts_lib._make(f"synthetic:{d.distribution}", splits, (dim,), int(dist.max_count),
                                f"{d.distribution} truncated at {dist.max_count}, {dim} coordinates, "
                                f"seed {d.seed}")
    if name in ("digits", "fashion_mnist", "randhie"):
        return counts_lib.load_counts(name, d.cache_dir or None)
    if name == "chorales":
        return counts_lib.load_chorales(d.path or None, window=int(d.window))
    raise ValueError(f"config.data.name={name!r}; choose from {counts_lib.NAMES + ('synthetic',)}")


def make_scaling(config, data: counts_lib.CountDataset) -> poisson.CountScaling:
    """``CountScaling(data.max_count, data.low, data.high)`` (default [1, 2], spec §1)."""
    return poisson.CountScaling(int(data.max_count), float(config.data.low), float(config.data.high))


def proposal(config, train_scaled_NxD: np.ndarray, scaling: poisson.CountScaling,
             section: str = "process") -> tuple[float, float, float]:
    """(loc, scale, clip) of the truncated-logistic log-SNR proposal of ``config.<section>``.

    ``proposal='paper'``: ItDPDM's (-1, 5, 4) (App. B.2); ``'auto'``:
    :func:`poisson.suggest_logistic` on (at most 20,000 rows of) the scaled training data;
    ``'manual'``: ``loc, scale, clip`` from the section. Raises ValueError otherwise.
    """
    s = config[section]
    kind = str(s.proposal)
    if kind == "paper":
        return -1.0, 5.0, 4.0
    if kind == "auto":
        x = train_scaled_NxD[: 20000]
        return tuple(float(v) for v in poisson.suggest_logistic(x, scaling.spacing))
    if kind == "manual":
        return float(s.loc), float(s.scale), float(s.clip)
    raise ValueError(f"config.{section}.proposal={kind!r}; choose 'paper', 'auto' or 'manual'")


# ---------------------------------------------------------------------------------------------
# Model and state
# ---------------------------------------------------------------------------------------------
def make_model(config, data: counts_lib.CountDataset, scaling: poisson.CountScaling):
    """The network of ``config.model`` (``arch`` 'mlp' | 'conv' | 'seqconv', ``head``, sizes)."""
    m = config.model
    kw = dict(head=str(m.head), emb_dim=int(m.emb_dim))
    if m.arch == "mlp":
        kw.update(hidden=int(m.hidden), num_layers=int(m.num_layers))
    else:
        kw.update(channels=int(m.channels), num_blocks=int(m.num_blocks))
    return cd.make_count_model(str(m.arch), data.event_shape, scaling.lattice(), scaling.low,
                               scaling.high, **kw)


def empirical_prior_logits(train_NxD: np.ndarray, num_levels: int, pseudo: float = 0.5) -> np.ndarray:
    """float32 [D, K] log of the per-coordinate histogram of the training counts (+ ``pseudo``).

    Used to initialise the categorical head's ``prior_logits`` so the denoiser starts at the
    exact posterior mean of the independent-marginals model."""
    x = np.asarray(train_NxD, np.int64)
    D = x.shape[1]
    flat = (np.arange(D)[None, :] * num_levels + x).reshape(-1)
    h = np.bincount(flat, minlength=D * num_levels).reshape(D, num_levels) + float(pseudo)
    return np.log(h / h.sum(1, keepdims=True)).astype(np.float32)


def init_state(config, model, optimizer, key, data, mesh) -> tr_lib.TrainState:
    """Fresh TrainState (EMA = params), replicated on ``mesh``; categorical ``prior_logits``
    initialised from the training data if ``model.init_prior``."""
    D = data.dim
    prior = None
    if config.model.head == "categorical" and bool(config.model.init_prior):
        prior = jnp.asarray(empirical_prior_logits(data.flat("train"), data.max_count + 1))

    def init(key):
        params = model.init(key, jnp.zeros((1, D), jnp.float32), jnp.zeros((1,), jnp.float32))["params"]
        if prior is not None:
            params = dict(params, prior_logits=prior)
        return tr_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                 ema_params=jax.tree.map(jnp.copy, params),
                                 opt_state=optimizer.init(params))

    return jax.jit(init, out_shardings=NamedSharding(mesh, P()))(key)


def _abstract_state(config, model, optimizer, data, mesh):
    repl = NamedSharding(mesh, P())
    shapes = jax.eval_shape(lambda k: init_state(config, model, optimizer, k, data, mesh), jax.random.key(0))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=repl), shapes)


def _metrics(loss_B, D):
    loss = jnp.mean(loss_B)
    return {"loss": loss, "bpd": loss / (D * _LN2)}


def make_train_step(config, model, optimizer, scaling, prop, mesh):
    """Jitted ``train_step(state, counts_BxD int32, key) -> (state, metrics)``.

    Loss: :func:`poisson.diffusion_loss` (nats per example) on ``scaling.scale(counts)``;
    differentiates ``mean / D``. Metrics: ``loss`` (nats / example), ``bpd``, ``grad_norm``,
    ``lr`` (with ``process.weighting='paper'`` the loss drops the gamma factor and ``loss`` /
    ``bpd`` are not likelihoods; the validation metrics always use likelihood weighting).
    EMA as :mod:`infodiff.training` (warm-started decay).
    """
    schedule = tr_lib.make_lr_schedule(config)
    ema_decay = float(config.optim.ema_decay)
    loc, scale, clip = prop
    weighting = str(config.process.weighting)
    repl, bs = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def loss_fn(params, c_BxD, key):
        x = scaling.scale(c_BxD)
        den = lambda z, a: model.apply({"params": params}, z.astype(jnp.float32), a)  # noqa: E731
        loss_B = poisson.diffusion_loss(den, key, x, loc, scale, clip, weighting)
        return jnp.mean(loss_B) / c_BxD.shape[1], loss_B

    def step_fn(state, c_BxD, key):
        (_, loss_B), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, c_BxD, key)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        d = tr_lib._ema_decay(ema_decay, state.step)
        ema = optax.incremental_update(params, state.ema_params, step_size=1.0 - d)
        m = _metrics(loss_B, c_BxD.shape[1])
        m["grad_norm"] = optax.global_norm(grads)
        m["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        return tr_lib.TrainState(step=state.step + 1, params=params, ema_params=ema, opt_state=opt_state), m

    return jax.jit(step_fn, in_shardings=(repl, bs, repl), out_shardings=(repl, repl), donate_argnums=(0,))


def make_eval_step(config, model, scaling, prop, mesh):
    """Jitted ``eval_step(params, counts_BxD, key) -> {'loss', 'bpd'}`` with likelihood weighting
    (an unbiased MC estimate of the NLL bound's diffusion term over the proposal's range)."""
    loc, scale, clip = prop
    repl, bs = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def fn(params, c_BxD, key):
        den = lambda z, a: model.apply({"params": params}, z.astype(jnp.float32), a)  # noqa: E731
        loss_B = poisson.diffusion_loss(den, key, scaling.scale(c_BxD), loc, scale, clip, "likelihood")
        return _metrics(loss_B, c_BxD.shape[1])

    return jax.jit(fn, in_shardings=(repl, bs, repl), out_shardings=repl)


def _check_counts(arr: np.ndarray, max_count: int, name: str) -> None:
    poisson.validate_counts(arr, name)
    if arr.size and arr.max() > max_count:
        idx = tuple(int(i) for i in np.argwhere(arr > max_count)[0])
        raise ValueError(f"{name}{list(idx)} = {arr[idx]} exceeds max_count = {max_count}")


# ---------------------------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------------------------
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *, data=None,
                       stop_at_step: int | None = None, mesh=None) -> dict:
    """Train (or resume) a Poisson-diffusion denoiser; validate periodically.

    Args:
      config: schema of ``configs/poisson_*.py`` (``process.name == 'poisson'``).
      workdir: output directory (``config.json``, ``metrics.jsonl``, ``checkpoints/``); an
        existing checkpoint is resumed (bit-identical continuation).
      data: optional :class:`counts.CountDataset` (default :func:`load_data`).
      stop_at_step: stop (with a checkpoint) at this step, as an interruption would.
      mesh: device mesh (default all local devices, data parallel).

    Logs every ``train.log_every`` steps (absl + ``metrics.jsonl`` ``split: 'train'``: loss
    nats / example, bpd, grad_norm, lr, steps/s, examples/s, ETA); every ``train.eval_every``
    steps and at the end the EMA validation loss on ``train.eval_batches`` fixed batches with
    fixed keys (``split: 'valid'``). SIGINT / SIGTERM save a checkpoint and return.

    Returns: dict ``step, train, valid, num_params, interrupted, wall_time, workdir, proposal``.

    Raises:
      ValueError: empty workdir, bad config values, counts out of range (names the value).
      ConfigMismatchError: resuming with a config that differs in a non-resumable key.
      FloatingPointError: non-finite training loss.
    """
    if not workdir:
        raise ValueError("a workdir is required (train.py --workdir=DIR)")
    if config.process.name != "poisson":
        raise ValueError(f"config.process.name={config.process.name!r}: this trainer is for 'poisson'")
    workdir = os.path.abspath(os.fspath(workdir))
    t_start = time.time()
    tr = config.train
    B, num_steps = int(tr.batch_size), int(tr.num_steps)
    if num_steps < 0:
        raise ValueError(f"config.train.num_steps must be >= 0; got {num_steps}")
    for k in ("log_every", "eval_every", "ckpt_every"):
        if int(tr[k]) < 1:
            raise ValueError(f"config.train.{k} must be >= 1; got {tr[k]}")
    end_step = num_steps if stop_at_step is None else min(num_steps, int(stop_at_step))
    mesh = tr_lib.make_mesh() if mesh is None else mesh
    tr_lib.check_batch_divisible(B, mesh)

    data = load_data(config) if data is None else data
    scaling = make_scaling(config, data)
    train_NxD, valid_NxD = data.flat("train"), data.flat("valid")
    _check_counts(train_NxD, data.max_count, "training data")
    _check_counts(valid_NxD, data.max_count, "validation data")
    D = data.dim
    prop = proposal(config, scaling.scale(train_NxD), scaling)
    nb = max(1, min(int(tr.eval_batches), len(valid_NxD) // B))
    if len(valid_NxD) < B:
        raise ValueError(f"validation split has {len(valid_NxD)} examples < batch_size {B}")
    vidx = np.linspace(0, len(valid_NxD) - 1, nb * B).round().astype(np.int64)
    valid_batches = valid_NxD[vidx].reshape(nb, B, D)
    os.makedirs(workdir, exist_ok=True)

    model = make_model(config, data, scaling)
    optimizer = tr_lib.make_optimizer(config)
    base = jax.random.key(int(config.seed))
    init_key, train_key, eval_key = (jax.random.fold_in(base, i) for i in range(3))
    abstract = _abstract_state(config, model, optimizer, data, mesh)
    num_params = cd.count_params(abstract.params)
    train_step = make_train_step(config, model, optimizer, scaling, prop, mesh)
    eval_step = make_eval_step(config, model, scaling, prop, mesh)
    bs = NamedSharding(mesh, P("data"))

    config_dict = tr_lib._config_json_dict(config)
    meta = {"seed": int(config.seed), "config": config_dict,
            "data": {"name": data.name, "checksums": dict(data.checksums)},
            "proposal": list(prop)}
    mngr = tr_lib._checkpoint_manager(workdir, int(tr.keep_checkpoints))
    latest = mngr.latest_step()
    if latest is not None:
        saved = mngr.restore(latest, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        diff = tr_lib.config_differences(saved.get("config", {}), config_dict)
        if diff:
            mngr.close()
            raise tr_lib.ConfigMismatchError(
                f"cannot resume from {workdir}/checkpoints/{latest}: the config differs in {diff}; "
                f"only {list(tr_lib.RESUMABLE_KEYS)} and eval.* may change on resume")
        if saved.get("data", {}).get("checksums") not in (None, data.checksums):
            mngr.close()
            raise tr_lib.ConfigMismatchError(
                f"cannot resume from {workdir}: checkpoint data checksums {saved['data']['checksums']} "
                f"differ from the current data's {data.checksums}")
        state = mngr.restore(latest, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))).state
        _log(logging.info, "resumed from checkpoint step %d in %s", int(state.step), workdir)
    else:
        state = init_state(config, model, optimizer, init_key, data, mesh)
    start_step = int(jax.device_get(state.step))
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    tr_lib._truncate_metrics(metrics_path, start_step)
    _log(logging.info, "poisson %s: %d params, D=%d, K=%d levels, batch %d, steps %d -> %d, "
         "proposal (loc, scale, clip) = (%.2f, %.2f, %.2f), %s",
         data.name, num_params, D, data.max_count + 1, B, start_step, end_step, *prop,
         mesh.devices.flat[0].platform)

    def run_eval(step):
        sums: dict = {}
        for i, vb in enumerate(valid_batches):
            m = jax.device_get(eval_step(state.ema_params, jax.device_put(vb, bs), jax.random.fold_in(eval_key, i)))
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        out = {k: v / len(valid_batches) for k, v in sums.items()}
        tr_lib._append_jsonl(metrics_path, {"step": step, "split": "valid", "metrics": out,
                                            "wall_time": time.time() - t_start, "time": time.time()})
        _log(logging.info, "step %d valid (EMA): loss %.4f nats/example, %.4f bits/dim", step, out["loss"], out["bpd"])
        return out

    last_train, last_valid, interrupted = {}, {}, None
    window, prev = [], None
    t_window, steps_window = time.time(), 0
    step = start_step
    N = len(train_NxD)
    pbar = tqdm.tqdm(total=num_steps, initial=start_step, desc="train", unit="step",
                     dynamic_ncols=True, mininterval=1.0, smoothing=0.1, disable=None)
    try:
        with tr_lib._StopFlag() as stop:
            while step < end_step:
                if stop.signum is not None:
                    interrupted = signal.Signals(stop.signum).name
                    break
                idx = counts_lib.batch_iterator_indices(N, B, int(config.seed), step)
                state, metrics = train_step(state, jax.device_put(train_NxD[idx], bs), tr_lib.step_key(train_key, step))
                if prev is not None:
                    jax.block_until_ready(prev)
                prev = metrics
                window.append(metrics)
                step += 1
                steps_window += 1
                pbar.update(1)
                if step % int(tr.log_every) == 0 or step == end_step:
                    avg, eta = tr_lib.summarise_window(window, steps_window, t_window, "examples_per_s", B,
                                                       step, num_steps, mngr)
                    if str(config.process.weighting) == "likelihood":
                        _log(logging.info, "step %d/%d: loss %.4f nats/example, %.4f bits/dim, grad_norm %.3f, "
                             "lr %.2e, %.1f steps/s, ETA %.0fs", step, num_steps, avg["loss"], avg["bpd"],
                             avg["grad_norm"], avg["lr"], avg["steps_per_s"], eta)
                    else:  # ItDPDM Alg. 1 weighting (no gamma factor): not a likelihood
                        _log(logging.info, "step %d/%d: loss %.4f (paper weighting: NOT nats; see valid), "
                             "grad_norm %.3f, lr %.2e, %.1f steps/s, ETA %.0fs", step, num_steps, avg["loss"],
                             avg["grad_norm"], avg["lr"], avg["steps_per_s"], eta)
                    tr_lib._append_jsonl(metrics_path, {"step": step, "split": "train", "metrics": avg,
                                                        "wall_time": time.time() - t_start, "time": time.time()})
                    pbar.set_postfix(bpd=f"{avg['bpd']:.4f}", refresh=False)
                    last_train, window, steps_window, t_window = avg, [], 0, time.time()
                if step % int(tr.eval_every) == 0 and step < num_steps:
                    last_valid = run_eval(step)
                    t_window = time.time()
                if step % int(tr.ckpt_every) == 0 or step == end_step:
                    tr_lib._save(mngr, state, meta)
            if stop.signum is not None and interrupted is None:
                interrupted = signal.Signals(stop.signum).name
        if interrupted is None and step == num_steps:
            last_valid = run_eval(step)
        tr_lib._save(mngr, state, meta)
    finally:
        pbar.close()
        mngr.wait_until_finished()
        mngr.close()
    return {"step": int(step), "train": last_train, "valid": last_valid, "num_params": int(num_params),
            "interrupted": interrupted, "wall_time": time.time() - t_start, "workdir": workdir,
            "proposal": list(prop)}


def load_trained(config, workdir: str, data=None, mesh=None):
    """Restore the latest checkpoint: returns ``(denoiser, state, meta, data, scaling)`` where
    ``denoiser`` is a :class:`cd.CountDenoiser` with the EMA (``eval.use_ema``) or raw params.

    Raises FileNotFoundError for a workdir without checkpoints."""
    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoints in {workdir!r} (expected {directory}); train first")
    data = load_data(config) if data is None else data
    scaling = make_scaling(config, data)
    mesh = tr_lib.make_mesh() if mesh is None else mesh
    model = make_model(config, data, scaling)
    optimizer = tr_lib.make_optimizer(config)
    abstract = _abstract_state(config, model, optimizer, data, mesh)
    mngr = ocp.CheckpointManager(directory, item_names=("state", "meta"),
                                 options=ocp.CheckpointManagerOptions(create=False))
    try:
        step = mngr.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {directory}")
        meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))).state
    finally:
        mngr.close()
    params = state.ema_params if bool(config.eval.use_ema) else state.params
    return cd.CountDenoiser(model, params), state, meta, data, scaling


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def _env() -> dict:
    from infodiff import evaluation

    return evaluation._env()


def _sampler_gammas(config, scaling) -> np.ndarray:
    """Increasing SNR grid of the samplers: eval.gamma_min .. eval.gamma_max (0 = auto:
    ``64 high / spacing^2``, where the lattice is resolved: gamma Delta^2 / (8 x) >= 4)."""
    ev = config.eval
    gmax = float(ev.gamma_max) or 64.0 * scaling.high / scaling.spacing**2
    return poisson.log_spaced_gammas(float(ev.gamma_min), gmax, int(ev.sample_steps))


def _nll_summary(est: poisson.PoissonNLL) -> dict:
    m = est.dataset_mean()
    D = est.dim
    return {
        "nll_nats_per_example": m["total"],
        "nll_stderr": m["stderr_examples"],
        "nll_stderr_mc": m["stderr_mc"],
        "bits_per_dim": m["total"] / (D * _LN2),
        "bits_per_dim_stderr": m["stderr_examples"] / (D * _LN2),
        "terms_nats": {k: m[k] for k in ("diffusion", "prior_tail", "recon_tail", "total")},
        "recon_tail_included": bool(est.recon_tail_included),
        "alpha_lo": est.alpha_lo, "alpha_top": est.alpha_top,
        "num_examples": m["num_examples"], "num_samples_per_example": m["num_samples"],
        "forward_passes": int(m["forward_passes"]) * int(m["num_examples"]),
    }


def _run_nll(config, denoiser, x_scaled_NxD, scaling, prop, key):
    ev = config.eval
    guard = str(ev.high_snr_guard) or None
    return poisson.poisson_nll(
        denoiser, x_scaled_NxD, key, num_samples=int(ev.num_samples), sampler=str(ev.sampler),
        loc=prop[0], scale=prop[1], clip=prop[2], batch_size=int(ev.batch_size),
        high_snr_guard=guard, alpha_guard=(float(ev.alpha_guard) if guard else None), scaling=scaling)


def _save_png(path: str, data, samples_NxD: np.ndarray, dist=None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shape = data.event_shape
    if data.name.startswith("synthetic") and data.dim == 2 and dist is not None and dist.dim == 2:
        K = data.max_count + 1
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.8))
        h = np.zeros((K, K))
        np.add.at(h, (samples_NxD[:, 0], samples_NxD[:, 1]), 1.0 / len(samples_NxD))
        t = np.zeros((K, K))
        sup = np.asarray(dist.support)
        t[sup[:, 0], sup[:, 1]] = dist.probs
        m = int(min(K, max(np.argwhere(t > 1e-4).max(), samples_NxD.max()) + 2))
        for ax, img, title in ((axes[0], h, "generated"), (axes[1], t, "true pmf")):
            ax.imshow(img[:m, :m].T, origin="lower", cmap="viridis", vmin=0, vmax=t.max())
            ax.set_title(f"{data.name} {title}")
            ax.set_xlabel("x1")
            ax.set_ylabel("x2")
    elif data.name.startswith("synthetic") or data.name == "randhie":
        fig, ax = plt.subplots(figsize=(6, 3.5))
        s = samples_NxD.reshape(-1)
        K = data.max_count + 1
        ax.bar(np.arange(K) - 0.2, np.bincount(s, minlength=K)[:K] / s.size, width=0.4, label="generated")
        if dist is not None:
            ax.bar(np.asarray(dist.support)[:, 0] + 0.2, dist.probs, width=0.4, label="true pmf")
        else:
            t = data.flat("test").reshape(-1)
            ax.bar(np.arange(K) + 0.2, np.bincount(t, minlength=K)[:K] / t.size, width=0.4, label="test data")
        ax.set_xlabel("count")
        ax.set_ylabel("probability")
        ax.set_title(f"{data.name}: {s.size} generated values")
        ax.legend()
    elif data.name == "chorales":
        # top row: real test windows; below: generated (pitch upwards, time to the right)
        real = data.flat("test")[np.linspace(0, len(data.test) - 1, 4).astype(int)]
        gen = samples_NxD[:8]
        panels = [(r, "test") for r in real] + [(g, "generated") for g in gen]
        rows = int(math.ceil(len(panels) / 4))
        fig, axes = plt.subplots(rows, 4, figsize=(12, 2.6 * rows), squeeze=False)
        for i, ax in enumerate(axes.flat):
            ax.set_xticks([])
            ax.set_yticks([])
            if i < len(panels):
                img, title = panels[i]
                ax.imshow(img.reshape(shape), cmap="Greys", vmin=0, vmax=2, origin="lower",
                          interpolation="nearest", aspect="auto")
                ax.set_title(title, fontsize=8)
            else:
                ax.axis("off")
        fig.suptitle("chorales (voice counts, 46 pitches x 32 eighth notes): test windows vs "
                     "increment-sampler samples")
    else:
        n = len(samples_NxD)
        cols = min(8, n)
        rows = int(math.ceil(n / cols))
        fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.2, rows * 1.3), squeeze=False)
        for i, ax in enumerate(axes.flat):
            ax.axis("off")
            if i < n:
                ax.imshow(samples_NxD[i].reshape(shape), cmap="gray", vmin=0, vmax=data.max_count,
                          interpolation="nearest")
        fig.suptitle(f"{data.name}: increment-sampler samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def evaluate_network(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Test NLL of a trained Poisson-diffusion model, generated samples and a PNG.

    NLL: :func:`poisson.poisson_nll` on ``eval.max_examples`` examples (0 = all) of
    ``eval.split`` with ``eval.num_samples`` log-SNR draws each from ``eval.sampler`` over the
    proposal ``eval.proposal`` (default: the training one). Reported in nats per example and bits
    per dimension with two standard errors: ``nll_stderr`` = over examples (data + MC; the error
    bar of a test-set mean) and ``nll_stderr_mc``. The tails (``terms_nats``) are exact for the
    combined denoiser (see ``PoissonNLL``). Samples: ``eval.num_generate`` draws of the increment
    sampler (spec §4.4) with ``eval.sample_steps`` log-spaced SNRs, saved in report.json and as
    ``<workdir>/samples.png``. Synthetic data: exact entropy (nats per example, D x the 1-D
    entropy) and W1 of ``eval.num_generate`` generated values vs the true pmf (per coordinate,
    averaged).

    Raises: FileNotFoundError (no checkpoint); ConfigMismatchError (config differs from the
    run's in a non-eval key).
    """
    t0 = time.time()
    ev = config.eval
    saved = tr_lib.saved_config(workdir)
    diff = tr_lib.config_differences(saved, json.loads(config.to_json_best_effort()),
                                     ignore_new_keys=True)
    if diff:
        raise tr_lib.ConfigMismatchError(
            f"the config differs from the one {workdir!r} was trained with in: {', '.join(diff)} "
            "(evaluate with `evaluate.py --workdir W` without --config; only eval.* may be overridden)")
    denoiser, state, meta, data, scaling = load_trained(config, workdir)
    split = data.flat(str(ev.split))
    _check_counts(split, data.max_count, f"{ev.split} data")
    total = len(split)
    if int(ev.max_examples) > 0 and int(ev.max_examples) < total:
        rng = np.random.default_rng(int(ev.seed))
        split = split[np.sort(rng.choice(total, int(ev.max_examples), replace=False))]
    train_scaled = scaling.scale(data.flat("train"))
    prop = proposal(config, train_scaled, scaling, "eval" if str(ev.proposal) != "train" else "process")
    key = jax.random.key(int(ev.seed))
    t_nll = time.time()
    est = _run_nll(config, denoiser, scaling.scale(split), scaling, prop, jax.random.fold_in(key, 0))
    t_nll = time.time() - t_nll
    report = {
        "version": 1, "kind": "poisson_network", "workdir": os.path.abspath(workdir),
        "checkpoint_step": int(meta["step"]), "params": "ema" if ev.use_ema else "raw",
        "data": {"name": data.name, "split": str(ev.split), "checksum": data.checksums.get(
            "valid" if ev.split in ("valid", "validation") else str(ev.split)),
                 "event_shape": list(data.event_shape), "dim": data.dim, "max_count": data.max_count,
                 "num_examples": int(len(split)), "total_examples": int(total),
                 "scaling": [scaling.low, scaling.high]},
        "sampler": str(ev.sampler), "proposal": list(prop),
        "high_snr_guard": str(ev.high_snr_guard) or None,
        "alpha_guard": float(ev.alpha_guard) if str(ev.high_snr_guard) else None,
        "nll_wall_time_s": t_nll,
    }
    report.update(_nll_summary(est))
    report["stderr_kind"] = ("data+mc (subset of examples)" if len(split) < total else "data+mc (all examples)")
    n_gen = int(ev.num_generate)
    report["samples"] = []
    if n_gen > 0:
        gammas = _sampler_gammas(config, scaling)
        t_s = time.time()
        gen = poisson.increment_sampler(denoiser, jax.random.fold_in(key, 1), n_gen, data.dim, gammas,
                                        scaling, decision=str(ev.decision))
        report["sample_wall_time_s"] = time.time() - t_s
        report["sample_steps"] = int(ev.sample_steps)
        report["sample_gamma_range"] = [float(gammas[0]), float(gammas[-1])]
        dist = None
        if data.name.startswith("synthetic"):
            dist = _synthetic_dist(config)
            h = _synthetic_entropy(config, dist)
            report["exact_entropy_nats_per_example"] = h
            report["exact_entropy_bits_per_dim"] = h / (data.dim * _LN2)
            report["truncated_mass"] = float(dist.truncated_mass)
            # paired comparison on the same test examples: model NLL(x) - (-log p(x))
            if dist.dim == 1:
                exact = -np.sum([dist.log_prob(split[:, j]) for j in range(split.shape[1])], axis=0)
            else:
                exact = -dist.log_prob(split)
            gap = est.nll - exact
            report["test_exact_nll_nats"] = float(exact.mean())
            report["gap_paired_nats"] = float(gap.mean())
            report["gap_paired_stderr"] = float(gap.std(ddof=1) / math.sqrt(len(gap)))
            report.update(_synthetic_w1(config, dist, gen, int(ev.seed) + 7))
            report["num_generated"] = n_gen
            report["samples"] = gen[:min(n_gen, 16)].tolist()
        else:
            report["samples"] = gen[:min(n_gen, 16)].tolist()
            report["generated_mean_count"] = float(gen.mean())
            report["test_mean_count"] = float(data.flat("test").mean())
        png = os.path.join(workdir, "samples.png")
        _save_png(png, data, gen if dist is not None or data.name == "randhie" else gen[:32], dist)
        report["samples_png"] = png
    report.update({"seed": int(ev.seed), "wall_time_s": time.time() - t0, "env": _env(),
                   "config": json.loads(config.to_json_best_effort())})
    return report


def evaluate_oracle(config: ml_collections.ConfigDict) -> dict:
    """Exact-oracle check on a synthetic distribution (no network).

    The denoiser is the exact posterior mean of ``data.distribution`` (``data.dim`` iid
    coordinates; :class:`count_oracles.ProductCountOracle` in the [low, high] scaled space).
    Reports the MC NLL of ``eval.num_examples`` fresh samples (``eval.num_samples`` log-SNR draws
    each) against their exact ``-log p(x)`` and the exact entropy, the bias in standard errors,
    and the total-variation distance to the true pmf of ``eval.num_generate`` samples from the
    increment and the paper-literal sampler for each step count in ``eval.sampler_steps``.
    """
    t0 = time.time()
    ev, d = config.eval, config.data
    dist = _synthetic_dist(config)
    dim = _synthetic_dim(config, dist)
    scaling = poisson.CountScaling(int(dist.max_count), float(d.low), float(d.high))
    orc = dist.oracle(scaling, dim=(dim if dist.dim == 1 else None))
    rng = np.random.default_rng(int(ev.seed))
    x_counts = _synthetic_sample(config, dist, rng, int(ev.num_examples))
    x = scaling.scale(x_counts)
    if dist.dim == 1:
        exact = -np.sum([dist.log_prob(x_counts[:, j]) for j in range(dim)], axis=0)
    else:
        exact = -dist.log_prob(x_counts)
    h = _synthetic_entropy(config, dist)
    key = jax.random.key(int(ev.seed))
    prop = proposal(config, x, scaling, "eval")
    est = _run_nll(config, orc, x, scaling, prop, jax.random.fold_in(key, 0))
    nll = est.nll
    bias = nll - exact
    bias_se = float(np.sqrt(np.sum(est.stderr**2)) / len(nll))
    out = {
        "version": 1, "kind": "poisson_oracle", "distribution": str(d.distribution), "dim": dim,
        "support_size": int(len(dist.probs)), "max_count": int(dist.max_count),
        "truncated_mass": float(dist.truncated_mass),
        "exact_entropy_nats": h, "num_examples": int(len(nll)),
        "mean_exact_nll": float(exact.mean()), "mean_estimate": float(nll.mean()),
        "bias": float(bias.mean()), "bias_stderr_mc": bias_se,
        "bias_z": float(bias.mean() / bias_se) if bias_se > 0 else float("nan"),
        "entropy_estimate_stderr": float(nll.std(ddof=1) / math.sqrt(len(nll))),
        "terms_nats": {k: float(v.mean()) for k, v in est.terms().items()},
        "sampler": str(ev.sampler), "proposal": list(prop), "num_samples_per_example": est.num_samples,
        "samplers": [],
    }
    # TV over the joint support (1-D law: first coordinate; 2-D law: pairs encoded a (K+1) + b)
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
    for i, T in enumerate(int(t) for t in str(ev.sampler_steps).split(",") if t.strip()):
        gammas = poisson.log_spaced_gammas(float(ev.gamma_min), float(ev.gamma_max) or
                                           64.0 * scaling.high / scaling.spacing**2, T)
        row = {"steps": T}
        for name, fn in (("increment", poisson.increment_sampler), ("paper", poisson.paper_sampler)):
            gen = fn(orc, jax.random.fold_in(key, 100 + 2 * i + (name == "paper")), int(ev.num_generate),
                     dim, gammas, scaling, decision=str(ev.decision))
            row[f"tv_{name}"] = float(poisson.total_variation(encode(gen), p_full))
            row[f"w1_{name}"] = _synthetic_w1(config, dist, gen, int(ev.seed) + 7)["wasserstein1"]
        out["samplers"].append(row)
    # E[TV] of an exact sample of this size (MC over 20 reference draws)
    ref_rng = np.random.default_rng(int(ev.seed) + 99)
    out["tv_noise_floor"] = float(np.mean([poisson.total_variation(
        encode(_synthetic_sample(config, dist, ref_rng, int(ev.num_generate))[:, :dist.dim]), p_full)
        for _ in range(20)]))
    out.update({"seed": int(ev.seed), "wall_time_s": time.time() - t0, "env": _env(),
                "config": json.loads(config.to_json_best_effort())})
    return out


def evaluate(config: ml_collections.ConfigDict, workdir: str | None) -> tuple[dict, str]:
    """Dispatch: ``eval.mode == 'oracle'`` -> :func:`evaluate_oracle` (output ``eval.output_dir``),
    else :func:`evaluate_network` (needs ``workdir``). Returns (report, output directory)."""
    if str(config.eval.get("mode", "network")) == "oracle":
        return evaluate_oracle(config), str(config.eval.output_dir)
    if not workdir:
        raise ValueError("evaluating a trained Poisson model needs --workdir (the training run's directory)")
    return evaluate_network(config, workdir), workdir


def _table(rows):
    from infodiff import evaluation

    return evaluation._table(["quantity", "value"], rows)


def format_report(report: dict) -> str:
    """Readable table of a Poisson report (what evaluate.py prints)."""
    if report["kind"] == "poisson_oracle":
        rows = [["distribution", f"{report['distribution']} (dim {report['dim']}, support {report['support_size']})"],
                ["exact entropy", f"{report['exact_entropy_nats']:.4f} nats"],
                ["mean exact -log p(x)", f"{report['mean_exact_nll']:.4f} nats ({report['num_examples']} samples)"],
                ["MC estimate (exact denoiser)", f"{report['mean_estimate']:.4f} nats"],
                ["bias ± MC SE", f"{report['bias']:+.4f} ± {report['bias_stderr_mc']:.4f} (z = {report['bias_z']:+.2f})"],
                ["terms", ", ".join(f"{k} {v:.4g}" for k, v in report["terms_nats"].items())],
                ["log-SNR", f"{report['sampler']}, {report['num_samples_per_example']} per example, "
                            f"proposal {tuple(round(v, 3) for v in report['proposal'])}"]]
        out = "infodiff Poisson oracle report\n" + _table(rows)
        srows = [[r["steps"], f"{r['tv_increment']:.4f}", f"{r['tv_paper']:.4f}",
                  f"{r['w1_increment']:.4f}", f"{r['w1_paper']:.4f}"] for r in report["samplers"]]
        from infodiff import evaluation

        out += ("\n\nsamplers with the exact denoiser (TV / W1 to the true pmf; noise floor ~"
                f"{report['tv_noise_floor']:.4f})\n" + evaluation._table(
                    ["steps", "TV increment", "TV paper", "W1 increment", "W1 paper"], srows))
        return out + f"\n\nwall time {report['wall_time_s']:.1f} s"
    d = report["data"]
    t = report["terms_nats"]
    rows = [
        ["checkpoint", f"step {report['checkpoint_step']} ({report['params']} params)"],
        ["data", f"{d['name']} / {d['split']}: {d['num_examples']} of {d['total_examples']} examples, "
                 f"shape {tuple(d['event_shape'])}, counts 0..{d['max_count']} -> [{d['scaling'][0]}, {d['scaling'][1]}]"],
        ["log-SNR", f"{report['sampler']}, {report['num_samples_per_example']} per example, proposal "
                    f"(loc, scale, clip) = {tuple(round(v, 3) for v in report['proposal'])}"],
        ["forward passes", report["forward_passes"]],
        ["NLL (nats / example)", f"{report['nll_nats_per_example']:.4f} ± {report['nll_stderr']:.4f} "
                                 f"[{report['stderr_kind']}; MC-only ± {report['nll_stderr_mc']:.4f}]"],
        ["bits per dim", f"{report['bits_per_dim']:.5f} ± {report['bits_per_dim_stderr']:.5f}"],
        ["terms (nats)", f"diffusion {t['diffusion']:.4f}, prior_tail {t['prior_tail']:.3g}, "
                         f"recon_tail {t['recon_tail']:.3g}"
                         + ("" if report["recon_tail_included"] else " (not included)")],
    ]
    if "exact_entropy_nats_per_example" in report:
        rows.append(["exact entropy", f"{report['exact_entropy_nats_per_example']:.4f} nats / example"])
        rows.append(["mean exact -log p(x) (same test examples)", f"{report['test_exact_nll_nats']:.4f} nats"])
        rows.append(["NLL - (-log p(x)), paired", f"{report['gap_paired_nats']:+.4f} ± {report['gap_paired_stderr']:.4f} nats"])
        floor = report.get("w1_noise_floor")
        rows.append(["W1 (generated vs true)", f"{report['wasserstein1']:.4f} ({report['num_generated']} samples"
                     + (f"; exact-sample floor {floor:.4f})" if floor is not None else ")")])
    if report.get("samples_png"):
        rows.append(["samples", f"{report['samples_png']} (increment sampler, {report['sample_steps']} steps)"])
    if "generated_mean_count" in report:
        rows.append(["mean count generated / test", f"{report['generated_mean_count']:.4f} / {report['test_mean_count']:.4f}"])
    rows.append(["wall time", f"{report['wall_time_s']:.1f} s"])
    return "infodiff Poisson likelihood report\n" + _table(rows)


def write_report(report: dict, out_dir: str) -> tuple[str, str]:
    """Write ``report.json`` (strict JSON) and ``report.txt`` into ``out_dir``; return paths."""
    from infodiff import evaluation

    text = format_report(report)
    os.makedirs(out_dir, exist_ok=True)
    jpath, tpath = os.path.join(out_dir, "report.json"), os.path.join(out_dir, "report.txt")
    with open(jpath + ".tmp", "w") as f:
        json.dump(evaluation._strict_json(report), f, indent=2, allow_nan=False)
    os.replace(jpath + ".tmp", jpath)
    with open(tpath + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(tpath + ".tmp", tpath)
    return jpath, tpath
