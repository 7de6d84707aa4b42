"""The same denoiser written in NumPy (a host callback) and in JAX (jitted), scored through
``infodiff.from_function``: the largest difference of nll / conditional_nll / log_ratio
(tests/test_external.py's neighbour model; RESULTS.md "A model trained elsewhere").

    python scripts/external_numpy_vs_jax.py
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    import infodiff
    from tests import test_external as te

    res = {}
    for name, fn in (("numpy", te.np_model), ("jax", te.jax_model)):
        run = infodiff.from_function(fn, vocab_size=te.V, mask_id=te.V, seq_len=te.L, encode=te.encode)
        t = time.time()
        res[name] = te._scores(run)
        res[name + "_s"] = time.time() - t
    for what, a, b in zip(("nll", "conditional_nll", "log_ratio"), res["numpy"], res["jax"]):
        d = np.abs(a.mean - b.mean)
        print(f"{what}: max |numpy - jax| {d.max():.3g} nats (relative {np.max(d / np.abs(b.mean)):.3g}; "
              f"values up to {np.abs(b.mean).max():.1f} nats, SE {b.stderr.max():.3g})")
    print(f"wall: numpy {res['numpy_s']:.1f} s, jax {res['jax_s']:.1f} s (compilation included)")


if __name__ == "__main__":
    main()
