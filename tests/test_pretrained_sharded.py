"""Released weights sharded over a mesh's 'fsdp' axis (``load_pretrained(..., mesh=)``): the same
numbers as unsharded (MDLM's DiT and LLaDA), on two host CPU devices (XLA_FLAGS in a
subprocess, as tests/test_parallel.py)."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent('''
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    import infodiff
    from infodiff import parallel, pretrained
    assert jax.device_count() == 2, jax.devices()
    mesh = parallel.make_mesh({"data": 1, "fsdp": 2})
    F = "tests/fixtures/pretrained/"
    ids = [[int(v) for v in np.random.default_rng(0).integers(0, 40, 16)]]
    for name, S in (("mdlm", 8), ("llada", 8)):
        whole = infodiff.load_pretrained(F + name, num_samples=S)
        split = infodiff.load_pretrained(F + name, num_samples=S, mesh=mesh)
        specs = [leaf.sharding.spec for leaf in jax.tree.leaves(split.loaded.params)]
        n_split = sum(any(a == "fsdp" for a in s) for s in specs)
        assert n_split >= 5, (name, specs)  # the weight matrices and embeddings are split
        for leaf, ref in zip(jax.tree.leaves(split.loaded.params), jax.tree.leaves(whole.loaded.params)):
            np.testing.assert_array_equal(np.asarray(leaf), np.asarray(ref))
        L, V = whole.loaded.max_seq_len, whole.loaded.vocab_size
        x = np.asarray(np.random.default_rng(1).integers(0, V, (2, L)), np.int32)
        sigma = np.array([0.3, 2.0], np.float32)
        a, b = np.asarray(whole.apply(x, sigma)), np.asarray(split.apply(x, sigma))
        keep = a > -1e5
        np.testing.assert_allclose(b[keep], a[keep], rtol=1e-5, atol=1e-5 * np.abs(a[keep]).max())
        ids_n = [[i % (V - (whole.loaded.mask_id >= 0)) for i in ids[0]] + [0] * (L - 16)]
        e1, e2 = whole.nll(ids_n), split.nll(ids_n)
        np.testing.assert_allclose(e2.mean, e1.mean, rtol=1e-5)
        np.testing.assert_allclose(e2.stderr, e1.stderr, rtol=1e-4)
        print(name, n_split, "of", len(specs), "arrays split;", float(e1.mean[0]), float(e2.mean[0]))
''')


@pytest.mark.slow  # ~40 s: a fresh process compiling two networks twice
def test_sharded_weights_give_the_same_numbers():
    env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=2"), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("arrays split") == 2, r.stdout
