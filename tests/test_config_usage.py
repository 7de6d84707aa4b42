"""A config key that the chosen mode does not read is an error (infodiff/config_usage.py).

For each config, a tiny real run (train + evaluate, or an oracle evaluation) under
``config_usage.track_reads`` must leave unread exactly the keys that ``config_usage.rules`` (the
process registration's ``conditional`` and ``config_usage.CONDITIONAL``) declare unread for that config: a new dead key, or a declaration that no longer matches the
code, fails here. The default suite covers one config per process, data source and mode;
``INFODIFF_ALL_CONFIGS=1`` runs every shipped config that needs no external file or download.
Then the refusal itself: an override of such a key is one line at the command line, before any
work.
"""

import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from infodiff import config_usage as cu
from infodiff import oracles

REPO = Path(__file__).resolve().parents[1]

# Shrinks a run to seconds without changing which keys it reads (only values of keys it has).
TINY = {"model.num_layers": 1, "model.width": 32, "model.num_heads": 2, "model.hidden": 16, "model.channels": 8,
        "model.emb_dim": 16, "data.seq_len": 16, "data.num_train": 256, "data.num_valid": 64, "data.num_test": 64,
        "train.batch_size": 8, "train.num_steps": 2, "train.log_every": 1, "train.eval_every": 1,
        "train.eval_batches": 1, "train.ckpt_every": 1, "optim.warmup_steps": 0,
        "eval.num_samples": 2, "eval.max_sequences": 4, "eval.max_examples": 4, "eval.num_generate": 2,
        "eval.sample_steps": 2, "eval.batch_size": 64}
ORACLE_TINY = {"eval.num_samples": 16, "eval.num_examples": 16, "eval.num_generate": 64,
               "eval.sampler_steps": (4,)}

DEFAULT = ["masked_text", "masked_bytes", "sedd_absorb_text", "poisson_synthetic", "poisson_digits",
           "oracle_tabular", "oracle_poisson", "oracle_sedd_markov"]
EVERY = DEFAULT + ["poisson_chorales", "sedd_uniform_text", "oracle_markov", "oracle_sedd_tabular", "poisson_fashion_mnist"]
CONFIGS = EVERY if os.environ.get("INFODIFF_ALL_CONFIGS") else DEFAULT


def _shrink(c, sizes):
    for k, v in sizes.items():
        g, n = k.split(".")
        if g in c and n in c[g] and not (n == "sampler_steps" and not c[g][n]):
            c[g][n] = v


def _unread_after_a_run(name, tmp_path):
    from infodiff import evaluation, tasks, training

    base, settings = {**VARIANTS, **EVERY_VARIANTS}.get(name, (name, {}))
    c = importlib.import_module(f"configs.{base}").get_config()
    oracle = c.eval.get("mode", "network") == "oracle"
    _shrink(c, ORACLE_TINY if oracle else TINY)
    files = {"INPUT_TXT": lambda p: p.write_text("the cat sat on the mat\nand the dog\n"),
             "COUNTS_NPY": lambda p: np.save(p, np.array([[0], [3]])),
             "TABLE_JSON": lambda p: p.write_text(json.dumps(
                 oracles.random_tabular(np.random.default_rng(0), "ACGT", 4, 16).to_json()))}
    for k, v in settings.items():
        if v in files:
            path = tmp_path / ("in." + v.split("_")[-1].lower())
            files[v](path)
            v = str(path)
        g, n = k.split(".")
        c[g][n] = v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if oracle:
            c.eval.output_dir = str(tmp_path)
            with cu.track_reads(c) as reads:
                evaluation.evaluate(c, None)
        else:
            with cu.track_reads(c) as reads:
                training.train(tasks.make_task(c), str(tmp_path))
                evaluation.evaluate(c, str(tmp_path))
    return c, cu.leaf_keys(c) - reads


# Settings that switch declared keys on or off, so both branches of CONDITIONAL are checked.
VARIANTS = {
    "sedd_geometric": ("sedd_absorb_text", {"process.schedule": "geometric"}),
    "poisson_manual": ("poisson_synthetic", {"process.proposal": "manual", "eval.proposal": "manual",
                                             "eval.channel_defensive": 0.0, "optim.decay": "constant",
                                             "model.head": "softplus"}),
    "masked_input": ("masked_text", {"eval.input": "INPUT_TXT"}),
    # the any-order likelihood (infodiff/orders.py): the ancestral sampler reads sample_steps without samples
    "masked_interval": ("masked_text", {"eval.interval": True, "eval.interval_orders": 2, "eval.num_generate": 0,
                                        "eval.sampler_likelihood": "ancestral"}),
    "masked_input_interval": ("masked_text", {"eval.input": "INPUT_TXT", "eval.interval": True,
                                              "eval.interval_orders": 2}),
    "tabular_file": ("oracle_tabular", {"data.path": "TABLE_JSON"}),
}
EVERY_VARIANTS = {"masked_t_dce": ("masked_text", {"process.objective": "t_dce", "process.finite_T": 4}),
                  "sedd_no_samples": ("sedd_uniform_text", {"eval.num_generate": 0}),
                  "poisson_2d_no_samples": ("poisson_synthetic", {"data.distribution": "bivariate_poisson",
                                                                  "eval.num_generate": 0}),
                  "oracle_poisson_2d": ("oracle_poisson", {"data.distribution": "bivariate_poisson",
                                                           "eval.sampler_steps": ()}),
                  "poisson_input": ("poisson_synthetic", {"eval.input": "COUNTS_NPY"})}
VARIANT_NAMES = list(VARIANTS) + (list(EVERY_VARIANTS) if os.environ.get("INFODIFF_ALL_CONFIGS") else [])


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS + VARIANT_NAMES)
def test_every_key_is_read_or_declared_unread(name, tmp_path):
    c, unread = _unread_after_a_run(name, tmp_path)
    declared = set(cu.not_read(c))
    assert unread == declared, (f"{name}: read by no run and not declared: {sorted(unread - declared)}; "
                                f"declared unread but read: {sorted(declared - unread)}")


def test_tracking_counts_reads_not_dumps():
    from configs import masked_text

    c = masked_text.get_config()
    with cu.track_reads(c) as reads:
        c.to_json_best_effort()
        str(c)
        _ = c.model.width, c.eval.get("seed"), dict(c.optim.items())
    assert reads == {"model.width", "eval.seed"} | {f"optim.{k}" for k in c.optim.keys()}
    assert type(c.model).__name__ == "ConfigDict"  # restored


def test_override_of_an_unread_key_is_refused():
    from configs import poisson_synthetic

    c = poisson_synthetic.get_config()
    assert c.process.proposal != "manual"
    with pytest.raises(ValueError, match=r"process\.loc is not read .* process\.proposal = 'manual'"):
        cu.check_overrides(c, ["process.loc"])
    cu.check_overrides(c, ["process.proposal", "optim.lr"])  # read: accepted
    c.process.proposal = "manual"
    cu.check_overrides(c, ["process.loc", "process.proposal"])
    assert cu.override_keys(["x.py", "--config.process.loc=1", "--config", "f.py", "--config.eval.seed", "3"]) == [
        "process.loc", "eval.seed"]
    assert cu.override_keys(["x.py", "-config.eval.loc=0.5"]) == ["eval.loc"]  # absl accepts one dash


def test_where_results_go_keys_are_refused_where_unread():
    """eval.limit is read only with eval.input; eval.overwrite only by a trained run's evaluation
    (oracle mode writes eval.output_dir as before); eval.output_dir in every mode."""
    from configs import masked_bytes, poisson_synthetic

    c = masked_bytes.get_config()
    with pytest.raises(ValueError, match=r"eval\.limit is not read .* eval\.input is set"):
        cu.check_overrides(c, ["eval.limit"])
    cu.check_overrides(c, ["eval.output_dir", "eval.overwrite"])
    c.eval.input = "x.txt"
    cu.check_overrides(c, ["eval.limit", "eval.output_dir", "eval.overwrite"])
    p = poisson_synthetic.get_config()
    p.eval.mode = "oracle"
    with pytest.raises(ValueError, match=r"eval\.overwrite is not read .* eval\.mode = 'network'"):
        cu.check_overrides(p, ["eval.overwrite"])
    cu.check_overrides(p, ["eval.output_dir"])


def test_allow_float16_is_read_only_with_float16():
    """config.model.allow_float16 is the float16 opt-in: read (and overridable) only when
    model.dtype = 'float16'."""
    from configs import masked_text

    c = masked_text.get_config()
    with pytest.raises(ValueError, match=r"model\.allow_float16 is not read .* model\.dtype = 'float16'"):
        cu.check_overrides(c, ["model.allow_float16"])
    c.model.dtype = "float16"
    cu.check_overrides(c, ["model.allow_float16", "model.dtype"])
    assert "model.allow_float16" not in cu.not_read(c)


def test_overrides_in_a_flagfile_are_checked(tmp_path):
    f = tmp_path / "flags"
    f.write_text("# my settings\n--config.eval.loc=0.5\n--workdir=/x\n")
    assert cu.override_keys(["x.py", f"--flagfile={f}", "--config.eval.seed=3"]) == ["eval.loc", "eval.seed"]


def test_train_refuses_eval_input():
    from configs import masked_text

    with pytest.raises(ValueError, match="eval.input is for evaluate.py"):
        cu.check_overrides(masked_text.get_config(), ["eval.input"], entry="train")
    cu.check_overrides(masked_text.get_config(), ["eval.num_samples"], entry="train")


def test_finite_T_needs_t_dce():
    from configs import masked_text
    from infodiff import tasks

    c = masked_text.get_config()
    c.process.finite_T = 10
    with pytest.raises(ValueError, match=r"finite_T=10 is read only by objective 't_dce'"):
        tasks.make_task(c)
    c.process.objective = "t_dce"
    tasks.make_task(c)


@pytest.mark.slow
def test_cli_refuses_an_unread_override_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--config", str(REPO / "configs/oracle_poisson.py"),
                        "--config.eval.loc=0.5", f"--config.eval.output_dir={tmp_path}"],
                       capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ValueError: config key eval.loc is not read by this run"), r.stderr
    assert "eval.proposal = 'manual'" in lines[-1] and "Traceback" not in r.stderr
    assert not (tmp_path / "report.json").exists()
