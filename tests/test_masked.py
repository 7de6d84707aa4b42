"""Masked process: mask samplers, objectives, categorical and ancestral samplers."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import likelihood as lk
from infodiff import oracles, schedules
from infodiff.processes import masked


@pytest.mark.parametrize("name", masked.ESTIMATORS)
def test_masks_stay_inside_target(name):
    plan = masked.neyman_plan(None, 6, 4, enumerate_strata=False) if name == "neyman" else None
    spec = masked.MaskSpec(name=name, plan=plan)
    target = np.zeros((512, 10), bool)
    target[:, 4:] = True
    target[:5] = False  # rows without target positions
    mask, t, w = masked.draw_masks(spec, jax.random.PRNGKey(0), jnp.asarray(target))
    mask, t, w = map(np.asarray, (mask, t, w))
    assert not np.any(mask & ~target)
    assert np.all((t >= 0) & (t <= 1))
    assert np.all(np.isfinite(w)) and np.all(w >= 0)
    if name in ("time_free", "k_dce"):
        assert np.all(mask[5:].sum(1) >= 1)  # at least one mask when n > 0
        assert np.all(w[:5] == 0)


@pytest.mark.slow
def test_time_free_mask_count_law():
    """P(m) = (1/m) / H_n on {1..n}, including m = n (the all-masked case)."""
    n, N = 6, 200_000
    spec = masked.MaskSpec(name="time_free")
    mask, _, w = masked.draw_masks(spec, jax.random.PRNGKey(1), jnp.ones((N, n), bool))
    m = np.asarray(mask).sum(1)
    freq = np.bincount(m, minlength=n + 1)[1:] / N
    expected = (1 / np.arange(1, n + 1)) / masked.harmonic(n)
    assert np.all(np.abs(freq - expected) < 4 * np.sqrt(expected / N)), (freq, expected)
    assert freq[-1] > 0
    np.testing.assert_allclose(np.asarray(w), masked.harmonic(n), rtol=1e-6)


def test_k_dce_subset_is_uniform():
    N, n = 60_000, 5
    spec = masked.MaskSpec(name="k_dce")
    mask, _, w = masked.draw_masks(spec, jax.random.PRNGKey(2), jnp.ones((N, n), bool))
    mask, w = np.asarray(mask), np.asarray(w)
    m = mask.sum(1)
    np.testing.assert_allclose(w, n / m, rtol=1e-6)
    for k in range(1, n + 1):
        rows = mask[m == k]
        # every position equally likely to be masked given k
        np.testing.assert_allclose(rows.mean(0), k / n, atol=4 * np.sqrt(0.25 / len(rows)))


@pytest.mark.slow
def test_categorical_sampler_matches_probabilities_including_rare():
    p = np.array([0.9, 0.0999, 1e-4, 0.0], np.float64)
    p[-1] = 1 - p[:-1].sum() if 1 - p[:-1].sum() > 0 else 0
    logp = jnp.log(jnp.asarray(p / p.sum(), jnp.float32))
    N = 400_000
    draws = np.asarray(masked.sample_categorical(jax.random.PRNGKey(3), jnp.broadcast_to(logp, (N, 4))))
    freq = np.bincount(draws, minlength=4) / N
    assert np.all(np.abs(freq - p / p.sum()) <= 4 * np.sqrt(p / N) + 1e-9), freq
    assert freq[2] > 0


@pytest.mark.slow
def test_exponentials_reach_far_below_float32_resolution():
    # A rare category wins the race when its exponential variate is tiny. Float32 uniforms
    # (spacing 2^-23) cannot produce E below ~1e-7 (MD4 App. G); two words reach ~1e-20.
    hi = jnp.asarray([0, 0, 1, 2**31], jnp.uint32)
    lo = jnp.asarray([0, 1000, 0, 0], jnp.uint32)
    e = np.asarray(masked.exponential_from_bits(hi, lo), np.float64)
    np.testing.assert_allclose(e[:3], [0.5 * 2.0**-64, 1000.5 * 2.0**-64, 2.0**-32], rtol=1e-5)
    assert e[3] == pytest.approx(np.log(2), rel=1e-6)
    assert e[0] < 1e-19 and np.all(np.isfinite(e))


def _tv_of_sampler(tab, steps, n=20_000, seed=0):
    x = masked.ancestral_sample(tab, jax.random.PRNGKey(seed), n, tab.seq_len, tab.vocab_size,
                                schedules.LinearSchedule(), steps)
    x = np.asarray(x)
    idx = {tuple(r): k for k, r in enumerate(tab.seqs)}
    counts = np.zeros(len(tab.probs))
    outside = 0
    for r in map(tuple, x):
        if r in idx:
            counts[idx[r]] += 1
        else:
            outside += 1
    return 0.5 * (np.abs(counts / n - tab.probs).sum() + outside / n)


@pytest.mark.slow
def test_ancestral_sampler_converges_to_data_distribution():
    tab = oracles.random_tabular(np.random.default_rng(5), "AB", seq_len=4, num_seqs=6, temperature=0.3)
    tvs = [_tv_of_sampler(tab, s) for s in (1, 4, 64)]
    # Sampling-noise floor: TV of an exact sampler with n draws is about sqrt(K / (2 pi n)).
    floor = np.sqrt(len(tab.probs) / (2 * np.pi * 20_000))
    assert tvs[0] > tvs[1] > tvs[2] or tvs[2] < 3 * floor, tvs
    assert tvs[2] < 3 * floor, (tvs, floor)
    assert tvs[0] > 5 * floor, tvs


@pytest.mark.slow
def test_finite_T_elbo_is_an_upper_bound_that_tightens():
    """MD4's discrete-time ELBO with exact conditionals: >= -log p(x), -> -log p(x) as T grows."""
    tab = oracles.random_tabular(np.random.default_rng(6), "ACGT", seq_len=6, num_seqs=32)
    x = tab.sample(np.random.default_rng(7), 2)
    truth = -tab.log_prob(x)
    tgt = np.ones(x.shape, bool)

    def finite_T(T, key):
        spec = masked.MaskSpec("t_dce", schedules.LinearSchedule(), finite_T=T)
        vals = lk.estimate(masked.MaskedProcess(spec, 4), tab, x[None], tgt, jax.random.PRNGKey(key), 8192, 4096)[0]
        return vals.mean(1), vals.std(1, ddof=1) / np.sqrt(vals.shape[1])

    m2, s2 = finite_T(2, 1)
    m256, s256 = finite_T(256, 2)
    assert np.all((m2 - truth) / s2 > 4)          # T = 2 is a loose bound
    assert np.all(np.abs(m256 - truth) < 4 * np.sqrt(s256**2) + 0.02 * truth)


def test_diffusion_loss_shapes_and_mask_id():
    tab = oracles.random_tabular(np.random.default_rng(8), "ACGT", seq_len=6, num_seqs=16)
    x = jnp.asarray(tab.sample(np.random.default_rng(9), 8))
    seen = {}

    def den(z, t):
        seen["z"] = z
        return tab(z, t)

    loss = masked.diffusion_loss(den, x, jax.random.PRNGKey(0), masked.MaskSpec("k_dce"), 4)
    assert loss.shape == (8,) and np.all(np.isfinite(np.asarray(loss)))
    z = np.asarray(seen["z"])
    assert set(np.unique(z)) <= {0, 1, 2, 3, 4} and (z == 4).any()
