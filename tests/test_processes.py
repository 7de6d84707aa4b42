"""Contract tests run over every registered process (as optax's alias_test runs over its
optimizers): each registration's ``contract_cases()`` (infodiff/tasks), the test-only one of
tests/conftest.py included, so a new registration gets them with no edit here.

For each estimator with an exact oracle denoiser:
  * the Monte Carlo estimate is within 4 SE of the exact -log p (per item and in total), except
    for a process flagged ``infinite_variance`` (its SE means nothing);
  * the training loss (the integrand under the training noise law) has the same mean as the
    exact value it estimates, within 4 SE;
  * the noise never reads the data (the coupled ratio shares it), and the integrand of every
    row is finite;
  * the Estimate's terms add up to its mean;
  * a row-wise process gives the same values when the driver evaluates a call in slices.
A process that ``needs_plan`` (neyman) draws its noise only through its pilot and plan stages:
the noise and slice checks take the other cases (its stages: tests/test_protocol.py).
Resume (bit-identical) is generated per registration in test_training.py; the report schema in
test_evaluation.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import denoisers, tasks
from infodiff import likelihood as lk
from infodiff.processes import base

CASES = [case for reg in tasks.REGISTRY.values() for case in reg.contract_cases()]
IDS = [c.name for c in CASES]


def _params(cases):
    return [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else []) for c in cases]


def test_every_registration_has_contract_cases_and_the_test_only_one_is_generated():
    names = {c.name.split(":")[0] for c in CASES}
    assert names == set(tasks.REGISTRY), (names, tuple(tasks.REGISTRY))
    assert {"test_masked:k_dce", "masked:lambda_dce", "masked:neyman"} <= set(IDS)
    assert len(IDS) == len(set(IDS))


@pytest.mark.parametrize("case", _params(CASES))
def test_estimate_within_4se_of_exact(case):
    est = lk.nll(case.denoiser, case.x, jax.random.PRNGKey(3), process=case.process,
                 num_samples=case.num_samples, batch_size=4096)
    assert np.all(np.isfinite(est.mean))
    if est.is_exact:  # every stratum enumerated (neyman at L = 6): the exact value, SE 0
        np.testing.assert_allclose(est.mean, case.truth, rtol=1e-5)
        assert np.all(est.stderr == 0)
    else:
        assert np.all(est.stderr > 0)
    if not est.is_exact and not case.process.infinite_variance:
        z = (est.mean - case.truth) / est.stderr
        assert np.all(np.abs(z) < 4), (case.name, z)
        total_z = (est.mean.sum() - case.truth.sum()) / np.sqrt(np.sum(est.stderr**2))
        assert abs(total_z) < 4, (case.name, total_z)
        assert np.all(est.stderr < 0.2 * np.abs(case.truth).max() + 0.05), "no power"
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
@pytest.mark.parametrize("case", [c for c in CASES if not c.process.needs_plan],
                         ids=[c.name for c in CASES if not c.process.needs_plan])
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
@pytest.mark.parametrize("case", [c for c in CASES if c.process.row_wise and not c.process.needs_plan],
                         ids=[c.name for c in CASES if c.process.row_wise and not c.process.needs_plan])
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
