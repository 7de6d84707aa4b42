"""The lm-eval model on a released checkpoint: ``model_args pretrained=DIR`` gives the numbers of
``infodiff.load_pretrained(DIR)`` (rolling log-likelihoods, multiple choice)."""
import importlib.util
import shutil

import numpy as np
import pytest

import infodiff
from tests.test_pretrained_run import FIXTURES, _char_tokenizer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                reason="lm-eval is not installed (pip install -e '.[harness]')")


def _instances(kind, args_list, doc_ids):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=kind, doc={}, arguments=a, idx=i, metadata=("t", doc_ids[i], 1))
            for i, a in enumerate(args_list)]


@pytest.fixture()
def checkpoint(tmp_path):
    d = tmp_path / "mdlm"
    shutil.copytree(FIXTURES / "mdlm", d)
    _char_tokenizer(d, 40)
    return d


@pytest.mark.slow  # ~35 s: two Runs compiled (rolling and multiple choice)
def test_harness_pretrained_is_load_pretrained(checkpoint):
    from infodiff.harness import InfodiffLM

    texts = ["hello world", "the cat sat on the mat, quietly."]
    lm = InfodiffLM(pretrained=str(checkpoint), num_samples=16)
    rolling = lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [(t,) for t in texts], [0, 1]))
    est = infodiff.load_pretrained(checkpoint, num_samples=16).nll(texts)
    np.testing.assert_allclose(rolling, -est.mean, rtol=1e-12)
    out = lm.loglikelihood(_instances("loglikelihood", [("the cat", " sat"), ("the cat", " ran")], [0, 0]))
    assert all(np.isfinite(v) and v < 0 for v, _ in out)
    assert lm.records and lm.records[0]["samples_per_option"] >= lm.first_samples


def test_harness_pretrained_bad_args_are_one_line(checkpoint, tmp_path):
    from infodiff.harness import InfodiffLM

    with pytest.raises(ValueError, match="tokenizer= goes with pretrained=DIR"):
        InfodiffLM(workdir=str(tmp_path), tokenizer="x")
    with pytest.raises(ValueError, match="not both"):
        InfodiffLM(workdir=str(tmp_path), pretrained=str(checkpoint))
    with pytest.raises(ValueError, match="does not exist"):
        InfodiffLM(pretrained=str(tmp_path / "nowhere"))
