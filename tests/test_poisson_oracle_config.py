"""configs/oracle_poisson.py with a pmf file (data.path), its validation, and locked keys."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from infodiff import evaluation, tasks
from infodiff.data import count_synthetic as cs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PMF = {"0": 0.5, "1": 0.2, "3": 0.25, "7": 0.05}


def _small(c, tmp_path):
    c.eval.num_examples, c.eval.num_samples = 60, 64
    c.eval.num_generate, c.eval.sampler_steps = 200, (10,)
    c.eval.output_dir = str(tmp_path / "out")
    return c


@pytest.mark.slow
def test_report_uses_the_pmf_file(tmp_path):
    from configs import oracle_poisson

    path = tmp_path / "pmf.json"
    path.write_text(json.dumps(PMF))
    c = _small(oracle_poisson.get_config(), tmp_path)
    c.data.path = str(path)
    rep, _ = evaluation.evaluate(c, None)
    p = np.array(list(PMF.values()))
    assert rep["oracle"] == "file:pmf.json" and rep["pmf_file"] == str(path)
    assert rep["max_count"] == 7 and rep["support_size"] == 4
    assert rep["exact_entropy_nats"] == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)
    row = rep["results"]["unconditional"][0]
    # the exact values of the report are -log p(x) of this pmf: the mean over the sampled items
    # lies between the smallest and largest -log p and, with the exact denoiser, the estimate
    # agrees within 4 SE; the SE method is recorded
    assert -np.log(p.max()) <= row["mean_exact"] <= -np.log(p.min())
    assert abs(row["bias"]) < 4 * row["bias_stderr"], row
    assert row["se_method"] == "strata_pairs" and rep["process"]["se_method"] == "strata_pairs"


def test_pmf_file_and_distribution_together_is_an_error(tmp_path):
    from configs import oracle_poisson

    path = tmp_path / "pmf.json"
    path.write_text(json.dumps(PMF))
    c = oracle_poisson.get_config()
    c.data.path, c.data.distribution = str(path), "zip"
    with pytest.raises(ValueError, match="not both"):
        tasks.oracle_distribution(c)


@pytest.mark.parametrize("content, message", [
    (None, "file not found"),
    ("[0.5, 0.5]", "expected a non-empty JSON object"),
    ('{"0": 0.5, "1.5": 0.5}', "key '1.5' is not a non-negative integer"),
    ('{"-1": 0.5, "1": 0.5}', "key '-1' is not a non-negative integer"),
    ('{"0": 0.5, "1": -0.1, "2": 0.6}', "need a finite number >= 0"),
    ('{"0": 0.5, "1": 0.4}', "sum to 0.9"),
    ("{not json", "not readable JSON"),
    ('{"0": 0.5, "²": 0.5}', r"key '²' is not a non-negative integer count \(write counts with the digits 0-9\)"),
    ('{"0": 0.5, "٣": 0.5}', "key '٣' is not a non-negative integer count"),  # Arabic-Indic 3: int() takes it
])
def test_bad_pmf_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as e:
        cs.load_pmf(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def _run(args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "evaluate.py", "--config", "configs/oracle_poisson.py", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["data.pth=x.json", "data.num_train=10", "train.num_steps=3",
                                 "eval.use_ema=False"])
def test_unread_or_misspelt_key_is_an_error(tmp_path, key):
    """The oracle config holds only what this mode reads: anything else is refused (locked)."""
    r = _run([f"--config.{key}", f"--config.eval.output_dir={tmp_path}"])
    section, name = key.split("=")[0].split(".")
    # the error names the unknown key (or, for a whole section this mode has not, the section)
    assert r.returncode != 0 and (f"'{name}'" in r.stderr or f"'{section}'" in r.stderr), r.stderr[-1500:]
    assert not (tmp_path / "report.json").exists()


def test_cli_bad_pmf_is_one_line_error(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"0": 0.7}')
    r = _run([f"--config.data.path={path}", f"--config.eval.output_dir={tmp_path}"])
    assert r.returncode != 0 and f"pmf file '{path}': probabilities sum to 0.7" in r.stderr, r.stderr[-1500:]


@pytest.mark.slow
def test_a_one_point_pmf_gives_zero_with_a_note(tmp_path):
    """-log p(x) = 0 for a law with one atom and the exact denoiser returns x at every SNR: the
    'auto' proposal has no spread to fit, so the oracle picks one that ends where the lattice is
    resolved (the paper's (-1, 5, 4) ends at alpha 19 and left 3.2 nats of rounding tail at 10^6)."""
    from configs import oracle_poisson

    count = 1_000_000
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"0": 0.0, str(count): 1.0}))
    c = _small(oracle_poisson.get_config(), tmp_path)
    c.data.path, c.eval.sampler_steps = str(path), ()
    rep, _ = evaluation.evaluate(c, None)
    row = rep["results"]["unconditional"][0]
    assert row["mean_exact"] == 0.0 and row["mean_estimate"] == 0.0 and row["terms"]["recon"] == 0.0, row
    note = rep["process"]["proposal_note"]
    assert note.startswith(f"pmf file {str(path)!r} has one atom (count {count}, probability 1)"), note
    assert not row["se_calibration"]["miscalibrated"]


@pytest.mark.slow
def test_a_sample_without_spread_names_the_file_and_the_fix(tmp_path):
    from configs import oracle_poisson

    path = tmp_path / "rare.json"
    path.write_text(json.dumps({"0": 0.999999, "1": 0.000001}))
    c = _small(oracle_poisson.get_config(), tmp_path)
    c.data.path, c.eval.sampler_steps = str(path), ()
    with pytest.raises(ValueError) as e:
        evaluation.evaluate(c, None)
    assert str(e.value) == (f"pmf file {str(path)!r}: all 60 sampled examples are count 0, so eval.proposal='auto' "
                            "has no spread to fit the log-SNR proposal to; raise config.eval.num_examples or give "
                            "--config.eval.proposal=paper")
    c.eval.proposal = "paper"
    rep, _ = evaluation.evaluate(c, None)
    assert rep["process"]["proposal"] == [-1.0, 5.0, 4.0]


@pytest.mark.slow
def test_the_oracle_flags_per_example_ses_that_under_cover(tmp_path):
    """A pmf with mass at 10^6 (the lattice spacing 1e-6 on [1, 2]): the per-example SEs of the
    default estimator are far too small at x = 0 (coverage 0.59 at 1000 examples, 0.63 at 100); the oracle
    report flags the row, in report.json and in one line of the text."""
    from configs import oracle_poisson

    path = tmp_path / "far.json"
    path.write_text(json.dumps({"0": 0.99, "1000000": 0.01}))
    c = _small(oracle_poisson.get_config(), tmp_path)
    c.data.path, c.eval.sampler_steps = str(path), ()
    c.eval.num_examples, c.eval.num_samples = 100, 1000
    rep, _ = evaluation.evaluate(c, None)
    row = rep["results"]["unconditional"][0]
    cal = row["se_calibration"]
    assert cal["miscalibrated"] and cal["direction"] == "too_small", cal
    assert cal["misses_95"] > 40 and cal["coverage_p_value"] < 1e-6, cal
    lines = evaluation.format_report(rep).splitlines()
    assert any("poisson_stratified (SE MISCALIBRATED)" in ln for ln in lines)
    text = " ".join(" ".join(lines).split())  # report.txt wraps a long warning at 100 columns
    assert text.count("warning: poisson_stratified: SE miscalibrated: ") == 1, lines
    warning = text.split("warning: poisson_stratified: SE miscalibrated: ")[1].split("warning:")[0]
    assert "the SEs are too small, the ± values under-state the error" in warning, lines
