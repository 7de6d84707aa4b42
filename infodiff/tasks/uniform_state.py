"""The ``uniform_state`` process's registration: uniform-state diffusion (UDLM / duo) on text.

Loss: UDLM's continuous-time NELBO (``processes/uniform_state.py``; arXiv 2412.10193, duo arXiv
2506.10892) with t ~ U[0, 1) under ``config.process.schedule``; the network (conditioned on lam =
1 - alpha_t) outputs log x_theta, the mean parametrisation; eval-mode denoiser
:class:`~infodiff.networks.text_denoisers.Denoiser` called as ``(z, lam)``; estimation process:
the same NELBO with lam = lam_max u^3 (the 'power3' law, ``eval.estimator = 'udlm'``) plus the exact
prior and truncation terms. Oracle case: the NELBO of the exact (leave-one-out) mean denoiser of
a tabular or Markov law. Masked-only features (any-order likelihoods, intervals, the masked
estimators, user files) are refused in one line.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from infodiff.denoisers import NoParams
from infodiff.networks.text_denoisers import Denoiser
from infodiff.processes import base
from infodiff.processes import uniform_state as us
from infodiff.tasks import CalibrationCase, ContractCase, OracleCase, OracleEstimator, Registration, register, repo_config
from infodiff.tasks import text

__all__ = ["UniformStateTask", "check_uniform_eval_config", "oracle_case", "REGISTRATION"]

ESTIMATORS = ("udlm",)
# Masked-run settings this process has no counterpart for: refused by name, in one line.
MASKED_ONLY = {
    "interval": "likelihood intervals and the exact any-order likelihood (infodiff/orders.py)",
    "interval_orders": "likelihood intervals (infodiff/orders.py)",
    "interval_level": "likelihood intervals (infodiff/orders.py)",
    "interval_proposal": "likelihood intervals (infodiff/orders.py)",
    "sampler_likelihood": "sampler likelihoods of a masked generation order (infodiff/orders.py)",
}


def check_uniform_eval_config(config: ml_collections.ConfigDict) -> None:
    """Validate a uniform-state run's ``eval.*`` settings up front (training and evaluate.py).

    Raises ValueError in one line naming the key: a masked-only setting (:data:`MASKED_ONLY`,
    or a masked estimator such as 'k_dce' in ``eval.estimator``), or an unknown estimator."""
    ev = config.eval
    for key, what in MASKED_ONLY.items():
        if key in ev:
            raise ValueError(f"config.eval.{key}: {what} are for masked (absorbing) runs; a uniform-state run "
                             "(process.name='uniform_state') reports its NELBO: remove the key")
    est = str(ev.get("estimator", "udlm"))
    if est not in ESTIMATORS:
        from infodiff import likelihood as lk

        if est in lk.ESTIMATORS:
            raise ValueError(f"config.eval.estimator={est!r} is a masked-diffusion estimator; a uniform-state run "
                             f"(process.name='uniform_state') is evaluated with {ESTIMATORS[0]!r}")
        raise ValueError(f"config.eval.estimator={est!r}; choose from {ESTIMATORS}")


class UniformStateTask(text.TextTask):
    """Uniform-state diffusion on text: UDLM's continuous-time NELBO, one Monte Carlo sample per
    sequence (nats per sequence); the network is conditioned on lam = 1 - alpha_t and outputs
    log x_theta. The ``eval.*`` settings are validated at construction."""

    name = "uniform_state"

    def __init__(self, config, data=None):
        check_uniform_eval_config(config)
        super().__init__(config, data)
        p = config.process
        self.schedule = text.schedule_from_config(p)
        self.process = us.UniformStateProcess(vocab_size=self.vocab_size, noise_law="time", schedule=self.schedule,
                                              antithetic=bool(p.antithetic))

    @property
    def objective(self):
        return "udlm"

    def loss_B(self, apply_fn, batch, key, *, train):
        return base.training_loss(self.process, NoParams(apply_fn), None, batch, key)

    def denoiser(self, params):
        return Denoiser(model=self.model, params=params)

    def check_eval_config(self):
        check_uniform_eval_config(self.config)
        super().check_eval_config()

    def estimation_process(self, key=None):
        return us.UniformStateProcess(vocab_size=self.vocab_size, lam_max=self.schedule.lambda_max)

    def process_info(self, process):
        p = self.config.process
        return {"name": self.name, "schedule": p.schedule, "eps": p.get("eps", None), "estimator": process.estimator,
                "lam_max": process.lam_max, "parametrisation": "mean (x_theta)",
                "recon": "the truncation term at lam = 0: exactly 0 (alpha_0 = 1)"}


def oracle_case(config, name: str = "uniform_state") -> OracleCase:
    """The UDLM NELBO of the exact mean denoiser (:class:`us.OracleMean`, leave-one-out posterior)
    of a tabular or Markov oracle (:func:`text.text_oracle_case`), unconditional only (a prompt's
    conditional and log-ratio are not estimated). ``name``: the report's process name."""
    text.check_num_sequences(config)
    case, orc, key = text.text_oracle_case(config, name, check_prompt=False)
    lam_max = text.schedule_from_config(config.process).lambda_max
    case.info["lam_max"] = lam_max
    case.estimators.append(OracleEstimator(us.UniformStateProcess(vocab_size=orc.vocab_size, lam_max=lam_max),
                                           us.OracleMean(orc), key, conditional=False, ratio=False))
    return case


# Keys its runs read only under a condition (infodiff/config_usage.py): the text ones.
RULES = text.RULES


# ---- contract material (tests/test_processes.py, test_calibration.py, the resume test) ----
def tiny_config() -> ml_collections.ConfigDict:
    """configs/uniform_text.py at the tiny masked run's size (``masked.TINY_RUN``)."""
    from infodiff.tasks import masked

    return repo_config("uniform_text", masked.TINY_RUN)


def contract_cases() -> list[ContractCase]:
    """The NELBO with the exact (leave-one-out) mean denoiser of the contract tabular law; the
    training law ('time', loglinear schedule, lam_max = 1 - 1e-3) estimates the NLL less the exact
    prior term."""
    from infodiff import denoisers, schedules
    from infodiff.tasks import masked

    tab, x, truth = masked.contract_table()
    V = tab.vocab_size
    loglin = schedules.LogLinearSchedule()
    proc = us.UniformStateProcess(vocab_size=V)
    train = us.UniformStateProcess(vocab_size=V, noise_law="time", schedule=loglin, antithetic=False,
                                   lam_max=loglin.lambda_max)
    den = us.OracleMean(tab)
    prior = train.exact_terms(*denoisers.split(den), x, np.ones(x.shape, bool), 64)["prior"]
    return [ContractCase("uniform_state:udlm", proc, train, den, x, truth, truth - prior, 1024)]


CALIBRATION_CASES = 400


def calibration_laws():
    """(tabular law 'ACG', L = 4, 27 sequences; 400 items; exact -log p) and (order-1 Markov law
    'ACG', L = 6; 400 items; exact -log p)."""
    from infodiff import oracles

    rng = np.random.default_rng(2)
    tab = oracles.random_tabular(rng, "ACG", 4, 27, 0.5)
    x = tab.sample(rng, CALIBRATION_CASES)
    rng = np.random.default_rng(3)
    mk = oracles.random_markov(rng, "ACG", 1, 0.5, seq_len=6)
    xm = mk.sample(rng, CALIBRATION_CASES)
    return (tab, x, -tab.log_prob(x)), (mk, xm, -mk.log_prob(xm))


def calibration_cases() -> list[CalibrationCase]:
    """The NELBO of the exact mean denoiser at ``min_samples`` (512) over 400 tabular and 400
    Markov sequences."""
    from infodiff import likelihood as lk

    def run(i):
        def go():
            orc, x, truth = calibration_laws()[i]
            process = us.UniformStateProcess(vocab_size=orc.vocab_size)
            return lk.nll(us.OracleMean(orc), x, jax.random.PRNGKey(40 + i), process=process,
                          num_samples=process.min_samples), truth
        return go

    return [CalibrationCase("udlm tabular", run(0)), CalibrationCase("udlm markov", run(1))]


REGISTRATION = register(Registration(name="uniform_state", task=UniformStateTask, oracle_case=oracle_case,
                                     conditional=RULES, input_format="text", contract_cases=contract_cases,
                                     calibration_cases=calibration_cases, tiny_config=tiny_config))
