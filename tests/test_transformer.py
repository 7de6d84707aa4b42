"""Tests for infodiff.networks.transformer (tiny models, CPU-fast)."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from infodiff.networks.transformer import (
    Transformer,
    apply_rope,
    count_params,
    flops_per_token,
)

V = 5
L = 8
B = 3


def _model(**kw):
    cfg = dict(vocab_size=V, seq_len=L, num_layers=2, num_heads=2, width=32)
    cfg.update(kw)
    return Transformer(**cfg)


def _tokens(key, b=B, l=L):
    # ids in [0, V]; V is MASK
    return jax.random.randint(key, (b, l), 0, V + 1, dtype=jnp.int32)


# Eager flax calls are used on purpose: JAX caches each compiled primitive by
# shape, and all tiny models here share shapes, so eager is cheaper overall on
# small CPUs than compiling one XLA program per model config.  The training
# step and the jit test are jitted.
def _init(model, z, t=None):
    return model.init(jax.random.key(0), z, t)


def _apply(model, variables, z, t=None, *, train=False, rngs=None):
    return model.apply(variables, z, t, train=train, rngs=rngs)


def _perturb(variables, seed, scale=0.5):
    """Adds N(0, scale^2) noise to every parameter (makes the zero head non-zero).

    Noise comes from numpy, not jax.random: eager jax.random per leaf shape
    costs an XLA compile each, which dominated the test time.
    """
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(np.asarray(x) + scale * rng.standard_normal(x.shape), x.dtype),
        variables)


def test_output_shape_dtype_normalised():
    model = _model()
    z = _tokens(jax.random.key(1))
    variables = _perturb(_init(model, z), 2)
    out = _apply(model, variables, z)
    assert out.shape == (B, L, V)
    assert out.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(out)))
    assert bool(jnp.all(out <= 0.0))
    np.testing.assert_allclose(np.exp(np.asarray(out)).sum(-1), 1.0, rtol=1e-5)
    # the head really is non-trivial after perturbation (so the check is meaningful)
    assert float(jnp.std(out)) > 1e-2


@pytest.mark.slow
def test_shorter_sequence_accepted():
    model = _model()
    z = _tokens(jax.random.key(1))
    variables = _init(model, z)
    # jit: new shapes are cheaper as one XLA program than op by op
    out = jax.jit(model.apply)(variables, z[:, :5])
    assert out.shape == (B, 5, V)
    assert out.dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.parametrize("time_conditioning", [False, True])
def test_init_output_is_minus_log_v(time_conditioning):
    model = _model(time_conditioning=time_conditioning)
    z = _tokens(jax.random.key(1))
    t = jnp.linspace(0.1, 0.9, B)
    variables = _init(model, z, t)
    out = _apply(model, variables, z, t)
    expected = jnp.full((B, L, V), -jnp.log(jnp.float32(V)), jnp.float32)
    assert bool(jnp.all(out == expected)), out
    np.testing.assert_allclose(np.asarray(out), -np.log(V), rtol=1e-7)


@pytest.mark.slow
def test_bidirectional_after_training_step():
    model = _model()
    z = _tokens(jax.random.key(1))
    variables = _init(model, z)
    params = variables["params"]
    target = jax.random.randint(jax.random.key(3), z.shape, 0, V)

    def loss_fn(p):
        lp = _apply(model, {"params": p}, z)
        return -jnp.mean(jnp.take_along_axis(lp, target[..., None], axis=-1))

    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    loss0 = None
    for _ in range(3):
        params, state, loss = step(params, state)
        loss0 = loss if loss0 is None else loss0
    assert float(loss_fn(params)) < float(loss0)

    j = 6
    z2 = z.at[0, j].set((z[0, j] + 1) % (V + 1))  # change example 0 only
    out1 = _apply(model, {"params": params}, z)
    out2 = _apply(model, {"params": params}, z2)
    diff_BxL = jnp.max(jnp.abs(out1 - out2), axis=-1)
    # examples do not interact
    assert float(jnp.max(diff_BxL[1:])) == 0.0
    diff = diff_BxL[0]  # [L]
    # information flows backwards (i < j) ...
    assert float(diff[0]) > 1e-6
    assert float(diff[j - 1]) > 1e-6
    # ... and forwards (i > j)
    assert float(diff[j + 1]) > 1e-6


@pytest.mark.slow
def test_time_free_ignores_t():
    model = _model(time_conditioning=False)
    z = _tokens(jax.random.key(1))
    variables = _perturb(_init(model, z), 2)
    out_none = _apply(model, variables, z)
    out_a = _apply(model, variables, z, jnp.full((B,), 0.1))
    out_b = _apply(model, variables, z, jnp.full((B,), 0.9))
    # wrong-shaped t is ignored too
    out_c = _apply(model, variables, z, jnp.zeros((7, 2)))
    assert float(jnp.std(out_none)) > 1e-2
    np.testing.assert_array_equal(np.asarray(out_none), np.asarray(out_a))
    np.testing.assert_array_equal(np.asarray(out_none), np.asarray(out_b))
    np.testing.assert_array_equal(np.asarray(out_none), np.asarray(out_c))
    assert "time_mlp_in" not in variables["params"]


@pytest.mark.slow
def test_time_conditioned_depends_on_t():
    model = _model(time_conditioning=True)
    z = _tokens(jax.random.key(1))
    t = jnp.full((B,), 0.2)
    variables = _perturb(_init(model, z, t), 2)
    out_a = _apply(model, variables, z, jnp.full((B,), 0.2))
    out_b = _apply(model, variables, z, jnp.full((B,), 0.7))
    assert float(jnp.max(jnp.abs(out_a - out_b))) > 1e-3
    # per-example conditioning: changing t of example 0 only changes example 0
    out_c = _apply(model, variables, z, jnp.array([0.7, 0.2, 0.2]))
    assert float(jnp.max(jnp.abs(out_c[0] - out_a[0]))) > 1e-3
    np.testing.assert_allclose(np.asarray(out_c[1:]), np.asarray(out_a[1:]), atol=1e-6)


def test_per_token_times():
    """t [B, L] (per-token adaLN, the same parameters): equal times in a row give the per-row
    output to float rounding; a token's own time changes the output (at every token, through
    attention), and the per-row program is unchanged by the per-token path's existence."""
    model = _model(time_conditioning=True)
    z = _tokens(jax.random.key(1))
    variables = _perturb(_init(model, z, jnp.full((B,), 0.2)), 2)
    t_B = jnp.array([0.1, 0.4, 0.9])
    out_row = _apply(model, variables, z, t_B)
    out_tok = _apply(model, variables, z, jnp.broadcast_to(t_B[:, None], (B, L)))
    np.testing.assert_allclose(np.asarray(out_tok), np.asarray(out_row), rtol=0, atol=2e-5)
    t_BxL = jnp.broadcast_to(t_B[:, None], (B, L)).at[0, 0].set(0.0)  # token 0 of row 0 clean
    out_one = _apply(model, variables, z, t_BxL)
    assert float(jnp.max(jnp.abs(out_one[0, 0] - out_row[0, 0]))) > 1e-3
    np.testing.assert_allclose(np.asarray(out_one[1:]), np.asarray(out_row[1:]), rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match=r"one per token"):
        model.apply(variables, z, jnp.zeros((B, L + 1)))


@pytest.mark.slow
def test_dropout_only_in_train():
    model = _model(dropout=0.3)
    z = _tokens(jax.random.key(1))
    variables = _perturb(_init(model, z), 2)
    eval1 = _apply(model, variables, z)
    eval2 = _apply(model, variables, z, train=False)
    np.testing.assert_array_equal(np.asarray(eval1), np.asarray(eval2))
    tr1 = _apply(model, variables, z, train=True, rngs={"dropout": jax.random.key(10)})
    tr2 = _apply(model, variables, z, train=True, rngs={"dropout": jax.random.key(11)})
    assert float(jnp.max(jnp.abs(tr1 - eval1))) > 1e-4
    assert float(jnp.max(jnp.abs(tr1 - tr2))) > 1e-4
    np.testing.assert_allclose(np.exp(np.asarray(tr1)).sum(-1), 1.0, rtol=1e-5)
    # dropout=0 model: train=True is a no-op and needs no rng
    model0 = _model()
    np.testing.assert_array_equal(
        np.asarray(_apply(model0, variables, z, train=True)), np.asarray(eval1))


# bfloat16 keeps 8 significand bits: each rounding is off by at most 2^-9 ~ 0.002 relative. The
# tiny model below (perturbation 0.1) has log-probs of magnitude ~3, and a few layers of rounded
# activations move them by ~0.01-0.02 (measured over seeds, both attentions); 0.05 nats
# bounds that with margin, while an error in the float32 policy (e.g. a log_softmax in bf16 of
# logits without the float32 cast) is caught by the dtype assertions instead.
BF16_ATOL = 5e-2


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["einsum", "dot_product"])
def test_bfloat16_runs_float32_output(attention):
    z = _tokens(jax.random.key(1))
    model32 = _model(time_conditioning=True)
    model16 = _model(time_conditioning=True, dtype=jnp.bfloat16, attention=attention)
    t = jnp.linspace(0.0, 1.0, B)
    variables = _perturb(_init(model32, z, t), 2, scale=0.1)
    variables16 = _init(model16, z, t)
    # params stay float32 regardless of compute dtype (and have the float32 model's names)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(variables16))
    assert jax.tree.structure(variables16) == jax.tree.structure(variables)
    for output in ("log_softmax", "logits"):
        out16 = _apply(model16.clone(output=output), variables, z, t)
        out32 = _apply(model32.clone(output=output), variables, z, t)
        assert out16.dtype == jnp.float32 and out16.shape == (B, L, V)
        assert bool(jnp.all(jnp.isfinite(out16)))
        # bf16 is close to, but not bit-identical with, float32
        err = float(jnp.max(jnp.abs(out16 - out32)))
        assert 0.0 < err < BF16_ATOL, err
    out16 = _apply(model16, variables, z, t)
    np.testing.assert_allclose(np.exp(np.asarray(out16)).sum(-1), 1.0, rtol=1e-5)
    # the gradient of a float32 loss through the bf16 network is float32, like the params
    grads = jax.grad(lambda v: jnp.sum(model16.apply(v, z, t) * jnp.arange(V, dtype=jnp.float32)))(variables)
    assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.slow
@pytest.mark.parametrize("time_conditioning", [False, True])
def test_dot_product_attention_matches_einsum(time_conditioning):
    """attention='dot_product' (jax.nn.dot_product_attention, token-major) is the einsum path's
    function on the same parameters: outputs and gradients to float32 rounding, and with bf16
    both are as close to float32 as bf16 allows."""
    z = _tokens(jax.random.key(5))
    t = jnp.asarray([0.1, 0.5, 0.9], jnp.float32)
    ein = _model(time_conditioning=time_conditioning, num_heads=4)
    dot = ein.clone(attention="dot_product")
    variables = _perturb(_init(ein, z, t), 6, scale=0.1)
    # no parameter of its own: the same tree, names, shapes and initial values
    init_dot = _init(dot, z, t)
    assert jax.tree.structure(init_dot) == jax.tree.structure(variables)
    for a, b in zip(jax.tree.leaves(init_dot), jax.tree.leaves(_init(ein, z, t))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def loss(model, v):
        return jnp.sum(model.apply(v, z, t) * jnp.arange(V, dtype=jnp.float32))

    out = {m.attention: np.asarray(jax.jit(lambda v, m=m: m.apply(v, z, t))(variables)) for m in (ein, dot)}
    np.testing.assert_allclose(out["dot_product"], out["einsum"], rtol=1e-5, atol=1e-5)
    g_ein = jax.jit(jax.grad(lambda v: loss(ein, v)))(variables)
    g_dot = jax.jit(jax.grad(lambda v: loss(dot, v)))(variables)
    for a, b in zip(jax.tree.leaves(g_dot), jax.tree.leaves(g_ein)):
        scale = max(1.0, float(np.abs(np.asarray(b)).max()))
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5 * scale)
    for m in (ein, dot):
        out16 = np.asarray(m.clone(dtype=jnp.bfloat16).apply(variables, z, t))
        assert out16.dtype == np.float32
        np.testing.assert_allclose(out16, out["einsum"], atol=BF16_ATOL)


def test_unknown_attention_and_dtype_are_refused_at_construction():
    with pytest.raises(ValueError, match=r"attention='flash'; choose from \('einsum', 'dot_product'\)"):
        _model(attention="flash")
    for bad in ("int8", jnp.int32, "float64", "bf16"):
        with pytest.raises(ValueError, match="is not a compute dtype"):
            _model(dtype=bad)
    for ok in ("float32", "bfloat16", "float16", jnp.float32, jnp.bfloat16):
        _model(dtype=ok)


@pytest.mark.slow
def test_jit_matches_eager():
    model = _model(time_conditioning=True)
    z = _tokens(jax.random.key(1))
    t = jnp.linspace(0.1, 0.9, B)
    variables = _perturb(_init(model, z, t), 2)
    f = jax.jit(lambda v, z, t: model.apply(v, z, t))
    out_jit = f(variables, z, t)
    out_eager = model.apply(variables, z, t)
    np.testing.assert_allclose(np.asarray(out_jit), np.asarray(out_eager), rtol=1e-5, atol=1e-5)


def test_shape_errors():
    model = _model()
    z = _tokens(jax.random.key(1))
    variables = _init(model, z)
    with pytest.raises(ValueError, match=r"\(3, 9\)"):
        model.apply(variables, jnp.zeros((3, L + 1), jnp.int32))
    with pytest.raises(ValueError, match=r"\(24,\)"):
        model.apply(variables, jnp.zeros((B * L,), jnp.int32))
    with pytest.raises(ValueError, match=r"\(1, 3, 8\)"):
        model.apply(variables, jnp.zeros((1, B, L), jnp.int32))
    with pytest.raises(TypeError, match="float32"):
        model.apply(variables, jnp.zeros((B, L), jnp.float32))
    with pytest.raises(TypeError, match="bool"):
        model.apply(variables, jnp.zeros((B, L), bool))
    # also raised under jit (checks are at trace time)
    with pytest.raises(ValueError, match=r"\(3, 9\)"):
        jax.jit(lambda z: model.apply(variables, z))(jnp.zeros((3, L + 1), jnp.int32))


def test_time_errors():
    model = _model(time_conditioning=True)
    z = _tokens(jax.random.key(1))
    t = jnp.full((B,), 0.5)
    variables = _init(model, z, t)
    with pytest.raises(ValueError, match="None"):
        model.apply(variables, z)
    with pytest.raises(ValueError, match=r"\(4,\)"):
        model.apply(variables, z, jnp.zeros((B + 1,)))
    with pytest.raises(ValueError, match=r"\(3, 1\)"):
        model.apply(variables, z, jnp.zeros((B, 1)))
    with pytest.raises(ValueError, match=r"\(\)"):
        model.apply(variables, z, jnp.float32(0.5))


@pytest.mark.slow
def test_rope_relative_positions():
    K, n = 16, 12
    kq, kk = jax.random.split(jax.random.key(0))
    q_K = jax.random.normal(kq, (K,))
    k_K = jax.random.normal(kk, (K,))
    # the same q (k) vector placed at every position: [1, n, 1, K]
    Q = jnp.broadcast_to(q_K, (1, n, 1, K))
    Kt = jnp.broadcast_to(k_K, (1, n, 1, K))
    rope = jax.jit(apply_rope)  # one compile, reused for every offset

    def scores(offset):
        pos = jnp.arange(n) + offset
        rq = np.asarray(rope(Q, pos))[0, :, 0]
        rk = np.asarray(rope(Kt, pos))[0, :, 0]
        return rq @ rk.T, rq  # S[i, j] = <rope(q, i+offset), rope(k, j+offset)>

    S0, rq0 = scores(0)
    # shifting both positions by s leaves every score unchanged
    for s in (1, 37, 1000):
        np.testing.assert_allclose(scores(s)[0], S0, rtol=1e-4, atol=1e-4)
    # equivalently S is Toeplitz: S[i, j] depends only on j - i
    np.testing.assert_allclose(S0[1:, 1:], S0[:-1, :-1], rtol=1e-5, atol=1e-5)
    # ... but it does depend on j - i
    assert abs(S0[0, 1] - S0[0, 5]) > 1e-3
    # position 0 is the identity; rotations preserve norms
    np.testing.assert_array_equal(rq0[0], np.asarray(q_K))
    np.testing.assert_allclose(np.linalg.norm(rq0, axis=-1), float(jnp.linalg.norm(q_K)), rtol=1e-5)
    # rotate-half pairing: feature 0 is paired with feature K/2
    E = jnp.zeros((1, n, 1, K)).at[..., 0].set(1.0)
    r = np.asarray(rope(E, jnp.arange(n)))[0, 1, 0]  # position 1
    assert set(np.flatnonzero(np.abs(r) > 1e-7).tolist()) == {0, K // 2}
    np.testing.assert_allclose(r[0], np.cos(1.0), rtol=1e-6)
    np.testing.assert_allclose(r[K // 2], np.sin(1.0), rtol=1e-6)
    with pytest.raises(ValueError, match="even"):
        apply_rope(jnp.zeros((1, 1, 1, 5)), jnp.array([0]))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(jnp.zeros((1, 4, 1, 4)), jnp.arange(3))


def test_count_params_and_flops():
    model = Transformer(vocab_size=4, seq_len=8, num_layers=8, num_heads=8, width=256)
    z = jnp.zeros((1, 8), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), z)["params"]
    D, F = 256, 1024
    per_layer = 3 * D * D + D * D + (D * F + F) + (F * D + D) + 2 * 2 * D
    expected = 5 * D + 8 * per_layer + 2 * D + (D * 4 + 4)
    assert count_params(params) == expected == 6_312_708
    assert flops_per_token(model) == 6 * (expected - 5 * D) + 12 * 8 * D * 8
    # time conditioning adds per-sequence params that are excluded from FLOPs/token
    model_t = Transformer(vocab_size=4, seq_len=8, num_layers=8, num_heads=8, width=256,
                          time_conditioning=True)
    params_t = jax.eval_shape(model_t.init, jax.random.key(0), z, jnp.zeros((1,)))["params"]
    assert count_params(params_t) > count_params(params)
    assert flops_per_token(model_t) == flops_per_token(model)


@pytest.mark.parametrize("time_conditioning", [pytest.param(False, marks=pytest.mark.slow), True])
def test_matches_the_reference_transformer(time_conditioning):
    """Same parameters, same outputs as the transformer as first written (plain jnp,
    benchmarks/plain_transformer.py), so a faster layout cannot change the function."""
    from benchmarks.plain_transformer import reference_forward

    model = _model(time_conditioning=time_conditioning, num_layers=2, num_heads=4, width=32)
    z = _tokens(jax.random.key(7), b=3, l=L)
    t = jnp.asarray([0.1, 0.5, 0.9], jnp.float32)
    variables = _perturb(_init(model, z, t), 8, scale=0.3)
    for output in ("log_softmax", "logits"):
        got = jax.jit(lambda v, z, t: model.clone(output=output).apply(v, z, t))(variables, z, t)
        want = reference_forward(variables["params"], z, t, num_layers=2, num_heads=4, output=output)
        # float32 rounding of a different summation order, relative to the outputs' scale
        scale = float(np.abs(np.asarray(want)).max())
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5 * scale)
    # The parameter gradients too (the library writes out LayerNorm's and the matmuls'):
    # against autodiff of the reference, 1e-5 of each leaf's largest entry. Perturbed less than
    # above: at scale 0.3 the time-conditioned network's float32 gradients, the reference's as
    # much as the library's, are up to 7e-4 of a leaf's scale from float64 ones (measured);
    # at 0.1 both are within 2e-5.
    variables = _perturb(_init(model, z, t), 8, scale=0.1)
    w_V = jnp.arange(V, dtype=jnp.float32)
    got_g = jax.grad(lambda v: jnp.sum(model.apply(v, z, t) * w_V))(variables)["params"]
    want_g = jax.grad(lambda p: jnp.sum(reference_forward(p, z, t, num_layers=2, num_heads=4) * w_V))(
        variables["params"])
    assert jax.tree.structure(got_g) == jax.tree.structure(want_g)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got_g), jax.tree.leaves(want_g)):
        b = np.asarray(b)
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5 * np.abs(b).max(),
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.parametrize("shape_IxO", [(48, 16), (16, 48)])
def test_layer_norm_and_linear_gradients_are_autodiffs(shape_IxO):
    """The written-out gradients of ``layer_norm`` (vs flax's LayerNorm) and of ``linear``
    (vs ``x @ w``; both orientations of the kernel gradient) equal autodiff's."""
    from infodiff.networks.transformer import layer_norm, linear
    import flax.linen as nn

    I, O = shape_IxO
    kx, kw, ks, kb, kg = jax.random.split(jax.random.key(11), 5)
    x_NxI = 3.0 + 2.0 * jax.random.normal(kx, (2, 5, I))  # offset mean: the centring matters
    scale_I, bias_I = 1 + 0.5 * jax.random.normal(ks, (I,)), jax.random.normal(kb, (I,))
    w_IxO = jax.random.normal(kw, (I, O)) / np.sqrt(I)
    g_NxO = jax.random.normal(kg, (10, O))

    def ours(x, s, b, w):
        return jnp.sum(linear(layer_norm(x, s, b).reshape(10, I), w) * g_NxO)

    def autodiff(x, s, b, w):
        y = nn.LayerNorm(epsilon=1e-5).apply({"params": {"scale": s, "bias": b}}, x)
        return jnp.sum((y.reshape(10, I) @ w) * g_NxO)

    args = (x_NxI, scale_I, bias_I, w_IxO)
    np.testing.assert_allclose(ours(*args), autodiff(*args), rtol=1e-5)
    for a, b in zip(jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3)))(*args),
                    jax.grad(autodiff, argnums=(0, 1, 2, 3))(*args)):
        b = np.asarray(b)
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5 * np.abs(b).max())


@pytest.mark.slow
def test_softmax_gradient_is_autodiffs():
    """The written-out gradient of ``softmax`` (from its output alone) equals autodiff's of
    ``jax.nn.softmax``, also for rows with -inf and very large scores; the values are jax's."""
    from infodiff.networks.transformer import softmax

    ks, kg = jax.random.split(jax.random.key(12))
    s_BxQxL = 4.0 * jax.random.normal(ks, (3, 5, 7))
    s_BxQxL = s_BxQxL.at[0, 0, :3].set(-jnp.inf).at[1, 2].multiply(1e4)
    g_BxQxL = jax.random.normal(kg, (3, 5, 7))
    got, got_vjp = jax.vjp(softmax, s_BxQxL)
    want, want_vjp = jax.vjp(lambda s: jax.nn.softmax(s, axis=-1), s_BxQxL)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    (a,), (b,) = jax.jit(got_vjp)(g_BxQxL), want_vjp(g_BxQxL)
    assert np.isfinite(np.asarray(a)).all()
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_query_blocked_attention_has_the_dense_values_and_gradients(monkeypatch):
    """Long sequences run attention by rematerialised query blocks (memory); with blocks of 4 of
    an L = 8 sequence the outputs and the parameter gradients are the dense ones (and the
    reference transformer's)."""
    from benchmarks.plain_transformer import reference_forward
    from infodiff.networks import transformer as tr

    model = _model(num_layers=2, num_heads=2, width=32)
    z = _tokens(jax.random.key(3), b=2, l=L)
    variables = _perturb(_init(model, z), 4, scale=0.3)

    def loss(v):
        return jnp.sum(model.apply(v, z) * jnp.arange(V, dtype=jnp.float32))

    out, grads = {}, {}
    monkeypatch.setattr(tr, "ATTENTION_BLOCK_MIN_BYTES", 0)
    for block in (0, 4):
        monkeypatch.setattr(tr, "ATTENTION_QUERY_BLOCK", block)
        out[block] = np.asarray(jax.jit(lambda v: model.apply(v, z))(variables))
        jaxpr = str(jax.make_jaxpr(lambda v: model.apply(v, z))(variables))
        assert ("scan" in jaxpr) == (block == 4)  # the blocks really run (a lax.map over them)
        grads[block] = jax.jit(jax.grad(loss))(variables)
    np.testing.assert_allclose(out[4], out[0], rtol=1e-5, atol=1e-5)
    want = reference_forward(variables["params"], z, None, num_layers=2, num_heads=2)
    np.testing.assert_allclose(out[4], np.asarray(want), rtol=1e-5, atol=1e-5)
    # Both paths' gradients against autodiff of the reference; float32 sums of B * L terms, so
    # the absolute tolerance scales with each leaf's largest entry (1e-5 of it, ~100 ulp).
    ref_grads = jax.grad(lambda p: jnp.sum(reference_forward(p, z, None, num_layers=2, num_heads=2)
                                           * jnp.arange(V, dtype=jnp.float32)))(variables["params"])
    for path, want_g in jax.tree_util.tree_leaves_with_path(ref_grads):
        want_g = np.asarray(want_g)
        for block in (0, 4):
            got = np.asarray(functools.reduce(lambda d, k: d[k.key], path, grads[block]["params"]))
            np.testing.assert_allclose(got, want_g, rtol=1e-4, atol=1e-5 * np.abs(want_g).max(),
                                       err_msg=f"query block {block}, {jax.tree_util.keystr(path)}")
