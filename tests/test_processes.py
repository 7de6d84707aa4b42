"""Contract tests run over every process (as optax's alias_test runs over its optimizers).

For each process under test, with an exact oracle denoiser:
  * the Monte Carlo estimate is within 4 SE of the exact -log p (per item and in total);
  * the training loss (the integrand under the training noise law) has the same mean as the
    exact value it estimates, within 4 SE;
  * the noise never reads the data (the coupled ratio shares it), and the integrand of every
    row is finite;
  * the Estimate's terms add up to its mean;
  * a row-wise process gives the same values when the driver evaluates a call in slices.
Resume (bit-identical) is tested per process in test_training.py; the report schema in
test_evaluation.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import denoisers
from infodiff import likelihood as lk
from infodiff import oracles, schedules
from infodiff.data import count_synthetic as cs
from infodiff.processes import base, masked, poisson
from infodiff.processes import score_entropy as se


@dataclasses.dataclass
class Case:
    name: str
    process: object           # estimation noise law
    train_process: object     # training noise law (None: no training law to compare)
    denoiser: object
    x: np.ndarray
    truth: np.ndarray         # exact -log p(x) per item
    train_truth: np.ndarray   # what the training loss estimates (truth minus exact terms it omits)
    num_samples: int


def _cases():
    tab = oracles.random_tabular(np.random.default_rng(0), "ACGT", 6, 32)
    x = tab.sample(np.random.default_rng(1), 4)
    truth = -tab.log_prob(x)
    V = tab.vocab_size
    lin = schedules.LinearSchedule()
    out = []
    for est in ("t_dce", "k_dce", "time_free", "stratified"):
        train = None
        if est in masked.OBJECTIVES:  # t_dce's training form (no boundary pieces) is a bound: skip
            spec = masked.MaskSpec(est, lin, exact_boundaries=False, antithetic=False)
            train = masked.MaskedProcess(spec, V) if est != "t_dce" else None
        out.append(Case(f"masked:{est}", lk.masked_process(est, lin, V), train, tab, x, truth, truth,
                        128 if est == "stratified" else 1024))
    loglin = schedules.LogLinearSchedule()
    lam_max = loglin.lambda_max
    for graph, law in (("absorb", "defensive"), ("uniform", "importance")):
        proc = se.ScoreEntropyProcess(graph=graph, vocab_size=V, noise_law=law, lam_max=lam_max)
        train = se.ScoreEntropyProcess(graph=graph, vocab_size=V, noise_law="time", schedule=loglin,
                                       antithetic=False)
        den = se.OracleScore(tab, graph)
        prior = proc.exact_terms(*denoisers.split(den), x, np.ones(x.shape, bool), 64)["prior"]
        out.append(Case(f"sedd:{graph}", proc, train, den, x, truth, truth - prior, 1024))
    dist = cs.get_distribution("zip", max_count=12)
    sc = poisson.CountScaling(12, 1.0, 2.0)
    orc = dist.oracle(sc, dim=1)
    counts = np.asarray(dist.sample(np.random.default_rng(2), 4, dim=1)).reshape(4, 1)
    loc, scale, clip = poisson.suggest_logistic(sc.scale(counts), sc.spacing)
    proc = poisson.estimation_process(4096, "logistic", loc, scale, clip, scaling=sc)
    train = poisson.PoissonProcess(loc=loc, scale=scale, clip=clip)
    xs = sc.scale(counts)
    ptruth = -dist.log_prob(counts[:, 0])
    out.append(Case("poisson:logistic", proc, train, orc, xs, ptruth, None, 4096))
    return out


CASES = _cases()
IDS = [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_estimate_within_4se_of_exact(case):
    est = lk.nll(case.denoiser, case.x, jax.random.PRNGKey(3), process=case.process,
                 num_samples=case.num_samples, batch_size=4096)
    z = (est.mean - case.truth) / est.stderr
    assert np.all(np.abs(z) < 4), (case.name, z)
    total_z = (est.mean.sum() - case.truth.sum()) / np.sqrt(np.sum(est.stderr**2))
    assert abs(total_z) < 4, (case.name, total_z)
    assert np.all(est.stderr > 0) and np.all(est.stderr < 0.2 * np.abs(case.truth).max() + 0.05), "no power"
    np.testing.assert_allclose(est.terms["total"], est.diffusion + est.prior + est.recon)
    np.testing.assert_allclose(est.split_mean()["mean"], est.mean.mean())


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c.train_process is not None],
                         ids=[c.name for c in CASES if c.train_process is not None])
def test_training_loss_has_the_estimated_mean(case):
    """The training loss is the same integrand under the training noise law: its mean with the
    exact denoiser is the quantity it estimates (the whole NLL, or the NLL without the exact
    prior term for SEDD's time law)."""
    apply_fn, params = denoisers.split(case.denoiser)
    n = 4096
    x = jnp.asarray(np.repeat(case.x, n, axis=0))
    loss = np.asarray(base.training_loss(case.train_process, apply_fn, params, x, jax.random.PRNGKey(5)),
                      np.float64).reshape(len(case.x), n)
    m, s = loss.mean(1), loss.std(1, ddof=1) / np.sqrt(n)
    truth = case.train_truth if case.train_truth is not None else case.truth
    assert np.all(np.abs(m - truth) < 4 * s + 2e-3), (case.name, m, truth, s)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_noise_does_not_read_the_data(case):
    """draw_noise sees only the target and the sample indices, so two inputs can share it."""
    tgt = jnp.ones(case.x.shape, bool)
    s_R = jnp.arange(case.x.shape[0], dtype=jnp.int32)
    a = case.process.draw_noise(jax.random.PRNGKey(0), tgt, s_R)
    b = case.process.draw_noise(jax.random.PRNGKey(0), tgt, s_R)
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if jnp.issubdtype(la.dtype, jax.dtypes.prng_key):
            la, lb = jax.random.key_data(la), jax.random.key_data(lb)
        np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))
    apply_fn, params = denoisers.split(case.denoiser)
    v = case.process.integrand(apply_fn, params, jnp.asarray(case.x), a, tgt)
    assert v.shape == (case.x.shape[0],) and bool(jnp.all(jnp.isfinite(v)))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_process_is_hashable_and_named(case):
    assert hash(case.process) == hash(dataclasses.replace(case.process))
    assert isinstance(case.process, base.Process)
    assert case.process.chunk_order in base.CHUNK_ORDERS and case.process.estimator
    assert isinstance(case.process.row_wise, bool)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c.process.row_wise],
                         ids=[c.name for c in CASES if c.process.row_wise])
def test_slices_change_speed_only(case):
    """The driver's sliced evaluation (lax.map over 3-row slices of a 4 x 5 = 20-row call: a
    ragged last slice) gives the values of one evaluation: the noise is drawn for the whole
    call, so the random stream is that of the unsliced driver."""
    apply_fn, params = denoisers.split(case.denoiser)
    x = jnp.asarray(case.x)[None]
    tgt = jnp.ones(case.x.shape, bool)
    per = case.process.passes_per_sample(np.asarray(tgt))
    args = (case.process, apply_fn, params, jax.random.PRNGKey(4), 0, x, tgt, 5, per)
    whole = np.asarray(lk._chunk_values(*args, 0))
    for rows in (3, 4):
        np.testing.assert_allclose(np.asarray(lk._chunk_values(*args, rows)), whole, rtol=1e-6, atol=1e-6)
    a = lk.estimate(case.process, case.denoiser, np.asarray(x), np.asarray(tgt), jax.random.PRNGKey(6), 7, 10,
                    rows_per_slice=0)
    b = lk.estimate(case.process, case.denoiser, np.asarray(x), np.asarray(tgt), jax.random.PRNGKey(6), 7, 10,
                    rows_per_slice=3)
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
