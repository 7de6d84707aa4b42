"""infodiff/provenance.py: the block written into every result file (report.json, results.json,
checkpoint metadata)."""

import importlib.metadata
import json
import sys

import jax

import infodiff
from infodiff import provenance
from infodiff.experiments import paper


def test_the_block_names_versions_machine_inputs_and_revision():
    ckpt = {"step": 7, "state_sha256": "ab" * 32}
    data = {"path": "/x.txt", "sha256": "cd" * 32}
    p = provenance.collect(checkpoint=ckpt, data=data)
    assert set(p["packages"]) == {*provenance.PACKAGES, "infodiff"}
    assert p["packages"]["jax"] == jax.__version__ == importlib.metadata.version("jax")
    assert p["packages"]["infodiff"] == infodiff.__version__
    assert p["devices"] == {"platform": jax.default_backend(), "kind": jax.devices()[0].device_kind,
                            "count": jax.device_count()}
    assert p["processes"] == 1 and p["checkpoint"] == ckpt and p["data"] == data
    assert p["argv"] == list(sys.orig_argv) and p["host"] and p["python"].count(".") == 2
    assert len(p["git"]["revision"]) == 40  # the tests run in a checkout
    json.dumps(p, allow_nan=False)  # strict JSON


def test_outside_a_checkout_git_says_so(monkeypatch, tmp_path):
    assert provenance.git_info(str(tmp_path)) is None
    monkeypatch.setattr(provenance, "git_info", lambda path=None: None)
    assert provenance.collect()["git"] == provenance.NOT_A_CHECKOUT


def test_experiment_results_carry_it(tmp_path):
    paths = paper.write_results(str(tmp_path), {"mae": 0.5}, "| a |")
    out = json.loads(open(paths["json"]).read())
    assert out["mae"] == 0.5 and out["provenance"]["checkpoint"] is None  # no trained model in tmp_path/train
    assert out["provenance"]["packages"]["numpy"] == importlib.metadata.version("numpy")
