"""Every estimator against exact likelihoods of distributions with exact oracle denoisers.

Tolerances come from the reported standard errors: |estimate - truth| < 4 SE per sequence.
"""

import itertools

import jax
import numpy as np
import pytest

from infodiff import likelihood as lk
from infodiff import oracles
from infodiff import schedules
from infodiff.processes import masked

N_SEQ = 3
N_MC = 1024
Z_MAX = 4.0


@pytest.fixture(scope="module")
def tabular():
    return oracles.random_tabular(np.random.default_rng(10), "ACGT", seq_len=6, num_seqs=64)


@pytest.fixture(scope="module")
def markov2():
    return oracles.random_markov(np.random.default_rng(11), "ACGT", order=2)


@pytest.fixture(scope="module")
def markov4():
    return oracles.random_markov(np.random.default_rng(12), "ACGT", order=4)


def _assert_unbiased(est, truth, label):
    if est.is_exact:  # every mask subset enumerated: float32 forward passes, no Monte Carlo error
        np.testing.assert_allclose(est.mean, truth, rtol=1e-5, atol=1e-5, err_msg=label)
        assert np.all(est.stderr == 0), label
        return
    z = (est.mean - truth) / est.stderr
    assert np.all(np.isfinite(z)), label
    assert np.all(np.abs(z) < Z_MAX), f"{label}: z-scores {z}, est {est.mean}, truth {truth}"


@pytest.mark.filterwarnings("ignore:lambda_dce has infinite variance")
@pytest.mark.parametrize("estimator", lk.ESTIMATORS)
def test_unconditional_tabular(tabular, estimator):
    x = tabular.sample(np.random.default_rng(0), N_SEQ)
    est = lk.nll(tabular, x, jax.random.PRNGKey(1), estimator=estimator, num_samples=N_MC)
    _assert_unbiased(est, -tabular.log_prob(x), f"tabular/{estimator}")
    if estimator == "neyman":  # 2^6 - 1 = 63 subsets < the budget of 1024 x 6 passes: exact
        assert est.is_exact and est.forward_passes == 63 and est.num_samples == 0
        return
    per = x.shape[1] if estimator == "stratified" else 1
    assert est.num_samples == N_MC and est.forward_passes == N_MC * per


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:lambda_dce has infinite variance")
@pytest.mark.parametrize("estimator", lk.ESTIMATORS)
def test_unconditional_markov2(markov2, estimator):
    x = markov2.sample(np.random.default_rng(0), N_SEQ, length=10)
    est = lk.nll(markov2, x, jax.random.PRNGKey(2), estimator=estimator, num_samples=N_MC)
    _assert_unbiased(est, -markov2.log_prob(x), f"markov2/{estimator}")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:lambda_dce has infinite variance")
@pytest.mark.parametrize("estimator", lk.ESTIMATORS)
@pytest.mark.parametrize("chain", ["markov2", "markov4"])
def test_conditional_markov_with_prompt(request, chain, estimator):
    mk = request.getfixturevalue(chain)
    x = mk.sample(np.random.default_rng(3), N_SEQ, length=16)
    prompt, resp = x[:, :8], x[:, 8:]
    target = np.zeros(x.shape, bool)
    target[:, 8:] = True
    truth = -mk.cond_log_prob(x, target)
    # With prompt length >= order the truth is the chain rule of the transition table.
    k = mk.order
    direct = np.zeros(N_SEQ)
    V = mk.vocab_size
    for b in range(N_SEQ):
        s = int(sum(x[b, 8 - k + i] * V ** (k - 1 - i) for i in range(k)))
        for j in range(8, 16):
            direct[b] -= np.log(mk.trans[s, x[b, j]])
            s = (s * V + x[b, j]) % V**k
    np.testing.assert_allclose(truth, direct, rtol=1e-10)
    est = lk.conditional_nll(mk, prompt, resp, jax.random.PRNGKey(4), estimator=estimator,
                             num_samples=N_MC)
    _assert_unbiased(est, truth, f"{chain}/conditional/{estimator}")


def test_conditional_tabular_masks_only_response(tabular):
    x = tabular.sample(np.random.default_rng(5), N_SEQ)
    target = np.zeros(x.shape, bool)
    target[:, 2:] = True
    truth = -tabular.cond_log_prob(x, target)
    est = lk.conditional_nll(tabular, x[:, :2], x[:, 2:], jax.random.PRNGKey(6),
                             estimator="time_free", num_samples=N_MC)
    _assert_unbiased(est, truth, "tabular/conditional")
    # A conditional NLL is smaller than the joint NLL of the same tokens.
    assert np.all(truth < -tabular.log_prob(x))


def _exact_subset_sum(oracle, x_L):
    """sum_m (1/m) E_{|S|=m} C_S, enumerating every subset: = -log p(x) by I-MDCE."""
    L = len(x_L)
    total = 0.0
    V = oracle.vocab_size
    for m in range(1, L + 1):
        subsets = list(itertools.combinations(range(L), m))
        z = np.repeat(x_L[None], len(subsets), 0)
        for r, S in enumerate(subsets):
            z[r, list(S)] = V
        with np.errstate(divide="ignore"):
            logp = np.log(oracle.exact_conditionals(z))
        ce = [-sum(logp[r, i, x_L[i]] for i in S) for r, S in enumerate(subsets)]
        total += np.mean(ce) / m
    return total


def test_identity_holds_exactly_by_enumeration(tabular, markov2):
    """Time-free / k-DCE identity to float32 round-off, no Monte Carlo (docs/discrete_diffusion.md §12.4)."""
    for orc, x in [(tabular, tabular.sample(np.random.default_rng(7), 2)),
                   (markov2, markov2.sample(np.random.default_rng(7), 2, length=7))]:
        for row in x:
            exact = -orc.log_prob(row[None])[0]
            np.testing.assert_allclose(_exact_subset_sum(orc, row), exact, rtol=2e-5)


def test_interval_tables():
    L = 12
    _, Z = masked.interval_tables(L, 0.0, 1.0)
    for n in range(1, L + 1):
        assert Z[n] == pytest.approx(masked.harmonic(n), rel=1e-12)
    _, Za = masked.interval_tables(L, 0.0, 0.3)
    _, Zb = masked.interval_tables(L, 0.3, 1.0)
    np.testing.assert_allclose(Za + Zb, Z, rtol=1e-12)
    # Numerical check of one coefficient: int_a^b (1/lam) C(n,m) lam^m (1-lam)^(n-m) dlam.
    from scipy import integrate, special
    n, m, a, b = 7, 3, 0.2, 0.9
    num, _ = integrate.quad(lambda l: special.comb(n, m) * l ** (m - 1) * (1 - l) ** (n - m), a, b)
    cdf, Zab = masked.interval_tables(L, a, b)
    coef = np.diff(np.concatenate([[0.0], cdf[n, :n]])) * Zab[n]
    assert coef[m - 1] == pytest.approx(num, rel=1e-10)


@pytest.mark.slow
def test_t_dce_exact_boundaries_matter_and_are_unbiased(tabular):
    """With a large eps the interior t-integral alone is clearly biased; with the boundary
    pieces the estimate is unbiased (same draws budget)."""
    x = tabular.sample(np.random.default_rng(8), 2)
    truth = -tabular.log_prob(x)
    sched = schedules.LinearSchedule(eps=0.2)
    est = lk.nll(tabular, x, jax.random.PRNGKey(9), estimator="t_dce", schedule=sched,
                 num_samples=4096)
    _assert_unbiased(est, truth, "t_dce eps=0.2 exact boundaries")
    spec = masked.MaskSpec("t_dce", sched, exact_boundaries=False)
    vals = lk.estimate(masked.MaskedProcess(spec, tabular.vocab_size), tabular, x[None],
                       np.ones(x.shape, bool), jax.random.PRNGKey(9), 4096, 1024)[0]
    interior = vals.mean(1)
    se = vals.std(1, ddof=1) / np.sqrt(vals.shape[1])
    assert np.all((truth - interior) / se > 4), "interior-only t-DCE should miss the boundaries"


@pytest.mark.slow
def test_coupled_ratio_unbiased_and_lower_variance(markov4):
    rng = np.random.default_rng(13)
    x = markov4.sample(rng, N_SEQ, length=20)
    prompt, ya = x[:, :10], x[:, 10:]
    yb = markov4.sample(rng, N_SEQ, length=20)[:, 10:]
    target = np.zeros(x.shape, bool)
    target[:, 10:] = True
    truth = (markov4.cond_log_prob(x, target)
             - markov4.cond_log_prob(np.concatenate([prompt, yb], 1), target))
    c = lk.log_ratio(markov4, prompt, ya, yb, jax.random.PRNGKey(14), coupled=True,
                     estimator="time_free", num_samples=N_MC)
    d = lk.log_ratio(markov4, prompt, ya, yb, jax.random.PRNGKey(15), coupled=False,
                     estimator="time_free", num_samples=N_MC)
    _assert_unbiased(c, truth, "coupled ratio")
    _assert_unbiased(d, truth, "decoupled ratio")
    assert c.forward_passes == d.forward_passes == 2 * N_MC
    assert np.all(c.per_sample_std**2 < d.per_sample_std**2 / 2), (
        c.per_sample_std, d.per_sample_std)


@pytest.mark.slow
def test_stratified_has_much_lower_variance_per_forward_pass(tabular, markov4):
    """Our stratified-m estimator vs the time-free estimator (I-MDCE Thm 4.1), exact oracles."""
    x = tabular.sample(np.random.default_rng(20), 8)
    tf = lk.nll(tabular, x, jax.random.PRNGKey(21), estimator="time_free", num_samples=1024)
    st = lk.nll(tabular, x, jax.random.PRNGKey(22), estimator="stratified", num_samples=256)
    assert st.forward_passes == 256 * x.shape[1]
    ratio = tf.variance_per_forward_pass.mean() / st.variance_per_forward_pass.mean()
    assert ratio > 10, ratio
    _assert_unbiased(st, -tabular.log_prob(x), "stratified")
    y = markov4.sample(np.random.default_rng(23), 4, length=24)
    tf = lk.conditional_nll(markov4, y[:, :8], y[:, 8:], jax.random.PRNGKey(24),
                            estimator="time_free", num_samples=1024)
    st = lk.conditional_nll(markov4, y[:, :8], y[:, 8:], jax.random.PRNGKey(25),
                            estimator="stratified", num_samples=64)
    assert tf.variance_per_forward_pass.mean() / st.variance_per_forward_pass.mean() > 10


def test_stratified_refuses_ragged_targets(tabular):
    x = tabular.sample(np.random.default_rng(0), 2)
    target = np.ones(x.shape, bool)
    target[0, 0] = False
    with pytest.raises(ValueError, match=r"same number .* got counts \[5, 6\]"):
        lk.nll(tabular, x, jax.random.PRNGKey(0), estimator="stratified", target_BxL=target)


def test_results_are_reproducible_from_key(tabular):
    x = tabular.sample(np.random.default_rng(0), 2)
    a = lk.nll(tabular, x, jax.random.PRNGKey(3), estimator="time_free", num_samples=64)
    b = lk.nll(tabular, x, jax.random.PRNGKey(3), estimator="time_free", num_samples=64)
    c = lk.nll(tabular, x, jax.random.PRNGKey(4), estimator="time_free", num_samples=64)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert not np.array_equal(a.samples, c.samples)


@pytest.mark.slow
def test_default_is_neyman_with_a_budget_of_about_128_passes(tabular, markov2):
    x = markov2.sample(np.random.default_rng(0), 2, length=16)
    est = lk.nll(markov2, x, jax.random.PRNGKey(0))
    assert est.estimator == "neyman" and not est.is_exact and not est.few_samples
    # max(16, 128 / 16) = 16 rounds of 16 passes, pilot and enumerated strata included
    assert 200 <= est.forward_passes <= 16 * 16, est.forward_passes
    x6 = tabular.sample(np.random.default_rng(0), 2)
    assert lk.nll(tabular, x6, jax.random.PRNGKey(0)).is_exact  # 2^6 - 1 = 63 subsets < 16 x 6 passes


@pytest.mark.slow
@pytest.mark.parametrize("n, S", [(8, 4), (11, 64), (12, 8), (12, 64), (16, 16), (20, 8)])
def test_neyman_stays_within_its_budget(markov2, n, S):
    """Pilot, enumerated strata and Monte Carlo rows together cost at most S n passes (or the
    2^n - 1 of the exact mode, when that is smaller)."""
    x = markov2.sample(np.random.default_rng(n), 2, length=n)
    est = lk.nll(markov2, x, jax.random.PRNGKey(n), estimator="neyman", num_samples=S)
    assert est.forward_passes <= max(S * n, 2 * n * 2) and (est.is_exact or est.num_samples >= 2)
    if 2**n - 1 <= S * n:
        assert est.is_exact and est.forward_passes == 2**n - 1
    else:
        assert not est.is_exact
        _assert_unbiased(est, -markov2.log_prob(x), f"neyman n={n} S={S}")


def test_a_plan_for_another_length_is_refused(markov2):
    plan = masked.neyman_plan(None, 12, 8)
    proc = lk.masked_process("neyman", None, 4)
    proc = type(proc)(spec=type(proc.spec)(name="neyman", plan=plan), vocab_size=4)
    x = markov2.sample(np.random.default_rng(0), 2, length=20)
    with pytest.raises(ValueError, match=r"built for n = 12 .* rows have n = 20"):
        lk.nll(markov2, x, jax.random.PRNGKey(0), process=proc, num_samples=8)


def test_bad_input_is_refused(tabular):
    key = jax.random.PRNGKey(0)
    x = tabular.sample(np.random.default_rng(0), 2)
    with pytest.raises(ValueError, match=r"x\[1, 3\] = 4 is outside the vocabulary \[0, 4\)"):
        bad = x.copy()
        bad[1, 3] = 4
        lk.nll(tabular, bad, key)
    with pytest.raises(ValueError, match=r"-1 is outside"):
        bad = x.copy()
        bad[0, 0] = -1
        lk.nll(tabular, bad, key)
    with pytest.raises(TypeError, match="float"):
        lk.nll(tabular, x.astype(np.float32), key)
    with pytest.raises(ValueError, match=r"shape \[batch, length\]; got shape \(6,\)"):
        lk.nll(tabular, x[0], key)
    with pytest.raises(ValueError, match="unknown estimator 'bogus'"):
        lk.nll(tabular, x, key, estimator="bogus")
    with pytest.raises(ValueError, match="num_samples=1 must be an integer >= 2"):
        lk.nll(tabular, x, key, num_samples=1)
    with pytest.raises(TypeError, match="num_samples must be an integer; got 2.7"):
        lk.nll(tabular, x, key, num_samples=2.7)
    with pytest.raises(ValueError, match="vocab_size=5 does not match"):
        lk.nll(tabular, x, key, num_samples=4, vocab_size=5)
    with pytest.raises(ValueError, match=r"equal shape; got \(2, 4\) and \(2, 3\)"):
        lk.log_ratio(tabular, x[:, :2], x[:, 2:], x[:, 3:], key)
    with pytest.raises(FloatingPointError, match="non-finite"):
        # A sequence outside the table's support has probability 0 under the oracle.
        support = {tuple(r) for r in tabular.seqs}
        row = next(np.array(r) for r in itertools.product(range(4), repeat=6) if r not in support)
        lk.nll(tabular, row[None].astype(np.int32), key, num_samples=8)


@pytest.mark.slow
def test_t_dce_with_lambda_zero_at_t_zero_is_flagged(tabular):
    x = tabular.sample(np.random.default_rng(0), 1)
    with pytest.warns(RuntimeWarning, match="t_dce has infinite variance"):
        est = lk.nll(tabular, x, jax.random.PRNGKey(0), estimator="t_dce", num_samples=8,
                     schedule=schedules.LogLinearSchedule())
    assert est.infinite_variance and np.all(np.isfinite(est.samples))


def test_lambda_dce_warns_infinite_variance(tabular):
    x = tabular.sample(np.random.default_rng(0), 1)
    with pytest.warns(RuntimeWarning, match="infinite variance"):
        est = lk.nll(tabular, x, jax.random.PRNGKey(0), estimator="lambda_dce", num_samples=8)
    assert est.infinite_variance


def test_a_swallowed_ctrl_c_still_stops_the_driver(monkeypatch):
    """A SIGINT that arrives during the driver's loop but whose KeyboardInterrupt is dropped where
    it was raised (as inside a gc callback: 'Exception ignored in _xla_gc_callback') is counted
    by infodiff.interrupts; the driver raises it after its next device call instead of running
    on. A SIGINT handled before the loop started is not raised again."""
    import os
    import signal

    from infodiff import interrupts

    tab = oracles.random_tabular(np.random.default_rng(0), "ACGT", 4, 16)
    x = tab.sample(np.random.default_rng(1), 3)
    proc = lk.masked_process("k_dce", vocab_size=tab.vocab_size)
    real, calls = lk._chunk_values, []

    def swallow_one_sigint():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at a bytecode boundary of this loop
                pass
        except KeyboardInterrupt:
            pass  # dropped, as Python drops it inside a gc callback

    def chunk_values(*args):
        calls.append(1)
        if len(calls) == 1:
            swallow_one_sigint()
        return real(*args)

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background
    with interrupts.installed():
        swallow_one_sigint()  # before the loop: handled, must not stop the next estimate
        v = lk.estimate(proc, tab, x[None], np.ones(x.shape, bool), jax.random.PRNGKey(0), 8, 4)
        assert v.shape == (1, 3, 8)
        monkeypatch.setattr(lk, "_chunk_values", chunk_values)
        with pytest.raises(KeyboardInterrupt):  # 8 calls of 1 row x 4 samples; stops after the first
            lk.estimate(proc, tab, x[None], np.ones(x.shape, bool), jax.random.PRNGKey(0), 8, 4)
        assert len(calls) == 1
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_rows_per_slice_is_checked():
    """Slices only for row-wise processes, and only a whole number >= 0 of rows."""
    from infodiff.data import count_synthetic as cs
    from infodiff.processes import poisson

    tab = oracles.random_tabular(np.random.default_rng(0), "ACGT", 4, 16)
    x = tab.sample(np.random.default_rng(1), 3)
    proc = lk.masked_process("k_dce", vocab_size=tab.vocab_size)
    for bad in (-1, 2.7, "3", True):
        with pytest.raises(ValueError, match="rows_per_slice must be an integer >= 0"):
            lk.estimate(proc, tab, x[None], np.ones(x.shape, bool), jax.random.PRNGKey(0), 4, 8,
                        rows_per_slice=bad)
    dist = cs.get_distribution("zip", max_count=12)
    sc = poisson.CountScaling(12, 1.0, 2.0)
    counts = sc.scale(np.asarray(dist.sample(np.random.default_rng(2), 4, dim=1)).reshape(4, 1))
    pproc = poisson.estimation_process(16, "logistic", 0.0, 1.0, 4.0, scaling=sc)
    assert not pproc.row_wise
    with pytest.raises(ValueError, match="not row-wise"):
        lk.estimate(pproc, dist.oracle(sc, dim=1), counts[None], np.ones(counts.shape, bool),
                    jax.random.PRNGKey(0), 4, 8, rows_per_slice=2)
