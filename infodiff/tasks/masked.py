"""The ``masked`` process's registration: masked (absorbing) diffusion on text (MD4 / RADD).

Loss: the DCE objective ``config.process.objective`` (``processes/masked.py``); eval-mode
denoiser :class:`Denoiser`; estimation process ``likelihood.masked_process(eval.estimator)``;
oracle case: every estimator of ``eval.estimators`` against a tabular or Markov law, with the
conditional and the coupled / decoupled log-ratio; user text scored through
:mod:`infodiff.scoring`.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from infodiff import config_rules as cr
from infodiff import likelihood as lk
from infodiff import validation
from infodiff import oracles, orders, schedules
from infodiff.denoisers import NoParams
from infodiff.networks.text_denoisers import Denoiser
from infodiff.processes import base
from infodiff.processes import masked as masked_lib
from infodiff.tasks import (CalibrationCase, ContractCase, OracleCase, OracleEstimator, Registration, register,
                            repo_config)
from infodiff.tasks import text

__all__ = ["MaskedTask", "make_mask_spec", "scoring_process", "oracle_case", "SCORING_ESTIMATORS", "REGISTRATION"]



_FLAGS = {"one_pass": lambda m: m.one_pass, "objective": lambda m: m.objective,
          "antithetic": lambda m: m.antithetic, "finite_T": lambda m: m.finite_T}


def _laws_with(flag: str) -> tuple[str, ...]:
    """The registered mask laws (``masked_lib.LAWS``) that declare ``flag`` (a key of
    :data:`_FLAGS`), in registry order."""
    return tuple(name for name, m in masked_lib.LAWS.items() if _FLAGS[flag](m))


def __getattr__(name: str):
    # SCORING_ESTIMATORS: the laws that take one forward pass per sample, so rows of different
    # lengths (pads) can be scored (infodiff.scoring); read from the registry when asked.
    if name == "SCORING_ESTIMATORS":
        return _laws_with("one_pass")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_mask_spec(config: ml_collections.ConfigDict) -> masked_lib.MaskSpec:
    """The training objective of a masked run's ``config.process`` as a :class:`masked.MaskSpec`.

    ``exact_boundaries=False``: for ``t_dce`` this is MD4's continuous-time (``finite_T=0``) or
    discrete-time (``finite_T=T``) diffusion loss (MD4 Eq. 5 / Eq. 4); the objectives
    ``k_dce``, ``lambda_dce`` and ``time_free`` ignore it.

    Raises:
      ValueError: unknown objective or schedule, invalid eps / finite_T, finite_T > 0 with an
        objective other than t_dce.
    """
    p = config.process
    objective = masked_lib.LAWS.get(p.objective) if isinstance(p.objective, str) else None
    if int(p.finite_T) > 0 and not (objective and objective.finite_T):
        # A key this objective does not read is an error, not silence (infodiff/config_usage.py).
        readers = _laws_with("finite_T")
        raise ValueError(f"config.process.finite_T={p.finite_T} is read only by objective "
                         f"{' or '.join(map(repr, readers))} (MD4's discrete-time ELBO), not by {p.objective!r}: "
                         f"set finite_T=0 or objective={' or '.join(map(repr, readers))}")
    return masked_lib.MaskSpec(
        name=p.objective,
        schedule=text.schedule_from_config(p),
        finite_T=int(p.finite_T),
        # read only where the objective draws a continuous time (RULES)
        antithetic=bool(p.antithetic) if objective and objective.antithetic else False,
        exact_boundaries=False,
    )


class MaskedTask(text.TextTask):
    """Masked (absorbing) diffusion on text: the DCE objective ``config.process.objective``
    (:func:`make_mask_spec`); an unbiased estimate of (or, for continuous ``t_dce``, a bound on)
    -log p(x) in nats per sequence. ``denoiser``: :class:`Denoiser`."""

    name = "masked"

    def __init__(self, config, data=None):
        super().__init__(config, data)
        self.spec = make_mask_spec(config)
        if not self.spec_law.objective:
            raise ValueError(f"config.process.objective={self.spec.name!r} is an estimator, not a "
                             f"training objective; choose from {_laws_with('objective')}")
        self.process = masked_lib.MaskedProcess(self.spec, self.vocab_size)

    @property
    def spec_law(self) -> masked_lib.MaskLaw:
        """The mask law of the training objective."""
        return masked_lib.law(self.spec.name)

    @property
    def objective(self):
        return str(self.config.process.objective)

    def loss_B(self, apply_fn, batch, key, *, train):
        return base.training_loss(self.process, NoParams(apply_fn), None, batch, key)

    def denoiser(self, params):
        return Denoiser(model=self.model, params=params)

    def check_eval_config(self):
        super().check_eval_config()
        order_settings(self.config)
        if self.config.eval.estimator not in masked_lib.LAWS:
            raise ValueError(f"config.eval.estimator={self.config.eval.estimator!r}; "
                             f"choose from {tuple(masked_lib.LAWS)}")

    def order_settings(self) -> dict:
        """The any-order likelihood settings of ``config.eval`` (:func:`order_settings`)."""
        return order_settings(self.config)

    def order_model(self, params) -> dict:
        """What :func:`infodiff.orders.nll_interval` needs of this run: ``denoiser``,
        ``time_conditioned`` (``model.time_conditioning``) and ``schedule``."""
        return {"denoiser": self.denoiser(params), "time_conditioned": bool(self.config.model.time_conditioning),
                "schedule": self.schedule_obj}

    def estimation_process(self, key=None):
        return lk.masked_process(str(self.config.eval.estimator), self.schedule_obj, self.vocab_size)

    def scoring_process(self, estimator):
        return scoring_process(estimator, self.schedule_obj, self.vocab_size)

    def process_info(self, process):
        p = self.config.process
        return {"name": self.name, "schedule": p.schedule, "eps": p.get("eps", None),
                "objective": str(p.objective)}

    def generate(self, denoiser, key):
        ev = self.config.eval
        n_gen, L = int(ev.get("num_generate", 4)), self.seq_len
        if n_gen <= 0:
            return {}
        sched, steps, V = self.schedule_obj, int(ev.get("sample_steps", L)), self.vocab_size

        @jax.jit
        def run(params, key):
            den = lambda z, t: denoiser.apply_params(params, z, t)  # noqa: E731
            return masked_lib.ancestral_sample(den, key, n_gen, L, V, sched, steps)

        return self._decoded(run(denoiser.params, key), "MD4 ancestral sampler", steps)


def scoring_process(estimator: str, schedule, vocab_size: int) -> masked_lib.MaskedProcess:
    """The masked process that scores rows of different lengths (:data:`SCORING_ESTIMATORS`).
    Raises ValueError for another estimator."""
    scoring = _laws_with("one_pass")
    if estimator not in masked_lib.LAWS:
        raise ValueError(f"unknown estimator {estimator!r} (config.eval.estimator); choose from {scoring}")
    if estimator not in scoring:
        raise ValueError(f"estimator {estimator!r} cannot score rows of different lengths; choose from {scoring}")
    return lk.masked_process(estimator, schedule, vocab_size)


def oracle_case(config, name: str = "masked") -> OracleCase:
    """Every estimator of ``eval.estimators`` with the exact denoiser of a tabular or Markov
    oracle; with a prompt also the conditional and the log-ratio against the case's alternative
    responses (:func:`text.text_oracle_case`). ``name``: the process's
    registered name (the report's)."""
    ev = config.eval
    text.check_num_sequences(config)
    est_names = text.names(ev.estimators, tuple(masked_lib.LAWS), "eval.estimators", "estimator")
    case, orc, key = text.text_oracle_case(config, name, check_prompt=True)
    schedule = text.schedule_from_config(config.process)
    for i, est in enumerate(est_names):
        case.estimators.append(OracleEstimator(lk.masked_process(est, schedule, orc.vocab_size), orc,
                                               jax.random.fold_in(key, i)))
    return case


def _is_true(path: str) -> cr.Test:
    return lambda c: cr.get(c, path) is True


def order_settings(config) -> dict:
    """The any-order likelihood settings (infodiff/orders.py) of ``config.eval``, validated;
    reads only the keys its mode reads (:data:`RULES`). Returns ``{"interval": bool, "orders":
    K, "level", "proposal", "sampler": '' or one of orders.SAMPLERS, "sample_steps"}`` (None
    where unread). Configs without the keys (older runs) give ``interval`` False.

    Raises:
      ValueError: one line naming the key and its value: ``eval.interval`` not a bool, K < 2,
        a level outside (0, 1), an unknown proposal or sampler.
    """
    ev = config.eval
    out = {"interval": False, "orders": None, "level": None, "proposal": None, "sampler": "", "sample_steps": None}
    if "interval" not in ev:
        return out
    if not isinstance(ev.interval, bool):
        raise ValueError(f"config.eval.interval={ev.interval!r} must be True or False")
    out["interval"] = ev.interval
    if cr.NO_INPUT(config):
        out["sampler"] = str(ev.sampler_likelihood)
        if out["sampler"] not in ("",) + orders.SAMPLERS:
            raise ValueError(f"config.eval.sampler_likelihood={ev.sampler_likelihood!r}; choose '' (none) or one "
                             f"of {orders.SAMPLERS}")
    if out["interval"] or out["sampler"] == "ancestral":
        out.update(interval_keys(ev, proposal=out["interval"], passes_each=2 * int(config.data.seq_len)))
    if out["sampler"] == "ancestral":
        out["sample_steps"] = int(ev.sample_steps)
        if out["sample_steps"] < 1:
            raise ValueError(f"config.eval.sample_steps={ev.sample_steps} must be >= 1 (the ancestral sampler's T)")
    return out


def interval_keys(ev, proposal: bool = True, per: str = "item", passes_each: int = 1) -> dict:
    """``{"orders": K, "level"}`` (and ``"proposal"`` if ``proposal``) of ``config.eval``'s interval
    keys, validated. ValueError, one line naming the key: K < 2 or over the budget bound (its cost
    at ``passes_each`` forward passes per order, :func:`infodiff.validation.check_budget`), a level
    outside (0, 1), an unknown proposal."""
    K, level = ev.interval_orders, ev.interval_level
    if isinstance(K, bool) or not isinstance(K, int) or K < 2:
        raise ValueError(f"config.eval.interval_orders={K!r} must be an integer >= 2 (orders per {per})")
    validation.check_budget(K, "config.eval.interval_orders", passes_each=passes_each)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"config.eval.interval_level={level!r} must be in (0, 1), e.g. 0.95")
    out = {"orders": int(K), "level": float(level)}
    if proposal:
        if ev.interval_proposal not in orders.PROPOSALS:
            raise ValueError(f"config.eval.interval_proposal={ev.interval_proposal!r}; choose from {orders.PROPOSALS}")
        out["proposal"] = str(ev.interval_proposal)
    return out


RULES: tuple[cr.Conditional, ...] = (
    *text.RULES,
    # the any-order likelihood (order_settings): network mode; sampler_likelihood on the split only
    cr.Conditional("eval.sampler_likelihood", "eval.input is not set (a split, not a file)", cr.NO_INPUT,
                   cr.NETWORK),
    *cr.keys(("eval.interval_orders", "eval.interval_level"),
             "eval.interval is True or eval.sampler_likelihood = 'ancestral' (without eval.input)",
             lambda c: cr.get(c, "eval.interval") is True
             or (cr.NO_INPUT(c) and cr.get(c, "eval.sampler_likelihood") == "ancestral"), cr.NETWORK),
    cr.Conditional("eval.interval_proposal", "eval.interval is True", _is_true("eval.interval"), cr.NETWORK),
    cr.Conditional("process.antithetic", f"process.objective in {_laws_with('antithetic')}",
                   lambda c: str(cr.get(c, "process.objective")) in _laws_with("antithetic")),
)

# ---- contract material (tests/test_processes.py, test_calibration.py, the resume test) ----
# A few-step tiny run: configs/masked_text.py (the embedded corpus) at 1 layer, width 32, L = 16.
TINY_RUN = {"model.num_layers": 1, "model.num_heads": 2, "model.width": 32, "data.seq_len": 16,
            "train.batch_size": 8, "train.num_steps": 4, "train.log_every": 2, "train.ckpt_every": 2,
            "train.eval_every": 1000, "train.eval_batches": 1, "optim.lr": 3e-3, "optim.warmup_steps": 2}


def tiny_config(name: str = "masked") -> ml_collections.ConfigDict:
    """The tiny masked run (:data:`TINY_RUN`) under the registered ``name``."""
    return repo_config("masked_text", {**TINY_RUN, "process.name": name})


def contract_table():
    """The contract tests' tabular law (4 letters, L = 6) and 4 items with their exact -log p
    (float64 [4], nats); shared by the text processes."""
    tab = oracles.random_tabular(np.random.default_rng(0), "ACGT", 6, 32)
    x = tab.sample(np.random.default_rng(1), 4)
    return tab, x, -tab.log_prob(x)


def contract_cases(name: str = "masked", estimators=None) -> list[ContractCase]:
    """Every masked estimator with the exact tabular denoiser; the training law of each objective
    that is an unbiased estimate (not t_dce's boundary-free bound, not lambda_dce's infinite
    variance); neyman enumerates every stratum at L = 6 (exact, SE 0). ``estimators``: default
    every registered mask law. Ids ``'<name>:<estimator>'``."""
    tab, x, truth = contract_table()
    V = tab.vocab_size
    lin = schedules.LinearSchedule()
    out = []
    for est in (tuple(masked_lib.LAWS) if estimators is None else estimators):
        process, train = lk.masked_process(est, lin, V), None
        m = process.law
        if m.objective and not m.exact_boundaries and not process.infinite_variance:
            train = masked_lib.MaskedProcess(masked_lib.MaskSpec(est, lin, exact_boundaries=False, antithetic=False), V)
        out.append(ContractCase(f"{name}:{est}", process, train, tab, x, truth, truth,
                                1024 if m.one_pass else 128))
    return out


def calibration_laws():
    """The calibration tables: (tabular law, 400 items, exact -log p) and (Markov law, 400
    prompt/response items, exact -log p(y | x) with the prompt the first 8 tokens)."""
    rng = np.random.default_rng(0)
    tab = oracles.random_tabular(rng, "ACGT", 6, 64, 0.5)
    x = tab.sample(rng, CALIBRATION_CASES)
    rng = np.random.default_rng(1)
    mk = oracles.random_markov(rng, "ACGT", 2, 0.5, seq_len=20)
    xm = mk.sample(rng, CALIBRATION_CASES)
    return (tab, x, -tab.log_prob(x)), (mk, xm, -mk.cond_log_prob(xm, text.response_mask(xm, 8)))


CALIBRATION_CASES = 400


def _calibration_samples(est: str) -> int:
    """The law's min_samples; twice that for a planned law (its pilot comes out of the budget)."""
    process = lk.masked_process(est)
    return process.min_samples * (2 if process.needs_plan else 1)


def calibration_cases() -> list[CalibrationCase]:
    """Each finite-variance estimator at its ``MIN_SAMPLES`` over 400 tabular sequences; the
    conditional (k_dce, stratified, neyman with a budget of 16 rounds: >= min_samples after its
    pilot) and the coupled log-ratio (k_dce, neyman) over 400 Markov prompt/response pairs."""
    import functools

    laws = functools.cache(calibration_laws)

    def unconditional(est):
        def run():
            tab, x, truth = laws()[0]
            S = masked_lib.MIN_SAMPLES[est]
            return lk.nll(tab, x, jax.random.PRNGKey(10 + S), estimator=est, num_samples=S), truth
        return run

    def conditional(est):
        def run():
            mk, x, truth = laws()[1]
            S = _calibration_samples(est)
            return lk.conditional_nll(mk, x[:, :8], x[:, 8:], jax.random.PRNGKey(20 + S), estimator=est,
                                      num_samples=S), truth
        return run

    def ratio(est):
        def run():
            mk, x, _ = laws()[1]
            y_alt = mk.sample_response(np.random.default_rng(5), x[:, :8], 12)
            target = text.response_mask(x, 8)
            truth = mk.cond_log_prob(x, target) - mk.cond_log_prob(np.concatenate([x[:, :8], y_alt], 1), target)
            S = _calibration_samples(est)
            return lk.log_ratio(mk, x[:, :8], x[:, 8:], y_alt, jax.random.PRNGKey(7), estimator=est,
                                num_samples=S), truth
        return run

    return ([CalibrationCase(est, unconditional(est)) for est in ("t_dce", "k_dce", "time_free", "stratified")]
            + [CalibrationCase(f"{est} conditional", conditional(est)) for est in ("k_dce", "stratified", "neyman")]
            + [CalibrationCase(f"{est} coupled log-ratio", ratio(est)) for est in ("k_dce", "neyman")])


REGISTRATION = register(Registration(name="masked", task=MaskedTask, oracle_case=oracle_case,
                                     conditional=RULES, input_format="text", contract_cases=contract_cases,
                                     calibration_cases=calibration_cases, tiny_config=tiny_config))
