"""Likelihood reports: a trained network on a text split, or every estimator with an oracle.

`evaluate(config, workdir)` dispatches on config.data.name: 'text' -> `evaluate_network`,
'tabular' / 'markov' -> `evaluate_oracle`. Both return a JSON-serialisable report (schema in
README.md, "report.json") that `write_report` saves as report.json plus report.txt, the
readable table that `format_report` prints.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
import warnings

import jax
import ml_collections
import numpy as np

from infodiff import likelihood as lk
from infodiff import oracles
from infodiff import schedules as schedules_lib

REPORT_VERSION = 1
LN2 = math.log(2.0)


def _schedule(config):
    p = config.process
    return schedules_lib.get_schedule(p.schedule, eps=p.get("eps", None))


def _env() -> dict:
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ---------------------------------------------------------------------------------------------
# Trained network on a text split
# ---------------------------------------------------------------------------------------------
def evaluate_network(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Test-split NLL of a trained masked-diffusion or SEDD model, with a standard error.

    Loads the latest checkpoint in `workdir` (EMA parameters unless config.eval.use_ema is
    False), cuts the split into non-overlapping chunks of config.data.seq_len characters
    (remainder dropped; config.eval.max_sequences > 0 keeps a random subset of that many),
    and runs `likelihood.nll` with config.eval.estimator and config.eval.num_samples masks
    per chunk (a SEDD run, config.process.name == 'sedd': `likelihood.imdse_nll`, the I-MDSE
    likelihood, with the diffusion and prior terms reported, and samples from the SEDD sampler).

    Units: nats per sequence and bits per character (= nats per sequence / (L ln 2)).
    Standard error: with every chunk of the split evaluated, the split NLL is a fixed
    quantity and the SE is the Monte Carlo error sqrt(sum_b se_b^2) / N; with a subset of
    chunks, it is the larger of the standard deviation of the per-chunk estimates / sqrt(N)
    (data + Monte Carlo) and the Monte Carlo error. Raises FileNotFoundError for a workdir
    without checkpoints; ValueError for bad eval settings (before any work).
    """
    from infodiff import training  # heavy imports only when needed
    from infodiff.data import text

    t0 = time.time()
    ev = config.eval
    sedd = config.process.name == "sedd"
    if sedd:
        training.check_sedd_eval_config(config)
    else:
        _check_estimators(ev.estimator)
    if int(ev.max_sequences) < 0 or int(ev.num_samples) < 2:
        raise ValueError(
            f"need config.eval.max_sequences >= 0 and config.eval.num_samples >= 2; got "
            f"{ev.max_sequences}, {ev.num_samples}")
    corpus = training.load_config_corpus(config)
    split = corpus.split(ev.split)
    L = int(config.data.seq_len)
    chunks = text.eval_chunks(split, L)
    total_chunks = len(chunks)
    subset = bool(ev.max_sequences) and ev.max_sequences < total_chunks
    if subset:
        rng = np.random.default_rng(ev.seed)
        chunks = chunks[np.sort(rng.choice(total_chunks, ev.max_sequences, replace=False))]

    saved = training.saved_config(workdir)
    diff = training.config_differences(saved, json.loads(config.to_json_best_effort()),
                                       ignore_new_keys=True)
    if diff:
        raise training.ConfigMismatchError(
            f"the config differs from the one {workdir!r} was trained with in: {', '.join(diff)} "
            "(evaluate with the run's own config: `evaluate.py --workdir W` without --config; "
            "only eval.* may be overridden)")
    state, meta = training.load_checkpoint(workdir, config=config)
    params = state.ema_params if ev.use_ema else state.params
    if sedd:
        denoiser = training.make_score_model(config, training.make_model(config), params)
        lam_max = _schedule(config).lambda_max
        est = lk.imdse_nll(denoiser, chunks, jax.random.PRNGKey(ev.seed), graph=denoiser.graph,
                           lam_max=lam_max, num_samples=int(ev.num_samples),
                           lambda_sampling=ev.get("lambda_sampling", None),
                           batch_size=int(ev.batch_size), progress=True)
    else:
        denoiser = training.make_denoiser(training.make_model(config), params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            est = lk.nll(denoiser, chunks, jax.random.PRNGKey(ev.seed), estimator=ev.estimator,
                         num_samples=int(ev.num_samples), batch_size=int(ev.batch_size),
                         schedule=_schedule(config), progress=True)
    means = est.mean
    N = len(means)
    nll = float(means.mean())
    se_mc = float(np.sqrt(np.sum(est.stderr**2)) / N)
    se_data = float(means.std(ddof=1) / math.sqrt(N)) if N > 1 else float("nan")
    # With a subset of chunks the spread of the per-chunk estimates (data + MC) is the SE; with
    # heavy-tailed Monte Carlo values (SEDD, few samples) it can come out below the MC SE alone,
    # so the larger of the two is reported.
    se = max(se_data, se_mc) if subset else se_mc
    unigram = text.unigram_entropy_bits(corpus.train)
    samples = []
    n_gen = int(ev.get("num_generate", 4))
    if n_gen > 0 and sedd:
        from infodiff.processes import score_entropy

        gen = score_entropy.sample(denoiser, denoiser.graph, jax.random.PRNGKey(ev.seed + 1), n_gen, L,
                                   denoiser.vocab_size, int(ev.get("sample_steps", L)),
                                   method=ev.get("sampler", "tweedie"), lam_max=lam_max)
        samples = [text.decode(np.asarray(row)) for row in gen]
    elif n_gen > 0:
        from infodiff.processes import masked

        sched, steps = _schedule(config), int(ev.get("sample_steps", L))

        @jax.jit
        def generate(params, key):
            den = lambda z, t: denoiser.apply_params(params, z, t)  # noqa: E731
            return masked.ancestral_sample(den, key, n_gen, L, denoiser.vocab_size, sched, steps)

        gen = generate(denoiser.params, jax.random.PRNGKey(ev.seed + 1))
        samples = [text.decode(np.asarray(row)) for row in gen]
    report = {
        "version": REPORT_VERSION,
        "kind": "network",
        "workdir": os.path.abspath(workdir),
        "checkpoint_step": int(meta["step"]),
        "params": "ema" if ev.use_ema else "raw",
        "data": {"corpus": corpus.name, "split": ev.split, "checksum": corpus.checksums.get(
            "valid" if ev.split in ("valid", "validation") else ev.split),
                 "seq_len": L, "num_sequences": N, "total_chunks": total_chunks,
                 "unigram_entropy_bits_per_char": unigram},
        "process": ({"name": "sedd", "graph": denoiser.graph, "score_param": denoiser.score_param,
                     "lambda_sampling": est.estimator.split(":")[1], "lam_max": lam_max}
                    if sedd else {"name": config.process.name}),
        "estimator": ev.estimator,
        "infinite_variance": est.infinite_variance,
        "num_samples_per_sequence": est.num_samples,
        "forward_passes": est.forward_passes * N,
        "nll_nats_per_sequence": nll,
        "nll_stderr": se,
        "stderr_kind": "data+mc (subset of chunks; at least the mc SE)" if subset else "mc (all chunks)",
        "stderr_mc": se_mc,
        "stderr_data_and_mc": se_data,
        "bits_per_char": nll / (L * LN2),
        "bits_per_char_stderr": se / (L * LN2),
        "per_sample_std_nats": float(np.sqrt(np.mean(est.per_sample_std**2))),
        **({"terms_nats_per_sequence": {"diffusion": float(est.diffusion.mean()),
                                        "prior": float(est.prior.mean())}} if sedd else {}),
        "samples": samples,
        "sample_steps": int(ev.get("sample_steps", L)) if samples else 0,
        "seed": int(ev.seed),
        "wall_time_s": time.time() - t0,
        "env": _env(),
        "config": json.loads(config.to_json_best_effort()),
    }
    return report


# ---------------------------------------------------------------------------------------------
# Oracle mode
# ---------------------------------------------------------------------------------------------
def _load_or_make_oracle(config, out_dir):
    d = config.data
    alphabet = d.get("alphabet", "") or None
    if d.path:
        kind = d.name
        orc = oracles.load_oracle(kind, d.path, alphabet=alphabet)
        source = os.path.abspath(d.path)
    else:
        rng = np.random.default_rng(d.seed)
        if d.name == "tabular":
            orc = oracles.random_tabular(rng, "ACGT", d.seq_len, d.num_support, d.temperature)
        elif d.name == "markov":
            orc = oracles.random_markov(rng, d.generated_alphabet, d.order, d.temperature)
        else:
            raise ValueError(f"unknown oracle data.name {d.name!r}")
        os.makedirs(out_dir, exist_ok=True)
        source = os.path.join(os.path.abspath(out_dir), f"generated_{d.name}.json")
        with open(source, "w") as f:
            json.dump(orc.to_json(), f, indent=1)
    return orc, source


def _check_estimators(spec: str) -> list[str]:
    """Parse 'a,b,c' and check every name before any work is done."""
    names = [e.strip() for e in str(spec).split(",") if e.strip()]
    if not names:
        raise ValueError("config.eval.estimators is empty; e.g. 'k_dce,time_free'")
    bad = [e for e in names if e not in lk.ESTIMATORS]
    if bad:
        raise ValueError(f"unknown estimator {bad[0]!r} in config.eval.estimators; choose from {lk.ESTIMATORS}")
    return names


def _summarise(est: lk.Estimate, truth: np.ndarray, budget: int = 1024) -> dict:
    """Per-estimator summary over sequences: bias and its SE, per-sample spread."""
    N = len(truth)
    bias = est.mean - truth
    bias_se = float(np.sqrt(np.sum(est.stderr**2)) / N)
    var_sample = float(np.mean(est.per_sample_std**2))
    fp_per_sample = est.forward_passes / est.num_samples
    return {
        "estimator": est.estimator,
        "mean_estimate": float(est.mean.mean()),
        "mean_exact": float(truth.mean()),
        "bias": float(bias.mean()),
        "bias_stderr": bias_se,
        # z is undefined (NaN -> null in report.json) when the estimator is exact (SE = 0).
        "bias_z": float(bias.mean() / bias_se) if bias_se > 0 else float("nan"),
        "max_abs_z_per_sequence": (float(np.max(np.abs(bias / est.stderr)))
                                   if np.all(est.stderr > 0) else float("nan")),
        "per_sample_std": math.sqrt(var_sample),
        "per_sample_variance": var_sample,
        "variance_per_forward_pass": var_sample * fp_per_sample,
        f"stderr_at_{budget}_forward_passes": math.sqrt(var_sample * fp_per_sample / budget),
        "num_samples": est.num_samples,
        "forward_passes": est.forward_passes,
        "infinite_variance": est.infinite_variance,
    }


def evaluate_oracle(config: ml_collections.ConfigDict) -> dict:
    """Run every estimator with the exact oracle denoiser and compare with the exact NLL.

    Unconditional -log p(x) for every config (x drawn from the distribution). With a prompt
    (markov: data.prompt_len / response_len; tabular: data.prompt_len > 0) also the
    conditional -log p(y | x) and log-ratios log p(y | x) - log p(y' | x), y' ~ p(. | x),
    coupled (shared masks, Eq. 18) and decoupled. Units: nats per sequence / response.
    """
    t0 = time.time()
    ev, d = config.eval, config.data
    estimators = _check_estimators(ev.estimators)
    if int(ev.num_sequences) < 1:
        raise ValueError(f"config.eval.num_sequences must be >= 1; got {ev.num_sequences}")
    out_dir = ev.output_dir
    orc, source = _load_or_make_oracle(config, out_dir)
    rng = np.random.default_rng(ev.seed)
    if d.name == "markov":
        P, R = int(d.prompt_len), int(d.response_len)
        if P < 0 or R < 1:
            raise ValueError(f"need data.prompt_len >= 0 and data.response_len >= 1; got {P}, {R}")
        x = orc.sample(rng, ev.num_sequences, length=P + R)
    else:
        x = orc.sample(rng, ev.num_sequences)
        P = int(d.get("prompt_len", 0))
        if not 0 <= P < x.shape[1]:
            raise ValueError(
                f"config.data.prompt_len={P} must be in [0, {x.shape[1] - 1}] for sequences of "
                f"length {x.shape[1]}")
        R = x.shape[1] - P
    sched = _schedule(config)
    key = jax.random.PRNGKey(ev.seed)
    kw = dict(num_samples=int(ev.num_samples), batch_size=int(ev.batch_size), schedule=sched)
    results = {"unconditional": [], "conditional": [], "ratio": []}
    truth_x = -orc.log_prob(x)
    if P > 0 and R > 0:
        # One alternative response per prompt, y' ~ p(. | x), shared by every estimator.
        y_alt = (orc.sample_response(rng, x[:, :P], R) if d.name == "markov"
                 else orc.sample_response(rng, x[:, :P]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for i, name in enumerate(estimators):
            k = jax.random.fold_in(key, i)
            est = lk.nll(orc, x, jax.random.fold_in(k, 0), estimator=name, **kw)
            results["unconditional"].append(_summarise(est, truth_x))
            if P > 0 and R > 0:
                prompt, y = x[:, :P], x[:, P:]
                target = np.zeros(x.shape, bool)
                target[:, P:] = True
                truth_c = -orc.cond_log_prob(x, target)
                est = lk.conditional_nll(orc, prompt, y, jax.random.fold_in(k, 1), estimator=name, **kw)
                results["conditional"].append(_summarise(est, truth_c))
                x_alt = np.concatenate([prompt, y_alt], axis=1)
                truth_r = orc.cond_log_prob(x, target) - orc.cond_log_prob(x_alt, target)
                pair = {}
                for coupled in (True, False):
                    est = lk.log_ratio(orc, prompt, y, y_alt, jax.random.fold_in(k, 2 + coupled),
                                       coupled=coupled, estimator=name, **kw)
                    pair["coupled" if coupled else "decoupled"] = _summarise(est, truth_r)
                pair["estimator"] = name
                vc, vd = pair["coupled"]["per_sample_variance"], pair["decoupled"]["per_sample_variance"]
                # Undefined (NaN) when both are 0, e.g. a one-token response, where
                # k_dce / time_free / stratified are exact.
                pair["variance_ratio_decoupled_over_coupled"] = (
                    vd / vc if vc > 0 else (float("inf") if vd > 0 else float("nan")))
                results["ratio"].append(pair)
    return {
        "version": REPORT_VERSION,
        "kind": "oracle",
        "oracle": d.name,
        "table": source,
        "alphabet": orc.alphabet,
        "order": getattr(orc, "order", None),
        "seq_len": int(x.shape[1]),
        "prompt_len": P,
        "num_sequences": int(x.shape[0]),
        "schedule": {"name": sched.name, "eps": getattr(sched, "eps", None)},
        "results": results,
        "seed": int(ev.seed),
        "wall_time_s": time.time() - t0,
        "env": _env(),
        "config": json.loads(config.to_json_best_effort()),
    }


def _csv(spec, allowed, what):
    names = [e.strip() for e in str(spec).split(",") if e.strip()]
    bad = [e for e in names if e not in allowed]
    if bad or not names:
        raise ValueError(f"config.eval.{what}={spec!r}: choose from {allowed}")
    return names


def evaluate_oracle_sedd(config: ml_collections.ConfigDict) -> dict:
    """SEDD with the exact score of an oracle: I-MDSE vs the exact NLL, and sampler TV.

    For each graph in config.eval.graphs and each noise-level sampling in
    config.eval.lambda_samplings: the I-MDSE estimate of -log p(x) (nats per sequence; the
    prior KL term at lam_max = schedule.lambda_max reported separately) against the exact value;
    for 'absorb' with a prompt also -log p(y | x). For a tabular oracle with at most 10^5
    sequences, the total variation between sequences generated with the exact score
    (config.eval.sampler_methods x config.eval.sampler_steps, config.eval.num_generate each) and
    the true law. Raises ValueError for unknown graph / sampling / sampler names.
    """
    from infodiff.processes import score_entropy as se

    t0 = time.time()
    ev, d = config.eval, config.data
    graphs = _csv(ev.graphs, se.GRAPHS, "graphs")
    samplings = _csv(ev.lambda_samplings, se.LAMBDA_SAMPLING, "lambda_samplings")
    methods = _csv(ev.sampler_methods, ("euler", "tweedie"), "sampler_methods") if ev.sampler_steps else []
    steps_list = [int(s) for s in str(ev.sampler_steps).split(",") if s.strip()]
    if int(ev.num_sequences) < 1:
        raise ValueError(f"config.eval.num_sequences must be >= 1; got {ev.num_sequences}")
    orc, source = _load_or_make_oracle(config, ev.output_dir)
    rng = np.random.default_rng(ev.seed)
    if d.name == "markov":
        P, R = int(d.prompt_len), int(d.response_len)
        x = orc.sample(rng, ev.num_sequences, length=P + R)
    else:
        x = orc.sample(rng, ev.num_sequences)
        P = int(d.get("prompt_len", 0))
    lam_max = _schedule(config).lambda_max
    key = jax.random.PRNGKey(ev.seed)
    truth_x = -orc.log_prob(x)
    results = {"unconditional": [], "conditional": [], "sampler_tv": []}
    kw = dict(lam_max=lam_max, num_samples=int(ev.num_samples), batch_size=int(ev.batch_size))
    for i, graph in enumerate(graphs):
        for j, samp in enumerate(samplings):
            k = jax.random.fold_in(jax.random.fold_in(key, i), j)
            est = lk.imdse_nll(se.OracleScore(orc, graph), x, jax.random.fold_in(k, 0), graph=graph,
                               lambda_sampling=samp, **kw)
            row = _summarise(est, truth_x)
            row["prior_mean"] = float(est.prior.mean())
            results["unconditional"].append(row)
            if graph == "absorb" and P > 0:
                target = np.zeros(x.shape, bool)
                target[:, P:] = True
                est = lk.imdse_conditional_nll(se.OracleScore(orc, graph), x[:, :P], x[:, P:],
                                               jax.random.fold_in(k, 1), graph=graph,
                                               lambda_sampling=samp, **kw)
                results["conditional"].append(_summarise(est, -orc.cond_log_prob(x, target)))
    V, L = orc.vocab_size, x.shape[1]
    if steps_list and d.name == "tabular" and V**L <= 100_000:
        allx = np.array(np.unravel_index(np.arange(V**L), (V,) * L)).T
        p_true = np.exp(orc.log_prob(allx))
        n = int(ev.num_generate)
        floor = []
        for r in range(3):  # TV of an exact sample of the same size: the Monte Carlo floor
            idx = np.ravel_multi_index(orc.sample(np.random.default_rng(ev.seed + 7 + r), n).T, (V,) * L)
            floor.append(0.5 * np.abs(np.bincount(idx, minlength=V**L) / n - p_true).sum())
        for graph in graphs:
            for method in methods:
                tvs = []
                for steps in steps_list:
                    gen = np.asarray(se.sample(se.OracleScore(orc, graph), graph,
                                               jax.random.fold_in(key, 10_000 + steps), n, L, V, steps,
                                               method=method, lam_max=lam_max))
                    idx = np.ravel_multi_index(gen.T, (V,) * L)
                    tvs.append(float(0.5 * np.abs(np.bincount(idx, minlength=V**L) / n - p_true).sum()))
                results["sampler_tv"].append({"graph": graph, "method": method, "steps": steps_list,
                                              "tv": tvs, "num_generate": n,
                                              "tv_of_exact_sample": float(np.mean(floor))})
    return {
        "version": REPORT_VERSION,
        "kind": "oracle_sedd",
        "oracle": d.name,
        "table": source,
        "alphabet": orc.alphabet,
        "order": getattr(orc, "order", None),
        "seq_len": int(L),
        "prompt_len": P,
        "num_sequences": int(x.shape[0]),
        "lam_max": lam_max,
        "schedule": {"name": _schedule(config).name, "eps": getattr(_schedule(config), "eps", None)},
        "results": results,
        "seed": int(ev.seed),
        "wall_time_s": time.time() - t0,
        "env": _env(),
        "config": json.loads(config.to_json_best_effort()),
    }


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------
def _table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).rjust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def format_report(report: dict) -> str:
    """Human-readable table of a report (what evaluate.py prints)."""
    if report["kind"] == "network":
        d = report["data"]
        rows = [
            ["estimator", report["estimator"] + (" (INFINITE VARIANCE: SE unreliable)" if report["infinite_variance"] else "")],
            ["checkpoint", f"step {report['checkpoint_step']} ({report['params']} params)"],
            ["data", f"{d['corpus']} / {d['split']}: {d['num_sequences']} of {d['total_chunks']} chunks x {d['seq_len']} chars"],
            ["MC samples / sequence", report["num_samples_per_sequence"]],
            ["forward passes", report["forward_passes"]],
            *([["process", "SEDD {graph} graph, {score_param} score, lam in (0, {lam_max:g}] ({lambda_sampling})".format(**report["process"])],
               ["I-MDSE terms (nats / seq)", "diffusion {diffusion:.4f} + prior {prior:.6f}".format(**report["terms_nats_per_sequence"])]]
              if "terms_nats_per_sequence" in report else []),
            ["NLL (nats / sequence)", f"{report['nll_nats_per_sequence']:.4f} ± {report['nll_stderr']:.4f}"],
            ["bits per character", f"{report['bits_per_char']:.4f} ± {report['bits_per_char_stderr']:.4f}  [{report['stderr_kind']}]"],
            ["unigram entropy (train)", f"{d['unigram_entropy_bits_per_char']:.4f} bits/char"],
            ["wall time", f"{report['wall_time_s']:.1f} s"],
        ]
        out = "infodiff likelihood report\n" + _table(["quantity", "value"], rows)
        if report.get("samples"):
            how = ("SEDD {} sampler".format(report["config"]["eval"].get("sampler", "tweedie"))
                   if report.get("process", {}).get("name") == "sedd" else "MD4 ancestral sampler")
            out += (f"\n\nsamples ({how}, {report['sample_steps']} steps):\n"
                    + "\n".join(f"  | {s}" for s in report["samples"]))
        return out

    if report["kind"] == "oracle_sedd":
        return _format_oracle_sedd(report)
    parts = [f"infodiff oracle report: {report['oracle']} ({report['table']}), "
             f"{report['num_sequences']} sequences of length {report['seq_len']}"
             + (f", prompt {report['prompt_len']}" if report["prompt_len"] else "")]
    headers = ["estimator", "estimate", "exact", "bias ± SE", "z", "sd/sample", "var/fwd", "SE@1024"]

    def rows_of(items):
        rows = []
        for r in items:
            rows.append([
                r["estimator"] + (" (inf. var.)" if r["infinite_variance"] else ""),
                f"{r['mean_estimate']:.4f}", f"{r['mean_exact']:.4f}",
                f"{r['bias']:+.4f} ± {r['bias_stderr']:.4f}", f"{r['bias_z']:+.2f}",
                f"{r['per_sample_std']:.3f}", f"{r['variance_per_forward_pass']:.3f}",
                f"{r['stderr_at_1024_forward_passes']:.4f}",
            ])
        return rows

    res = report["results"]
    parts.append("\n-log p(x), nats per sequence\n" + _table(headers, rows_of(res["unconditional"])))
    if res["conditional"]:
        parts.append("\n-log p(y | x), nats per response\n" + _table(headers, rows_of(res["conditional"])))
    if res["ratio"]:
        items = []
        for pair in res["ratio"]:
            for kind in ("coupled", "decoupled"):
                r = dict(pair[kind])
                r["estimator"] = f"{pair['estimator']}:{kind}"
                items.append(r)
        parts.append("\nlog p(y | x) - log p(y' | x), nats\n" + _table(headers, rows_of(items)))
        parts.append("variance ratio decoupled / coupled: " + ", ".join(
            f"{p['estimator']} {p['variance_ratio_decoupled_over_coupled']:.1f}x" for p in res["ratio"]))
    parts.append(f"\nwall time {report['wall_time_s']:.1f} s")
    return "\n".join(parts)


def _format_oracle_sedd(report: dict) -> str:
    parts = [f"infodiff SEDD oracle report: {report['oracle']} ({report['table']}), "
             f"{report['num_sequences']} sequences of length {report['seq_len']}"
             + (f", prompt {report['prompt_len']}" if report["prompt_len"] else "")
             + f"; I-MDSE over lam in (0, {report['lam_max']:g}] with the exact score"]
    headers = ["graph:sampling", "estimate", "exact", "bias ± SE", "z", "sd/sample", "SE@1024"]

    def rows_of(items):
        return [[r["estimator"] + (" (inf. var.)" if r["infinite_variance"] else ""),
                 f"{r['mean_estimate']:.4f}", f"{r['mean_exact']:.4f}",
                 f"{r['bias']:+.4f} ± {r['bias_stderr']:.4f}", f"{r['bias_z']:+.2f}",
                 f"{r['per_sample_std']:.3f}", f"{r['stderr_at_1024_forward_passes']:.4f}"] for r in items]

    res = report["results"]
    parts.append("\n-log p(x), nats per sequence (mean over sequences):\n"
                 + _table(headers, rows_of(res["unconditional"])))
    if res["conditional"]:
        parts.append("\n-log p(y | x), nats per response:\n" + _table(headers, rows_of(res["conditional"])))
    if res["sampler_tv"]:
        steps = res["sampler_tv"][0]["steps"]
        rows = [[f"{r['graph']}:{r['method']}", *[f"{v:.4f}" for v in r["tv"]]] for r in res["sampler_tv"]]
        parts.append(f"\nsampler total variation to the true law ({res['sampler_tv'][0]['num_generate']} "
                     f"samples; an exact sample of that size has TV {res['sampler_tv'][0]['tv_of_exact_sample']:.4f}):\n"
                     + _table(["graph:sampler", *[f"{s} steps" for s in steps]], rows))
    parts.append(f"\nwall time {report['wall_time_s']:.1f} s")
    return "\n".join(parts)


def _strict_json(obj):
    """NaN / inf -> None so report.json is strict JSON (jq, JavaScript)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict_json(v) for v in obj]
    return obj


def write_report(report: dict, out_dir: str) -> tuple[str, str]:
    """Write report.json (strict JSON: undefined numbers are null) and report.txt into
    out_dir; return their paths. The text is formatted first, so a failure leaves the
    previous report in place."""
    text = format_report(report)
    os.makedirs(out_dir, exist_ok=True)
    jpath = os.path.join(out_dir, "report.json")
    tpath = os.path.join(out_dir, "report.txt")
    tmp = jpath + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_strict_json(report), f, indent=2, allow_nan=False)
    os.replace(tmp, jpath)
    with open(tpath + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(tpath + ".tmp", tpath)
    return jpath, tpath


def evaluate(config: ml_collections.ConfigDict, workdir: str | None) -> tuple[dict, str]:
    """Dispatch on config.data.name; returns (report, output directory)."""
    name = config.data.name
    if name in ("tabular", "markov"):
        if config.process.name == "sedd":
            return evaluate_oracle_sedd(config), config.eval.output_dir
        return evaluate_oracle(config), config.eval.output_dir
    if name in ("text", "text8"):
        if not workdir:
            raise ValueError("evaluating a trained model needs --workdir (the training run's directory)")
        return evaluate_network(config, workdir), workdir
    raise ValueError(f"unknown config.data.name {name!r}")
