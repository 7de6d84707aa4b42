"""infodiff.denoisers: one contract for networks (apply_params, params) and parameter-free oracles."""

import jax.numpy as jnp
import pytest

from infodiff import denoisers, oracles
import numpy as np


class _Net:
    params = {"w": jnp.ones(())}
    vocab_size = 3

    def apply_params(self, params, z, t):
        return params["w"] * z


def test_split_network_and_oracle():
    net = _Net()
    fn, params = denoisers.split(net)
    assert params is net.params and fn(params, jnp.ones(2), None).tolist() == [1.0, 1.0]
    orc = oracles.random_tabular(np.random.default_rng(0), "AB", 3, 4)
    fn, params = denoisers.split(orc)
    assert params is None and fn == denoisers.NoParams(orc) and hash(fn) == hash(denoisers.NoParams(orc))
    z = np.full((1, 3), 2, np.int32)
    assert np.allclose(np.asarray(fn(None, z, None)), np.asarray(orc(z)))


def test_errors():
    with pytest.raises(TypeError, match="callable"):
        denoisers.split(3)
    with pytest.raises(ValueError, match="vocab_size"):
        denoisers.vocab_size_of(lambda z, t: z)
    assert denoisers.vocab_size_of(_Net()) == 3 and denoisers.vocab_size_of(_Net(), 5) == 5
