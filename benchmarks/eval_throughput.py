"""Likelihood-evaluation throughput: forward passes/s of each estimator, sliced and not, against
the pure jitted forward of the same network.

    python benchmarks/eval_throughput.py                        # configs/masked_text.py
    python benchmarks/eval_throughput.py --sequences 64 --repeats 3
    python benchmarks/eval_throughput.py --config.model.width=256 --config.data.seq_len=256

Runs ``infodiff.likelihood.estimate`` (the Monte Carlo driver evaluate.py uses) on
``--sequences`` random sequences of the config's length with the config's ``eval.batch_size``
and ``eval.num_samples``, for the estimators k_dce, stratified, t_dce and time_free, twice: with
the backend's slices (``likelihood.slice_rows``) and in one piece (``rows_per_slice=0``, the
driver before slicing). The network is the config's transformer with its initial parameters
plus N(0, 0.02^2) noise (the output head is zero at initialisation; throughput does not depend on
the values). Reported: forward passes/s (rows through the network per second; median of
``--repeats`` timed runs after one compiling run), the speed-up of slicing, the largest
difference of the per-sample values between the two (float rounding only: the draws are the
same), and each estimator's rate over the pure jitted forward at its best row count, so that a
regression shows as a ratio. A benchmark, not a test: it asserts nothing.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_REPO, "configs", "masked_text.py"), "A masked run's config.", lock_config=True
)
_SEQUENCES = flags.DEFINE_integer("sequences", 32, "Sequences evaluated per timed run.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per estimator and mode (median reported).")
_ESTIMATORS = flags.DEFINE_list("estimators", ["k_dce", "stratified", "t_dce", "time_free"], "Estimators timed.")


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.eval_inputs import median_time, noisy_network
    from infodiff import denoisers, likelihood

    config = _CONFIG.value
    L, V = int(config.data.seq_len), int(config.data.vocab_size)
    bs, S = int(config.eval.batch_size), int(config.eval.num_samples)
    task, den, x, target, rng = noisy_network(config, _SEQUENCES.value)
    apply_fn, dparams = denoisers.split(den)
    auto = likelihood.slice_rows(L)

    # the pure jitted forward: rows/s at the call size and at the slice size
    fwd = jax.jit(lambda p, z, t: apply_fn(p, z, t))
    forward = {}
    for rows in sorted({bs, auto or bs, 32}):
        z = jnp.asarray(rng.integers(0, V + 1, (rows, L)).astype(np.int32))
        t = jnp.full((rows,), 0.5, jnp.float32)
        forward[rows] = rows / median_time(lambda: jax.block_until_ready(fwd(dparams, z, t)), _REPEATS.value)
    best_fwd = max(forward.values())

    table = []
    for name in _ESTIMATORS.value:
        process = likelihood.masked_process(name, task.schedule_obj, V)
        per = process.passes_per_sample(target)
        samples = S
        passes = x.shape[0] * samples * per
        out, rate = {}, {}
        for mode, rows in (("one piece", 0), ("sliced", None)):
            def run():
                out[mode] = likelihood.estimate(process, den, x[None], target, jax.random.PRNGKey(1), samples, bs,
                                                rows_per_slice=rows)
            rate[mode] = passes / median_time(run, _REPEATS.value)
        diff = float(np.max(np.abs(out["sliced"] - out["one piece"])))
        table.append((name, f"{samples} x {per}", rate["one piece"], rate["sliced"], diff))

    dev = jax.devices()[0]
    print()
    print(f"backend {dev.platform}, {os.cpu_count()} host CPUs; {config.model.num_layers} layers x "
          f"{config.model.width}, L {L}; eval.batch_size {bs}; {x.shape[0]} sequences; slice "
          f"{auto or 'none'} rows ({likelihood.SLICE_TOKENS.get(dev.platform, 0)} tokens)")
    print("pure jitted forward, rows/s: " + ", ".join(f"{r} rows {v:,.0f}" for r, v in sorted(forward.items())))
    head = ("estimator", "samples x passes", "one piece /s", "sliced /s", "speed-up", "vs best forward", "max |diff| nats")
    rows = [(n, sp, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.2f}x", f"{b / best_fwd:.2f}", f"{d:.1e}")
            for n, sp, a, b, d in table]
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    app.run(main)
