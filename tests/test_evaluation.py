"""infodiff.evaluation: one path and one report schema for every process, network and oracle mode."""

import json
import os

import numpy as np
import pytest

from infodiff import evaluation, tasks, training
from infodiff.evaluation import report as report_lib


def _check_schema(rep):
    """The report conforms to its kind's schema and agrees with report.txt and docs/report.md
    (tests/test_report_schema.py), plus the invariants between its numbers."""
    from tests.test_report_schema import assert_report_agrees

    assert_report_agrees(rep)
    assert rep["version"] == evaluation.REPORT_VERSION
    _check_bound(rep)
    if rep["kind"] == "network":
        assert set(rep["terms"]) == set(report_lib.TERMS)
        assert abs(rep["terms"]["total"] - rep["nll"]) < 1e-9 * max(1.0, abs(rep["nll"]))
        assert rep["nll_stderr"] >= rep["stderr_mc"] > 0
        u = rep["units"]
        assert rep["bits"] == pytest.approx(rep["nll"] / (u["tokens_per_item"] * np.log(2)))
    text = json.dumps(report_lib.strict_json(rep), allow_nan=False)  # strict JSON
    assert "NaN" not in text


def _check_bound(rep):
    """What the numbers are (``bound``, report.BOUNDS): a trained network's NELBO (a ratio: a
    difference of two), the exact value in every oracle row; named in report.txt; ``units`` are
    units only."""
    text = " ".join(report_lib.format_report(rep).split())  # long values are wrapped to 100 columns
    assert not any(w in rep["units"]["nll"] for w in ("NELBO", "bound")), rep["units"]
    if rep["kind"] == "oracle":
        res = rep["results"]
        rows = [*res["unconditional"], *res["conditional"], *(p[k] for p in res["ratio"] for k in ("coupled", "decoupled"))]
        assert rows and {r["bound"] for r in rows} == {"exact"}
        assert f"-log p(x), {rep['units']['nll']}; NLL, exact (oracle denoiser)" in text
        return
    want = "nelbo_difference" if rep["kind"] == "input" and rep["input"]["format"] == "ratios" else "nelbo"
    assert rep["bound"] == want and want in report_lib.BOUNDS
    if rep["kind"] == "network":
        assert f"NELBO, upper bound on NLL ({rep['units']['nll']})" in text
    else:
        assert f"{rep['units']['nll']}; {report_lib.BOUND_LABELS[want]}" in text


def _tiny(config, **over):
    for k, v in over.items():
        sec, key = k.split(".")
        config[sec][key] = v
    return config


def _masked():
    from configs import masked_text

    return _tiny(masked_text.get_config(), **{
        "data.seq_len": 16, "model.num_layers": 1, "model.width": 32, "model.num_heads": 2,
        "train.num_steps": 2, "train.batch_size": 8, "train.eval_batches": 1, "train.log_every": 1,
        "eval.num_samples": 2, "eval.max_sequences": 12, "eval.batch_size": 32, "eval.num_generate": 1,
        "eval.sample_steps": 2})


def _sedd():
    from configs import sedd_uniform_text

    c = sedd_uniform_text.get_config()
    m = _masked()
    for sec in ("data", "model", "train"):
        for k in m[sec]:
            if k != "time_conditioning":
                c[sec][k] = m[sec][k]
    return _tiny(c, **{"eval.num_samples": 2, "eval.max_sequences": 12, "eval.batch_size": 32,
                       "eval.num_generate": 1, "eval.sample_steps": 2})


def _poisson():
    from configs import poisson_synthetic

    return _tiny(poisson_synthetic.get_config(), **{
        "data.num_train": 256, "data.num_valid": 64, "data.num_test": 64, "model.hidden": 16,
        "model.num_layers": 1, "model.emb_dim": 8, "train.num_steps": 2, "train.batch_size": 32,
        "train.eval_batches": 1, "train.log_every": 1, "eval.num_samples": 4, "eval.num_generate": 50,
        "eval.sample_steps": 10})


@pytest.mark.slow
@pytest.mark.parametrize("make", [_masked, _sedd, _poisson], ids=["masked", "sedd", "poisson"])
def test_network_report_has_every_schema_key(make, tmp_path):
    cfg = make()
    wd = str(tmp_path / "run")
    training.train(tasks.make_task(cfg), wd)
    rep, out = evaluation.evaluate(cfg, wd)
    assert out == wd and rep["kind"] == "network" and rep["process"]["name"] == cfg.process.name
    _check_schema(rep)
    jpath, tpath = evaluation.write_report(rep, wd)
    assert json.load(open(jpath))["nll"] == pytest.approx(rep["nll"])
    assert not any(f.endswith(".tmp") for f in os.listdir(wd))
    if cfg.process.name == "poisson":
        assert rep["stderr_kind"].startswith("mc") and rep["plots"] and os.path.exists(rep["plots"][0])
    else:
        assert rep["stderr_kind"].startswith("data+mc") and isinstance(rep["samples"][0], str)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["oracle_tabular", "oracle_sedd_tabular", "oracle_poisson"])
def test_oracle_report_has_every_schema_key(which, tmp_path):
    import importlib

    c = importlib.import_module(f"configs.{which}").get_config()
    c.eval.output_dir = str(tmp_path)
    c.eval.num_samples = 16
    if which == "oracle_poisson":
        c.eval.num_examples, c.eval.num_generate, c.eval.sampler_steps = 20, 200, (10,)
    else:
        c.eval.num_sequences = 2
        if which == "oracle_sedd_tabular":
            c.eval.sampler_steps, c.eval.num_generate, c.data.seq_len = (1,), 100, 4
    rep, out = evaluation.evaluate(c, None)
    assert rep["kind"] == "oracle" and out == str(tmp_path)
    _check_schema(rep)


def test_unknown_mode_and_missing_workdir():
    from configs import masked_text

    c = masked_text.get_config()
    with pytest.raises(ValueError, match="needs --workdir"):
        evaluation.evaluate(c, None)
    c.eval.mode = "bogus"
    with pytest.raises(ValueError, match="eval.mode='bogus'"):
        evaluation.evaluate(c, "x")


def test_se_calibration_flags_only_what_the_exact_values_refute():
    """The oracle's flag of miscalibrated SEs (report_lib.se_calibration): quiet on calibrated
    Student-t-scaled SEs over many runs of every size; raised for SEs too small (coverage),
    too large, a bias many SEs away, and an SE of 0 that misses the exact value."""
    rng = np.random.default_rng(0)
    for n in (3, 16, 200, 2000):
        for _ in range(200):
            truth = rng.normal(size=n) * 10
            dof = 15
            raw = rng.uniform(0.5, 2.0, size=n)
            se_hat = raw * np.sqrt(rng.chisquare(dof, size=n) / dof)  # a sampled SE, dof 15, t-scaled
            est = truth + raw * rng.normal(size=n)
            se = se_hat * 2.131449545559323 / 1.959963984540054  # t_{0.975, 15} / 1.96
            bias_z = float(np.mean(est - truth) / (np.sqrt(np.sum(raw**2)) / n))
            assert not report_lib.se_calibration(est, truth, se, bias_z)["miscalibrated"]
    truth, se = np.zeros(1000), np.ones(1000)
    small = report_lib.se_calibration(rng.normal(size=1000) * 1.5, truth, se, 0.3)
    assert small["miscalibrated"] and small["direction"] == "too_small" and small["misses_95"] > 100, small
    assert "the SEs are too small, the ± values under-state the error" in small["why"]
    large = report_lib.se_calibration(rng.normal(size=1000) * 0.4, truth, se, 0.3)
    assert large["miscalibrated"] and large["direction"] == "too_large" and "conservative" in large["why"], large
    biased = report_lib.se_calibration(rng.normal(size=1000), truth, se, 6.0)
    assert biased["miscalibrated"] and biased["why"].startswith("the mean bias is +6.0 of its SE"), biased
    exact = report_lib.se_calibration(np.array([3.2452, 0.0]), np.zeros(2), np.zeros(2), float("nan"))
    assert exact["miscalibrated"], exact
    assert exact["why"] == "1 item has SE 0 (exact) but misses the exact value by up to 3.245 nats"
    fine = report_lib.se_calibration(np.array([1.0 + 1e-7]), np.ones(1), np.zeros(1), float("nan"))
    assert not fine["miscalibrated"]  # float rounding of an exact estimator
