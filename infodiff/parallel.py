"""Many processes and devices: ``jax.distributed`` start, the (data, fsdp) mesh, parameter
sharding rules and per-process batches.

One code path for one device, several local devices and a pod: a run's result does not depend
on how it was launched (the same global batch, the same random draws at every step; float
rounding of the reductions aside).

* :func:`initialize` calls ``jax.distributed.initialize`` when the run is one of several
  processes (explicit address / count / id, the ``JAX_COORDINATOR_ADDRESS`` /
  ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` environment, or a detected SLURM, Open MPI or
  multi-host TPU job); a single process is left as it is.
* :func:`make_mesh`: a 2-D :class:`jax.sharding.Mesh` with axes ``('data', 'fsdp')`` over all
  devices of all processes (``config.train.mesh``). Batches are split along both axes
  (:func:`batch_sharding`); parameters and optimizer state along ``'fsdp'`` by the rule table
  :data:`FSDP_RULES` (:func:`state_shardings`); the train step gathers the parameters once
  and reduce-scatters their gradient (parameters, EMA and optimizer state split at rest, as in
  ZeRO: Rajbhandari et al. 2020, arXiv:1910.02054; the gather is per step, not per layer).
* :func:`process_rows` / :func:`global_batch`: each process reads only its rows of a global
  batch and the global ``jax.Array`` is assembled from the per-process pieces
  (``jax.make_array_from_process_local_data``).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
import signal
import sys
from typing import Any, Iterator

import jax
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from infodiff import supervise
from infodiff.supervise import DistributedError, cluster_detected

__all__ = [
    "AXES",
    "FSDP_RULES",
    "DistributedError",
    "cluster_detected",
    "initialize",
    "is_primary",
    "check_same",
    "agreed_signal",
    "mesh_shape",
    "make_mesh",
    "batch_sharding",
    "replicated",
    "param_specs",
    "describe",
    "state_shardings",
    "process_rows",
    "global_batch",
    "to_host",
    "sync",
    "rows_mesh",
    "current_rows_mesh",
]

AXES = ("data", "fsdp")

# Which parameters are split along the 'fsdp' axis: (regex over the '/'-joined parameter path,
# policy), first match wins. "largest": along the leaf's largest axis whose size the fsdp size
# divides (the first of equal ones); a leaf that no axis fits stays replicated. None: replicated.
# Matmul kernels and embeddings hold all but a fraction of a per cent of the parameters; biases,
# LayerNorm scales and the step counter stay whole on every device.
FSDP_RULES = (
    (r"(^|/)(kernel|embedding)$", "largest"),
    (r".*", None),
)


# ---------------------------------------------------------------------------------------------
# Start
# ---------------------------------------------------------------------------------------------
def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, environ: dict | None = None) -> bool:
    """Join a multi-process run; True if ``jax.distributed.initialize`` was called.

    Explicit arguments win over ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
    ``JAX_PROCESS_ID``; with neither, a detected cluster (:func:`cluster_detected`) lets JAX
    find its settings. Nothing is done for a single process (``num_processes`` 1 or nothing
    given), so one-process runs are unchanged. Must run before any other JAX call. The
    command-line entry points run this in the worker of :mod:`infodiff.supervise`, once every
    process has joined; a dead or missing process is then one line, not JAX's C++ abort.

    Raises DistributedError (one line): an address without ``host:port``, a count < 1, an id
    outside ``[0, num_processes)``, or a count / id without an address.
    """
    env = os.environ if environ is None else environ
    found = supervise.settings(coordinator_address, num_processes, process_id, env)
    if found is None:
        return False
    if found == "cluster":
        jax.distributed.initialize()
        return True
    address, n, pid = found
    timeout = supervise.timeout_s(env)
    if not supervise.is_worker(env):  # else its supervisor said so
        print(f"process {pid} of {n}: joining the run at {address} (waiting up to {timeout} s for all "
              f"processes; set {supervise.TIMEOUT_ENV} to change)", file=sys.stderr, flush=True)
    jax.distributed.initialize(address, n, pid, initialization_timeout=timeout)
    return True


def check_same(text: str, what: str) -> None:
    """DistributedError (one line, on every process) unless ``text`` (e.g. the config as JSON)
    is the same in every process; nothing in a single process."""
    if jax.process_count() == 1:
        return
    mine = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), -1)
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise DistributedError(f"processes {differ} were started with {what} different from process 0's: "
                               "start every process with the same command (only --process_id differs)")


def agreed_signal(signum: int | None) -> str | None:
    """The name of the signal any process received (``signum`` is this process's, or None), the
    same answer in every process (a gather: every process must call it at the same point); the
    larger number if they differ (SIGTERM over SIGINT)."""
    if jax.process_count() == 1:
        return None if signum is None else signal.Signals(int(signum)).name
    every = np.asarray(multihost_utils.process_allgather(np.int32(signum or 0))).ravel()
    got = [int(v) for v in every if v]
    return signal.Signals(max(got)).name if got else None


def is_primary() -> bool:
    """True in process 0 (the one that writes metrics, reports and config files)."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """Barrier of all processes (a no-op in a single process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


# ---------------------------------------------------------------------------------------------
# Mesh and shardings
# ---------------------------------------------------------------------------------------------
def mesh_shape(mesh_config: Any, num_devices: int) -> tuple[int, int]:
    """``(data, fsdp)`` from ``config.train.mesh`` (``data`` and ``fsdp``; one of them may be -1:
    what the other leaves of ``num_devices``). DistributedError unless the product is
    ``num_devices``."""
    data = int(mesh_config["data"]) if mesh_config is not None else -1
    fsdp = int(mesh_config["fsdp"]) if mesh_config is not None else 1
    if (data, fsdp).count(-1) > 1 or min(data, fsdp) < -1 or 0 in (data, fsdp):
        raise DistributedError(f"config.train.mesh data={data} fsdp={fsdp}: use positive sizes, at most "
                               "one of them -1 (the rest of the devices)")
    want = (data, fsdp)
    if data == -1:
        data, rest = divmod(num_devices, fsdp)
    elif fsdp == -1:
        fsdp, rest = divmod(num_devices, data)
    else:
        rest = 0
    if rest or min(data, fsdp) < 1 or data * fsdp != num_devices:
        raise DistributedError(f"config.train.mesh data={want[0]} fsdp={want[1]} does not fit the "
                               f"{num_devices} devices of this run (data x fsdp must equal it)")
    return data, fsdp


def make_mesh(mesh_config: Any = None, devices: Any = None):
    """The ``('data', 'fsdp')`` mesh over ``devices`` (default: every device of every process,
    in process order, so that each 'fsdp' group lies on as few hosts as possible).
    ``mesh_config``: ``config.train.mesh`` (default: all devices on 'data')."""
    devs = list(jax.devices() if devices is None else devices)
    devs.sort(key=lambda d: (d.process_index, d.id))
    data, fsdp = mesh_shape(mesh_config, len(devs))
    return Mesh(np.array(devs, dtype=object).reshape(data, fsdp), AXES)


def batch_sharding(mesh):
    """Leading (batch) axis split over every device of ``mesh`` (all its axes)."""
    return NamedSharding(mesh, P(tuple(mesh.axis_names)))


def replicated(mesh):
    """A whole copy on every device of ``mesh``."""
    return NamedSharding(mesh, P())


def _path_name(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(jax.tree_util.keystr((k,)))
    return "/".join(parts)


def _leaf_spec(name: str, shape: tuple, fsdp: int, rules=FSDP_RULES):
    for pattern, policy in rules:
        if re.search(pattern, name):
            break
    else:
        policy = None
    if policy is None or fsdp == 1:
        return P()
    if policy != "largest":
        raise ValueError(f"unknown sharding policy {policy!r} for {name}")
    axes = sorted(range(len(shape)), key=lambda i: (-shape[i], i))
    for i in axes:
        if shape[i] % fsdp == 0:
            return P(*[("fsdp" if j == i else None) for j in range(len(shape))])
    return P()


def param_specs(params: Any, mesh, rules=FSDP_RULES) -> Any:
    """PartitionSpec per leaf of ``params`` (arrays or ShapeDtypeStructs) by ``rules`` for the
    'fsdp' size of ``mesh`` (all ``P()`` when it is 1)."""
    fsdp = int(mesh.shape["fsdp"]) if "fsdp" in mesh.shape else 1
    return jax.tree_util.tree_map_with_path(
        lambda path, x: _leaf_spec(_path_name(path), tuple(x.shape), fsdp, rules), params)


def state_shardings(abstract_state: Any, optimizer: Any, mesh) -> Any:
    """NamedShardings of a :class:`infodiff.training.TrainState`: ``params`` and
    ``ema_params`` by :func:`param_specs`, the optimizer's parameter-shaped state (Adam's
    moments) like the parameters it belongs to (``optax.tree_map_params``), everything else
    (step, counters) replicated."""
    specs = param_specs(abstract_state.params, mesh)
    named = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    repl = NamedSharding(mesh, P())
    opt = optax.tree_map_params(optimizer, lambda _, s: s, abstract_state.opt_state, named,
                                transform_non_params=lambda _: repl,
                                is_leaf=lambda s: isinstance(s, NamedSharding))
    return abstract_state.replace(step=repl, params=named, ema_params=named, opt_state=opt)


def describe(mesh, params: Any) -> str:
    """One line: processes, devices, the mesh and how much of ``params`` (arrays or
    ShapeDtypeStructs) :func:`param_specs` splits over 'fsdp'."""
    specs = jax.tree.leaves(param_specs(params, mesh), is_leaf=lambda s: isinstance(s, P))
    sizes = [int(np.prod(x.shape)) for x in jax.tree.leaves(params)]
    split = [n for n, s in zip(sizes, specs) if any(a is not None for a in s)]
    return (f"{jax.process_count()} process(es) x {jax.local_device_count()} device(s) "
            f"({mesh.devices.flat[0].platform}), mesh data={mesh.shape['data']} fsdp={mesh.shape['fsdp']}; "
            f"{len(split)} of {len(sizes)} parameter arrays ({100.0 * sum(split) / max(1, sum(sizes)):.1f}% "
            f"of the parameters) split over fsdp")


# ---------------------------------------------------------------------------------------------
# Per-process data
# ---------------------------------------------------------------------------------------------
def process_rows(sharding, global_shape: tuple) -> slice:
    """The rows of a global batch that this process's devices hold under ``sharding`` (split
    along the leading axis): one contiguous slice."""
    blocks = sorted({(i[0].start or 0, global_shape[0] if i[0].stop is None else i[0].stop)
                     for i in sharding.addressable_devices_indices_map(tuple(global_shape)).values()})
    if any(b0 != a1 for (_, a1), (b0, _) in zip(blocks, blocks[1:])):
        raise DistributedError(f"this process's devices do not hold one contiguous block of rows ({blocks})")
    lo, hi = blocks[0][0], blocks[-1][1]
    return slice(lo, hi)


def global_batch(local_rows: Any, sharding, global_shape: tuple):
    """The global ``jax.Array`` of shape ``global_shape`` whose rows :func:`process_rows` are
    ``local_rows`` (numpy) in this process."""
    return jax.make_array_from_process_local_data(sharding, local_rows, tuple(global_shape))


def to_host(tree: Any) -> Any:
    """numpy copy of a pytree of arrays, whole on every process (gathered across processes when
    they are split over several; every process must call it)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_replicated or x.is_fully_addressable:
            return jax.device_get(x)
        return multihost_utils.process_allgather(x, tiled=True)

    return jax.tree.map(one, tree)


# ---------------------------------------------------------------------------------------------
# The Monte Carlo rows of likelihood evaluation
# ---------------------------------------------------------------------------------------------
_ROWS_MESH: contextvars.ContextVar = contextvars.ContextVar("infodiff_rows_mesh", default=None)


@contextlib.contextmanager
def rows_mesh(mesh) -> Iterator[None]:
    """Within the block, :func:`infodiff.likelihood.estimate` splits the Monte Carlo rows of
    each call over every device of ``mesh`` (None: one device, as outside)."""
    token = _ROWS_MESH.set(mesh if mesh is not None and mesh.devices.size > 1 else None)
    try:
        yield
    finally:
        _ROWS_MESH.reset(token)


def current_rows_mesh():
    """The mesh set by :func:`rows_mesh`, or None."""
    return _ROWS_MESH.get()
