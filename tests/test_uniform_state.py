"""Uniform-state diffusion (UDLM / duo): the NELBO's closed form, its tightness for the exact
(leave-one-out) mean denoiser, Monte Carlo estimates against exact -log p, refusals, the CLI.

The registry's generic checks (contract within 4 SE, training-loss mean, noise independence,
bit-identical resume, SE calibration over 400 + 400 oracle sequences) run from
tests/test_processes.py, test_training.py and test_calibration.py; here we check they pick the
process up. Source: docs/uniform_state.md.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import likelihood as lk
from infodiff import oracles, tasks
from infodiff.processes import score_entropy as se
from infodiff.processes import uniform_state as us

REPO = Path(__file__).resolve().parents[1]


def _udlm_expression_np(log_xt, x0, z, lam):
    """UDLM's continuous-time NELBO per unit lam as written in the paper / official code
    (term1 - term2 with xbar, float64 numpy), summed over positions: [B]."""
    V = log_xt.shape[-1]
    a = (1.0 - lam)[:, None, None]
    xbar = V * a * np.eye(V)[x0] + (1 - a)
    xbar_t = V * a * np.exp(log_xt) + (1 - a)
    at = lambda m: np.take_along_axis(m, z[..., None], -1)  # noqa: E731
    term1 = V / at(xbar) - V / at(xbar_t)
    term2 = np.sum(xbar / at(xbar) * (np.log(at(xbar_t)) - np.log(xbar_t) + np.log(xbar) - np.log(at(xbar))), -1,
                   keepdims=True)
    # per unit t: alpha' / (V alpha) (term1 - term2); per unit lam divide by -alpha'
    return np.sum((term2 - term1)[..., 0], -1) / (V * (1.0 - lam))


def test_closed_form_is_udlm_expression_and_sedd_uniform_dse():
    """For any x_theta: nelbo_density == UDLM's xbar expression (float64) == SEDD's uniform-graph
    DSE per unit lam with the score s_j = xbar_theta_j / xbar_theta_{z_i}."""
    rng = np.random.default_rng(0)
    B, L, V = 32, 5, 4
    x_theta = rng.dirichlet(np.ones(V) * 0.7, size=(B, L))
    log_xt = np.log(x_theta)
    x0 = rng.integers(0, V, (B, L))
    z = np.where(rng.random((B, L)) < 0.5, rng.integers(0, V, (B, L)), x0)
    lam = rng.uniform(0.02, 0.98, B)
    got = np.asarray(us.nelbo_density(jnp.asarray(log_xt, jnp.float32), jnp.asarray(x0), jnp.asarray(z),
                                      jnp.asarray(lam, jnp.float32)))
    np.testing.assert_allclose(got, _udlm_expression_np(log_xt, x0, z, lam), rtol=2e-4)
    lxt = np.asarray(us.log_xbar(jnp.asarray(log_xt, jnp.float32), jnp.asarray(lam, jnp.float32)))
    log_s = lxt - np.take_along_axis(lxt, z[..., None], -1)
    dse = np.asarray(se.UNIFORM.score_entropy(jnp.asarray(log_s), jnp.asarray(x0), jnp.asarray(z),
                                              jnp.asarray(lam, jnp.float32))) / (1.0 - lam)
    np.testing.assert_allclose(got, dse, rtol=2e-4)
    assert np.all(got >= 0)


def _exact_nelbo(orc, x_NxL, posterior, num_nodes=200):
    """int_0^1 E_{z ~ q(. | x)} nelbo_density d lam with the oracle's mean denoiser, by enumerating
    every z (V^L) and Gauss-Legendre in u with lam = u^3 (smooths the log-singularity at 0): no
    Monte Carlo. float64 [N] nats."""
    V, L = orc.vocab_size, x_NxL.shape[1]
    allz = np.array(np.unravel_index(np.arange(V**L), (V,) * L)).T  # [Z, L]
    u, w = np.polynomial.legendre.leggauss(num_nodes)
    u, w = 0.5 * (u + 1), 0.5 * w
    lam = u**3
    den = us.OracleMean(orc, posterior)
    out = []
    for x in x_NxL:
        lam_R = np.repeat(lam, len(allz))
        z_R = np.tile(allz, (len(lam), 1))
        x_R = np.broadcast_to(x, z_R.shape)
        lam32 = jnp.asarray(lam_R, jnp.float32)
        d = np.asarray(us.nelbo_density(den(jnp.asarray(z_R), lam32), jnp.asarray(x_R), jnp.asarray(z_R), lam32),
                       np.float64)
        logk = se.UNIFORM.log_emission(np, z_R, lam_R, V)  # [R, L, V]: log K_lam(z_j | u)
        pz = np.exp(np.take_along_axis(logk, x_R[..., None], -1)[..., 0].sum(-1))
        out.append(np.sum(w * 3 * u**2 * (pz * d).reshape(len(lam), len(allz)).sum(1)))
    return np.array(out)


def test_nelbo_of_the_exact_mean_denoiser_is_minus_log_p_and_the_posterior_mean_is_not():
    """The I-MDSE identity for the mean parametrisation, without Monte Carlo: with x_theta the
    leave-one-out posterior P(x_0^i | z^{-i}) the NELBO integral equals -log p(x) (rtol 1e-5);
    with the full posterior mean E[x_0^i | z] it does not (docs/uniform_state.md §4)."""
    tab = oracles.random_tabular(np.random.default_rng(5), "ACG", 3, 9, 0.5)
    x = tab.seqs[:4]
    truth = -tab.log_prob(x)
    np.testing.assert_allclose(_exact_nelbo(tab, x, "loo"), truth, rtol=1e-5)  # measured: |diff| < 2e-7
    full = _exact_nelbo(tab, x, "full")
    assert np.max(np.abs(full - truth)) > 0.05, (full, truth)
    assert np.sum(np.exp(-truth) * (full - truth)) > 0  # the plug-in model is worse on the data's own mass


@pytest.mark.parametrize("kind", ["tabular", "markov"])
def test_mc_nelbo_of_the_exact_denoiser_within_4_se(kind):
    """The Monte Carlo NELBO (lam_max = 1: no prior term) of the exact mean denoiser within 4 SE of
    -log p(x) on a tabular and an order-2 Markov law; the full posterior mean is many SE off."""
    if kind == "tabular":
        orc = oracles.random_tabular(np.random.default_rng(7), "ACGT", 6, 48, 0.5)
        x = orc.sample(np.random.default_rng(8), 6)
    else:
        orc = oracles.random_markov(np.random.default_rng(7), "ACGT", 2, 0.5, seq_len=10)
        x = orc.sample(np.random.default_rng(8), 6)
    truth = -orc.log_prob(x)
    proc = us.UniformStateProcess(vocab_size=orc.vocab_size)
    est = lk.nll(us.OracleMean(orc), x, jax.random.PRNGKey(0), process=proc, num_samples=1024)
    assert np.all(np.abs(est.mean - truth) < 4 * est.stderr), (est.mean, truth, est.stderr)
    assert not est.few_samples and est.estimator == "udlm:power3"
    full = lk.nll(us.OracleMean(orc, "full"), x, jax.random.PRNGKey(0), process=proc, num_samples=1024)
    split = full.split_mean()
    assert abs(split["mean"] - truth.mean()) > 4 * split["stderr"]


def test_prior_and_truncation_terms():
    """lam_max < 1: the prior is KL(q(z_1 | x) || uniform) per position (closed form), the
    truncation ('recon') term is 0; both exact (no Monte Carlo)."""
    tab = oracles.random_tabular(np.random.default_rng(0), "ACG", 4, 9)
    x = tab.seqs[:3]
    proc = us.UniformStateProcess(vocab_size=3, lam_max=0.9)
    est = lk.nll(us.OracleMean(tab), x, jax.random.PRNGKey(1), process=proc, num_samples=8)
    lam, V = 0.9, 3
    e, b = 1 - lam + lam / V, lam / V
    kl = e * np.log(V * e) + (V - 1) * b * np.log(V * b)
    np.testing.assert_allclose(est.terms["prior"], 4 * kl, rtol=1e-12)
    np.testing.assert_array_equal(est.terms["recon"], 0.0)


def test_refusals_name_the_value_in_one_line():
    """Masked-only settings and estimators, conditionals, a bad noise law: one-line errors."""
    from infodiff.configs import masked_text, uniform_text
    from infodiff.tasks import uniform_state as ut

    c = uniform_text.get_config()
    c.eval.estimator = "k_dce"
    with pytest.raises(ValueError, match=r"^config.eval.estimator='k_dce' is a masked-diffusion estimator[^\n]*$"):
        tasks.make_task(c)
    m = masked_text.get_config()
    m.process = uniform_text.get_config().process
    m.eval.estimator = "udlm"
    with pytest.raises(ValueError, match=r"^config.eval.interval: likelihood intervals[^\n]*$"):
        ut.check_uniform_eval_config(m)
    tab = oracles.random_tabular(np.random.default_rng(0), "ACG", 4, 9)
    with pytest.raises(NotImplementedError, match="whole sequences only"):
        lk.conditional_nll(us.OracleMean(tab), tab.seqs[:2, :1], tab.seqs[:2, 1:], jax.random.PRNGKey(0),
                           process=us.UniformStateProcess(vocab_size=3), num_samples=4)
    with pytest.raises(ValueError, match="unknown noise law 'importance'"):
        us.UniformStateProcess(vocab_size=3, noise_law="importance")
    with pytest.raises(ValueError, match="posterior='mean'"):
        us.OracleMean(tab, "mean")


def test_the_registry_picks_it_up():
    """Contract, calibration (>= 400 cases each) and resume tests are generated for it."""
    from infodiff.tasks import uniform_state as ut

    reg = tasks.REGISTRY["uniform_state"]
    assert [c.name for c in reg.contract_cases()] == ["uniform_state:udlm"]
    assert [c.name for c in reg.calibration_cases()] == ["udlm tabular", "udlm markov"]
    assert all(len(x) >= 400 for _, x, _ in ut.calibration_laws())
    assert reg.tiny_config is not None and reg.tiny_config().process.name == "uniform_state"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["uniform_text", "oracle_uniform_state"])
def test_every_key_is_read_or_declared_unread(name, tmp_path):
    """The config-usage check of tests/test_config_usage.py on this process's configs."""
    from infodiff import config_usage as cu
    from tests.test_config_usage import _unread_after_a_run

    c, unread = _unread_after_a_run(name, tmp_path)
    assert unread == set(cu.not_read(c)), (unread, cu.not_read(c))


@pytest.mark.slow
def test_train_and_evaluate_cli_report_the_nelbo_in_nats_and_bits(tmp_path):
    """train.py on configs/uniform_text.py (tiny) then evaluate.py: the NELBO ± SE in nats per
    sequence and bits per character, with its terms."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    tiny = ["--config.model.num_layers=1", "--config.model.width=32", "--config.model.num_heads=2",
            "--config.data.seq_len=16", "--config.train.batch_size=8", "--config.train.num_steps=4",
            "--config.train.log_every=2", "--config.train.ckpt_every=2", "--config.train.eval_every=1000",
            "--config.train.eval_batches=1", "--config.optim.warmup_steps=2"]
    wd = tmp_path / "w"
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/uniform_text.py", f"--workdir={wd}", *tiny],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "evaluate.py", f"--workdir={wd}", "--config.eval.max_sequences=8",
                        "--config.eval.num_samples=8"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bits per character (NELBO)" in r.stdout and "NELBO, upper bound on NLL (nats per sequence)" in r.stdout
    rep = json.loads((wd / "report.json").read_text())
    assert rep["bound"] == "nelbo" and rep["process"]["name"] == "uniform_state"
    assert rep["units"]["bits"] == "bits per character"
    np.testing.assert_allclose(rep["bits"], rep["nll"] / (16 * np.log(2)), rtol=1e-9)
    t = rep["terms"]
    assert t["prior"] > 0 and t["recon"] == 0 and abs(t["diffusion"] + t["prior"] - t["total"]) < 1e-9


def test_every_protocol_member_is_declared(monkeypatch):
    """tests/test_protocol.py's member checks on this process's estimation and training laws."""
    from infodiff import schedules
    from tests import test_protocol as tp

    procs = {f"uniform_state/{law}": us.UniformStateProcess(vocab_size=4, noise_law=law, lam_max=0.9,
                                                            schedule=schedules.LogLinearSchedule())
             for law in us.NOISE_LAWS}
    monkeypatch.setattr(tp, "PROCESSES", procs)
    for label in procs:
        tp.test_every_process_exposes_every_member(label)
    tp.test_a_dataclass_field_does_not_inherit_a_protocol_default()
