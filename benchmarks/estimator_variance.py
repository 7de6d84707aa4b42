"""Variance per forward pass of every masked estimator: DNA-128, Markov-4 conditional, a trained model.

    python benchmarks/estimator_variance.py
    python benchmarks/estimator_variance.py --markov_table=path/to/table.json --skip_trained

Three tables (a benchmark: prints, asserts nothing):

1. DNA-128 recipe (arXiv 2510.24088 §5.1: 128 random ACGT sequences of length 8, softmax
   temperature 0.5). EXACT per-forward-pass variances from enumerating all 255 mask subsets of
   each sequence (``masked.stratum_masks``): time_free, k_dce, stratified, Neyman allocation
   pooled over sequences and per sequence (continuous, the ideal), and with the cheap strata
   m in {1, n-1, n} enumerated at the budget; then the library's estimates at the same budget
   (``likelihood.nll``), with their measured variance per pass and |bias| / SE.
2. Markov-4 conditional: the order-4 ACGT chain of ``--markov_table`` (default: the paper's
   released table if ``../shared/data/infodis_markov4_table.json`` exists, else a random chain;
   the table printed says which), 16-symbol prompt, 16-symbol response. Measured variances per
   pass at ``--budget`` passes per pair (2^16 subsets are too many to enumerate), plus the ideal
   pooled vs per-sequence Neyman variance from a large pilot.
3. A trained model (skipped with ``--skip_trained``): a tiny time-free transformer trained
   ``--train_steps`` steps on an order-2 chain of length 16; measured variance per pass of each
   estimator (all have the same expectation for a time-free network).
"""

import dataclasses
import math
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from infodiff import likelihood as lk  # noqa: E402
from infodiff import oracles, tasks, training  # noqa: E402
from infodiff.evaluation.report import table  # noqa: E402
from infodiff.processes import masked  # noqa: E402

PAPER_TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                           "data", "infodis_markov4_table.json")
FLAGS = flags.FLAGS
flags.DEFINE_string("markov_table", PAPER_TABLE, "order-4 Markov table {context: {symbol: p}}")
flags.DEFINE_integer("num_sequences", 16, "sequences (pairs) per table")
flags.DEFINE_integer("budget", 1024, "forward passes per sequence for the measured rows")
flags.DEFINE_integer("train_steps", 400, "training steps of the trained-model table")
flags.DEFINE_bool("skip_trained", False, "skip the trained-model table")
flags.DEFINE_integer("seed", 0, "seed of the tables, sequences and Monte Carlo keys")


def exact_strata(den, x_BxL, target_BxL):
    """E[C_m] and E[C_m^2] per sequence and stratum by enumeration: float64 [B, n] each."""
    n = masked.common_target_count(target_BxL, "enumeration")
    apply_fn, params = lk.denoisers.split(den)
    spec = masked.MaskSpec()
    B, L = x_BxL.shape
    m1, m2 = np.zeros((B, n)), np.zeros((B, n))
    for m in range(1, n + 1):
        masks = masked.stratum_masks(target_BxL, m)
        K = masks.shape[1]
        xr = np.repeat(x_BxL, K, 0)
        t = float(spec.schedule.t_from_lambda(np.float32(m / n)))
        ce = np.asarray(masked._masked_ce(apply_fn, params, xr, masks.reshape(B * K, L),
                                          np.full(B * K, t, np.float32), int(den.vocab_size)), np.float64)
        ce = ce.reshape(B, K)
        m1[:, m - 1], m2[:, m - 1] = ce.mean(1), (ce**2).mean(1)
    return m1, m2


def _pooled(var_BxM, m_M, share_M):
    """[B] variance per pass of shares ``share_M`` of the passes: sum_m var / (m^2 share)."""
    terms = np.divide(var_BxM / m_M**2, share_M, out=np.zeros_like(var_BxM), where=share_M > 0)
    return terms.sum(1)


def ideal_rows(m1, m2, budget):
    """Exact variance per forward pass (mean over sequences) of each allocation."""
    B, n = m1.shape
    ms = np.arange(1, n + 1)
    mu = (m1 / ms).sum(1)
    var_m = np.maximum(m2 - m1**2, 0.0)
    sd_m = np.sqrt(var_m)
    H = float(np.sum(1.0 / ms))
    rows = {
        "time_free": H * (m2 / ms).sum(1) - mu**2,
        "k_dce": n * (m2 / ms**2).sum(1) - mu**2,
        "stratified": n * (var_m / ms**2).sum(1),
    }
    a_pool = np.sqrt(var_m[:, :-1].mean(0)) / ms[:-1]
    share = a_pool / a_pool.sum()
    rows["neyman pooled (ideal)"] = _pooled(var_m[:, :-1], ms[:-1], share) * (1 + 1 / budget)
    rows["neyman per sequence (ideal)"] = (sd_m[:, :-1] / ms[:-1]).sum(1) ** 2 * (1 + 1 / budget)
    E = [0, n - 2]  # m = 1 and n - 1 (n is in every neyman row already)
    keep = [i for i in range(n - 1) if i not in E]
    cost = 1 + 2 * n
    a_k = np.sqrt(var_m[:, keep].mean(0)) / ms[keep]
    rows["neyman pooled + enumerate m in {1,n-1,n}"] = (
        _pooled(var_m[:, keep], ms[keep], a_k / a_k.sum()) * (1 + cost / budget))
    rows["neyman per seq. + enumerate {1,n-1,n}"] = (sd_m[:, keep] / ms[keep]).sum(1) ** 2 * (1 + cost / budget)
    return {k: float(np.mean(v)) for k, v in rows.items()}, mu


def measured(den, x, target, budget, key, names=("time_free", "k_dce", "stratified", "neyman")):
    """{name: (variance per pass, max |bias| / SE or None, forward passes, exact)} from likelihood.nll."""
    n = masked.common_target_count(target, "x")
    out = {}
    for i, name in enumerate(names):
        S = budget // n if name in ("stratified", "neyman") else budget
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            est = lk.nll(den, x, jax.random.fold_in(key, i), estimator=name, num_samples=S,
                         target_BxL=target, batch_size=4096)
        out[name] = est
    return out


def pure_neyman(den, x, target, budget, key):
    """neyman without enumerating strata other than m = n (the allocation alone)."""
    n = masked.common_target_count(target, "x")
    S = budget // n
    proc = lk.masked_process("neyman", None, int(den.vocab_size))
    pilot = dataclasses.replace(proc, spec=dataclasses.replace(proc.spec, plan=masked.NeymanPlan(n, pilot=True)))
    r, k = masked.pilot_rounds(x.shape[0], n, budget)
    s_p = r * (n - 1)
    pv = lk.estimate(pilot, den, x[None, :k], target[:k], jax.random.fold_in(key, 99), s_p, 4096)[0]
    plan = masked.neyman_plan(pv, n, S, enumerate_strata=False)
    planned = dataclasses.replace(proc, spec=dataclasses.replace(proc.spec, plan=plan))
    est = lk.nll(den, x, key, process=planned, num_samples=plan.num_samples, target_BxL=target, batch_size=4096)
    est.forward_passes += -(-s_p * k // x.shape[0])
    return est, pv


def fmt_measured(ests, truth, ref="time_free"):
    rows = []
    base = np.mean(ests[ref].variance_per_forward_pass)
    for name, e in ests.items():
        v = float(np.mean(e.variance_per_forward_pass))
        if truth is not None:
            zs = "exact" if e.is_exact else f"{np.max(np.abs((e.mean - truth) / e.stderr)):.2f}"
        else:
            zs = "-"
        rows.append([name, f"{v:.4f}", f"{base / v:.1f}x" if v > 0 else "inf (exact)", zs, e.forward_passes,
                     e.num_samples])
    return table(["estimator", "var / pass", f"{ref} / it", "max |bias|/SE", "passes / seq", "samples"], rows)


def dna128(key):
    rng = np.random.default_rng(FLAGS.seed)
    tab = oracles.random_tabular(rng, "ACGT", 8, 128, 0.5)
    x = tab.sample(rng, FLAGS.num_sequences)
    target = np.ones(x.shape, bool)
    m1, m2 = exact_strata(tab, x, target)
    ideal, mu = ideal_rows(m1, m2, FLAGS.budget)
    np.testing.assert_allclose(mu, -tab.log_prob(x), rtol=1e-5)  # the stratified identity, exactly
    tf = ideal["time_free"]
    print(f"\n== DNA-128 recipe: {FLAGS.num_sequences} sequences of length 8, exact variance per forward pass "
          f"(enumeration; budget {FLAGS.budget} passes)")
    print(table(["allocation", "var / pass (exact)", "time_free / it"],
                [[k, f"{v:.4f}", f"{tf / v:.1f}x"] for k, v in ideal.items()]))
    ests = measured(tab, x, target, FLAGS.budget, key)
    ests["neyman (no enumeration)"] = pure_neyman(tab, x, target, FLAGS.budget, key)[0]
    small = 128
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ests[f"neyman at {small} passes"] = lk.nll(tab, x, jax.random.fold_in(key, 7), estimator="neyman",
                                                    num_samples=small // 8, batch_size=4096)
    print(f"\nmeasured by likelihood.nll ({FLAGS.budget} passes per sequence; neyman enumerates all 255 subsets "
          "when they fit)")
    print(fmt_measured(ests, -tab.log_prob(x)))


def markov4(key):
    if os.path.exists(FLAGS.markov_table):
        mk = oracles.MarkovOracle.from_json(FLAGS.markov_table, seq_len=32)
        what = f"table {os.path.abspath(FLAGS.markov_table)}"
    else:
        mk = oracles.random_markov(np.random.default_rng(FLAGS.seed), "ACGT", 4, 0.5, seq_len=32)
        what = "a random order-4 chain (temperature 0.5; the paper's table was not found)"
    rng = np.random.default_rng(FLAGS.seed + 1)
    x = mk.sample(rng, FLAGS.num_sequences)
    target = np.zeros(x.shape, bool)
    target[:, 16:] = True
    truth = -mk.cond_log_prob(x, target)
    print(f"\n== Markov-4 conditional: {what}; {FLAGS.num_sequences} pairs, 16-symbol prompt -> 16-symbol "
          f"response; measured at {FLAGS.budget} passes per pair")
    ests = measured(mk, x, target, FLAGS.budget, key)
    est, _ = pure_neyman(mk, x, target, FLAGS.budget, key)
    ests["neyman (no enumeration)"] = est
    print(fmt_measured(ests, truth, ref="stratified"))
    # Ideal pooled vs per-sequence allocation from a large pilot (64 draws per stratum).
    proc = lk.masked_process("neyman", None, 4)
    pilot = dataclasses.replace(proc, spec=dataclasses.replace(proc.spec, plan=masked.NeymanPlan(16, pilot=True)))
    pv = lk.estimate(pilot, mk, x[None], target, jax.random.fold_in(key, 5), 64 * 15, 4096)[0].reshape(len(x), 64, 15)
    var_m = pv.var(1, ddof=1)
    ms = np.arange(1, 16)
    a_pool = np.sqrt(var_m.mean(0)) / ms
    pooled = np.mean(_pooled(var_m, ms, a_pool / a_pool.sum()))
    perseq = np.mean((np.sqrt(var_m) / ms).sum(1) ** 2)
    strat = np.mean(16 * (var_m / ms**2).sum(1))
    print(table(["allocation (from a 64-draw pilot, m = 1..15)", "var / pass", "stratified / it"],
                [["stratified (equal)", f"{strat:.4f}", "1.0x"], ["neyman pooled", f"{pooled:.4f}", f"{strat / pooled:.2f}x"],
                 ["neyman per sequence", f"{perseq:.4f}", f"{strat / perseq:.2f}x"]]))


def trained(key):
    from configs import masked_text

    mk = oracles.random_markov(np.random.default_rng(FLAGS.seed + 2), "ACGT", order=2, temperature=0.3, seq_len=16)
    c = masked_text.get_config()
    c.data.seq_len, c.data.vocab_size = 16, 4
    c.model.update(dict(num_layers=2, num_heads=2, width=64, mlp_ratio=2, time_conditioning=False))
    c.optim.update(dict(lr=3e-3, warmup_steps=20, decay="constant", ema_decay=0.99))
    c.train.update(dict(batch_size=128, num_steps=FLAGS.train_steps))
    task = tasks.make_task(c)
    opt = training.make_optimizer(c)
    mesh = training.make_mesh()
    state = training.init_train_state(task.init_params, opt, jax.random.PRNGKey(0), mesh)
    step = training.make_train_step(task, opt, mesh)
    rng = np.random.default_rng(FLAGS.seed + 3)
    t0 = time.time()
    for s in range(FLAGS.train_steps):
        state, _ = step(state, mk.sample(rng, 128), jax.random.PRNGKey(s))
    den = task.denoiser(state.ema_params)
    x = mk.sample(rng, FLAGS.num_sequences)
    target = np.ones(x.shape, bool)
    print(f"\n== trained model: 2 x 64 time-free transformer, {FLAGS.train_steps} steps on an order-2 chain of "
          f"length 16 ({time.time() - t0:.0f} s); exact NLL {np.mean(-mk.log_prob(x)):.3f} nats; measured at "
          f"{FLAGS.budget} passes per sequence")
    ests = measured(den, x, target, FLAGS.budget, key)
    ests["neyman (no enumeration)"] = pure_neyman(den, x, target, FLAGS.budget, key)[0]
    print(fmt_measured(ests, None, ref="stratified"))
    print("model NLL by estimator (all estimate the same quantity): " + ", ".join(
        f"{k} {np.mean(e.mean):.3f} ± {e.split_mean()['stderr_mc']:.3f}" for k, e in ests.items()))


def main(argv):
    del argv
    key = jax.random.PRNGKey(FLAGS.seed)
    dna128(jax.random.fold_in(key, 1))
    markov4(jax.random.fold_in(key, 2))
    if not FLAGS.skip_trained:
        trained(jax.random.fold_in(key, 3))


if __name__ == "__main__":
    app.run(main)
