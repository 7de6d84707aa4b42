"""Block diffusion (infodiff/processes/block.py, tasks/block.py) against exact ground truth.

* every estimator per block within 4 SE of the exact -log p of an enumerable law (tabular and
  Markov, unconditional and conditional), and the training loss likewise;
* the exact block likelihood equal to enumeration for an exact denoiser (rtol 1e-5), and for a
  network equal to a brute-force mean over every order within each block;
* the block NELBO equal to the sum of the per-block closed forms E_sigma[-log p(x^b | sigma, x^{<b})];
* blocks of L' = L give the whole-sequence process's numbers bit for bit (same seed);
* BD3-LM's two-copy layout gives the row-per-block values (loss and network outputs);
* bad input is one line; the config-usage check of configs/block_text.py.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import denoisers, oracles, orders, schedules, tasks
from infodiff import likelihood as lk
from infodiff.networks.transformer import Transformer
from infodiff.processes import block

LIN = schedules.LinearSchedule()


def _table():
    tab = oracles.random_tabular(np.random.default_rng(0), "ACGT", 6, 32)
    x = tab.sample(np.random.default_rng(1), 4)
    return tab, x, -tab.log_prob(x)


def _process(est, Lb, V=4):
    return block.BlockProcess(lk.masked_process(est, LIN, V), Lb)


@pytest.mark.parametrize("est", ["k_dce", "time_free", "stratified", "t_dce"])
@pytest.mark.parametrize("Lb", [2, 3])
def test_block_estimators_within_4se_of_exact(est, Lb):
    tab, x, truth = _table()
    e = lk.nll(tab, x, jax.random.PRNGKey(3), process=_process(est, Lb), num_samples=256)
    z = (e.mean - truth) / e.stderr
    assert np.all(np.abs(z) < 4), z
    assert np.all(e.stderr < 0.2 * truth.max()), "no power"
    assert e.forward_passes == 256 * (6 // Lb) * (Lb if est == "stratified" else 1)


def test_block_conditional_on_markov_within_4se():
    mk = oracles.random_markov(np.random.default_rng(2), "ACGT", 2, 0.5, seq_len=12)
    x = mk.sample(np.random.default_rng(3), 6)
    P = 5  # not a multiple of the block size: the prompt ends inside block 1
    target = np.zeros(x.shape, bool)
    target[:, P:] = True
    truth = -mk.cond_log_prob(x, target)
    e = lk.conditional_nll(mk, x[:, :P], x[:, P:], jax.random.PRNGKey(4), process=_process("k_dce", 4),
                           num_samples=256)
    assert np.all(np.abs(e.mean - truth) < 4 * e.stderr), (e.mean, truth, e.stderr)


def test_block_coupled_log_ratio_within_4se():
    mk = oracles.random_markov(np.random.default_rng(2), "ACGT", 2, 0.5, seq_len=12)
    x = mk.sample(np.random.default_rng(3), 6)
    y_alt = mk.sample_response(np.random.default_rng(5), x[:, :4], 8)
    target = np.zeros(x.shape, bool)
    target[:, 4:] = True
    truth = mk.cond_log_prob(x, target) - mk.cond_log_prob(np.concatenate([x[:, :4], y_alt], 1), target)
    e = lk.log_ratio(mk, x[:, :4], x[:, 4:], y_alt, jax.random.PRNGKey(7), process=_process("k_dce", 4),
                     num_samples=256)
    assert np.all(np.abs(e.mean - truth) < 4 * e.stderr + 1e-6), (e.mean, truth, e.stderr)


@pytest.mark.parametrize("Lb", [1, 2, 3, 6])
def test_exact_block_mode_equals_enumeration(Lb):
    tab, x, truth = _table()
    ex = orders.exact_block_nll(tab, x, Lb)
    np.testing.assert_allclose(ex["nll"], truth, rtol=1e-5)
    np.testing.assert_array_equal(ex["forward_passes"], (6 // Lb) * (2**Lb - 1))


def _network(L=6, V=4, Lb=3, seed=0):
    """A time-free block-causal transformer with random (non-zero-head) weights: inconsistent
    conditionals, so the orders disagree."""
    m = Transformer(vocab_size=V, seq_len=L, num_layers=1, num_heads=2, width=16, block_size=Lb)
    p = m.init(jax.random.PRNGKey(seed), jnp.zeros((1, L), jnp.int32))["params"]
    leaves, tree = jax.tree.flatten(p)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    p = jax.tree.unflatten(tree, [a + 0.5 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])
    return m, p


def _order_logprob(den, x_L, Lb, b, order, V):
    """log p(x^b | sigma, x^{<b}): reveal block b's positions in ``order``, later blocks masked."""
    z = np.array(x_L)
    z[b * Lb:] = V
    total = 0.0
    for i in order:
        lp = np.asarray(den(jnp.asarray(z[None]), jnp.ones((1,), jnp.float32)))[0]
        total += float(lp[i, x_L[i]])
        z[i] = x_L[i]
    return total


@pytest.mark.slow
def test_exact_block_mode_equals_brute_force_over_orders_for_a_network():
    L, V, Lb = 6, 4, 3
    m, p = _network(L, V, Lb)
    den = lambda z, t: m.apply({"params": p}, z, t)  # noqa: E731
    x = np.random.default_rng(0).integers(0, V, (2, L))
    ex = orders.exact_block_nll(den, x, Lb, vocab_size=V)
    for r in range(2):
        total, best, elbo = 0.0, 0.0, 0.0
        for b in range(L // Lb):
            pos = range(b * Lb, (b + 1) * Lb)
            lps = np.array([_order_logprob(den, x[r], Lb, b, o, V) for o in itertools.permutations(pos)])
            total += -(np.logaddexp.reduce(lps) - math.log(len(lps)))
            best += -lps.max()
            elbo += -lps.mean()
        np.testing.assert_allclose(ex["nll"][r], total, rtol=1e-5)
        np.testing.assert_allclose(ex["best_order_nll"][r], best, rtol=1e-5)
        assert ex["nll"][r] <= elbo + 1e-6  # the NELBO bounds the any-order likelihood from above


def test_block_nelbo_equals_sum_of_per_block_closed_forms():
    """The block NELBO (the estimators' expectation) with a network is sum_b E_sigma[-log p(x^b |
    sigma, x^{<b})], the mean over every order within each block: stratified k_dce per block
    enumerates it exactly when every stratum is drawn (L' = 2: one subset per stratum and order)."""
    L, V, Lb = 6, 4, 2
    m, p = _network(L, V, Lb, seed=3)
    den = lambda z, t: m.apply({"params": p}, z, t)  # noqa: E731
    x = np.random.default_rng(1).integers(0, V, (3, L))
    closed = np.zeros(3)
    for r in range(3):
        for b in range(L // Lb):
            pos = range(b * Lb, (b + 1) * Lb)
            closed[r] += -np.mean([_order_logprob(den, x[r], Lb, b, o, V) for o in itertools.permutations(pos)])
    e = lk.nll(den, x, jax.random.PRNGKey(0), process=_process("k_dce", Lb, V),
               num_samples=512, vocab_size=V)
    assert np.all(np.abs(e.mean - closed) < 4 * e.stderr), (e.mean, closed, e.stderr)
    # the same value from the exact recursion's table: the ELBO weights w_S = |S|! (m-|S|-1)! / m!
    ex = orders.exact_block_nll(den, x, Lb, vocab_size=V)
    assert np.all(ex["nll"] <= closed + 1e-6)


@pytest.mark.slow
def test_block_of_the_whole_length_is_the_whole_sequence_process():
    tab, x, _ = _table()
    for est in ("k_dce", "time_free", "t_dce", "stratified"):
        a = lk.nll(tab, x, jax.random.PRNGKey(9), process=lk.masked_process(est, LIN, 4), num_samples=32)
        b = lk.nll(tab, x, jax.random.PRNGKey(9), process=_process(est, 6), num_samples=32)
        np.testing.assert_array_equal(a.samples, b.samples)
        assert a.forward_passes == b.forward_passes


@pytest.mark.parametrize("Lb", [2, 3])
def test_training_loss_has_the_exact_mean(Lb):
    tab, x, truth = _table()
    apply_fn, params = denoisers.split(tab)
    n = 2048
    loss = block.training_loss(_process("k_dce", Lb), apply_fn, params, jnp.asarray(np.repeat(x, n, 0)),
                               jax.random.PRNGKey(5))
    loss = np.asarray(loss, np.float64).reshape(len(x), n)
    m, s = loss.mean(1), loss.std(1, ddof=1) / math.sqrt(n)
    assert np.all(np.abs(m - truth) < 4 * s + 1e-4), (m, truth, s)


@pytest.mark.slow
def test_two_copy_loss_equals_a_pass_per_block():
    L, V, Lb = 8, 5, 4
    m, p = _network(L, V, Lb, seed=7)
    x = jnp.asarray(np.random.default_rng(2).integers(0, V, (6, L)), jnp.int32)
    proc = _process("k_dce", Lb, V)
    per_block = block.training_loss(proc, lambda prm, z, t: m.apply({"params": prm}, z, t), p, x,
                                    jax.random.PRNGKey(1))
    two = block.two_copy_loss(proc, lambda z, x0, t: m.apply({"params": p}, z, t, x0_BxL=x0), x,
                              jax.random.PRNGKey(1))
    np.testing.assert_allclose(np.asarray(two), np.asarray(per_block), rtol=1e-5, atol=1e-5)
    assert float(jnp.min(two)) > 0


def test_block_causal_network_never_sees_later_blocks():
    m, p = _network(6, 4, 3)
    z = np.random.default_rng(0).integers(0, 5, (2, 6))
    a = m.apply({"params": p}, jnp.asarray(z), None)
    z2 = z.copy()
    z2[:, 3:] = 4 - z2[:, 3:]
    b = m.apply({"params": p}, jnp.asarray(z2), None)
    np.testing.assert_array_equal(np.asarray(a)[:, :3], np.asarray(b)[:, :3])


def test_bad_input_is_one_line():
    from infodiff.configs import block_text

    c = block_text.get_config()
    c.process.block_size = 5
    with pytest.raises(ValueError, match=r"block_size=5 does not divide the sequence length 64: choose one of"):
        tasks.make_task(c)
    c = block_text.get_config("16")
    c.eval.exact_max_block_size = 8
    with pytest.raises(ValueError, match=r"costs 2\^16 - 1 = 65535 passes per block, 262140 per sequence"):
        tasks.make_task(c).check_eval_config()
    tab, x, _ = _table()
    with pytest.raises(ValueError, match="over the budget"):
        orders.exact_block_nll(tab, x, 3, max_block=2)
    with pytest.raises(ValueError, match="neyman"):
        _process("neyman", 2)
    c = block_text.get_config()
    c.eval.estimator = "neyman"
    with pytest.raises(ValueError, match="neyman"):
        tasks.make_task(c).check_eval_config()


def test_time_conditioned_run_gets_the_interval_and_says_why():
    from infodiff.configs import block_text
    from infodiff.tasks import block as block_task

    c = block_text.get_config()
    c.model.time_conditioning = True
    s = block_task.exact_settings(c)
    assert s["interval"] and s["orders"] == 16
    t = tasks.make_task(c)
    assert not t.two_copy
    with pytest.raises(ValueError, match="time-conditioned"):
        t.exact_nll(None, np.zeros((1, 64), np.int32))


@pytest.mark.slow
def test_config_usage_of_block_text(tmp_path):
    """configs/block_text.py leaves unread exactly the keys its registration declares unread
    (tests/test_config_usage.py's check, for this config)."""
    from tests import test_config_usage as tcu

    tcu.test_every_key_is_read_or_declared_unread("block_text", tmp_path)


@pytest.mark.slow
def test_load_run_exact_nll_and_nll_of_a_tiny_block_run(tmp_path):
    """A few-step block run: ``load_run(W).exact_nll`` equals the recursion on the run's own
    windows (SE 0, bound 'exact'); ``nll`` (the block NELBO) is above it within its SE."""
    import infodiff
    from infodiff import training
    from infodiff.tasks import block as block_task

    c = block_task.tiny_config()
    training.train(tasks.make_task(c), str(tmp_path))
    run = infodiff.load_run(str(tmp_path))
    texts = ["the cat sat on the mat", "and the dog"]
    ex = run.exact_nll(texts)
    assert ex.info["bound"] == "exact" and np.all(ex.stderr == 0) and ex.is_exact
    ids = [run.encode(t) for t in texts]
    L = run.seq_len  # 16: the first text (22 characters) is two windows, the second one
    pieces = [ids[0][:L], ids[0][L:], ids[1]]
    x = np.zeros((3, L), np.int32)
    pad = np.ones((3, L), bool)
    for r, d in enumerate(pieces):
        x[r, :len(d)], pad[r, :len(d)] = d, False
    ref = orders.exact_block_nll(run.denoiser, x, 4, target_BxL=~pad, pad_BxL=pad)["nll"]
    np.testing.assert_allclose(ex.mean, [ref[0] + ref[1], ref[2]], rtol=1e-6)
    nelbo = run.nll(texts, num_samples=64)
    assert nelbo.info["bound"] == "nelbo"
    assert np.all(nelbo.mean - ex.mean > -4 * nelbo.stderr), (nelbo.mean, ex.mean, nelbo.stderr)
    with pytest.raises(ValueError, match="per block"):
        run.nll_interval(texts)


def test_oracle_mode_with_blocks(tmp_path):
    """configs/oracle_tabular.py with process.name='block': every estimator per block against the
    exact values, unconditional, conditional and log-ratio, in the oracle report."""
    import ml_collections

    from infodiff import evaluation
    from infodiff.configs import oracle_tabular

    c = oracle_tabular.get_config()
    with c.unlocked():
        c.process.name = "block"
        c.process.block_size = 2
    c.eval.estimators = ("k_dce", "time_free")
    c.eval.num_sequences, c.eval.num_samples, c.eval.output_dir = 8, 64, str(tmp_path)
    c.data.prompt_len = 3  # ends inside the second block
    assert isinstance(c, ml_collections.ConfigDict)
    report, _ = evaluation.evaluate(c, None)
    assert report["process"]["block_size"] == 2
    rows = [r for k in ("unconditional", "conditional", "ratio") for r in report["results"][k]]
    assert len(rows) == 6 and all(r["estimator"].endswith("per block of 2") for r in rows[:4])
    for r in report["results"]["unconditional"] + report["results"]["conditional"]:
        assert abs(r["bias_z"]) < 4, r


@pytest.mark.parametrize("sampler", ["greedy_confidence", "left_to_right"])
def test_sampler_likelihood_per_block_is_exact_for_a_consistent_denoiser(sampler):
    """A deterministic unmasking policy run block after block (what the block task reports for
    eval.sampler_likelihood): with the exact (consistent) denoiser every order gives p(x)."""
    from infodiff import scoring

    tab, x, truth = _table()
    xr, tgt, pad, row = block.block_rows(x, 3)
    oi = orders.sampler_nll(tab, xr, jax.random.PRNGKey(0), sampler=sampler, target_BxL=tgt, pad_BxL=pad)
    total = scoring.sum_interval_windows(oi, row, len(x))
    np.testing.assert_allclose(total.iw, truth, rtol=1e-5)
