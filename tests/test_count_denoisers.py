"""Tests for infodiff.networks.count_denoisers (Poisson-diffusion denoiser networks)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import count_oracles
from infodiff.networks import count_denoisers as cd
from infodiff.processes import poisson

SCALING = poisson.CountScaling(4)  # counts 0..4 -> {1, 1.25, 1.5, 1.75, 2}
LAT = SCALING.lattice()


def _init(model, D, seed=0):
    init = jax.jit(lambda k: model.init(k, jnp.zeros((1, D)), jnp.zeros((1,)))["params"])
    return init(jax.random.key(seed))


@pytest.mark.slow
@pytest.mark.parametrize("arch,shape,kw,head", [
    ("mlp", (2,), dict(hidden=16), "categorical"),
    ("mlp", (2,), dict(hidden=16), "sigmoid"),
    ("mlp", (2,), dict(hidden=16), "softplus"),
    # the heads are shared code (head_mean); the image / roll nets are checked with one head
    ("conv", (4, 6), dict(channels=8, num_blocks=1), "categorical"),
    ("seqconv", (5, 8), dict(channels=16, num_blocks=2), "sigmoid"),
])
def test_shapes_and_positivity(arch, shape, kw, head):
    model = cd.make_count_model(arch, shape, LAT, head=head, **kw)
    D = int(np.prod(shape))
    alpha = jnp.array([-30.0, -5.0, 0.0, 8.0, 18.0, 40.0])
    gamma = np.exp(np.asarray(alpha, np.float64))
    z = np.minimum(np.random.default_rng(0).poisson(np.minimum(gamma, 1e12)[:, None] * 1.5, (6, D)), 2**31 - 1)
    z = jnp.asarray(z, jnp.float32)

    @jax.jit  # one compilation: init, random (non-zero) output layers, forward pass
    def run(key):
        params = model.init(key, jnp.zeros((1, D)), jnp.zeros((1,)))["params"]
        params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.key(1), p.shape), params)
        return params, cd.CountDenoiser(model, params).apply_params(params, z, alpha)

    params, out = run(jax.random.key(0))
    out = np.asarray(out)
    assert out.shape == (6, D) and out.dtype == np.float32
    assert np.all(np.isfinite(out)) and np.all(out > 0)
    if head != "softplus":
        assert np.all(out >= 1.0) and np.all(out <= 2.0)
    if arch == "mlp":  # eager __call__ == jitted apply_params (up to float32 re-association)
        np.testing.assert_allclose(np.asarray(cd.CountDenoiser(model, params)(z, alpha)), out,
                                   rtol=1e-5, atol=1e-6)


def test_categorical_head_with_true_prior_is_the_exact_posterior_mean():
    """f = 0 and prior_logits = log pmf: the head IS E[X | Z] of the pmf (ground truth: oracle)."""
    probs = np.array([0.1, 0.4, 0.05, 0.25, 0.2])
    model = cd.make_count_model("mlp", (3,), LAT, hidden=8)
    params = _init(model, 3)  # output layer is zero-initialised -> f = 0
    params = dict(params, prior_logits=jnp.asarray(np.log(probs)[None].repeat(3, 0), jnp.float32))
    den = cd.CountDenoiser(model, params)
    orc = count_oracles.ProductCountOracle(LAT, probs, dim=3)
    rng = np.random.default_rng(1)
    alpha = np.linspace(-12, 14, 40).astype(np.float32)
    x = LAT[rng.choice(5, size=(40, 3), p=probs)]
    z = rng.poisson(np.exp(alpha.astype(np.float64))[:, None] * x)
    got = np.asarray(den(jnp.asarray(z, jnp.float32), jnp.asarray(alpha)))
    want = orc.posterior_mean_np(z, np.exp(alpha.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    # at high SNR the output sits exactly on the lattice (zero PRL at x)
    hi = np.asarray(den(jnp.asarray(np.round(1e7 * x[:4]), jnp.float32), jnp.full((4,), np.log(1e7), jnp.float32)))
    np.testing.assert_array_equal(hi, x[:4].astype(np.float32))


def test_snr_embedding_and_errors():
    e = cd.snr_embedding(jnp.array([0.0, 1.0]), 8)
    assert e.shape == (2, 8)
    np.testing.assert_allclose(np.asarray(e[0]), [0, 0, 0, 0, 1, 1, 1, 1], atol=1e-7)
    with pytest.raises(ValueError, match="even"):
        cd.snr_embedding(jnp.zeros(2), 7)
    with pytest.raises(ValueError, match="unknown count denoiser arch 'transformer'"):
        cd.make_count_model("transformer", (2,), LAT)
    with pytest.raises(ValueError, match="unknown denoiser head 'relu'"):
        cd.make_count_model("mlp", (2,), LAT, head="relu")
    with pytest.raises(ValueError, match="increasing and > 0"):
        cd.make_count_model("mlp", (2,), [0.0, 1.0])
    with pytest.raises(ValueError, match="needs an \\(H, W\\)"):
        cd.make_count_model("conv", (16,), LAT)
    model = cd.make_count_model("conv", (4, 4), LAT, channels=8, num_blocks=1)
    with pytest.raises(ValueError, match="D=15"):
        model.init(jax.random.key(0), jnp.zeros((1, 15)), jnp.zeros((1,)))


@pytest.mark.slow
def test_gradients_flow_through_every_head():
    model = cd.make_count_model("mlp", (2,), LAT, hidden=8)
    params = _init(model, 2)
    x = jnp.asarray(LAT[[1, 3]])[None].repeat(4, 0)

    def loss(p):
        den = lambda z, a: model.apply({"params": p}, z.astype(jnp.float32), a)  # noqa: E731
        return poisson.diffusion_loss(den, jax.random.key(0), x, 2.0, 3.0, 4.0).mean()

    g = jax.jit(jax.grad(loss))(params)
    norms = jax.tree.map(lambda v: float(jnp.abs(v).sum()), g)
    assert all(np.isfinite(v) for v in jax.tree.leaves(norms))
    assert norms["prior_logits"] > 0
