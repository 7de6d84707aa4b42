"""Training throughput of the jitted train step, and how it compares to the machine's matmul rate.

    python benchmarks/train_throughput.py                          # configs/masked_text.py
    python benchmarks/train_throughput.py --config.train.batch_size=128 --config.model.width=256
    python benchmarks/train_throughput.py --config configs/other.py --repeats 10
    python benchmarks/train_throughput.py --attention=einsum,dot_product  # both, interleaved

Times ``infodiff.training.make_train_step`` of the config's task (``infodiff.tasks.make_task``;
the exact function train.py runs: loss, backward, clip + AdamW, EMA; data-parallel over all
local devices) on random tokens, excluding
compilation and warmup steps; reports the median and best of ``--repeats`` timings of
``--steps`` consecutive steps each. Model FLOPs per token are
``infodiff.networks.transformer.flops_per_token`` (6 N + 12 n_layers D L, forward + backward,
Kaplan et al. 2020), so "achieved FLOP/s" counts only the matmul work of the model, not the
optimizer, LayerNorm, softmax or the mask sampling. The reference is the dense float32 matmul
rate of this process (``jnp.dot`` of two ``--matmul_size`` square matrices, best of 5 timed
runs with ``block_until_ready``), measured before each repeat of the steps, since it drifts by
about 15 % between minutes on a shared machine; the ratio (median over the repeats, each step
time over the matmul rate beside it) is the model-FLOP utilisation (MFU) relative to that, not
to a datasheet peak.

The peer: a plain train step of the same FLOPs timed in the same run, interleaved repeat by
repeat with the library's: ``benchmarks/plain_transformer.py`` (the transformer in plain jnp on
the same parameters, token-major attention), a masked cross-entropy weighted by 1 / t with
t ~ U(0, 1), and ``optax.adamw`` + clipping + EMA written out here. "vs plain step" is the
library's tokens/s over the peer's, so a regression of the library shows as a ratio, not as an
absolute time. ``--attention=einsum,dot_product`` times the library's step once per attention
path (``config.model.attention``; same parameters and batches), interleaved with each other and
with the peer; the rows after the first path's are that path's step time and its tokens/s
relative to the first. A benchmark, not a test: it asserts nothing.
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
    "config", os.path.join(_REPO, "configs", "masked_text.py"), "Training config.", lock_config=True
)
_STEPS = flags.DEFINE_integer("steps", 10, "Train steps per timed repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats (median and best reported).")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_MATMUL = flags.DEFINE_integer("matmul_size", 2048, "Side of the square float32 matmul reference.")
_ATTENTION = flags.DEFINE_list("attention", [], "Attention paths to time, interleaved (e.g. einsum,dot_product); "
                               "default: the config's model.attention.")


def _fmt(x: float, unit: str) -> str:
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def matmul_rate_runner(n: int):
    """``rate(repeats)``: the best-of-``repeats`` dense float32 [n, n] @ [n, n] rate (2 n^3
    FLOPs per product) in FLOP/s, compiled once."""
    import jax
    import jax.numpy as jnp

    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.float32)
    b = jax.random.normal(kb, (n, n), jnp.float32)
    dot = jax.jit(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST))
    dot(a, b).block_until_ready()

    def rate(repeats: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            dot(a, b).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n**3 / best

    return rate


def _plain_step_runner(config, params, batches):
    """``run(n)``: n plain train steps (the peer, see the module docstring) from ``params``."""
    import jax
    import jax.numpy as jnp
    import optax

    from benchmarks.plain_transformer import reference_forward

    m, o = config.model, config.optim
    V = int(config.data.vocab_size)
    clip = optax.clip_by_global_norm(float(o.grad_clip)) if float(o.grad_clip) > 0 else optax.identity()
    opt = optax.chain(clip,
                      optax.adamw(float(o.lr), b1=float(o.b1), b2=float(o.b2), eps=float(o.eps),
                                  weight_decay=float(o.weight_decay)))

    def loss(p, x_BxL, key):
        kt, km = jax.random.split(key)
        t_B = jax.random.uniform(kt, (x_BxL.shape[0],), minval=1e-3)
        mask_BxL = jax.random.uniform(km, x_BxL.shape) < t_B[:, None]
        z_BxL = jnp.where(mask_BxL, V, x_BxL)
        logp_BxLxV = reference_forward(p, z_BxL, t_B, num_layers=int(m.num_layers), num_heads=int(m.num_heads))
        ce_BxL = -jnp.take_along_axis(logp_BxLxV, x_BxL[..., None], -1)[..., 0]
        return jnp.mean(jnp.sum(jnp.where(mask_BxL, ce_BxL, 0.0), -1) / t_B)

    @jax.jit
    def step(carry, x_BxL, key):
        p, ema, s = carry
        g = jax.grad(loss)(p, x_BxL, key)
        u, s = opt.update(g, s, p)
        p = optax.apply_updates(p, u)
        return p, optax.incremental_update(p, ema, step_size=1.0 - float(o.ema_decay)), s

    carry = [(params, params, opt.init(params))]
    key = jax.random.key(2)

    def run(n):
        for i in range(n):
            carry[0] = step(carry[0], batches[i % len(batches)], jax.random.fold_in(key, i))
        jax.block_until_ready(carry[0])

    return run


def main(argv):
    del argv
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from infodiff import tasks, training
    from infodiff.networks.transformer import count_params, flops_per_token

    config = _CONFIG.value
    B, L, V = int(config.train.batch_size), int(config.data.seq_len), int(config.data.vocab_size)
    attentions = list(_ATTENTION.value) or [str(config.model.get("attention", "einsum"))]
    mesh = training.make_mesh()
    training.check_batch_divisible(B, mesh)
    batch_sharding = NamedSharding(mesh, P("data"))
    rng = np.random.default_rng(0)
    batches = [jax.device_put(rng.integers(0, V, (B, L)).astype(np.int32), batch_sharding) for _ in range(4)]
    key = jax.random.key(1)

    def library_runner(attention):
        """(run(n), model, params): n library train steps of the config with ``attention``."""
        c = config.copy_and_resolve_references()
        with c.unlocked():
            c.model.attention = attention
        task = tasks.make_task(c)  # the corpus is never loaded: the batches are random tokens
        optimizer = training.make_optimizer(c)
        state = [training.init_train_state(task.init_params, optimizer, jax.random.key(0), mesh)]
        train_step = training.make_train_step(task, optimizer, mesh)
        step = [0]

        def run(n):
            for _ in range(n):
                state[0], metrics = train_step(state[0], batches[step[0] % len(batches)],
                                               jax.random.fold_in(key, step[0]))
                step[0] += 1
            jax.block_until_ready((state[0], metrics))

        return run, task.model, jax.device_get(state[0].params)  # host copy: the step donates the state

    runs, compile_s = {}, {}
    for a in attentions:
        runs[a], model_a, params_a = library_runner(a)
        if a == attentions[0]:
            model, params = model_a, params_a  # the FLOP count and the peer use the first path's
        t0 = time.perf_counter()
        runs[a](1)
        compile_s[a] = time.perf_counter() - t0
        runs[a](_WARMUP.value)
    first = attentions[0]
    peer_run = _plain_step_runner(config, params, batches)
    peer_run(1 + _WARMUP.value)
    times, peer_times, matmul_rates = {a: [] for a in attentions}, [], []
    matmul_rate = matmul_rate_runner(_MATMUL.value)
    for _ in range(_REPEATS.value):  # interleaved: all see the same machine state
        matmul_rates.append(matmul_rate(5))
        for a in attentions:
            t0 = time.perf_counter()
            runs[a](_STEPS.value)
            times[a].append((time.perf_counter() - t0) / _STEPS.value)
        t0 = time.perf_counter()
        peer_run(_STEPS.value)
        peer_times.append((time.perf_counter() - t0) / _STEPS.value)
    step_med, step_best = statistics.median(times[first]), min(times[first])
    peer_med = statistics.median(peer_times)

    fpt = flops_per_token(model)
    tokens_per_step = B * L
    peak = statistics.median(matmul_rates)
    achieved = fpt * tokens_per_step / step_med
    shares = sorted(fpt * tokens_per_step / t / r for t, r in zip(times[first], matmul_rates))
    dev = mesh.devices.flat[0]
    rows = [
        ("devices", f"{mesh.devices.size} x {dev.platform} ({getattr(dev, 'device_kind', '')}), "
                    f"{os.cpu_count()} host CPUs"),
        ("model", f"{config.model.num_layers} layers, width {config.model.width}, "
                  f"{config.model.num_heads} heads, dtype {config.model.dtype}, "
                  f"time_conditioning={config.model.time_conditioning}, attention {first}"),
        ("objective", f"{config.process.objective} ({config.process.schedule})"),
        ("batch", f"{B} x {L} = {tokens_per_step} tokens/step"),
        ("params", f"{count_params(params):,}"),
        ("compile + first step", f"{compile_s[first]:.2f} s"),
        ("step time (median / best)", f"{step_med * 1e3:.2f} / {step_best * 1e3:.2f} ms "
                                      f"({_REPEATS.value} x {_STEPS.value} steps)"),
        ("steps/s", f"{1.0 / step_med:.2f}"),
        ("tokens/s", f"{tokens_per_step / step_med:,.0f}"),
        ("model FLOPs/token (fwd+bwd)", _fmt(fpt, "FLOP")),
        ("achieved model FLOP/s", _fmt(achieved, "FLOP/s")),
        (f"float32 matmul {_MATMUL.value}^2 FLOP/s", f"{_fmt(peak, 'FLOP/s')} (median; "
                                                    f"{min(matmul_rates) / 1e9:.0f}-{max(matmul_rates) / 1e9:.0f} GFLOP/s)"),
        ("fraction of matmul rate", f"{statistics.median(shares):.1%} (median of the repeats; "
                                    f"{shares[0]:.1%}-{shares[-1]:.1%})"),
        ("plain jnp step (median)", f"{peer_med * 1e3:.2f} ms, {tokens_per_step / peer_med:,.0f} tokens/s"),
        ("tokens/s vs plain step", f"{peer_med / step_med:.2f}x"),
    ]
    for a in attentions[1:]:
        med = statistics.median(times[a])
        rows += [(f"attention {a}: compile + first step", f"{compile_s[a]:.2f} s"),
                 (f"attention {a}: step time (median / best)", f"{med * 1e3:.2f} / {min(times[a]) * 1e3:.2f} ms"),
                 (f"attention {a}: tokens/s vs {first}", f"{step_med / med:.2f}x")]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    app.run(main)
