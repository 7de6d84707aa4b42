"""duo (s-sahoo/duo, uniform-state diffusion on the MDLM DiT) against the official code, its NELBO
through ``load_pretrained(...).nll``, and whole-window-only networks (duo, SEDD's uniform graph)
refusing prompts and padded windows up front.

Fixture tests/fixtures/pretrained/duo/ (scripts/make_dit_fixtures.py --duo): random tiny weights
in duo's hub layout, inputs, the official ``DIT`` + ``_process_sigma`` + ``_process_model_output``
outputs at five noise levels, and the official ``DUO_BASE.nll_per_token`` at those inputs.
"""
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

import infodiff
from infodiff import pretrained
from infodiff.pretrained import dit
from infodiff.processes import uniform_state as us
from tests.test_pretrained_dit import REL_TOL, _interleaved, parity

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "pretrained" / "duo"
WINDOW = [int(v) for v in np.random.default_rng(0).integers(0, 40, 16)]  # one full 16-token window


def test_duo_loads_with_its_facts():
    d = pretrained.load(FIXTURE)
    assert (d.kind, d.output, d.vocab_size, d.mask_id, d.time_conditioned) == ("duo", "logits", 40, -1, True)
    assert (d.info["graph"], d.info["process"]) == ("uniform", "uniform_state")
    assert pretrained.load(FIXTURE, kind="duo").kind == "duo"


def test_duo_parity_with_official():
    worst, scale = parity("duo")
    assert worst <= REL_TOL * scale, (worst, scale)


@pytest.mark.parametrize("detail,value", [("rotate_half", _interleaved), ("LN_EPS", 1e-6), ("ROTATE_V", True)])
def test_duo_one_detail_changed_fails_parity(monkeypatch, detail, value):
    monkeypatch.setattr(dit, detail, value)
    worst, scale = parity("duo")
    assert worst > REL_TOL * scale, (detail, worst, scale)


def test_duo_without_its_time_input_fails_parity():
    loaded = pretrained.load(FIXTURE)
    a = dit.arch_of(pretrained.safetensors_io.read_config(FIXTURE), "duo")
    off = dit.dataclasses.replace(a, time_conditioned=False)
    worst, scale = parity("duo", loaded._replace(apply=lambda p, x, s: dit.forward(off, p, x, s)))
    assert worst > REL_TOL * scale


def test_nelbo_integrand_equals_duo_nll_per_token():
    """infodiff's UDLM integrand per unit lam (uniform_state.nelbo_density) on the port's output
    equals the official DUO_BASE.nll_per_token (with dalpha_t = -1) summed over positions."""
    loaded = pretrained.load(FIXTURE)
    f, g = np.load(FIXTURE / "io.npz"), np.load(FIXTURE / "nelbo.npz")
    for s, alpha, ref in zip(f["sigma_S"], g["alpha_S"], g["nll_per_token_SxBxL"]):
        B = f["x_BxL"].shape[0]
        log_x_theta = loaded.apply(loaded.params, f["x_BxL"], np.full(B, s, np.float32))
        ours = np.asarray(us.nelbo_density(log_x_theta, g["x0_BxL"], f["x_BxL"], np.full(B, 1 - alpha, np.float32)))
        np.testing.assert_allclose(ours, ref.sum(-1), rtol=2e-5)


def test_duo_nelbo_through_load_pretrained_is_finite_with_se_and_terms():
    run = infodiff.load_pretrained(FIXTURE, num_samples=512)
    est = run.nll([WINDOW])
    assert est.estimator == "udlm:power3" and np.isfinite(est.mean).all() and 0 < est.stderr[0] < 0.1 * est.mean[0]
    assert set(est.exact) == {"prior", "recon"} and est.exact["recon"][0] == 0.0
    # the prior term: KL(q(z at lam_max = 1 - 1e-3 | x) || uniform) over 16 tokens, small and positive
    assert 0 < est.exact["prior"][0] < 1e-2
    info = run.task.process_info(run.process)
    assert (info["name"], info["process"], info["kind"]) == ("duo", "uniform_state", "duo")
    assert run.process.lam_max == pytest.approx(1 - 1e-3)
    with pytest.raises(ValueError, match="udlm"):
        run.task.scoring_process("k_dce")


@pytest.mark.parametrize("name", ["duo", "sedd_uniform"])
def test_whole_window_networks_refuse_prompts_and_pads_up_front(name, monkeypatch):
    run = infodiff.load_pretrained(FIXTURE.parent / name)
    calls = []
    monkeypatch.setattr(run, "denoiser", lambda *a: calls.append(a))  # no forward pass may run
    for call, what in [(lambda: run.nll([WINDOW[:8]]), "a padded window"),
                       (lambda: run.conditional_nll([WINDOW[:8]], [WINDOW[8:]]), "a prompt"),
                       (lambda: run.log_ratio([WINDOW[:8]], [WINDOW[8:]], [WINDOW[9:]]), "a log-ratio"),
                       (lambda: infodiff.choose(run, [WINDOW[:8]], [[WINDOW[8:], WINDOW[9:]]]), "a multiple-choice")]:
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(what) and "one noise level per row" in msg and "16 tokens" in msg
    assert not calls


def test_sedd_uniform_full_window_still_scores():
    run = infodiff.load_pretrained(FIXTURE.parent / "sedd_uniform", num_samples=64)
    est = run.nll([WINDOW])
    assert np.isfinite(est.mean).all() and est.stderr[0] > 0


def test_duo_bfloat16_runs():
    loaded = pretrained.load(FIXTURE, dtype=jnp.bfloat16)
    worst, scale = parity("duo", loaded)
    assert np.isfinite(worst) and worst < 0.1 * scale
