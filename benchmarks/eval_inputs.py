"""The network and sequences the evaluation benchmarks time (eval_throughput.py, eval_devices.py)."""

import statistics
import time

import jax
import numpy as np

from infodiff import tasks


def noisy_network(config, sequences: int):
    """``(task, denoiser, x_BxL int32, target_BxL bool, rng)``: the config's network with its
    initial parameters plus N(0, 0.02^2) noise (the output head is zero at initialisation;
    throughput does not depend on the values), ``sequences`` uniform random sequences of
    ``data.seq_len`` tokens, every position scored, and the numpy generator that drew them."""
    L, V = int(config.data.seq_len), int(config.data.vocab_size)
    task = tasks.make_task(config)
    params = task.init_params(jax.random.key(0))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda p: p + 0.02 * rng.standard_normal(p.shape).astype(np.float32), params)
    x = rng.integers(0, V, (sequences, L)).astype(np.int32)
    return task, task.denoiser(params), x, np.ones(x.shape, bool), rng


def median_time(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one (compiling) call."""
    fn()  # compiles
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
