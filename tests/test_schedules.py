"""Schedules: endpoints, derivatives (vs finite differences), inverse, loss weight identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import schedules

jax.config.update("jax_enable_x64", False)

ALL = [
    schedules.LinearSchedule(),
    schedules.CosineSchedule(),
    schedules.PolySchedule(power=3.0),
    schedules.LogLinearSchedule(),
    schedules.GeometricSchedule(),
]


@pytest.mark.parametrize("s", ALL, ids=lambda s: s.name)
def test_monotone_and_in_range(s):
    t = jnp.linspace(0.0, 1.0, 101)
    a = np.asarray(s.alpha(t))
    assert np.all((a > 0) & (a <= 1))
    assert np.all(np.diff(a) < 0)
    assert np.all(np.asarray(s.loss_weight(t[1:-1])) > 0)


@pytest.mark.parametrize("s", ALL, ids=lambda s: s.name)
def test_derivative_matches_finite_difference(s):
    t = np.linspace(0.05, 0.95, 19)
    h = 1e-3
    fd = (np.asarray(s.alpha(jnp.asarray(t + h))) - np.asarray(s.alpha(jnp.asarray(t - h)))) / (2 * h)
    np.testing.assert_allclose(np.asarray(s.dalpha(jnp.asarray(t))), fd, rtol=2e-2, atol=1e-4)
    # sigma = d sigma_bar / dt
    fd_sb = (np.asarray(s.sigma_bar(jnp.asarray(t + h))) - np.asarray(s.sigma_bar(jnp.asarray(t - h)))) / (2 * h)
    np.testing.assert_allclose(np.asarray(s.sigma(jnp.asarray(t))), fd_sb, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("s", ALL, ids=lambda s: s.name)
def test_t_from_lambda_inverts(s):
    t = jnp.linspace(0.02, 0.98, 49)
    back = s.t_from_lambda(s.mask_prob(t))
    np.testing.assert_allclose(np.asarray(back), np.asarray(t), atol=2e-3)


def test_md4_shift_and_sedd_loglinear_values():
    lin = schedules.LinearSchedule(eps=1e-4)
    assert float(lin.alpha(jnp.float32(0.0))) == pytest.approx(1 - 1e-4)
    assert float(lin.alpha(jnp.float32(1.0))) == pytest.approx(1e-4)
    ll = schedules.LogLinearSchedule(eps=1e-3)
    # docs/discrete_diffusion.md §2.2: at t = 1, lambda = 0.999, sigma_bar = 6.9078, sigma = 999
    assert float(ll.mask_prob(jnp.float32(1.0))) == pytest.approx(0.999, rel=1e-6)
    assert float(ll.sigma_bar(jnp.float32(1.0))) == pytest.approx(6.9078, rel=1e-4)
    assert float(ll.sigma(jnp.float32(1.0))) == pytest.approx(999.0, rel=1e-4)
    assert ll.lambda_min == 0.0
    # loss weight = sigma * a with a = alpha / (1 - alpha) (Lemma 3.3 weight)
    t = jnp.linspace(0.1, 0.9, 9)
    a = ll.alpha(t) / (1 - ll.alpha(t))
    np.testing.assert_allclose(np.asarray(ll.loss_weight(t)), np.asarray(ll.sigma(t) * a), rtol=1e-5)


def test_geometric_is_stable_near_zero():
    g = schedules.GeometricSchedule()
    t = jnp.asarray([0.0, 1e-6, 1e-3])
    for fn in (g.loss_weight, g.log_snr, g.mask_prob):
        assert np.all(np.isfinite(np.asarray(fn(t))))


def test_get_schedule_and_errors():
    assert schedules.get_schedule("poly3").power == 3.0
    assert schedules.get_schedule("cosine", eps=1e-3).eps == 1e-3
    assert schedules.get_schedule("loglinear", eps=None).eps == 1e-3
    with pytest.raises(ValueError, match="unknown schedule 'bogus'"):
        schedules.get_schedule("bogus")
    with pytest.raises(ValueError, match="polyK"):
        schedules.get_schedule("polyx")
    with pytest.raises(ValueError, match="eps=0.7"):
        schedules.LinearSchedule(eps=0.7)
    with pytest.raises(ValueError, match="sigma_min"):
        schedules.GeometricSchedule(sigma_min=5.0, sigma_max=1.0)
