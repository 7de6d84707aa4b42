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


@pytest.mark.slow
def test_compute_dtype_float16_only_on_request():
    """config.model.dtype: float32 / bfloat16; float16 refused in one line unless
    config.model.allow_float16; anything else refused; likewise an unknown attention."""
    import jax.numpy as jnp

    cfg = _configs()["masked"]
    assert cfg.model.dtype == "float32" and cfg.model.allow_float16 is False and cfg.model.attention == "einsum"
    for name in ("float32", "bfloat16"):
        cfg.model.dtype = name
        assert tasks.make_task(cfg).model.dtype == jnp.dtype(name)
    cfg.model.dtype = "float16"
    with pytest.raises(ValueError, match=r"config.model.dtype='float16' is refused: .*allow_float16=True") as e:
        tasks.make_task(cfg)
    assert "\n" not in str(e.value)
    cfg.model.allow_float16 = True
    assert tasks.make_task(cfg).model.dtype == jnp.float16
    for name in ("int8", "float64", "bf16"):
        cfg.model.dtype = name
        with pytest.raises(ValueError, match=f"config.model.dtype='{name}'; choose 'float32' or 'bfloat16'"):
            tasks.make_task(cfg)
    cfg = _configs()["masked"]
    cfg.model.attention = "flash"
    with pytest.raises(ValueError, match=r"config.model.attention='flash'; choose from \('einsum', 'dot_product'\)"):
        tasks.make_task(cfg)
    cfg.model.attention = "dot_product"
    assert tasks.make_task(cfg).model.attention == "dot_product"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["masked", "sedd"])
def test_bfloat16_training_loss_is_float32(name):
    """With dtype='bfloat16' the task's loss, per-example losses, metrics and gradients are
    float32 (the network's output is float32; the processes' sums follow it), and the loss is
    close to the float32 network's on the same params, batch and key."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    losses = {}
    for dtype in ("float32", "bfloat16"):
        cfg = _configs()[name]
        cfg.model.update(dict(num_layers=1, num_heads=2, width=32, dtype=dtype))
        cfg.data.seq_len = 16
        task = tasks.make_task(cfg)
        params = task.init_params(jax.random.key(0))
        rng = np.random.default_rng(1)
        params = jax.tree.map(lambda p: p + 0.1 * rng.standard_normal(p.shape).astype(p.dtype), params)
        batch = jnp.asarray(rng.integers(0, task.vocab_size, (4, 16)), jnp.int32)
        (loss, loss_B), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(params, batch, jax.random.key(2), True)
        assert loss.dtype == jnp.float32 and loss_B.dtype == jnp.float32 and loss_B.shape == (4,)
        assert all(v.dtype == jnp.float32 for v in task.metrics(loss_B).values())
        assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
        assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
        losses[dtype] = np.asarray(loss_B)
    # per-token log-prob error of bf16 (< 0.05 nats, tests/test_transformer.py) summed over <= L positions
    np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=2e-2, atol=0.05 * 16)


# ---------------------------------------------------------------------------------------------
# The registry: a process added by registration only
# ---------------------------------------------------------------------------------------------
def test_registration_reads_process_name_once_and_names_the_choices():
    cfg = _configs()["masked"]
    assert tasks.registration(cfg) is tasks.REGISTRY["masked"]
    assert tasks.PROCESSES == tuple(tasks.REGISTRY) and set(tasks.PROCESSES) >= {"masked", "sedd", "poisson"}
    cfg.process.name = "duo"
    with pytest.raises(ValueError, match=r"config.process.name='duo'; choose from \('masked', 'sedd', 'poisson'"):
        tasks.registration(cfg)
    with pytest.raises(ValueError, match="input_format='images'"):
        tasks.register(tasks.Registration("duo", tasks.MaskedTask, tasks.masked.oracle_case, input_format="images"))
    assert "duo" not in tasks.REGISTRY


@pytest.fixture
def test_only_process():
    """A masked process registered under another name, from the test, with no library edit."""
    import functools

    from infodiff.tasks import masked

    name = "masked_test_only"
    reg = tasks.register(tasks.Registration(name=name, task=tasks.MaskedTask,
                                            oracle_case=functools.partial(masked.oracle_case, name=name),
                                            conditional=masked.RULES))
    try:
        yield reg
    finally:
        tasks.REGISTRY.pop(name)


def test_a_registered_test_only_process_trains_and_evaluates(test_only_process, tmp_path):
    """make_task / training / evaluate.py's network and oracle paths see the new name through the
    registry; the oracle estimates are within 4 SE of the exact -log p(x)."""
    import warnings

    import numpy as np

    from configs import masked_text, oracle_tabular
    from infodiff import config_usage, evaluation, training

    name = test_only_process.name
    c = masked_text.get_config()
    c.process.name = name
    for k, v in {"model.num_layers": 1, "model.width": 32, "model.num_heads": 2, "data.seq_len": 16,
                 "train.batch_size": 8, "train.num_steps": 3, "train.log_every": 1, "train.eval_every": 3,
                 "train.eval_batches": 1, "train.ckpt_every": 3, "optim.warmup_steps": 0, "eval.num_samples": 2,
                 "eval.max_sequences": 4, "eval.num_generate": 0}.items():
        sec, key = k.split(".")
        c[sec][key] = v
    task = tasks.make_task(c)
    assert task.name == name and isinstance(task, tasks.MaskedTask)
    same = c.copy_and_resolve_references()
    same.process.name = "masked"
    assert set(config_usage.not_read(c)) == set(config_usage.not_read(same)) >= {"eval.input_unit"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = training.train(task, str(tmp_path / "run"))
        rep, _ = evaluation.evaluate(c, str(tmp_path / "run"))
    assert result["step"] == 3 and rep["process"]["name"] == name and np.isfinite(rep["nll"])

    o = oracle_tabular.get_config()
    o.process.name = name
    o.eval.estimators, o.eval.num_sequences, o.eval.num_samples = ("k_dce",), 8, 256
    o.eval.output_dir = str(tmp_path / "oracle")
    case = tasks.oracle_case(o)
    assert case.process_info["name"] == name and len(case.estimators) == 1
    rep, _ = evaluation.evaluate(o, None)
    assert rep["process"]["name"] == name
    for row in rep["results"]["unconditional"]:
        assert abs(row["bias"]) < 4 * row["bias_stderr"], row


def test_user_file_scoring_is_the_registrations():
    """Text processes score .txt / .jsonl through their task's scoring_process (a process with
    pads); Poisson scores .npy counts; an estimator a process does not have is one line."""
    cfgs = _configs()
    assert [tasks.registration(cfgs[n]).input_format for n in ("masked", "sedd", "poisson")] == \
        ["text", "text", "counts"]
    task = tasks.make_task(cfgs["masked"])
    assert task.scoring_process("k_dce").estimator == "k_dce"
    with pytest.raises(ValueError, match="'neyman' cannot score rows of different lengths"):
        task.scoring_process("neyman")
    sedd_process = tasks.make_task(cfgs["sedd"]).scoring_process("imdse")
    assert sedd_process.pad_id == sedd_process.vocab_size  # rows of any length: pads
    with pytest.raises(ValueError, match="'k_dce': a score-entropy"):
        tasks.make_task(cfgs["sedd"]).scoring_process("k_dce")
    cfgs["poisson"].data.num_train = cfgs["poisson"].data.num_valid = cfgs["poisson"].data.num_test = 64
    with pytest.raises(ValueError, match="config.process.name='poisson': scoring your own text is not implemented"):
        tasks.make_task(cfgs["poisson"]).scoring_process("k_dce")
