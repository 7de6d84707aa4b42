"""The Monte Carlo driver over several CPU devices: forward passes/s of
``infodiff.likelihood.estimate`` with the rows of each call split over D devices (what
``evaluate.py`` does with ``INFODIFF_CPU_DEVICES``), against the same devices without the split.

    python benchmarks/eval_devices.py                      # 2 devices, configs/masked_text.py
    python benchmarks/eval_devices.py --devices 4 --estimator stratified

Runs in one process with ``jax_num_cpu_devices = --devices``: the driver on ``--sequences``
random sequences with the config's ``eval.batch_size`` and ``eval.num_samples``, (a) without a
rows mesh (one device computes; the others idle), (b) split over all devices at the backend's
slice (``likelihood.slice_rows`` rows per device) and (c) at half and twice that slice.
Reported: passes/s (median of ``--repeats`` timed runs after a compiling run), the ratio to (a),
and the largest difference of the per-sample values from (a) (float rounding only: the draws
are the same). The network is the config's transformer with its initial parameters plus
N(0, 0.02^2) noise. A benchmark, not a test: it asserts nothing.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_REPO, "configs", "masked_text.py"), "A masked run's config.", lock_config=True)
_DEVICES = flags.DEFINE_integer("devices", 2, "CPU devices.")
_SEQUENCES = flags.DEFINE_integer("sequences", 128, "Sequences evaluated per timed run.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per setting (median reported).")
_ESTIMATOR = flags.DEFINE_string("estimator", "k_dce", "Estimator timed.")


def main(argv):
    del argv
    import jax

    jax.config.update("jax_num_cpu_devices", _DEVICES.value)
    import numpy as np

    from benchmarks.eval_inputs import noisy_network
    from infodiff import likelihood, parallel

    config = _CONFIG.value
    L, V = int(config.data.seq_len), int(config.data.vocab_size)
    bs, S = int(config.eval.batch_size), int(config.eval.num_samples)
    task, den, x, target, _ = noisy_network(config, _SEQUENCES.value)
    process = likelihood.masked_process(_ESTIMATOR.value, task.schedule_obj, V)
    passes = x.shape[0] * S * process.passes_per_sample(target)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("rows",))
    auto = likelihood.slice_rows(L)

    def timed(rows_mesh, rows):
        out = {}

        def run():
            with parallel.rows_mesh(rows_mesh):
                out["v"] = likelihood.estimate(process, den, x[None], target, jax.random.PRNGKey(1), S, bs,
                                               rows_per_slice=rows)
        run()  # compiles
        times = []
        for _ in range(_REPEATS.value):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return passes / statistics.median(times), out["v"]

    settings = [("one device computes (no rows mesh)", None, auto)]
    settings += [(f"split over {jax.device_count()} devices, {r} rows per device", mesh, r)
                 for r in (auto, max(1, auto // 2), 2 * auto)]
    table, ref = [], None
    for name, m, r in settings:
        rate, v = timed(m, r)
        if ref is None:
            ref = (rate, v)
        table.append((name, f"{rate:,.0f}", f"{rate / ref[0]:.2f}x", f"{float(np.max(np.abs(v - ref[1]))):.1e}"))
    print()
    print(f"{jax.device_count()} CPU devices, {os.cpu_count()} host CPUs; {config.model.num_layers} layers x "
          f"{config.model.width}, L {L}; {_ESTIMATOR.value}, {x.shape[0]} sequences x {S} samples; "
          f"eval.batch_size {bs}")
    head = ("setting", "passes/s", "vs one device", "max |diff| nats")
    widths = [max(len(str(r[i])) for r in [head] + table) for i in range(len(head))]
    for r in [head] + table:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    app.run(main)
