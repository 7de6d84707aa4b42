"""The mask-law registry (infodiff/processes/masking.py): one contract that every registered law
passes, generated over the registry, and a throwaway law registered only here that goes through
the same contract and shows up everywhere the library lists estimators.

Adding an estimator is one module in infodiff/processes/mask_laws/ like the ``LinearM`` class
below: a :class:`masking.MaskLaw` subclass with a ``name``, a ``draw`` and the facts it declares,
and a ``register_law`` call.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import likelihood as lk
from infodiff import scoring
from infodiff.processes import masked, masking
from infodiff.tasks import masked as masked_task


class LinearM(masking.MaskLaw):
    """A throwaway estimator: m ~ q(m) ∝ m on {1..n} (large masks favoured), a uniform m-subset of
    the targets, weight 1 / (m q(m)) = n (n + 1) / (2 m^2): unbiased by the stratified identity
    -log p = sum_m (1/m) E_{|S| = m}[C_S] (arXiv 2510.24088 Eq. 15 with another law of m)."""

    name = "linear_m"
    min_samples = 64

    def draw(self, spec, keys, target_BxL, n_B, sample_B):
        B, L = target_BxL.shape
        n = jnp.maximum(n_B, 1).astype(jnp.float32)
        m_L = jnp.arange(1, L + 1, dtype=jnp.float32)
        cdf_BxL = m_L * (m_L + 1) / (n * (n + 1))[:, None]        # P(m' <= m) = m (m + 1) / (n (n + 1))
        u_B = jax.random.uniform(keys.u, (B,))
        m_B = jnp.clip(1 + jnp.sum(cdf_BxL < u_B[:, None], axis=-1), 1, jnp.maximum(n_B, 1)).astype(jnp.int32)
        mask = masking.subset_mask(keys.mask, target_BxL, m_B) & target_BxL
        w = jnp.where(n_B > 0, n * (n + 1) / (2.0 * m_B.astype(jnp.float32) ** 2), 0.0).astype(jnp.float32)
        return mask, masking.frac_time(spec, m_B, n_B), w


THROWAWAY = LinearM()
LAWS = [*masking.LAWS, THROWAWAY.name]  # the registered laws at collection, and the throwaway


@pytest.fixture(autouse=True, scope="module")
def throwaway_law():
    masking.register_law(THROWAWAY)
    yield THROWAWAY
    masking.unregister_law(THROWAWAY.name)


@pytest.fixture(scope="module")
def table():
    return masked_task.contract_table()  # 4-letter tabular law, L = 6, 4 items, exact -log p


def _ready(process, target, num_samples):
    """The process with its plan (a law that plans first plans without a pilot here)."""
    return process.plan(None, target, num_samples)[0] if process.needs_plan else process


def _within(est, truth, label):
    if est.is_exact:
        np.testing.assert_allclose(est.mean, truth, rtol=1e-5, atol=1e-5, err_msg=label)
        return
    z = (est.mean - truth) / est.stderr
    pooled = np.sum(est.mean - truth) / np.sqrt(np.sum(est.stderr**2))  # the items' total: 2x more sensitive
    assert np.all(np.isfinite(z)) and np.all(np.abs(z) < 4) and abs(pooled) < 4, \
        f"{label}: z {z}, pooled z {pooled}, est {est.mean}, truth {truth}"


@pytest.mark.parametrize("name", LAWS)
def test_law_declares_what_the_process_reads(name):
    law = masking.law(name)
    assert isinstance(law, masking.MaskLaw) and law.name == name
    assert isinstance(law.min_samples, int) and law.min_samples >= 2
    for flag in (law.objective, law.one_pass, law.per_input_targets, law.antithetic, law.finite_T,
                 law.exact_boundaries):
        assert isinstance(flag, bool), (name, flag)
    process = lk.masked_process(name, vocab_size=4)
    assert process.estimator == name and process.min_samples == law.min_samples
    assert process.per_input_targets == law.per_input_targets
    assert isinstance(process.infinite_variance, bool)


@pytest.mark.parametrize("name", LAWS)
def test_draw_stays_inside_the_target_with_finite_weights(name):
    """Masks inside the target, t in [0, 1], finite weights >= 0; a row without targets (where the
    law takes rows of different target counts) contributes 0; the same key gives the same draw."""
    target = np.zeros((96, 10), bool)
    target[:, 2:] = True  # a 2-token context, n = 8 (neyman: not every subset fits 16 rounds)
    if masking.law(name).one_pass:
        target[:5] = False  # rows without targets
        target[5:20, 8:] = False  # rows with fewer
    process = _ready(lk.masked_process(name, vocab_size=4), target, 16)
    assert process.passes_per_sample(target) >= 1
    sample_R = jnp.arange(len(target), dtype=jnp.int32) % 4
    noise = process.draw_noise(jax.random.PRNGKey(0), jnp.asarray(target), sample_R)
    mask, t, w = (np.asarray(a) for a in (noise.mask, noise.t, noise.weight))
    assert mask.dtype == bool and mask.shape == target.shape and t.shape == w.shape == (len(target),)
    assert t.dtype == np.float32 and w.dtype == np.float32
    assert not np.any(mask & ~target)
    assert np.all((t >= 0) & (t <= 1)) and np.all(np.isfinite(w)) and np.all(w >= 0)
    uniform = lambda params, z, t: jnp.full(z.shape + (4,), -np.log(4.0), jnp.float32)  # noqa: E731
    x = jnp.zeros(target.shape, jnp.int32)
    values = np.asarray(process.integrand(uniform, None, x, noise, jnp.asarray(target)))
    assert np.all(np.isfinite(values)) and np.all(values[~target.any(1)] == 0)
    again = process.draw_noise(jax.random.PRNGKey(0), jnp.asarray(target), sample_R)
    np.testing.assert_array_equal(np.asarray(again.mask), mask)


@pytest.mark.filterwarnings("ignore:lambda_dce has infinite variance")
@pytest.mark.parametrize("name", LAWS)
def test_unbiased_against_the_exact_tabular_law(name, table):
    """-log p(x) and -log p(x[target] | x[rest]) within 4 SE of the exact values (unless the law
    declares infinite variance: then only finite), at a budget of 512 passes per item."""
    tab, x, truth = table
    process = lk.masked_process(name, vocab_size=tab.vocab_size)
    target = np.ones(x.shape, bool)
    target[:, :2] = False
    budget = lambda tgt: max(8, 512 // process.passes_per_sample(tgt))  # noqa: E731
    full = np.ones(x.shape, bool)
    est = lk.nll(tab, x, jax.random.PRNGKey(1), process=process, num_samples=budget(full))
    cond = lk.nll(tab, x, jax.random.PRNGKey(2), process=process, target_BxL=target, num_samples=budget(target))
    if process.infinite_variance:
        assert np.all(np.isfinite(est.mean)) and np.all(np.isfinite(cond.mean))
        return
    _within(est, truth, f"{name} unconditional")
    _within(cond, -tab.cond_log_prob(x, target), f"{name} conditional")


@pytest.mark.parametrize("name", LAWS)
def test_an_objective_is_a_training_loss(name, table):
    """A law that declares itself a training objective gives a finite one-sample loss per row
    through diffusion_loss; another is refused there, naming the objectives."""
    tab, x, _ = table
    spec = masked.MaskSpec(name=name, exact_boundaries=False)
    if not masking.law(name).objective:
        with pytest.raises(ValueError, match="not a training objective"):
            masked.diffusion_loss(tab, jnp.asarray(x), jax.random.PRNGKey(0), spec, tab.vocab_size)
        return
    loss = np.asarray(masked.diffusion_loss(tab, jnp.asarray(x), jax.random.PRNGKey(0), spec, tab.vocab_size))
    assert loss.shape == (len(x),) and np.all(np.isfinite(loss)) and np.all(loss >= 0)


def test_a_registered_law_is_listed_wherever_estimators_are():
    """The registry is the one list: the estimator names, the scorers' estimators (one pass per
    sample), the contract cases; a second registration of a name replaces the first, and an
    unregistered name is refused naming the registered ones."""
    name = THROWAWAY.name
    assert name in lk.ESTIMATORS and name in masked.ESTIMATORS and name not in masked.OBJECTIVES
    assert masked.MIN_SAMPLES[name] == THROWAWAY.min_samples
    assert name in scoring.SCORING_ESTIMATORS and name in masked_task.SCORING_ESTIMATORS
    assert f"masked:{name}" in [c.name for c in masked_task.contract_cases()]
    assert masked_task.scoring_process(name, None, 4).estimator == name
    with pytest.raises(ValueError, match="unknown estimator/objective 'no_such_law'; choose from"):
        masked.MaskSpec(name="no_such_law")


def test_register_law_refuses_a_law_without_a_name_or_a_usable_min_samples():
    class Nameless(masking.MaskLaw):
        pass

    class TooFew(LinearM):
        name = "too_few"
        min_samples = 1

    with pytest.raises(ValueError, match="name must be a non-empty string"):
        masking.register_law(Nameless())
    with pytest.raises(ValueError, match="min_samples=1 must be >= 2"):
        masking.register_law(TooFew())
    assert "too_few" not in masking.LAWS
