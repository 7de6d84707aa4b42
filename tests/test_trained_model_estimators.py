"""On a trained tiny time-free network, all four estimators estimate the same quantity.

For a time-free denoiser c_theta every estimator has expectation sum_m E[C_m] / m (docs/discrete_diffusion.md §6),
so their means must agree within their combined standard errors; a trained model (not the
zero-initialised one, for which every estimator is trivially L log V) makes this a real test.
"""

import jax
import numpy as np
import pytest

from infodiff import likelihood as lk
from infodiff import oracles, tasks, training


def _tiny_config(L, V):
    from configs import masked_text

    c = masked_text.get_config()
    c.data.seq_len, c.data.vocab_size = L, V
    c.model.update(dict(num_layers=1, num_heads=2, width=32, mlp_ratio=2, time_conditioning=False))
    c.optim.update(dict(lr=3e-3, warmup_steps=5, decay="constant", ema_decay=0.9))
    c.train.update(dict(batch_size=64, num_steps=150))
    return c


@pytest.fixture(scope="module")
def trained():
    tab = oracles.random_markov(np.random.default_rng(0), "ACGT", order=1, temperature=0.15, seq_len=8)
    cfg = _tiny_config(8, 4)
    task = tasks.make_task(cfg)  # its own batches below: the task's corpus is never loaded
    opt = training.make_optimizer(cfg)
    mesh = training.make_mesh()
    state = training.init_train_state(task.init_params, opt, jax.random.PRNGKey(0), mesh)
    step = training.make_train_step(task, opt, mesh)
    rng = np.random.default_rng(1)
    first = last = None
    for s in range(cfg.train.num_steps):
        state, metrics = step(state, tab.sample(rng, cfg.train.batch_size), jax.random.PRNGKey(s))
        bpc = float(metrics["bpc"])
        first = bpc if first is None else first
        last = bpc
    assert last < first - 0.5, (first, last)  # it learned something (bits per char)
    return tab, task.denoiser(state.params)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:lambda_dce has infinite variance")
def test_estimators_agree_on_trained_model(trained):
    tab, den = trained
    x = tab.sample(np.random.default_rng(2), 4)
    ests = {name: lk.nll(den, x, jax.random.PRNGKey(i), estimator=name, num_samples=2048)
            for i, name in enumerate(lk.ESTIMATORS)}
    ref = ests["time_free"]
    for name, e in ests.items():
        z = (e.mean - ref.mean) / np.sqrt(e.stderr**2 + ref.stderr**2 + 1e-30)
        if name != "time_free":
            assert np.all(np.abs(z) < 4), (name, e.mean, ref.mean, z)
    # Trained: far below the untrained value L log V.
    assert ref.mean.mean() < 0.7 * 8 * np.log(4)
