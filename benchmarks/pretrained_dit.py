"""Forward passes per second of the released DiT (infodiff/pretrained/dit.py) at a given shape.

    python benchmarks/pretrained_dit.py                      # DiT-small: 12 x 768, 12 heads, L 1024, V 50258
    python benchmarks/pretrained_dit.py --blocks 2 --width 64 --length 128 --vocab 1000   # a quick run

Random weights in the MDLM layout (the SUBS head included), batch ``--batch`` rows, float32 and
bfloat16 weights/compute; one warm-up pass (compilation) then ``--passes`` timed passes. Prints one
JSON line per dtype: passes per second (rows x passes / seconds), seconds per pass, the device.
"""
import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from infodiff.pretrained import dit


def params_for(a: dit.Arch, dtype, seed: int = 0) -> dict:
    """Random parameters of ``a`` (normal / sqrt(fan-in)) in the layout :func:`dit.forward` reads."""
    rng = np.random.default_rng(seed)
    shapes, optional = dit.expected_shapes(a)
    tensors = {k: (rng.standard_normal(s) / np.sqrt(s[-1] if len(s) > 1 else 4.0)).astype(np.float32)
               for k, s in shapes.items() if k not in optional}
    return dit.params_of(tensors, a, dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50258)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    a = dit.Arch("mdlm", args.vocab, args.width, 128, args.blocks, args.heads, args.length, "backbone.", False,
                 False, "absorb", args.vocab - 1)
    x = jnp.asarray(np.random.default_rng(1).integers(0, args.vocab, (args.batch, args.length)), jnp.int32)
    sigma = jnp.zeros((args.batch,), jnp.float32)
    for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        params = params_for(a, dtype)
        f = jax.jit(lambda p, x, s: dit.forward(a, p, x, s))
        f(params, x, sigma).block_until_ready()  # compile
        t0 = time.perf_counter()
        for _ in range(args.passes):
            f(params, x, sigma).block_until_ready()
        dt = (time.perf_counter() - t0) / args.passes
        print(json.dumps({"dtype": name, "blocks": args.blocks, "width": args.width, "length": args.length,
                          "vocab": args.vocab, "batch": args.batch, "seconds_per_pass": dt,
                          "passes_per_s": args.batch / dt, "device": str(jax.devices()[0].device_kind)}))


if __name__ == "__main__":
    main()
