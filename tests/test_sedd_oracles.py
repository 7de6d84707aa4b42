"""Exact SEDD score ratios of the oracles vs brute-force enumeration of the noised law.

Ground truth: enumerate every clean sequence x (V^L of them), build the noised law
p_lam(z) = sum_x p0(x) prod_i K_lam(z_i | x_i) as a dense tensor by applying the per-token
kernel along each axis, and take ratios p_lam(z with z_i := v) / p_lam(z) directly.
"""

import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import oracles

EPS32 = float(np.finfo(np.float32).eps)
# float32 jax output is also checked finite at each (all z, zero transitions included)
LAMS = [1e-6, 1e-3, 0.3, 0.999, 1 - 1e-7, 1.0]
F64_TOL = 1e-10  # float64 log-ratios of magnitude <= 90: round-off ~1e-13


# ---------------------------------------------------------------------------------------------
# Brute force
# ---------------------------------------------------------------------------------------------
def _p0_tensor_tabular(tab):
    T = np.zeros((tab.vocab_size,) * tab.seq_len)
    T[tuple(tab.seqs.T)] = tab.probs
    return T


def _p0_tensor_markov(mk, L):
    """p(x) = sum_{s0} pi(s0) prod_j P(x_j | s_{j-1}) for every x, straight from the tables."""
    V, S = mk.vocab_size, mk.vocab_size**mk.order
    xs = np.array(list(itertools.product(range(V), repeat=L)))
    p = np.zeros(len(xs))
    for s0 in range(S):
        w = np.full(len(xs), mk.stationary[s0])
        s = np.full(len(xs), s0)
        for j in range(L):
            w = w * mk.trans[s, xs[:, j]]
            s = (s * V + xs[:, j]) % S
        p += w
    return p.reshape((V,) * L)


def _kernel(lam, graph, V):
    """K[z, x] = K_lam(z | x): [V, V] uniform, [V + 1, V] absorb (last row MASK)."""
    if graph == "uniform":
        return (1 - lam) * np.eye(V) + lam / V
    return np.vstack([(1 - lam) * np.eye(V), np.full((1, V), lam)])


def _noised_tensor(T, lam, graph, V):
    K = _kernel(lam, graph, V)
    for ax in range(T.ndim):
        T = np.moveaxis(np.tensordot(K, T, axes=([1], [ax])), 0, ax)
    return T


def _all_z(graph, V, L):
    Z = V + 1 if graph == "absorb" else V
    return np.array(list(itertools.product(range(Z), repeat=L)), np.int32)


def _brute_log_score(N, z_BxL, V, graph):
    """Brute-force log s* with the documented convention (absorb unmasked -> LOG_ZERO, floor)."""
    pz = N[tuple(z_BxL.T)]
    out = np.zeros(z_BxL.shape + (V,))
    with np.errstate(divide="ignore"):
        for i in range(z_BxL.shape[1]):
            for v in range(V):
                z2 = z_BxL.copy()
                z2[:, i] = v
                out[:, i, v] = np.log(N[tuple(z2.T)]) - np.log(pz)
    if graph == "absorb":
        out = np.where((z_BxL == V)[..., None], out, oracles.LOG_ZERO)
    return np.maximum(out, oracles.LOG_ZERO)


def _f32_tol(lam, L):
    """float32 round-off budget for log-ratios: L log-space steps on log-weights of size
    |log lam|, plus the rounding of log(1 - lam) in log a (absorb near lam = 1; at lam = 1
    the outputs are exact: 0 for uniform, LOG_ZERO for absorb)."""
    lam = np.asarray(lam, np.float64)
    with np.errstate(divide="ignore"):
        l1m = np.abs(np.log1p(-lam))
    return 8 * EPS32 * (L * (1.0 + np.abs(np.log(lam))) + np.where(np.isfinite(l1m), l1m, 0.0))


_jit_log_score = {}


def _jnp_log_score(orc, z, lam, graph):
    key = (id(orc), graph)
    if key not in _jit_log_score:
        _jit_log_score[key] = jax.jit(lambda z, l, o=orc, g=graph: o.log_score(z, l, g))
    return np.asarray(_jit_log_score[key](jnp.asarray(z), jnp.asarray(lam, jnp.float32)), np.float64)


# ---------------------------------------------------------------------------------------------
# Oracles under test
# ---------------------------------------------------------------------------------------------
def _periodic_markov():
    """Deterministic 3-cycle a -> b -> c -> a (period 3): every transition row one-hot."""
    P = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], float)
    return oracles.MarkovOracle(P, "abc")


def _sparse_order2_markov():
    """Order 2, V = 2, zeros in the table; context 'bb' is transient (stationary mass 0):
    aa -> b, ab -> a, ba -> a or b, bb -> a."""
    P = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5], [1.0, 0.0]])
    return oracles.MarkovOracle(P, "ab")


_CASES = {}


def _case(name):
    """Oracles are built once per session, so jitted calls are reused across tests."""
    if name not in _CASES:
        _CASES[name] = _case_makers()[name]()
    return _CASES[name]


def _case_makers():
    return {
        "tabular": lambda: (oracles.random_tabular(np.random.default_rng(0), "ACGT", 5, 60), 5),
        "markov1": lambda: (oracles.random_markov(np.random.default_rng(1), "ACGT", 1), 5),
        "markov2": lambda: (oracles.random_markov(np.random.default_rng(2), "abc", 2), 6),
        "periodic": lambda: (_periodic_markov(), 6),
        "sparse2": lambda: (_sparse_order2_markov(), 7),
    }


def _p0(orc, L):
    if isinstance(orc, oracles.TabularOracle):
        return _p0_tensor_tabular(orc)
    return _p0_tensor_markov(orc, L)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("case", list(_case_makers()))
@pytest.mark.parametrize("graph", ["uniform", "absorb"])
def test_log_score_matches_enumeration(case, graph):
    orc, L = _case(case)
    V = orc.vocab_size
    T = _p0(orc, L)
    assert T.sum() == pytest.approx(1.0, abs=1e-12)
    z_all = _all_z(graph, V, L)
    zs, lam32s, refs32 = [], [], []
    for lam in LAMS:
        N = _noised_tensor(T, lam, graph, V)
        lam_B = np.full(len(z_all), lam)
        # The noised marginal: exact, and a probability distribution over all z.
        lm = orc.log_noised_marginal(z_all, lam_B, graph)
        pz = N[tuple(z_all.T)]
        assert np.exp(lm).sum() == pytest.approx(1.0, abs=1e-12)
        pos = pz > 0
        np.testing.assert_allclose(lm[pos], np.log(pz[pos]), rtol=0, atol=1e-12)
        assert np.all(np.isneginf(lm[~pos]))
        if graph == "absorb" and lam == 1.0:  # only all-MASK z is possible; its ratios are 0
            assert pos.sum() == 1
        z = z_all[pos]
        brute = _brute_log_score(N, z, V, graph)
        ref = orc.log_score_np(z, lam_B[pos], graph)
        assert ref.dtype == np.float64 and ref.shape == z.shape + (V,)
        np.testing.assert_allclose(ref, brute, rtol=0, atol=F64_TOL)
        if graph == "uniform" and lam == 1.0:
            assert np.all(ref == 0.0)
        # float32 jax is compared with the float64 reference at the float32-rounded lam (the
        # input rounding of lam = 0.999 alone moves log a by 1.3e-5).
        lam32 = np.full(len(z), np.float32(lam))
        zs.append(z)
        lam32s.append(lam32)
        refs32.append(orc.log_score_np(z, lam32.astype(np.float64), graph))
    z, lam32, ref32 = np.concatenate(zs), np.concatenate(lam32s), np.concatenate(refs32)
    got = _jnp_log_score(orc, z, lam32, graph)  # one jitted call for every lam
    assert np.all(np.isfinite(got))
    tol = _f32_tol(lam32, L)[:, None, None]
    err = np.abs(got - ref32)
    assert np.all(err <= tol), f"max err {err.max():.3g} (tol {tol.max():.3g})"
    if graph == "uniform":  # the entry v = z_i is exactly log 1; at lam = 1 every entry
        assert np.all(np.take_along_axis(got, z[..., None], -1) == 0.0)
        assert np.all(got[lam32 == 1.0] == 0.0)
    else:
        assert np.all(got[z != V] == np.float32(oracles.LOG_ZERO))


@pytest.mark.parametrize("case", ["tabular", "markov2", "sparse2"])
def test_absorb_is_scaled_exact_conditional(case):
    """docs/discrete_diffusion.md §5.1: at masked positions s* = a * p0(x_i = v | unmasked z), a = (1 - lam) / lam."""
    orc, L = _case(case)
    V = orc.vocab_size
    rng = np.random.default_rng(5)
    x = orc.sample(rng, 64) if isinstance(orc, oracles.TabularOracle) else orc.sample(rng, 64, L)
    z = np.where(rng.random(x.shape) < 0.6, V, x).astype(np.int32)
    lam = rng.uniform(1e-3, 0.99, size=len(z))
    c = orc.exact_conditionals(z)
    masked = (z == V)[..., None] & (c > 0)
    with np.errstate(divide="ignore"):
        want = np.log((1 - lam) / lam)[:, None, None] + np.log(c)
    ref = orc.log_score_np(z, lam, "absorb")
    np.testing.assert_allclose(ref[np.broadcast_to(masked, ref.shape)],
                               want[np.broadcast_to(masked, ref.shape)], rtol=0, atol=1e-12)
    # probability-0 symbols and unmasked positions are LOG_ZERO
    assert np.all(ref[~np.broadcast_to(masked, ref.shape)] == oracles.LOG_ZERO)
    got = _jnp_log_score(orc, z, lam.astype(np.float32), "absorb")
    call = np.asarray(orc(z))  # the masked-diffusion denoiser, float32 log c*
    want32 = np.log((1 - lam) / lam)[:, None, None] + call
    sel = np.broadcast_to(masked, ref.shape)
    np.testing.assert_allclose(got[sel], want32[sel], rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: _sparse_order2_markov(), lambda: _periodic_markov(),
                                  lambda: oracles.random_markov(np.random.default_rng(3), "ACGT", 4)])
def test_markov_uniform_long_sequence_jit(make):
    """L = 64, batch 64 under jit: float32 agrees with float64; adversarial (random) z with
    zero transitions and lam = 1e-6 gives no NaN. Also times the compiled call."""
    mk = make()
    V, L, B = mk.vocab_size, 64, 64
    rng = np.random.default_rng(11)
    x = mk.sample(rng, B, L)
    # half the rows: a clean chain sample lightly noised; half: uniformly random tokens
    z = np.where(rng.random(x.shape) < 0.05, rng.integers(0, V, x.shape), x)
    z[B // 2:] = rng.integers(0, V, size=(B - B // 2, L))
    z = z.astype(np.int32)
    lam = np.float32(np.geomspace(1e-6, 1.0, B))
    f = jax.jit(lambda z, l: mk.log_score(z, l, "uniform"))
    got = np.asarray(f(z, lam))  # compile
    t0 = time.perf_counter()
    got = np.asarray(jax.block_until_ready(f(z, lam)), np.float64)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"compiled L=64 forward-backward took {elapsed:.2f} s"
    ref = mk.log_score_np(z, lam.astype(np.float64), "uniform")
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(ref))
    tol = _f32_tol(lam, L)[:, None, None]
    err = np.abs(got - ref)
    assert np.all(err <= tol), f"max err {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"
    # normalisation: sum_v K-weighted... the ratio to itself is exactly 1
    assert np.all(np.take_along_axis(got, z[..., None], -1) == 0.0)


@pytest.mark.slow
def test_noised_marginal_markov_matches_tabular_of_enumeration():
    """Markov log p_lam(z) (forward algorithm) equals the tabular one on the enumerated chain."""
    mk = oracles.random_markov(np.random.default_rng(4), "abc", 2)
    L = 4
    seqs = np.array(list(itertools.product(range(3), repeat=L)), np.int32)
    p = np.exp(mk.log_prob(seqs))
    tab = oracles.TabularOracle(seqs, p / p.sum(), "abc")
    rng = np.random.default_rng(0)
    for graph in ("uniform", "absorb"):
        z = rng.integers(0, 3 + (graph == "absorb"), size=(50, L)).astype(np.int32)
        lam = rng.uniform(0, 1, size=50)
        np.testing.assert_allclose(mk.log_noised_marginal(z, lam, graph),
                                   tab.log_noised_marginal(z, lam, graph), rtol=0, atol=1e-12)
        np.testing.assert_allclose(mk.log_score_np(z, np.maximum(lam, 1e-9), graph),
                                   tab.log_score_np(z, np.maximum(lam, 1e-9), graph), rtol=0, atol=1e-10)
    # lam = 0: the clean law
    np.testing.assert_allclose(mk.log_noised_marginal(seqs, np.zeros(len(seqs)), "uniform"),
                               mk.log_prob(seqs), atol=1e-12)


def test_bad_inputs_raise():
    tab = oracles.random_tabular(np.random.default_rng(0), "abc", 3, 5)
    mk = oracles.random_markov(np.random.default_rng(0), "abc", 1)
    z = np.zeros((2, 3), np.int32)
    for orc in (tab, mk):
        with pytest.raises(ValueError, match="unknown graph 'mask'"):
            orc.log_score(z, np.ones(2), "mask")
        with pytest.raises(ValueError, match="unknown graph"):
            orc.log_score_np(z, np.ones(2), "mask")
        with pytest.raises(ValueError, match=r"lam\[1\] = 1.5 is outside \(0, 1\]"):
            orc.log_score_np(z, np.array([0.5, 1.5]), "uniform")
        with pytest.raises(ValueError, match=r"lam\[0\] = 0.0 is outside \(0, 1\]"):
            orc.log_score_np(z, np.array([0.0, 0.5]), "absorb")
        with pytest.raises(ValueError, match=r"lam\[0\] = -0.1 is outside \[0, 1\]"):
            orc.log_noised_marginal(z, np.array([-0.1, 0.5]), "uniform")
        with pytest.raises(ValueError, match=r"z\[0, 1\] = 3 is outside the vocabulary \[0, 3\)"):
            orc.log_score_np(np.array([[0, 3, 0]]), 0.5, "uniform")  # MASK under 'uniform'
        with pytest.raises(ValueError, match="lam must have shape"):
            orc.log_score_np(z, np.ones(3) * 0.5, "uniform")
        with pytest.raises(TypeError):
            orc.log_score_np(z.astype(float), 0.5, "uniform")
    with pytest.raises(ValueError, match="z must have length 3"):
        tab.log_score_np(np.zeros((1, 4), np.int32), 0.5, "uniform")
    with pytest.raises(ValueError, match="z must have length 3"):
        tab.log_score(np.zeros((1, 4), np.int32), 0.5, "uniform")
    # absorb: unmasked tokens impossible under p0 -> undefined ratio
    impossible = next(s for s in itertools.product(range(3), repeat=3)
                      if tuple(s) not in {tuple(r) for r in tab.seqs})
    with pytest.raises(ValueError, match=r"z\[0\] has probability 0"):
        tab.log_score_np(np.array([impossible]), 0.5, "absorb")
    det = _periodic_markov()
    with pytest.raises(ValueError, match=r"z\[0\] has probability 0"):
        det.log_score_np(np.array([[0, 0, 3]]), 0.5, "absorb")


def _noised_tensor_per_position(T, lam_L, graph, V):
    """The noised law with one noise level per position (axis j under K_{lam_j})."""
    for ax, lam in enumerate(lam_L):
        T = np.moveaxis(np.tensordot(_kernel(lam, graph, V), T, axes=([1], [ax])), 0, ax)
    return T


@pytest.mark.parametrize("case", ["tabular", "markov2", "sparse2"])
@pytest.mark.parametrize("graph", ["uniform", "absorb"])
def test_per_position_noise_levels_match_enumeration(case, graph):
    """lam [B, L] (0 = a clean position, 1 = pure noise, else a level): the float64 and float32
    scores and the noised marginal equal brute force on the per-position noised law; a row
    of equal levels gives the per-row result."""
    orc, L = _case(case)
    V = orc.vocab_size
    rng = np.random.default_rng(7)
    T = _p0(orc, L)
    B = 6
    lam = rng.choice([0.0, 1.0, 1e-3, 0.3, 0.9], size=(B, L))
    lam[:, 0] = 0.0 if graph == "uniform" else 0.5  # a clean prompt position (uniform)
    x = np.array(np.unravel_index(rng.choice(T.size, size=B, p=T.ravel()), T.shape)).T.astype(np.int32)
    hit = rng.random((B, L)) < lam
    noise = np.full((B, L), V) if graph == "absorb" else rng.integers(0, V, (B, L))
    z = np.where(hit, noise, x).astype(np.int32)
    for b in range(B):
        N = _noised_tensor_per_position(T, lam[b], graph, V)
        want = _brute_log_score(N, z[b:b + 1], V, graph)
        got = orc.log_score_np(z[b:b + 1], lam[b:b + 1], graph)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
        got32 = np.asarray(orc.log_score(jnp.asarray(z[b:b + 1]), jnp.asarray(lam[b:b + 1], jnp.float32), graph))
        assert np.all(np.isfinite(got32))
        tol = _f32_tol(np.maximum(lam[b], 1e-30), L).max() + 1e-5 * np.abs(want).max()
        ok = want > oracles.LOG_ZERO + 1  # float32 floors may differ near log 0
        np.testing.assert_allclose(got32[ok], want[ok], rtol=0, atol=tol)
        with np.errstate(divide="ignore"):
            np.testing.assert_allclose(orc.log_noised_marginal(z[b:b + 1], lam[b:b + 1], graph),
                                       np.log(N[tuple(z[b])]), rtol=0, atol=1e-10)
    row = np.full((2, L), 0.3)
    np.testing.assert_allclose(orc.log_score_np(z[:2], row, graph), orc.log_score_np(z[:2], row[:, 0], graph),
                               rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match=r"lam\[1, 2\] = -0.5 is outside \[0, 1\]"):
        bad = row.copy()
        bad[1, 2] = -0.5
        orc.log_score_np(z[:2], bad, graph)
