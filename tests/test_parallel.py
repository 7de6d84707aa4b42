"""infodiff.parallel without starting processes: the start settings, the mesh shape, the
parameter sharding rules and the per-process rows (the multi-process runs themselves are in
tests/test_distributed.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from infodiff import parallel


@pytest.mark.parametrize("env, kind", [
    ({}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}, None),  # one task: nothing to join
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, "slurm"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "ompi"),
    ({"TPU_WORKER_HOSTNAMES": "t0"}, None),               # a single-host TPU
    ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}, "tpu"),
])
def test_cluster_detected(env, kind):
    assert parallel.cluster_detected(env) == kind


@pytest.mark.parametrize("kwargs, env, message", [
    (dict(num_processes=2), {}, "without --coordinator_address=HOST:PORT"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), {}, "process_id=2 must be in [0, 2)"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=-1), {}, "process_id=-1 must be in [0, 2)"),
    (dict(coordinator_address="h", num_processes=2, process_id=0), {}, "must be HOST:PORT"),
    (dict(coordinator_address="h:99999", num_processes=2, process_id=0), {}, "must be HOST:PORT"),
    (dict(coordinator_address=":12", num_processes=2, process_id=0), {}, "must be HOST:PORT"),
    (dict(num_processes=0), {}, "num_processes=0 must be >= 1"),
    (dict(coordinator_address="h:1"), {}, "needs --num_processes and --process_id"),
    ({}, {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     "num_processes='two' is not an integer"),
])
def test_bad_start_settings_are_one_line_errors(kwargs, env, message):
    with pytest.raises(parallel.DistributedError, match=re.escape(message)):
        parallel.initialize(**kwargs, environ=env)


def test_a_single_process_is_left_alone():
    assert parallel.initialize(environ={}) is False
    assert parallel.initialize(num_processes=1, environ={}) is False
    assert jax.process_count() == 1


@pytest.mark.parametrize("data, fsdp, n, shape", [
    (-1, 1, 8, (8, 1)), (-1, 2, 8, (4, 2)), (2, -1, 8, (2, 4)), (1, 8, 8, (1, 8)), (-1, 1, 1, (1, 1)),
])
def test_mesh_shape(data, fsdp, n, shape):
    assert parallel.mesh_shape({"data": data, "fsdp": fsdp}, n) == shape


@pytest.mark.parametrize("data, fsdp, n, message", [
    (-1, 3, 8, "does not fit the 8 devices"), (4, 4, 8, "does not fit the 8 devices"),
    (0, 1, 8, "use positive sizes"), (-1, -1, 8, "at most one of them -1"), (-2, 1, 8, "use positive sizes"),
])
def test_bad_mesh_shape(data, fsdp, n, message):
    with pytest.raises(parallel.DistributedError, match=message):
        parallel.mesh_shape({"data": data, "fsdp": fsdp}, n)


class _FakeMesh:
    """Only what param_specs reads: the axis sizes."""

    def __init__(self, fsdp):
        self.shape = {"data": 1, "fsdp": fsdp}


def test_sharding_rules():
    params = {"block": {"qkv": {"kernel": jnp.zeros((32, 96)), "bias": jnp.zeros(96)},
                        "ln": {"scale": jnp.zeros(32)}},
              "embed": {"embedding": jnp.zeros((28, 32))},
              "odd": {"kernel": jnp.zeros((3, 5))},
              "conv": {"kernel": jnp.zeros((3, 3, 8, 16))}}
    specs = parallel.param_specs(params, _FakeMesh(4))
    assert specs["block"]["qkv"]["kernel"] == P(None, "fsdp")      # the largest axis (96) divides by 4
    assert specs["embed"]["embedding"] == P(None, "fsdp")         # 28 does, too, but 32 is larger
    assert specs["conv"]["kernel"] == P(None, None, None, "fsdp")
    assert specs["block"]["qkv"]["bias"] == P() and specs["block"]["ln"]["scale"] == P()
    assert specs["odd"]["kernel"] == P()                          # no axis divides by 4: whole
    assert all(s == P() for s in jax.tree.leaves(parallel.param_specs(params, _FakeMesh(1)),
                                                 is_leaf=lambda s: isinstance(s, P)))


def test_process_rows_of_one_process():
    mesh = parallel.make_mesh()
    sharding = parallel.batch_sharding(mesh)
    assert parallel.process_rows(sharding, (8, 3)) == slice(0, 8)
    x = parallel.global_batch(jnp.arange(24).reshape(8, 3), sharding, (8, 3))
    assert x.shape == (8, 3) and int(x.sum()) == 276
