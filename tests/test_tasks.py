"""infodiff.tasks: the one reader of config.process.name; each task's processes and eval hooks."""

import pytest

from infodiff import tasks
from infodiff.processes import base


def _configs():
    from configs import masked_text, poisson_synthetic, sedd_absorb_text

    return {"masked": masked_text.get_config(), "sedd": sedd_absorb_text.get_config(),
            "poisson": poisson_synthetic.get_config()}


@pytest.mark.parametrize("name", ["masked", "sedd", "poisson"])
def test_make_task_and_estimation_process(name):
    cfg = _configs()[name]
    if name == "poisson":
        cfg.data.num_train, cfg.data.num_valid, cfg.data.num_test = 256, 64, 64
    task = tasks.make_task(cfg)
    assert task.name == name
    proc = task.estimation_process()
    assert isinstance(proc, base.Process)
    assert task.units["tokens_per_item"] == task.dim
    task.check_eval_config()
    if name != "poisson":
        assert isinstance(task.process, base.Process)  # the training law of the same integrand


def test_unknown_process_and_bad_eval_settings():
    cfg = _configs()["masked"]
    cfg.process.name = "gaussian"
    with pytest.raises(ValueError, match="config.process.name='gaussian'"):
        tasks.make_task(cfg)
    cfg = _configs()["masked"]
    cfg.eval.estimator = "timefree"
    with pytest.raises(ValueError, match="eval.estimator='timefree'"):
        tasks.make_task(cfg).check_eval_config()
    cfg = _configs()["masked"]
    cfg.process.objective = "stratified"
    with pytest.raises(ValueError, match="not a training objective"):
        tasks.make_task(cfg)


def test_synthetic_w1_for_a_2d_law():
    """The 2-D branch (exact assignment against fresh samples of the law) runs."""
    import numpy as np

    cfg = _configs()["poisson"]
    cfg.data.distribution = "bivariate_poisson"
    dist = tasks.synthetic_distribution(cfg)
    gen = tasks.synthetic_sample(cfg, dist, np.random.default_rng(0), 50)
    out = tasks.synthetic_w1(cfg, dist, gen, seed=1)
    assert out["wasserstein1"] >= 0 and out["w1_noise_floor"] >= 0


@pytest.mark.parametrize("key,value", [("eval.sample_steps", 0), ("eval.num_generate", -5),
                                       ("eval.max_sequences", -1)])
def test_eval_settings_refused_up_front(key, value):
    cfg = _configs()["masked"]
    sec, k = key.split(".")
    cfg[sec][k] = value
    with pytest.raises(ValueError, match=f"config.{key}={value}"):
        tasks.make_task(cfg).check_eval_config()


def test_oracle_config_is_not_a_training_config():
    from configs import oracle_tabular

    with pytest.raises(ValueError, match="oracle config"):
        tasks.make_task(oracle_tabular.get_config())
