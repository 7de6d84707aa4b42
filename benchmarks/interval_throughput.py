"""NLL-interval throughput: forward passes/s of the order-plan driver (infodiff.orders) against the
k_dce Monte Carlo driver evaluate.py uses, on the same network and sequences, in the same run.

    python benchmarks/interval_throughput.py                    # configs/masked_text.py
    python benchmarks/interval_throughput.py --sequences 16 --orders 16

The network is the config's transformer with noisy initial parameters (benchmarks/eval_inputs.py;
throughput does not depend on the values). k_dce: ``likelihood.estimate`` with ``eval.num_samples``
x 8 samples per sequence (one pass each); the orders: ``orders.plan_log_weights`` with ``--orders``
plans per sequence (L passes each; informed and uniform proposals) and the greedy-confidence
sampler (one plan). Reported: forward passes/s (median of ``--repeats`` timed runs after one
compiling run) and each rate over k_dce's. A benchmark, not a test: it asserts nothing.
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
_SEQUENCES = flags.DEFINE_integer("sequences", 64, "Sequences per timed run (with --orders 4: calls of 256 rows, as k_dce's).")
_ORDERS = flags.DEFINE_integer("orders", 4, "Order plans per sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per driver (median reported).")


def main(argv):
    del argv
    import jax

    from benchmarks.eval_inputs import median_time, noisy_network
    from infodiff import likelihood, orders

    config = _CONFIG.value
    L, V = int(config.data.seq_len), int(config.data.vocab_size)
    bs = int(config.eval.batch_size)
    task, den, x, target, _ = noisy_network(config, _SEQUENCES.value)
    B = x.shape[0]
    S = int(config.eval.num_samples) * 8
    process = likelihood.masked_process("k_dce", task.schedule_obj, V)
    key = jax.random.PRNGKey(1)
    rates = {}
    t = median_time(lambda: likelihood.estimate(process, den, x[None], target, key, S, bs), _REPEATS.value)
    rates[f"k_dce ({S} samples)"] = B * S / t
    for mode, K in (("informed", _ORDERS.value), ("uniform", _ORDERS.value), ("greedy_confidence", 1)):
        passes = []

        def run():
            _, p = orders.plan_log_weights(den, x, key, K, mode=mode, schedule=task.schedule_obj, batch_size=bs)
            passes.append(int(p.sum()))

        t = median_time(run, _REPEATS.value)
        rates[f"orders {mode} ({K} plans)"] = passes[-1] / t
    base = next(iter(rates.values()))
    dev = jax.devices()[0]
    print()
    print(f"backend {dev.platform}, {os.cpu_count()} host CPUs; {config.model.num_layers} layers x "
          f"{config.model.width}, L {L}; batch {bs}; {B} sequences")
    head = ("driver", "forward passes/s", "vs k_dce")
    rows = [(n, f"{r:,.0f}", f"{r / base:.2f}") for n, r in rates.items()]
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    app.run(main)
