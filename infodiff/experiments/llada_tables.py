"""The LLaDA tables of arXiv 2510.24088 (§5.2, Table 1) on a released LLaDA checkpoint.

(a) Variance of conditional NLL estimates -log p(response | prompt) at a fixed number of forward
    passes per estimate: the time-integral estimator (``lambda_dce``, Eq. 16), the time-free
    estimator (Eq. 17), k-DCE and the stratified estimator; ``num_pairs`` pairs x ``reps``
    independent estimates, variance over the repeats averaged over the pairs (the paper's
    protocol: 30 pairs x 15 repeats at 128/256/512 passes, HellaSwag/ARC/PIQA questions with the
    response "Correct: ... | Incorrect: ...").
(b) Variance of the time-free log-ratio log p(y | x) - log p(y' | x) with shared noise (coupled,
    Eq. 18) and independent noise (decoupled) at 5/10/15/20 samples, 8 estimates per triplet
    (the paper: about 500 BeaverTails prompt/safe/unsafe triplets).

    python run_experiment.py --config configs/exp_llada_tables.py --workdir results/llada_tables \
        --config.llada.checkpoint=DIR --config.llada.pairs=PAIRS.jsonl --config.llada.triplets=TRIPLETS.jsonl

The checkpoint is loaded by :mod:`infodiff.pretrained.llada` and scored as a masked-diffusion
denoiser (its mask logit at -inf, then log-softmax; docs/pretrained_llada.md). Rows come from
JSONL files of texts (``{"prompt", "response"}``; ``{"prompt", "response", "alt_response"}``),
tokenised by the checkpoint's ``tokenizer.json`` (HF tokenizers), or, where a file is not given,
are random token ids of ``prompt_len`` / ``response_len`` tokens (the CPU check on a tiny random
checkpoint; the report says which). The model sees exactly prompt + response; in (b) two responses
of different lengths are padded to a common width with positions that hold the mask token and are
never scored (:func:`infodiff.likelihood.paired_nll`).
"""
from __future__ import annotations

import os
import pathlib
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from infodiff import external
from infodiff import likelihood as lk
from infodiff.evaluation.inputs import json_rows
from infodiff.experiments import paper
from infodiff.pretrained import llada, safetensors_io

TABLE_A = ("prompt", "response")
TABLE_B = ("prompt", "response", "alt_response")


def load_denoiser(checkpoint: str, dtype: str):
    """(ExternalDenoiser in the library's ids, Loaded) of the LLaDA checkpoint directory."""
    directory = pathlib.Path(os.path.expanduser(checkpoint))
    config = safetensors_io.read_config(directory)
    if llada.detect(config) is None:
        raise ValueError(f"config.llada.checkpoint={checkpoint!r} is not a LLaDA checkpoint (config.json has "
                         f"model_type={config.get('model_type')!r})")
    m = llada.load(directory, config, "llada", jnp.dtype(dtype))

    def logprobs(x_BxL):
        return llada.logprobs(m.apply(m.params, x_BxL, jnp.zeros(x_BxL.shape[0], jnp.float32)), m.mask_id)

    return external.ExternalDenoiser(logprobs, m.vocab_size, m.mask_id, False, True), m


def _encoder(lc, checkpoint: str):
    """str -> the model's token ids, from ``llada.tokenizer`` or ``CHECKPOINT/tokenizer.json``."""
    from tokenizers import Tokenizer

    path = os.path.expanduser(lc.tokenizer or os.path.join(checkpoint, "tokenizer.json"))
    if not os.path.isfile(path):
        raise ValueError(f"no tokenizer at {path!r}: give config.llada.tokenizer=PATH/tokenizer.json to score text files")
    tok = Tokenizer.from_file(path)
    return lambda s: tok.encode(s, add_special_tokens=False).ids


def read_rows(path: str, keys: tuple[str, ...], n: int, rng, encode, den) -> list[tuple[np.ndarray, ...]]:
    """``n`` rows drawn without replacement (all if fewer) from the JSONL file ``path``, each the
    library ids (int32) of its ``keys`` texts. ValueError naming the file and line for a row
    that is not an object with those string fields or that tokenises to nothing."""
    rows = []
    with open(os.path.expanduser(path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, obj in json_rows(path, lines):
        if not all(isinstance(obj.get(k), str) for k in keys):
            raise ValueError(f"{path}:{i}: expected string fields {', '.join(keys)}")
        ids = tuple(external.from_model_ids(list(encode(obj[k])), den.model_vocab, den.mask_id, f"{path}:{i} {k}")
                    for k in keys)
        if any(len(a) == 0 for a in ids[1:]):
            raise ValueError(f"{path}:{i}: a response tokenises to no tokens")
        rows.append(ids)
    if len(rows) < 2:
        raise ValueError(f"{path} holds {len(rows)} row(s); the variance tables need at least 2")
    pick = rng.permutation(len(rows))[:n]
    return [rows[j] for j in sorted(pick)]


def random_rows(n: int, lengths: tuple[int, ...], V: int, rng) -> list[tuple[np.ndarray, ...]]:
    """``n`` rows of uniformly random library ids in [0, V) with the given lengths."""
    return [tuple(rng.integers(0, V, size=k).astype(np.int32) for k in lengths) for _ in range(n)]


def _groups(rows):
    """[stacked arrays per field] for each set of rows of one shape (one call each)."""
    out: dict = {}
    for i, r in enumerate(rows):
        out.setdefault(tuple(len(a) for a in r), []).append(i)
    return [[np.stack([rows[i][j] for i in idx]) for j in range(len(k))] for k, idx in out.items()]


def _ratio_variance(den, prompts, ya, yb, n_samples, reps, key, coupled, batch_size) -> np.ndarray:
    """Per-triplet variance over ``reps`` time-free log-ratio estimates of ``n_samples`` samples
    each (float64 [N]); responses of different lengths padded to a common width."""
    N, P = prompts.shape
    Ra, Rb = ya.shape[1], yb.shape[1]
    W = P + max(Ra, Rb)

    def widen(y):
        x = np.zeros((N, W), np.int32)
        x[:, :P], x[:, P:P + y.shape[1]] = prompts, y
        pos = np.arange(W)[None].repeat(N, 0)
        return x, (pos >= P) & (pos < P + y.shape[1]), pos >= P + y.shape[1]

    (xa, ta, pa), (xb, tb, pb) = widen(ya), widen(yb)
    ea, eb = lk.paired_nll(den, xa, xb, key, target_a_BxL=ta, target_b_BxL=tb,
                           pad_a_BxL=pa if pa.any() else None, pad_b_BxL=pb if pb.any() else None,
                           coupled=coupled, estimator="time_free", num_samples=n_samples * reps,
                           batch_size=batch_size)
    return (eb.samples - ea.samples).reshape(N, reps, n_samples).mean(-1).var(axis=1, ddof=1)


def _check(lc) -> None:
    for key, low in (("num_pairs", 2), ("num_triplets", 2), ("reps", 2), ("ratio_reps", 2), ("batch_size", 1),
                     ("prompt_len", 1), ("response_len", 1)):
        v = lc[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"config.llada.{key}={v!r} must be an integer >= {low}")
    for key in ("budgets", "ratio_samples"):
        if not paper.int_list(lc[key]) or min(paper.int_list(lc[key])) < 2:
            raise ValueError(f"config.llada.{key}={lc[key]!r} must list integers >= 2")
    bad = [e for e in paper.name_list(lc.estimators) if e not in ("lambda_dce", "time_free", "k_dce", "stratified",
                                                                 "t_dce", "neyman")]
    if bad:
        raise ValueError(f"config.llada.estimators holds {bad[0]!r}: choose from lambda_dce, time_free, k_dce, "
                         "stratified, t_dce, neyman")
    if not lc.checkpoint:
        raise ValueError("config.llada.checkpoint is empty: give the directory of a LLaDA checkpoint "
                         "(config.json + model.safetensors.index.json), e.g. --config.llada.checkpoint=~/LLaDA-8B-Base")


def run_llada_tables(config, workdir: str) -> dict:
    """Tables 1 (a) and (b) of arXiv 2510.24088 on ``config.llada.checkpoint`` (module
    docstring); writes results.json / results.md in ``workdir``."""
    t0 = time.time()
    lc = config.llada
    _check(lc)
    den, m = load_denoiser(lc.checkpoint, lc.dtype)
    rng = np.random.default_rng(int(lc.seed))
    encode = _encoder(lc, lc.checkpoint) if (lc.pairs or lc.triplets) else None
    P, R = int(lc.prompt_len), int(lc.response_len)
    pairs = (read_rows(lc.pairs, TABLE_A, int(lc.num_pairs), rng, encode, den) if lc.pairs
             else random_rows(int(lc.num_pairs), (P, R), den.vocab_size, rng))
    triplets = (read_rows(lc.triplets, TABLE_B, int(lc.num_triplets), rng, encode, den) if lc.triplets
                else random_rows(int(lc.num_triplets), (P, R, R), den.vocab_size, rng))
    too_long = [len(r[0]) + max(len(a) for a in r[1:]) for r in pairs + triplets]
    if max(too_long) > m.max_seq_len:
        raise ValueError(f"a row of {max(too_long)} tokens is longer than the model's {m.max_seq_len} positions")
    key = jax.random.PRNGKey(int(lc.seed))
    bs, reps = int(lc.batch_size), int(lc.reps)
    budgets, estimators = paper.int_list(lc.budgets), paper.name_list(lc.estimators)
    table_a, table_b = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # lambda_dce's infinite-variance warning
        for e_i, est in enumerate(estimators):
            for b in budgets:
                var, passes = [], []
                for g, (pr, rs) in enumerate(_groups(pairs)):
                    v, p = paper.repeat_variance(den, pr, rs, est, b, reps,
                                                  jax.random.fold_in(key, 100_000 * e_i + 100 * b + g), bs)
                    var += [v] * len(pr)
                    passes += [p] * len(pr)
                table_a[f"{est}/{b}"] = {"variance": float(np.mean(var)), "forward_passes": float(np.mean(passes))}
        for n in paper.int_list(lc.ratio_samples):
            for coupled in (True, False):
                var = []
                for g, (pr, ya, yb) in enumerate(_groups(triplets)):
                    var.append(_ratio_variance(den, pr, ya, yb, n, int(lc.ratio_reps),
                                               jax.random.fold_in(key, 7 * n + int(coupled) + 1000 * g), coupled, bs))
                table_b[f"{n}/{'coupled' if coupled else 'decoupled'}"] = float(np.concatenate(var).mean())
    source = {"pairs": lc.pairs or f"random token ids, prompt {P} + response {R}",
              "triplets": lc.triplets or f"random token ids, prompt {P} + two responses of {R}"}
    results = {"experiment": "llada_tables", "checkpoint": os.path.abspath(os.path.expanduser(lc.checkpoint)),
               "model": m.info,
               "rows": source, "num_pairs": len(pairs), "num_triplets": len(triplets), "reps": reps,
               "ratio_reps": int(lc.ratio_reps), "table1a_conditional_variance": table_a,
               "table1b_ratio_variance": table_b, "wall_time_s": time.time() - t0}
    md = [f"## Table 1 (a): variance of conditional NLL estimates (nats²), {len(pairs)} pairs × {reps} "
          f"repeats\n\ncheckpoint {results['checkpoint']}; rows: {source['pairs']}\n",
          paper.md_table(["forward passes"] + estimators,
                         [[b] + [f"{table_a[f'{e}/{b}']['variance']:.4g}" for e in estimators] for b in budgets]),
          f"\n## Table 1 (b): variance of time-free log-ratio estimates (nats²), coupled vs decoupled, "
          f"{len(triplets)} triplets × {lc.ratio_reps} estimates\n\nrows: {source['triplets']}\n",
          paper.md_table(["MC samples", "coupled", "decoupled", "decoupled ÷ coupled"],
                         [[n, f"{table_b[f'{n}/coupled']:.4g}", f"{table_b[f'{n}/decoupled']:.4g}",
                           f"{table_b[f'{n}/decoupled'] / table_b[f'{n}/coupled']:.1f}×"]
                          for n in paper.int_list(lc.ratio_samples)])]
    results["files"] = paper.write_results(workdir, results, "\n".join(md), model_dir=os.path.join(workdir, "none"))
    return results
