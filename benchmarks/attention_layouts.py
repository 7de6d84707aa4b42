"""One attention layer's forward and forward + backward time, four ways: jax's softmax or the
library's (gradient from the output alone), the value product written token-major
("bhqs,bhsk->bqhk", one einsum) or head-major then transposed.

    python benchmarks/attention_layouts.py                        # B 8, L 256, 4 heads of 64
    python benchmarks/attention_layouts.py --batch 64 --seq_len 64 --head_dim 32

The layer is what ``infodiff.networks.transformer`` runs between the qkv projection and the
out-projection: q, k, v read head-major from a ``[B*L, 3D]`` projection, RoPE, softmax(q k^T /
sqrt(K)) v, the result token-major ``[B*L, D]``, here followed by a fixed ``[D, D]`` matmul and a
sum so that the backward has a cotangent. "library" is ``transformer._attend`` itself (both
changes); the other rows rebuild the earlier variants from jax primitives. Reported: the median
of ``--repeats`` timings of 10 calls each (interleaved, after compiling), the ratio to the first
row, and the largest difference of the qkv gradient from the first row (float rounding only). A
benchmark, not a test: it asserts nothing.
"""

import math
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

_B = flags.DEFINE_integer("batch", 8, "Sequences B.")
_L = flags.DEFINE_integer("seq_len", 256, "Sequence length L.")
_H = flags.DEFINE_integer("heads", 4, "Heads H.")
_K = flags.DEFINE_integer("head_dim", 64, "Head dimension K (even).")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed repeats of 10 calls (median reported).")


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np

    from infodiff.networks import transformer as T

    B, L, H, K = _B.value, _L.value, _H.value, _K.value
    D = H * K
    pos_L = np.arange(L)

    def attend(q, k, v, softmax, head_major):
        s = jnp.einsum("bhqk,bhsk->bhqs", q, k, preferred_element_type=jnp.float32) / math.sqrt(K)
        p = softmax(s)
        if head_major:
            return jnp.swapaxes(jnp.einsum("bhqs,bhsk->bhqk", p, v), 1, 2)
        return jnp.einsum("bhqs,bhsk->bqhk", p, v)

    jax_softmax = lambda s: jax.nn.softmax(s, axis=-1)
    variants = {
        "jax softmax, token-major product": lambda q, k, v: attend(q, k, v, jax_softmax, False),
        "written-out softmax, token-major": lambda q, k, v: attend(q, k, v, T.softmax, False),
        "jax softmax, head-major product": lambda q, k, v: attend(q, k, v, jax_softmax, True),
        "library (_attend: both)": lambda q, k, v: T._attend(q, k, v, jnp.float32, token_major_out=True),
    }

    def layer(fn):
        def f(qkv_Nx3D, w_DxD):
            q, k, v = jnp.transpose(qkv_Nx3D.reshape(B, L, 3, H, K), (2, 0, 3, 1, 4))
            q, k = T.apply_rope(q, pos_L, seq_axis=-2), T.apply_rope(k, pos_L, seq_axis=-2)
            return jnp.sum(fn(q, k, v).reshape(B * L, D) @ w_DxD)
        return jax.jit(f), jax.jit(jax.value_and_grad(f))

    rng = np.random.default_rng(0)
    qkv = jnp.asarray(rng.normal(size=(B * L, 3 * D)).astype(np.float32))
    w = jnp.asarray(rng.normal(size=(D, D)).astype(np.float32) / math.sqrt(D))
    fns = {name: layer(fn) for name, fn in variants.items()}
    grads = {name: np.asarray(g(qkv, w)[1]) for name, (_, g) in fns.items()}
    times = {(name, mode): [] for name in fns for mode in (0, 1)}
    for _ in range(_REPEATS.value):
        for name, pair in fns.items():
            for mode in (0, 1):
                jax.block_until_ready(pair[mode](qkv, w))
                t0 = time.perf_counter()
                for _ in range(10):
                    out = pair[mode](qkv, w)
                jax.block_until_ready(out)
                times[(name, mode)].append((time.perf_counter() - t0) / 10)
    first = next(iter(fns))
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"\nbackend {jax.default_backend()}, {os.cpu_count()} host CPUs; B {B}, L {L}, {H} heads x {K}")
    width = max(len(n) for n in fns)
    print(f"{'variant':<{width}}  forward ms  vs first  fwd+bwd ms  vs first  max |d grad|")
    for name in fns:
        f, g = med[(name, 0)], med[(name, 1)]
        diff = float(np.max(np.abs(grads[name] - grads[first])))
        print(f"{name:<{width}}  {f * 1e3:10.2f}  {med[(first, 0)] / f:7.2f}x  {g * 1e3:10.2f}  "
              f"{med[(first, 1)] / g:7.2f}x  {diff:12.1e}")


if __name__ == "__main__":
    app.run(main)
