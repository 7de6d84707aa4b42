"""infodiff.validation: the one token validator and the one count validator."""

import numpy as np
import pytest

from infodiff.validation import validate_counts, validate_rates, validate_tokens


@pytest.mark.parametrize("bad, msg", [
    ([[1, 2], [3, -2]], r"x\[1, 1\] = -2 is negative"),
    ([0.0, 1.5], r"x\[1\] = 1.5 is not an integer"),
    ([0.0, np.nan], r"x\[1\] = nan is not finite"),
    ([np.inf], r"x\[0\] = inf is not finite"),
])
def test_validate_counts_rejects(bad, msg):
    with pytest.raises(ValueError, match=msg):
        validate_counts(bad)


def test_validate_counts_returns_int64():
    out = validate_counts(np.array([[0.0, 3.0]]))
    assert out.dtype == np.int64 and out.tolist() == [[0, 3]]



def test_validate_tokens():
    x = validate_tokens(np.array([[0, 3], [2, 1]], np.int64), 4)
    assert x.dtype == np.int32
    with pytest.raises(TypeError, match="integer"):
        validate_tokens(np.zeros((1, 2), np.float32), 4)
    with pytest.raises(ValueError, match=r"x\[1, 0\] = 4 is outside the vocabulary \[0, 4\)"):
        validate_tokens(np.array([[0, 1], [4, 0]]), 4)
    with pytest.raises(ValueError, match="shape"):
        validate_tokens(np.zeros(3, np.int32), 4)
    with pytest.raises(ValueError, match="length 3"):
        validate_tokens(np.zeros((1, 2), np.int32), 4, seq_len=3)


def test_validate_rates():
    assert validate_rates([[0.0, 1.5]]).dtype == np.float64
    with pytest.raises(ValueError, match="negative"):
        validate_rates([[1.0, -0.5]])
