"""Per-device memory of the train step on (data, fsdp) meshes: what FSDP saves.

    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python benchmarks/sharding_memory.py
    ... python benchmarks/sharding_memory.py --configs=text8 --batch_size=512
    ... python benchmarks/sharding_memory.py --configs=gpt2m --gpt2m_seq_len=1024

Compiles (never runs) ``infodiff.training.make_train_step`` -- the step train.py runs: loss,
backward, clip + AdamW, EMA, the state donated -- on abstract inputs (the state of
``abstract_train_state`` with its shardings, a ``[B, L]`` int32 batch split over every device, a
key) for each mesh (data, fsdp) = (8, 1), (4, 2), (2, 4), (1, 8) of 8 devices, and reads XLA's
``compiled.memory_analysis()``, which for a sharded program is per device:

* ``args``: ``argument_size_in_bytes`` (state shards + batch rows + key);
* ``temp``: ``temp_size_in_bytes``, the activations and other temporaries of the step;
* ``out - alias``: ``output_size_in_bytes - alias_size_in_bytes``, output not written in place
  of a donated input (0 when the whole new state reuses the old state's buffers).

Independently of XLA, "state/dev" sums over the state's leaves ``nbytes / (number of shards
along its sharded axes)`` for params, EMA and AdamW moments (+ step, counters), and "cut" is the
(8, 1) mesh's state/dev over this mesh's. The issue's acceptance: fsdp=8 cuts params + optimizer
+ EMA bytes per device at least 6x (printed, not asserted). Configs: ``text8`` is
configs/masked_text8.py (12 x 768, L 256); ``gpt2m`` the same with GPT-2-medium's shape (24 x
1024, 16 heads). The global batch is the same for every mesh and split over all 8 devices in each,
so the rows per device are constant too. A benchmark, not a test: it asserts nothing.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

_CONFIGS = flags.DEFINE_list("configs", ["text8", "gpt2m"], "Configs to measure: text8, gpt2m.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Global batch (0: text8's config, 512, for text8; "
                              "--gpt2m_batch_size for gpt2m).")
_GPT2M_BATCH = flags.DEFINE_integer("gpt2m_batch_size", 64, "Global batch of gpt2m when --batch_size=0.")
_GPT2M_L = flags.DEFINE_integer("gpt2m_seq_len", 1024, "Sequence length of gpt2m.")
_MESHES = ((8, 1), (4, 2), (2, 4), (1, 8))


def _config(name: str):
    from configs import masked_text8

    c = masked_text8.get_config()
    if name == "gpt2m":
        c.model.num_layers, c.model.width, c.model.num_heads = 24, 1024, 16
        c.data.seq_len = _GPT2M_L.value
        c.train.batch_size = _GPT2M_BATCH.value
    elif name != "text8":
        raise app.UsageError(f"--configs: unknown config {name!r} (text8, gpt2m)")
    if _BATCH.value:
        c.train.batch_size = _BATCH.value
    return c


def _per_device_bytes(tree) -> int:
    """Sum over the leaves (ShapeDtypeStructs with NamedShardings) of nbytes / shard count."""
    import jax
    import numpy as np

    total = 0
    for x in jax.tree.leaves(tree):
        shards = 1
        for axes in x.sharding.spec:
            for a in (axes,) if isinstance(axes, str) else (axes or ()):
                shards *= x.sharding.mesh.shape[a]
        total += int(np.prod(x.shape)) * x.dtype.itemsize // shards
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp

    from infodiff import parallel, tasks, training
    from infodiff.networks.transformer import count_params

    devices = jax.devices()[:8]
    if len(devices) < 8:
        raise app.UsageError(f"needs 8 devices, found {len(devices)}: set "
                             "XLA_FLAGS=--xla_force_host_platform_device_count=8")
    print(f"{len(devices)} x {devices[0].platform} devices, {os.cpu_count()} host CPUs, jax {jax.__version__}")
    for name in _CONFIGS.value:
        config = _config(name)
        B, L, m = int(config.train.batch_size), int(config.data.seq_len), config.model
        task = tasks.make_task(config)  # no data is loaded: the batch is abstract
        optimizer = training.make_optimizer(config)
        print(f"\n{name}: {m.num_layers} layers x {m.width}, {m.num_heads} heads, L {L}, "
              f"{m.dtype} compute, {count_params(jax.eval_shape(task.init_params, jax.random.key(0))):,} "
              f"params (float32); global batch {B} (constant over meshes) = {B // 8} rows/device")
        if name == "gpt2m" and L != 1024:
            print(f"  (sequence length {L} instead of GPT-2's 1024: --gpt2m_seq_len)")
        head = (f"{'mesh (data,fsdp)':>16} {'state/dev MiB':>13} {'cut':>6} {'XLA args MiB':>12} "
                f"{'XLA cut':>7} {'temp MiB':>9} {'out-alias':>9} {'compile s':>9}")
        print(head + "\n" + "-" * len(head))
        base = base_xla = None
        for data, fsdp in _MESHES:
            mesh = parallel.make_mesh({"data": data, "fsdp": fsdp}, devices)
            state = training.abstract_train_state(task.init_params, optimizer, mesh)
            batch = jax.ShapeDtypeStruct((B, L), jnp.int32, sharding=parallel.batch_sharding(mesh))
            key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=parallel.replicated(mesh))
            t0 = time.perf_counter()
            compiled = training.make_train_step(task, optimizer, mesh).lower(state, batch, key).compile()
            seconds = time.perf_counter() - t0
            ma = compiled.memory_analysis()
            mine = _per_device_bytes(state)
            base = base or mine
            base_xla = base_xla or ma.argument_size_in_bytes
            print(f"{f'({data}, {fsdp})':>16} {_mib(mine):>13} {base / mine:>5.2f}x "
                  f"{_mib(ma.argument_size_in_bytes):>12} {base_xla / ma.argument_size_in_bytes:>6.2f}x "
                  f"{_mib(ma.temp_size_in_bytes):>9} "
                  f"{_mib(ma.output_size_in_bytes - ma.alias_size_in_bytes):>9} {seconds:>9.1f}")
        print(f"  fsdp=8 cuts params + EMA + optimizer bytes per device {base / mine:.2f}x "
              f"(acceptance: >= 6x)")


if __name__ == "__main__":
    app.run(main)
