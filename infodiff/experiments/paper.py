"""The experiments of Information-Theoretic Discrete Diffusion (arXiv 2510.24088 §5) as numbers.

Each `run_*` function trains what it needs (resumable: the training run lives in
`<outdir>/train` and rerunning continues from its last checkpoint), evaluates, and writes
`<outdir>/results.json`, `<outdir>/results.md` (a markdown table) and a PNG figure. Entry
point: `python run_experiment.py --config configs/exp_<name>.py --workdir results/<name>`.

  dna128            per-sequence NLL of a trained time-free model vs the exact -log p
                    (paper Fig. 1a / App. Fig. 4)
  markov_cond       conditional NLL of responses given prompts, 4th-order chain (Fig. 1b)
  ood               out-of-distribution continuations scored with coupled masks (Fig. 2)
  variance          Table 1 style variance tables, oracle and trained model, plus the
                    stratified estimator (beyond the paper)

The paper gives these as figures only; its released evaluators use a biased m-sampler (never
m = n) and per-token averaging (docs/discrete_diffusion.md §11), which infodiff does not reproduce.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import re
import time
import warnings

import jax
import ml_collections
import numpy as np
import scipy.special
import scipy.stats
from absl import logging

from infodiff import denoisers
from infodiff import likelihood as lk
from infodiff import oracles, provenance, tasks, training
from infodiff import schedules as schedules_lib
from infodiff.data import text as text_data
from infodiff.validation import check_num_samples, validate_tokens
from infodiff.networks.text_denoisers import Denoiser
from infodiff.processes import masked


def say(msg: str, *args) -> None:
    """A progress line on stderr (absl INFO, clear of a live progress bar): what the experiment
    does next, so a long step (compilation, scoring) is never silent."""
    from infodiff.training.logs import log

    log(logging.info, msg, *args)


def int_list(spec) -> list[int]:
    """A tuple of integers (or a comma-separated string, as older configs wrote them)."""
    return [int(v) for v in (spec.split(",") if isinstance(spec, str) else spec)]


def name_list(spec) -> list[str]:
    return [str(v).strip() for v in (spec.split(",") if isinstance(spec, str) else spec)]


def _pyplot():
    """matplotlib's pyplot with the file-only Agg backend (imported when a figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class ToyCorpus:
    """Token streams made of concatenated fixed-length samples (train with data.aligned)."""

    train: np.ndarray
    valid: np.ndarray
    name: str
    checksums: dict


def toy_corpus(sample_fn, n_train: int, n_valid: int, seed: int, name: str) -> ToyCorpus:
    """Draw n_train + n_valid sequences with sample_fn(rng, n) -> int [n, L]; flatten."""
    rng = np.random.default_rng(seed)
    tr = np.asarray(sample_fn(rng, n_train), np.uint8).reshape(-1)
    va = np.asarray(sample_fn(rng, n_valid), np.uint8).reshape(-1)
    sums = {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in (("train", tr), ("valid", va))}
    return ToyCorpus(tr, va, name, sums)


def train_model(config, workdir: str, corpus) -> Denoiser:
    """Train (or resume) `tasks.make_task(config, data=corpus)` with `training.train` in
    `<workdir>/train`; draw its learning curves into `<workdir>/train/training_curves.png`;
    return the EMA denoiser."""
    from infodiff.evaluation import plots

    train_dir = os.path.join(workdir, "train")
    task = tasks.make_task(config, data=corpus)
    result = training.train(task, train_dir)
    if result.get("interrupted"):  # a checkpoint was saved: stop here, score nothing
        import sys

        print(f"training stopped by {result['interrupted']} at step {result.get('step')}; its checkpoint "
              "is saved: rerun the same command to resume", file=sys.stderr, flush=True)
        if result["interrupted"] == "SIGINT":
            raise KeyboardInterrupt
        raise SystemExit(training.exit_status(result["interrupted"]))
    metrics = os.path.join(train_dir, "metrics.jsonl")
    try:
        plots.training_curves_png(os.path.join(train_dir, "training_curves.png"), metrics, task.units)
    except ValueError as e:  # no validation record yet (train.eval_every > num_steps)
        warnings.warn(f"no learning-curve plot: {e}")
    state, _ = training.load_checkpoint(train_dir, task)
    return task.denoiser(state.ema_params)


def write_results(outdir: str, results: dict, markdown: str, fig=None, name: str = "results",
                  model_dir: str | None = None):
    """results.json (with ``provenance``: :func:`infodiff.provenance.collect`, the checkpoint being
    the newest of ``model_dir``, default ``outdir/train``, when there is one), results.md and
    results.png (if fig) in outdir; returns the paths."""
    os.makedirs(outdir, exist_ok=True)
    paths = {}
    paths["json"] = os.path.join(outdir, f"{name}.json")
    model_dir = model_dir or os.path.join(outdir, "train")
    checkpoint = None
    if os.path.isdir(os.path.join(model_dir, training.CKPT_DIR)):
        meta = training.load_meta(model_dir)
        checkpoint = dict(provenance.checkpoint_info(meta), workdir=os.path.abspath(model_dir))
    with open(paths["json"], "w") as f:
        json.dump(dict(results, provenance=provenance.collect(checkpoint=checkpoint)), f, indent=2)
    paths["md"] = os.path.join(outdir, f"{name}.md")
    with open(paths["md"], "w") as f:
        f.write(markdown + "\n")
    if fig is not None:
        paths["png"] = os.path.join(outdir, f"{name}.png")
        fig.savefig(paths["png"], dpi=120, bbox_inches="tight")
        _pyplot().close(fig)
    return paths


def md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def error_stats(est: np.ndarray, truth: np.ndarray) -> dict:
    """Mean absolute error, RMSE, max error, mean signed error, Pearson r (nats)."""
    err = est - truth
    return {
        "mae": float(np.mean(np.abs(err))),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "max_abs_error": float(np.max(np.abs(err))),
        "mean_error": float(np.mean(err)),
        "pearson_r": float(np.corrcoef(est, truth)[0, 1]) if len(est) > 1 else float("nan"),
    }


@functools.partial(jax.jit, static_argnames=("apply_fn", "vocab_size"))
def _masked_ce_all(apply_fn, params, vocab_size, x_BxL, mask_BxL, t_B):
    z = masked.corrupt(x_BxL, mask_BxL, vocab_size)
    return masked.masked_cross_entropy(apply_fn(params, z, t_B), x_BxL, mask_BxL)


def exact_time_free_values(denoiser, x_NxL: np.ndarray, vocab_size: int, schedule=None,
                           batch_size: int = 8192) -> np.ndarray:
    """The I-MDCE value sum_m (1/m) E_{|S|=m} C_S of a denoiser for each sequence, computed by
    enumerating all 2^L - 1 masks (no Monte Carlo error; L <= ~14). float64 [N], nats.

    A time-conditioned denoiser gets t = t(lambda = m / L), as in the estimators.
    """
    x = validate_tokens(x_NxL, vocab_size)
    N, L = x.shape
    masks = np.array(list(itertools.product([False, True], repeat=L))[1:])  # [K, L], K = 2^L - 1
    m_K = masks.sum(1)
    w_K = 1.0 / (m_K * scipy.special.comb(L, m_K))
    sched = schedule or schedules_lib.LinearSchedule()
    t_K = np.asarray(sched.t_from_lambda(m_K / L), np.float32)
    apply_fn, params = denoisers.split(denoiser)
    K = len(masks)
    per = max(1, batch_size // K)
    out = np.zeros(N)
    for n0 in range(0, N, per):
        rows = np.arange(n0, n0 + per) % N  # fixed shape: one compilation
        xb = np.repeat(x[rows], K, axis=0)
        ce = _masked_ce_all(apply_fn, params, vocab_size, xb, np.tile(masks, (per, 1)),
                            np.tile(t_K, per))
        vals = np.asarray(ce, np.float64).reshape(per, K) @ w_K
        n1 = min(N, n0 + per)
        out[n0:n1] = vals[: n1 - n0]
    return out


def _schedule_of(config):
    return schedules_lib.get_schedule(config.process.schedule, eps=config.process.get("eps", None))


def _scatter_sorted(ax, truth, est, se=None, label="estimate"):
    order = np.argsort(truth)
    idx = np.arange(len(truth))
    ax.plot(idx, truth[order], "k-", lw=2, label="exact −log p")
    if se is None:
        ax.plot(idx, est[order], "o", ms=3, label=label)
    else:
        ax.errorbar(idx, est[order], yerr=2 * se[order], fmt="o", ms=3, lw=0.8, label=label + " ± 2 SE")
    ax.set_xlabel("sequence (sorted by exact NLL)")
    ax.set_ylabel("NLL (nats)")
    ax.legend()


# ---------------------------------------------------------------------------------------------
# 1. DNA-128 toy
# ---------------------------------------------------------------------------------------------
def run_dna128(config, workdir: str) -> dict:
    """Per-sequence NLL of a trained time-free model on the DNA-128 toy vs the exact NLL.

    Data: 128 distinct length-8 sequences over ACGT with probabilities softmax(u / 0.5),
    u ~ U[0, 1) (seed config.toy.seed), and config.toy.num_train samples from it.
    Model estimate per sequence: the time-free I-MDCE value computed exactly by enumerating
    all 255 masks (so the error is the model's, not Monte Carlo's), and a Monte Carlo
    time-free estimate with config.toy.num_mc samples (paper: 2^15) for comparison.
    """
    t0 = time.time()
    tc = config.toy
    tab = oracles.random_tabular(np.random.default_rng(tc.seed), "ACGT", 8, 128, tc.temperature)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "table.json"), "w") as f:
        json.dump(tab.to_json(), f, indent=1)
    corpus = toy_corpus(tab.sample, tc.num_train, tc.num_valid, tc.seed + 1, "dna128")
    den = train_model(config, workdir, corpus)
    truth = -tab.log_prob(tab.seqs)
    exact_model = exact_time_free_values(den, tab.seqs, 4, schedule=_schedule_of(config))
    say("dna128: scoring %d sequences x %d Monte Carlo samples (time_free)", len(tab.seqs), int(tc.num_mc))
    est = lk.nll(den, tab.seqs, jax.random.PRNGKey(tc.seed + 2), estimator="time_free",
                 num_samples=int(tc.num_mc), batch_size=8192, progress=True)
    stats_exact = error_stats(exact_model, truth)
    stats_mc = error_stats(est.mean, truth)
    results = {
        "experiment": "dna128",
        "entropy_nats": tab.entropy(),
        "num_sequences": len(truth),
        "model_vs_truth_enumerated": stats_exact,
        "model_vs_truth_monte_carlo": dict(stats_mc, num_samples=int(tc.num_mc),
                                           mean_stderr=float(est.stderr.mean())),
        "target_mae_nats": 0.2,
        "per_sequence": [{"sequence": s, "exact_nll": float(a), "model_enumerated": float(b),
                          "model_mc": float(c), "model_mc_stderr": float(d)}
                         for s, a, b, c, d in zip(tab.decode(tab.seqs), truth, exact_model,
                                                  est.mean, est.stderr)],
        "train_steps": int(config.train.num_steps),
        "wall_time_s": time.time() - t0,
    }
    md = "## DNA-128: per-sequence NLL of the trained model vs exact (nats)\n\n" + md_table(
        ["evaluation", "MAE", "RMSE", "max |err|", "mean err", "Pearson r"],
        [[name, f"{s['mae']:.3f}", f"{s['rmse']:.3f}", f"{s['max_abs_error']:.3f}",
          f"{s['mean_error']:+.3f}", f"{s['pearson_r']:.4f}"]
         for name, s in (("all 255 masks enumerated", stats_exact),
                         (f"time-free MC, {tc.num_mc} samples", stats_mc))])
    fig, ax = _pyplot().subplots(figsize=(9, 4))
    _scatter_sorted(ax, truth, exact_model, label="model (time-free, enumerated)")
    ax.set_title(f"DNA-128: MAE {stats_exact['mae']:.3f} nats, r = {stats_exact['pearson_r']:.3f}")
    results["files"] = write_results(workdir, results, md, fig)
    return results


# ---------------------------------------------------------------------------------------------
# 2. 4th-order Markov chain, conditional NLL
# ---------------------------------------------------------------------------------------------
def markov_chain(tc) -> oracles.MarkovOracle:
    """The toys' 4th-order chain over ACGT: read from ``tc.table`` (a {context: {symbol:
    probability}} JSON file, e.g. the table released with arXiv 2510.24088) when set, else
    generated with rows softmax(u / tc.temperature) from seed tc.seed. Raises FileNotFoundError
    naming a missing file, ValueError for a malformed table or an order other than 4."""
    path = str(tc.get("table", "") or "")
    if not path:
        return oracles.random_markov(np.random.default_rng(tc.seed), "ACGT", 4, tc.temperature)
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "no such file"
        raise FileNotFoundError(f"config.toy.table={path!r}: {what} (give a JSON file {{context: {{symbol: "
                                f"probability}}}}, a table of order 4 over ACGT)")
    chain = oracles.MarkovOracle.from_json(path, alphabet="ACGT")
    if chain.order != 4:
        raise ValueError(f"config.toy.table={path!r}: a chain of order {chain.order}; the Markov-4 toy needs "
                         "contexts of 4 symbols")
    return chain


def _chain_source(tc) -> dict:
    """Where the chain came from, for results.json: the table file and its sha256, or the seed and
    temperature of a generated chain."""
    path = str(tc.get("table", "") or "")
    if not path:
        return {"generated": True, "seed": int(tc.seed), "temperature": float(tc.temperature)}
    with open(path, "rb") as f:
        return {"table": os.path.abspath(path), "sha256": hashlib.sha256(f.read()).hexdigest()}


def run_markov_cond(config, workdir: str) -> dict:
    """Conditional NLL of 16-symbol responses given 16-symbol prompts, 4th-order chain.

    Chain: :func:`markov_chain` (config.toy.table, or generated). Prompts: stationary samples;
    responses freshly sampled from the chain given the prompt (as the paper's evaluator).
    Estimator config.toy.estimator (default: stratified) with config.toy.num_mc samples;
    the exact value is the chain rule of the table.
    """
    t0 = time.time()
    tc = config.toy
    P, R = int(tc.prompt_len), int(tc.response_len)
    chain = markov_chain(tc)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "table.json"), "w") as f:
        json.dump(chain.to_json(), f)
    corpus = toy_corpus(lambda rng, n: chain.sample(rng, n, P + R), tc.num_train, tc.num_valid,
                        tc.seed + 1, "markov4")
    den = train_model(config, workdir, corpus)
    rng = np.random.default_rng(tc.seed + 2)
    prompts = chain.sample(rng, tc.num_pairs, P)
    resp = chain.sample_response(rng, prompts, R)
    x = np.concatenate([prompts, resp], 1)
    target = np.zeros(x.shape, bool)
    target[:, P:] = True
    truth = -chain.cond_log_prob(x, target)
    say("markov_cond: scoring %d responses x %d Monte Carlo samples (%s), network then oracle", len(prompts),
         int(tc.num_mc), tc.estimator)
    est = lk.conditional_nll(den, prompts, resp, jax.random.PRNGKey(tc.seed + 3),
                             estimator=tc.estimator, num_samples=int(tc.num_mc), batch_size=8192, progress=True)
    oracle_est = lk.conditional_nll(chain, prompts, resp, jax.random.PRNGKey(tc.seed + 4),
                                    estimator=tc.estimator, num_samples=int(tc.num_mc), batch_size=8192,
                                    progress=True)
    stats = error_stats(est.mean, truth)
    z_oracle = (oracle_est.mean - truth) / oracle_est.stderr
    results = {
        "experiment": "markov_cond",
        "chain": _chain_source(tc),
        "order": 4, "prompt_len": P, "response_len": R, "num_pairs": int(tc.num_pairs),
        "estimator": tc.estimator, "num_samples": int(tc.num_mc),
        "forward_passes_per_pair": est.forward_passes,
        "model_vs_truth": dict(stats, mean_stderr=float(est.stderr.mean())),
        "oracle_check": {"max_abs_z": float(np.max(np.abs(z_oracle))),
                         "mean_error": float(np.mean(oracle_est.mean - truth)),
                         "mean_stderr": float(oracle_est.stderr.mean())},
        "target_mae_nats": 0.5,
        "per_pair": [{"exact": float(a), "model": float(b), "model_stderr": float(c)}
                     for a, b, c in zip(truth, est.mean, est.stderr)],
        "train_steps": int(config.train.num_steps),
        "wall_time_s": time.time() - t0,
    }
    md = ("## Markov-4 conditional NLL, 16-symbol responses given 16-symbol prompts (nats per "
          "response)\n\n" + md_table(
              ["estimator", "MC samples", "MAE", "RMSE", "max |err|", "mean err", "Pearson r",
               "mean SE", "oracle max |z|"],
              [[tc.estimator, tc.num_mc, f"{stats['mae']:.3f}", f"{stats['rmse']:.3f}",
                f"{stats['max_abs_error']:.3f}", f"{stats['mean_error']:+.3f}",
                f"{stats['pearson_r']:.4f}", f"{est.stderr.mean():.3f}",
                f"{np.max(np.abs(z_oracle)):.2f}"]]))
    fig, ax = _pyplot().subplots(figsize=(9, 4))
    _scatter_sorted(ax, truth, est.mean, est.stderr, label=f"model ({tc.estimator})")
    ax.set_title(f"Markov-4 conditional: MAE {stats['mae']:.3f} nats, r = {stats['pearson_r']:.3f}")
    results["files"] = write_results(workdir, results, md, fig)
    return results


# ---------------------------------------------------------------------------------------------
# 3. Out-of-distribution detection
# ---------------------------------------------------------------------------------------------
def python_docs_text() -> str:
    """A second real English corpus available offline everywhere: the prose of Python's own
    documentation topics (pydoc_data.topics), text8-cleaned."""
    from pydoc_data import topics

    raw = " ".join(topics.topics[k] for k in sorted(topics.topics))
    raw = re.sub(r"[^\x00-\x7f]", " ", raw)
    return text_data.clean_text8(raw)


def auroc(scores_neg: np.ndarray, scores_pos: np.ndarray) -> float:
    """P(score_pos > score_neg) + P(tie)/2 (Mann-Whitney U / (n_neg n_pos))."""
    u = scipy.stats.mannwhitneyu(scores_pos, scores_neg, alternative="two-sided").statistic
    return float(u / (len(scores_neg) * len(scores_pos)))


def run_ood(config, workdir: str) -> dict:
    """Score held-out continuations vs out-of-distribution ones given the same prompts.

    Model: the masked_text model (trained here from config, or reused from config.ood.model_dir).
    Prompts: the first P characters of test-split chunks; in-distribution response: the true
    next R characters. OOD responses (same prompts): (a) R characters of another real corpus,
    Python's documentation prose; (b) the true continuation with its words shuffled. Each pair
    (y, y') is scored with shared masks (coupled, Eq. 18). Reported: AUROC of -log p(y|x) for
    OOD vs in-distribution, its bootstrap SE over prompts, and the paired accuracy
    P(log p(y|x) > log p(y'|x)).
    """
    t0 = time.time()
    oc = config.ood
    if oc.model_dir:
        mcfg = ml_collections.ConfigDict(training.load_meta(oc.model_dir)["config"])
        corpus = tasks.load_text_corpus(mcfg)
        task = tasks.make_task(mcfg, data=corpus)
        state, _ = training.load_checkpoint(oc.model_dir, task)
        den = task.denoiser(state.ema_params)
        L = int(mcfg.data.seq_len)
    else:
        corpus = tasks.load_text_corpus(config)
        den = train_model(config, workdir, corpus)
        L = int(config.data.seq_len)
    P = int(oc.prompt_len)
    R = L - P
    rng = np.random.default_rng(oc.seed)
    chunks = text_data.eval_chunks(corpus.test, L)
    chunks = chunks[np.sort(rng.choice(len(chunks), oc.num_prompts, replace=False))]
    prompts, y_in = chunks[:, :P], chunks[:, P:]
    docs = text_data.encode(python_docs_text())
    starts = rng.integers(0, len(docs) - R, size=len(prompts))
    y_docs = np.stack([docs[s:s + R] for s in starts]).astype(np.int32)

    def shuffle_words(row):
        words = text_data.decode(row).split(" ")
        rng.shuffle(words)
        return text_data.encode(" ".join(words))[:R]

    y_shuf = np.stack([shuffle_words(r) for r in y_in]).astype(np.int32)
    groups = {"python_docs": y_docs, "shuffled_words": y_shuf}
    out, hist = {}, {}
    for gi, (name, y_ood) in enumerate(groups.items()):
        say("ood: scoring %d prompts, true vs %s continuations (%s, %d coupled samples; compiling first)",
             len(prompts), name, oc.estimator, int(oc.num_mc))
        ein, eood = lk.paired_conditional_nll(den, prompts, y_in, y_ood, jax.random.PRNGKey(oc.seed + gi),
                                              coupled=True, estimator=oc.estimator,
                                              num_samples=int(oc.num_mc), batch_size=4096)
        a = auroc(ein.mean, eood.mean)
        boots = []
        for _ in range(int(oc.bootstrap)):
            idx = rng.integers(0, len(prompts), len(prompts))
            boots.append(auroc(ein.mean[idx], eood.mean[idx]))
        diff = eood.mean - ein.mean
        out[name] = {
            "auroc": a, "auroc_bootstrap_se": float(np.std(boots, ddof=1)),
            "paired_accuracy": float(np.mean(diff > 0)),
            "mean_nll_in_nats": float(ein.mean.mean()), "mean_nll_ood_nats": float(eood.mean.mean()),
            "mean_log_ratio_nats": float(diff.mean()),
            "mean_stderr_in": float(ein.stderr.mean()), "mean_stderr_ood": float(eood.stderr.mean()),
        }
        hist[name] = (ein.mean, eood.mean)
    results = {"experiment": "ood", "prompt_len": P, "response_len": R, "num_prompts": int(oc.num_prompts),
               "estimator": oc.estimator, "num_samples": int(oc.num_mc), "coupled": True,
               "groups": out, "wall_time_s": time.time() - t0}
    md = "## OOD detection: -log p(y | x) of true vs OOD continuations, coupled masks\n\n" + md_table(
        ["OOD group", "AUROC ± bootstrap SE", "paired accuracy", "mean NLL in", "mean NLL OOD"],
        [[k, f"{v['auroc']:.3f} ± {v['auroc_bootstrap_se']:.3f}", f"{v['paired_accuracy']:.3f}",
          f"{v['mean_nll_in_nats']:.1f}", f"{v['mean_nll_ood_nats']:.1f}"] for k, v in out.items()])
    fig, axes = _pyplot().subplots(1, len(hist), figsize=(11, 3.5))
    for ax, (name, (a, b)) in zip(np.atleast_1d(axes), hist.items()):
        bins = np.linspace(min(a.min(), b.min()), max(a.max(), b.max()), 40)
        ax.hist(a, bins, alpha=0.6, label="true continuation")
        ax.hist(b, bins, alpha=0.6, label=name)
        ax.set_xlabel(f"-log p(y | x), nats per {R} chars")
        ax.set_title(f"AUROC {out[name]['auroc']:.3f}")
        ax.legend()
    results["files"] = write_results(workdir, results, md, fig, model_dir=str(oc.model_dir) or None)
    return results


# ---------------------------------------------------------------------------------------------
# 4. Variance tables (+ the stratified estimator)
# ---------------------------------------------------------------------------------------------
def repeat_variance(denoiser, prompts, resp, estimator, budget, reps, key, batch_size):
    """Variance over `reps` independent estimates at a fixed number of forward passes per
    estimate, averaged over pairs (paper Table 1 protocol). Returns (mean variance, passes)."""
    per = resp.shape[1] if estimator == "stratified" else 1
    S = max(2, budget // per)
    est = lk.conditional_nll(denoiser, prompts, resp, key, estimator=estimator,
                             num_samples=S * reps, batch_size=batch_size)
    groups = est.samples.reshape(len(prompts), reps, S).mean(-1)  # [pairs, reps]
    return float(groups.var(axis=1, ddof=1).mean()), S * per


def _ratio_variance(denoiser, prompts, ya, yb, n_samples, reps, key, coupled, batch_size):
    est = lk.log_ratio(denoiser, prompts, ya, yb, key, coupled=coupled, estimator="time_free",
                       num_samples=n_samples * reps, batch_size=batch_size)
    groups = est.samples.reshape(len(prompts), reps, n_samples).mean(-1)
    return float(groups.var(axis=1, ddof=1).mean())


def run_variance(config, workdir: str) -> dict:
    """Variance tables in the style of the paper's Table 1, with an exact oracle (Markov-4
    chain, prompt/response) and a trained model (the Markov-4 model of `run_markov_cond`,
    trained in config.variance.model_workdir, e.g. results/markov_cond, or here). Plus variance per forward pass of every estimator relative to the
    time-free estimator on DNA-128 (unconditional) and Markov-4 (conditional), with bias
    against the oracle."""
    t0 = time.time()
    vc = config.variance
    tc = config.toy
    P, R = int(tc.prompt_len), int(tc.response_len)
    chain = markov_chain(tc)
    corpus = toy_corpus(lambda rng, n: chain.sample(rng, n, P + R), tc.num_train, tc.num_valid,
                        tc.seed + 1, "markov4")
    model = train_model(config, vc.get("model_workdir", "") or workdir, corpus)
    rng = np.random.default_rng(vc.seed)
    prompts = chain.sample(rng, vc.num_pairs, P)
    resp = chain.sample_response(rng, prompts, R)
    alt = chain.sample_response(rng, prompts, R)
    key = jax.random.PRNGKey(vc.seed)
    bs = int(vc.batch_size)
    budgets = int_list(vc.budgets)
    estimators = name_list(vc.estimators)
    table1 = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for which, den in (("oracle", chain), ("model", model)):
            for e_i, est_name in enumerate(estimators):
                for b in budgets:
                    v, passes = repeat_variance(den, prompts, resp, est_name, b, int(vc.reps),
                                                 jax.random.fold_in(key, 100 * e_i + b), bs)
                    table1[f"{which}/{est_name}/{b}"] = {"variance": v, "forward_passes": passes}
        table2 = {}
        for which, den in (("oracle", chain), ("model", model)):
            for n in int_list(vc.ratio_samples):
                for coupled in (True, False):
                    table2[f"{which}/{n}/{'coupled' if coupled else 'decoupled'}"] = _ratio_variance(
                        den, prompts, resp, alt, n, int(vc.ratio_reps), jax.random.fold_in(key, 7 * n + coupled),
                        coupled, bs)
    # Variance per forward pass relative to time-free, and unbiasedness, on the toys.
    tab = oracles.random_tabular(np.random.default_rng(tc.seed), "ACGT", 8, 128, tc.temperature)
    x_dna = tab.sample(np.random.default_rng(vc.seed + 1), vc.num_pairs)
    vpf = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for toy, call, truth in (
            ("dna128", lambda e, k, n: lk.nll(tab, x_dna, k, estimator=e, num_samples=n, batch_size=bs),
             -tab.log_prob(x_dna)),
            ("markov4_conditional",
             lambda e, k, n: lk.conditional_nll(chain, prompts, resp, k, estimator=e, num_samples=n, batch_size=bs),
             -chain.cond_log_prob(np.concatenate([prompts, resp], 1),
                                  np.arange(P + R)[None].repeat(len(prompts), 0) >= P)),
        ):
            rows = {}
            for e_i, e in enumerate(["t_dce", "lambda_dce", "k_dce", "time_free", "stratified"]):
                # Same forward-pass budget for every estimator (a stratified sample = n passes).
                n_target = x_dna.shape[1] if toy == "dna128" else R
                per = n_target if e == "stratified" else 1
                est = call(e, jax.random.fold_in(key, 1000 + e_i), max(int(vc.vpf_passes) // per, 2))
                bias = est.mean - truth
                rows[e] = {"variance_per_forward_pass": float(est.variance_per_forward_pass.mean()),
                           "bias": float(bias.mean()),
                           "bias_stderr": float(np.sqrt(np.sum(est.stderr**2)) / len(bias)),
                           "max_abs_z": float(np.max(np.abs(bias / est.stderr))),
                           "forward_passes": est.forward_passes}
            ref = rows["time_free"]["variance_per_forward_pass"]
            for e in rows:
                rows[e]["ratio_time_free_over_this"] = ref / rows[e]["variance_per_forward_pass"]
            vpf[toy] = rows
    results = {"experiment": "variance", "num_pairs": int(vc.num_pairs), "reps": int(vc.reps),
               "table1_conditional_variance": table1, "table2_ratio_variance": table2,
               "variance_per_forward_pass": vpf, "wall_time_s": time.time() - t0}
    md = ["## Table 1 (a): variance of conditional NLL estimates (nats²), Markov-4, "
          f"{vc.num_pairs} prompt/response pairs × {vc.reps} repeats"]
    for which in ("oracle", "model"):
        rows = []
        for b in budgets:
            rows.append([b] + [f"{table1[f'{which}/{e}/{b}']['variance']:.3f}" for e in estimators])
        md.append(f"\n{which}:\n\n" + md_table(["forward passes"] + estimators, rows))
    md.append("\n## Table 1 (b): variance of log-ratio estimates (nats²), time-free, coupled vs decoupled")
    for which in ("oracle", "model"):
        rows = [[n, f"{table2[f'{which}/{n}/coupled']:.3f}", f"{table2[f'{which}/{n}/decoupled']:.3f}",
                 f"{table2[f'{which}/{n}/decoupled'] / table2[f'{which}/{n}/coupled']:.1f}×"]
                for n in int_list(vc.ratio_samples)]
        md.append(f"\n{which}:\n\n" + md_table(["MC samples", "coupled", "decoupled", "ratio"], rows))
    md.append("\n## Variance per forward pass relative to the time-free estimator (exact oracles)")
    for toy, rows in vpf.items():
        md.append(f"\n{toy}:\n\n" + md_table(
            ["estimator", "var / forward pass", "time-free ÷ this", "bias ± SE", "max |z|"],
            [[e, f"{r['variance_per_forward_pass']:.3f}", f"{r['ratio_time_free_over_this']:.1f}×",
              f"{r['bias']:+.4f} ± {r['bias_stderr']:.4f}", f"{r['max_abs_z']:.2f}"] for e, r in rows.items()]))
    fig, ax = _pyplot().subplots(figsize=(6, 4))
    for e in estimators:
        ax.loglog(budgets, [table1[f"oracle/{e}/{b}"]["variance"] for b in budgets], "o-", label=e)
    ax.set_xlabel("forward passes per estimate")
    ax.set_ylabel("variance (nats²)")
    ax.set_title("Markov-4 conditional NLL, exact oracle")
    ax.legend()
    results["files"] = write_results(workdir, results, "\n".join(md), fig,
                                     model_dir=os.path.join(vc.get("model_workdir", "") or workdir, "train"))
    return results


EXPERIMENTS = {"dna128": run_dna128, "markov_cond": run_markov_cond, "ood": run_ood,
               "variance": run_variance}  # and llada_tables: infodiff/experiments/run.py


_MINIMUM = {"num_train": 1, "num_valid": 1, "num_pairs": 2, "num_prompts": 2,
            "reps": 2, "ratio_reps": 2, "vpf_passes": 2, "batch_size": 1, "bootstrap": 2,
            "prompt_len": 1, "response_len": 1}


def check_counts(config) -> None:
    """Refuse counts below their minimum (e.g. num_mc=1 gives no standard error), naming them."""
    for section in ("toy", "ood", "variance"):
        sec = config.get(section, None)
        if sec is None:
            continue
        if "num_mc" in sec:  # Monte Carlo samples
            check_num_samples(sec.num_mc, f"config.{section}.num_mc")
        for key, low in _MINIMUM.items():
            if key in sec and int(sec[key]) < low:
                raise ValueError(f"config.{section}.{key} must be >= {low}; got {sec[key]}")
