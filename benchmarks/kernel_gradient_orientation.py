"""The kernel gradient x^T g of a dense layer in both orientations on this backend.

    python benchmarks/kernel_gradient_orientation.py

``infodiff.networks.transformer.linear`` computes ``x^T g`` ([I, O]) as ``(g^T x)^T`` (an
[O, I] product behind ``lax.optimization_barrier``) when I > O, because XLA:CPU's matmul runs
the product with the smaller output dimension first about twice as fast. This prints, for the
default transformer's shapes (N = 64 x 64 tokens), GFLOP/s of ``x.T @ g`` (XLA's choice) and of
the barrier form, median of 20 calls after one compiling call, so the choice can be checked on
any backend. A benchmark, not a test: it asserts nothing.
"""

import statistics
import time

import jax
import jax.numpy as jnp


def _gflops(fn, *args, flops):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times) / 1e9


def main():
    N = 4096
    print(f"{jax.device_count()} x {jax.devices()[0].platform}, jax {jax.__version__}; x [N, I], g [N, O], N = {N}")
    print(f"{'I x O':>10} {'x.T @ g':>10} {'barrier(g.T @ x).T':>20}  GFLOP/s")
    for I, O in [(512, 128), (384, 128), (128, 128), (128, 384), (128, 512)]:
        x = jax.random.normal(jax.random.key(0), (N, I))
        g = jax.random.normal(jax.random.key(1), (N, O))
        flops = 2 * N * I * O
        plain = _gflops(lambda x, g: x.T @ g, x, g, flops=flops)
        flipped = _gflops(lambda x, g: jax.lax.optimization_barrier(g.T @ x).T, x, g, flops=flops)
        print(f"{I:>4} x {O:<4} {plain:>10.1f} {flipped:>20.1f}")


if __name__ == "__main__":
    main()
