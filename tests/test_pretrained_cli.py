"""evaluate.py --pretrained DIR: a released checkpoint scores a file (bits per byte of the original
UTF-8 text and nats per token), --compare with another checkpoint, bad input as one line with
nothing written."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from infodiff import evaluation
from infodiff.pretrained import cli_config

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "pretrained"
DOCS = "hello world\nthe cat sat on the mat, quietly.\n"


@pytest.fixture()
def checkpoint(tmp_path):
    """The MDLM fixture with a 40-character tokenizer.json beside it, and a text file."""
    from tests.test_pretrained_run import _char_tokenizer

    d = tmp_path / "mdlm"
    shutil.copytree(FIXTURES / "mdlm", d)
    _char_tokenizer(d, 40)
    (tmp_path / "docs.txt").write_text(DOCS)
    return d


def _config(d, **ev):
    c = cli_config.get_config(str(d))
    c.eval.update(ev)
    return c


def test_pretrained_scores_a_file(checkpoint, tmp_path):
    out = tmp_path / "out"
    config = _config(checkpoint, input=str(tmp_path / "docs.txt"), output_dir=str(out), input_samples=16)
    report, out_dir = evaluation.evaluate(config, None, pretrained=str(checkpoint))
    s = report["summary"]
    assert out_dir == str(out)
    assert s["bytes"] == len(DOCS.replace("\n", "").encode()) and s["tokens"] == s["bytes"]  # one char a token
    assert np.isclose(s["bits_per_byte"], s["total_nats"] / (s["bytes"] * np.log(2)))
    assert np.isclose(s["nll_per_token"], s["total_nats"] / s["tokens"])
    assert report["process"]["kind"] == "mdlm" and report["process"]["name"] == "masked"
    assert report["bound"] == "nelbo"
    assert "nats per token" in evaluation.format_report(report)


def test_pretrained_compare_with_another_checkpoint(checkpoint, tmp_path):
    other = tmp_path / "sedd"
    shutil.copytree(FIXTURES / "sedd_absorb", other)
    shutil.copy(checkpoint / "tokenizer.json", other / "tokenizer.json")  # the same tokenizer: rows compare
    config = _config(checkpoint, input=str(tmp_path / "docs.txt"), input_samples=8)
    report, _ = evaluation.evaluate(config, None, compare=str(other), pretrained=str(checkpoint))
    assert report["runs"]["b"]["process"]["kind"] == "sedd"
    assert report["summary"]["rows"] == 2


def _cli(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "evaluate.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args,words", [
    (["--pretrained", "{tmp}/nowhere", "--config.eval.input={tmp}/docs.txt"], "does not exist"),
    (["--pretrained", "{ck}"], "--config.eval.input=FILE"),
    (["--pretrained", "{ck}", "--config.eval.input={tmp}/docs.txt", "--config.eval.use_ema=True"],
     "eval.use_ema is not read"),
    (["--pretrained", "{ck}", "--config.eval.input={tmp}/docs.txt", "--config.pretrained.kind=sedd"],
     "holds a mdlm checkpoint"),
])
def test_pretrained_bad_input_is_one_line(checkpoint, tmp_path, args, words):
    args = [a.format(tmp=tmp_path, ck=checkpoint) for a in args]
    before = sorted(p.name for p in checkpoint.iterdir())
    r = _cli(*args)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert sorted(p.name for p in checkpoint.iterdir()) == before  # nothing written


def test_cli_config_keys_are_documented():
    c = cli_config.get_config("DIR")
    assert c.pretrained.path == "DIR" and json.loads(c.to_json())["eval"]["input_samples"] == 0
