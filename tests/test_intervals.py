"""NLL intervals over generation orders in the entry points (infodiff/evaluation/intervals.py):
the eval.interval* / eval.sampler_likelihood config keys, evaluate.py's report blocks on a split,
the interval fields of an input file's rows, and Run.nll_interval / conditional_nll_interval.
The maths (orders.py) is tested in its own module; here: the plumbing gives orders.py's numbers,
and the relations that hold for every draw (TUBE <= IW: log y <= y - 1; lower <= upper)."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from infodiff import orders, scoring
from infodiff.data import text as text_data
from tests.test_scoring import run_dir  # noqa: F401 (the tiny trained masked run, a module fixture)

REPO = Path(__file__).resolve().parents[1]
K = 4


def _masked_config(**eval_overrides):
    from configs import masked_text

    c = masked_text.get_config()
    for k, v in eval_overrides.items():
        c.eval[k] = v
    return c


# ---------------------------------------------------------------------------------------------
# Config keys
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    ({"interval": True, "interval_orders": 1}, r"config\.eval\.interval_orders=1 must be an integer >= 2"),
    ({"interval": True, "interval_level": 1.0}, r"config\.eval\.interval_level=1\.0 must be in \(0, 1\)"),
    ({"interval": True, "interval_level": 0.0}, r"config\.eval\.interval_level=0\.0 must be in \(0, 1\)"),
    ({"interval": True, "interval_proposal": "greedy"}, r"config\.eval\.interval_proposal='greedy'; choose from"),
    ({"sampler_likelihood": "beam"}, r"config\.eval\.sampler_likelihood='beam'; choose '' \(none\)"),
    ({"sampler_likelihood": "ancestral", "interval_orders": 1}, r"config\.eval\.interval_orders=1"),
])
def test_bad_interval_settings_fail_up_front_naming_key_and_value(overrides, match):
    from infodiff import tasks

    task = tasks.make_task(_masked_config(**overrides))
    with pytest.raises(ValueError, match=match):
        task.check_eval_config()


def test_interval_settings_are_read_only_where_used():
    from configs import sedd_absorb_text

    from infodiff import config_usage as cu
    from infodiff.tasks import masked

    c = _masked_config()
    assert masked.order_settings(c) == {"interval": False, "orders": None, "level": None, "proposal": None,
                                        "sampler": "", "sample_steps": None}
    for k in ("eval.interval_orders", "eval.interval_level", "eval.interval_proposal"):
        with pytest.raises(ValueError, match=rf"{k} is not read .* eval\.interval is True"):
            cu.check_overrides(c, [k])
    cu.check_overrides(c, ["eval.interval", "eval.sampler_likelihood"])
    c.eval.interval = True
    cu.check_overrides(c, ["eval.interval_orders", "eval.interval_level", "eval.interval_proposal"])
    assert masked.order_settings(c) == {"interval": True, "orders": 16, "level": 0.95, "proposal": "uniform",
                                        "sampler": "", "sample_steps": None}
    c.eval.input = "f.txt"  # a file: no sampler likelihood
    with pytest.raises(ValueError, match=r"eval\.sampler_likelihood is not read .* eval\.input is not set"):
        cu.check_overrides(c, ["eval.sampler_likelihood"])
    c = _masked_config(sampler_likelihood="ancestral", num_generate=0)  # T = sample_steps, K = interval_orders
    cu.check_overrides(c, ["eval.sample_steps", "eval.interval_orders", "eval.interval_level"])
    with pytest.raises(ValueError, match=r"eval\.interval_proposal is not read"):
        cu.check_overrides(c, ["eval.interval_proposal"])
    assert masked.order_settings(c)["sample_steps"] == 64
    sedd = sedd_absorb_text.get_config()
    assert not {"interval", "interval_orders", "interval_level", "interval_proposal", "sampler_likelihood"} & set(
        sedd.eval.keys())


# ---------------------------------------------------------------------------------------------
# Run.nll_interval: the windows of run.nll, summed
# ---------------------------------------------------------------------------------------------
def test_sedd_run_refuses_in_one_line():
    from configs import sedd_absorb_text

    from infodiff import tasks

    task = tasks.make_task(sedd_absorb_text.get_config())
    run = scoring.Run("w", types.SimpleNamespace(eval=types.SimpleNamespace(seed=0)), task, None, None, 0, 4, 8)
    for call in (lambda: run.nll_interval(["the cat"]), lambda: run.conditional_nll_interval(["a"], ["the cat"])):
        with pytest.raises(ValueError, match=r"process is 'sedd': SEDD networks do not define the any-order "
                                             r"conditionals used here$"):
            call()


def test_windows_sum_iw_and_tube_with_ses_in_quadrature():
    import scipy.stats

    level, rng = 0.9, np.random.default_rng(0)
    exact = np.array([False, False, True, False, True])
    iw, tube = rng.uniform(5, 9, 5), rng.uniform(1, 5, 5)
    tube[exact] = iw[exact]  # as orders.nll_interval gives an exact window: iw = tube, SE 0
    iw_se, tube_se = np.where(exact, 0.0, rng.uniform(0.1, 1, 5)), np.where(exact, 0.0, rng.uniform(0.1, 1, 5))
    oi = orders.OrderInterval(
        what="any_order", lower=None, upper=None, iw=iw, iw_stderr=iw_se, tube=tube, tube_stderr=tube_se,
        ess=np.array([2.0, 3.0, np.nan, 1.5, np.nan]), pareto_k=np.full(5, np.nan), exact=exact,
        forward_passes=np.array([10, 20, 7, 30, 7]), orders=K, pilot_orders=K, proposal="informed", level=level)
    out = scoring.sum_interval_windows(oi, np.array([0, 0, 1, 2, 2]), 3)
    t_lo = scipy.stats.t.ppf(1 - (1 - level) / 2, K - 1)  # the windows' own quantiles: TUBE on K orders,
    t_up = scipy.stats.t.ppf(1 - (1 - level) / 2, 2 * K - 1)  # IW on the K orders and the K pilot orders
    np.testing.assert_allclose(out.iw, [iw[0] + iw[1], iw[2], iw[3] + iw[4]])
    np.testing.assert_allclose(out.iw_stderr[0], np.hypot(iw_se[0], iw_se[1]))
    np.testing.assert_allclose(out.upper[0], iw[0] + iw[1] + t_up * np.hypot(iw_se[0], iw_se[1]))
    np.testing.assert_allclose(out.lower[2], tube[3] + tube[4] - t_lo * tube_se[3])
    assert out.lower[1] == out.upper[1] == iw[2]  # an exact window: no width
    np.testing.assert_array_equal(out.exact, [False, True, False])
    np.testing.assert_array_equal(out.forward_passes, [30, 7, 37])
    np.testing.assert_array_equal(out.ess, [2.0, np.nan, 1.5])


DOCS = ["The cat sat", "and the dog ate the hat and the cat sat on the mat"]  # 1 and 4 windows of 16


@pytest.mark.slow
def test_api_rows_are_orders_intervals_of_the_windows(run_dir):
    import infodiff

    run = infodiff.load_run(str(run_dir))
    oi = run.nll_interval(DOCS, orders=K, level=0.9, proposal="uniform", seed=5)
    ids = [text_data.encode(scoring.clean(t)[0]).astype(np.int32) for t in DOCS]
    win = scoring.document_windows(ids, run.seq_len)
    ref = orders.nll_interval(run.denoiser, win.x_WxL, jax.random.fold_in(jax.random.key(5), scoring.INTERVAL_STREAM),
                              target_BxL=win.target_WxL, pad_BxL=win.pad_WxL, num_orders=K, proposal="uniform",
                              level=0.9, batch_size=run.batch_size)
    assert list(win.row_W) == [0, 1, 1, 1, 1]
    for name in ("lower", "upper", "iw", "iw_stderr", "tube", "tube_stderr", "ess", "pareto_k"):
        np.testing.assert_allclose(getattr(oi, name)[0], getattr(ref, name)[0], rtol=1e-12, err_msg=name)
    assert not oi.exact[0] and not ref.exact[0] and ref.exact[4]  # 11 targets: Monte Carlo; 3: exact
    np.testing.assert_allclose(oi.iw[1], ref.iw[1:].sum(), rtol=1e-12)
    np.testing.assert_allclose(oi.tube_stderr[1], np.sqrt(np.sum(ref.tube_stderr[1:] ** 2)), rtol=1e-12)
    assert oi.forward_passes[1] == ref.forward_passes[1:].sum()
    nelbo = run.nll(DOCS, seed=5)
    np.testing.assert_array_equal(oi.nelbo, nelbo.mean)
    np.testing.assert_array_equal(oi.nelbo_stderr, nelbo.stderr)
    assert np.all(oi.lower <= oi.upper)
    c = run.conditional_nll_interval(["the cat sat on", ""], ["the mat", "the dog"], orders=K, seed=5)
    assert c.iw.shape == (2,) and np.all(c.lower <= c.upper)
    np.testing.assert_array_equal(c.nelbo, run.conditional_nll(["the cat sat on", ""], ["the mat", "the dog"],
                                                                 seed=5).mean)
    with pytest.raises(ValueError, match=r"^orders=1 must be an integer >= 2"):
        run.nll_interval(DOCS, orders=1)
    with pytest.raises(ValueError, match=r"^proposal='greedy'; choose from"):
        run.conditional_nll_interval(["a"], ["b"], proposal="greedy")


# ---------------------------------------------------------------------------------------------
# evaluate.py: the split's blocks, an input file's rows
# ---------------------------------------------------------------------------------------------
def _cli(args):
    return subprocess.run([sys.executable, str(REPO / "evaluate.py"), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})


def _check_block(b, items, exact_sampler=False):
    assert b["items" if "items" in b else "rows"] == items
    assert b["lower"] <= b["upper"]
    assert b["lower"] <= b["tube"] and b["iw"] <= b["upper"]
    assert b["bits"]["lower"] <= b["bits"]["upper"] and b["forward_passes"] > 0
    if exact_sampler:
        assert b["exact_rows"] == items and b["lower"] == b["upper"] and b["iw_stderr"] == 0


@pytest.mark.slow
def test_cli_split_report_has_the_interval_and_sampler_blocks(run_dir):
    from tests.test_report_schema import assert_report_agrees

    r = _cli(["--workdir", str(run_dir), "--config.eval.max_sequences=3", "--config.eval.num_generate=0",
              "--config.eval.interval=True", f"--config.eval.interval_orders={K}", "--config.eval.interval_level=0.9",
              "--config.eval.sampler_likelihood=greedy_confidence"])
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((run_dir / "report.json").read_text())
    assert_report_agrees(rep)
    b = rep["interval"]
    _check_block(b, rep["data"]["num_items"])
    assert b["settings"]["orders"] == b["settings"]["pilot_orders"] == K and b["settings"]["level"] == 0.9
    assert b["settings"]["proposal"] == "uniform" and "mixture over generation orders" in b["settings"]["what"]
    np.testing.assert_allclose(b["nelbo"], rep["nll"], rtol=1e-9)  # the same items
    np.testing.assert_allclose(b["bits"]["iw"], b["iw"] / (16 * np.log(2)), rtol=1e-12)
    _check_block(rep["sampler_likelihood"], 3, exact_sampler=True)
    assert rep["sampler_likelihood"]["settings"]["sampler"] == "greedy_confidence"
    text = (run_dir / "report.txt").read_text()
    assert "NLL interval (any order)" in text and "sampler likelihood" in text and "[lower, upper] at 90%" in text
    bad = _cli(["--workdir", str(run_dir), "--config.eval.interval=True", "--config.eval.interval_orders=1"])
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: ValueError: config.eval.interval_orders=1 must be an integer >= 2 (orders per item)")


@pytest.mark.slow
def test_input_rows_gain_interval_fields_and_the_figure(run_dir, tmp_path):
    from ml_collections import ConfigDict

    from infodiff import evaluation, training
    from tests.test_report_schema import assert_report_agrees

    cfg = ConfigDict(training.saved_config(str(run_dir)))
    cfg.eval.input = str(tmp_path / "docs.txt")
    Path(cfg.eval.input).write_text("\n".join(DOCS) + "\n")
    cfg.eval.interval, cfg.eval.interval_orders = True, K
    rep, out = evaluation.evaluate(cfg, str(run_dir))
    assert_report_agrees(rep)
    _check_block(rep["interval"], 2)
    rows = [json.loads(x) for x in rep.attachments["rows.jsonl"].decode().splitlines()]
    api = scoring.load_run(str(run_dir), config=cfg).nll_interval(DOCS, orders=K)
    for r, a in zip(rows, api.rows()):
        for k in ("lower", "upper", "iw", "iw_stderr", "tube", "tube_stderr"):
            np.testing.assert_allclose(r[k], a[k], rtol=1e-6, err_msg=k)  # devices split: float rounding
        assert r["exact"] == a["exact"] and r["interval_forward_passes"] == a["forward_passes"] and r["lower"] <= r["upper"]
    header = rep.attachments["rows.csv"].decode().splitlines()[0].split(",")
    assert {"lower", "upper", "iw", "iw_stderr", "tube", "tube_stderr", "ess", "pareto_k", "exact",
            "interval_forward_passes"} <= set(header)
    assert len(rep.attachments["intervals.png"]) > 10_000 and os.path.join(out, "intervals.png") in rep["plots"]
    cfg.eval.input = str(tmp_path / "ab.jsonl")
    Path(cfg.eval.input).write_text(json.dumps({"prompt": "the", "a": "cat", "b": "dog"}) + "\n")
    with pytest.raises(ValueError, match=r"holds ratios .* get no interval"):
        evaluation.evaluate(cfg, str(run_dir))


def test_report_text_of_a_deterministic_sampler_and_of_clipped_rows():
    from infodiff.evaluation import intervals, report

    v = np.array([10.0, 12.0])
    det = orders.OrderInterval(what="greedy_confidence", lower=v, upper=v, iw=v, iw_stderr=np.zeros(2), tube=v,
                               tube_stderr=np.zeros(2), ess=np.ones(2), pareto_k=np.full(2, np.nan),
                               exact=np.ones(2, bool), forward_passes=np.array([4, 4]), orders=1, pilot_orders=0,
                               proposal="greedy_confidence", level=0.95,
                               settings={"sampler": "greedy_confidence", "tokens_per_step": 1})
    b = intervals.block(det, np.array([4, 4]), 0.1)
    text = dict(report._order_rows("sampler_likelihood", "sampler").render({"sampler_likelihood": b}))
    assert "exact (one path)" in text["sampler"] and "± 0.0000" not in " ".join(text.values())
    mc = orders.OrderInterval(what="any_order", lower=np.array([0.0, 3.0]), upper=np.array([9.0, 8.0]),
                              iw=np.array([8.0, 7.0]), iw_stderr=np.ones(2), tube=np.array([1.0, 5.0]),
                              tube_stderr=np.array([9.0, 1.0]), ess=np.ones(2), pareto_k=np.full(2, np.nan),
                              exact=np.zeros(2, bool), forward_passes=np.array([8, 8]), orders=4, pilot_orders=4,
                              proposal="uniform", level=0.999)
    b = intervals.block(mc, np.array([4, 4]), 0.1)
    assert b["rows_lower_clipped"] == 1
    text = dict(report._order_rows("interval", "interval").render({"interval": b}))
    assert any("at 99.9%" in k for k in text) and "clipped" in text["  WARNING"]


def test_oracle_mode_on_a_training_config_is_refused_in_one_line():
    from infodiff.evaluation import run as run_lib

    c = _masked_config(mode="oracle")
    with pytest.raises(ValueError, match=r"needs an oracle config"):
        run_lib.evaluate(c, None)


def test_interval_keys_on_a_config_without_them_say_why():
    from absl import flags
    from ml_collections import config_flags

    from infodiff import cli

    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=fv)
    argv = ["evaluate.py", f"--config={REPO / 'configs' / 'sedd_absorb_text.py'}", "--config.eval.interval=True"]
    with pytest.raises(Exception) as e:
        fv(argv)
    line = cli.config_flag_error(e.value, argv)
    assert line.startswith("error: --config.eval.interval: NLL intervals") and "masked-diffusion" in line
