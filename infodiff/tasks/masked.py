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
from infodiff.denoisers import NoParams
from infodiff.networks.text_denoisers import Denoiser
from infodiff.processes import base
from infodiff.processes import masked as masked_lib
from infodiff.tasks import OracleCase, OracleEstimator, Registration, register
from infodiff.tasks import text

__all__ = ["MaskedTask", "make_mask_spec", "oracle_case", "SCORING_ESTIMATORS", "REGISTRATION"]

# The estimators that take one forward pass per sample, so rows of different lengths (pads) can
# be scored: infodiff.scoring.
SCORING_ESTIMATORS = ("k_dce", "t_dce", "time_free", "lambda_dce")


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
    if int(p.finite_T) > 0 and p.objective != "t_dce":
        # A key this objective does not read is an error, not silence (infodiff/config_usage.py).
        raise ValueError(f"config.process.finite_T={p.finite_T} is read only by objective 't_dce' (MD4's "
                         f"discrete-time ELBO), not by {p.objective!r}: set finite_T=0 or objective='t_dce'")
    return masked_lib.MaskSpec(
        name=p.objective,
        schedule=text.schedule_from_config(p),
        finite_T=int(p.finite_T),
        # read only where the objective draws a continuous time (RULES)
        antithetic=bool(p.antithetic) if p.objective in ("t_dce", "lambda_dce") else False,
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
        if self.spec.name not in masked_lib.OBJECTIVES:
            raise ValueError(f"config.process.objective={self.spec.name!r} is an estimator, not a "
                             f"training objective; choose from {masked_lib.OBJECTIVES}")
        self.process = masked_lib.MaskedProcess(self.spec, self.vocab_size)

    @property
    def objective(self):
        return str(self.config.process.objective)

    def loss_B(self, apply_fn, batch, key, *, train):
        return base.training_loss(self.process, NoParams(apply_fn), None, batch, key)

    def denoiser(self, params):
        return Denoiser(model=self.model, params=params)

    def check_eval_config(self):
        super().check_eval_config()
        if self.config.eval.estimator not in masked_lib.ESTIMATORS:
            raise ValueError(f"config.eval.estimator={self.config.eval.estimator!r}; "
                             f"choose from {masked_lib.ESTIMATORS}")

    def estimation_process(self, key=None):
        return lk.masked_process(str(self.config.eval.estimator), self.schedule_obj, self.vocab_size)

    def scoring_process(self, estimator):
        if estimator not in lk.ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r} (config.eval.estimator); choose from "
                             f"{SCORING_ESTIMATORS}")
        if estimator not in SCORING_ESTIMATORS:
            raise ValueError(f"estimator {estimator!r} cannot score rows of different lengths; choose from "
                             f"{SCORING_ESTIMATORS}")
        return lk.masked_process(estimator, self.schedule_obj, self.vocab_size)

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


def oracle_case(config, name: str = "masked") -> OracleCase:
    """Every estimator of ``eval.estimators`` with the exact denoiser of a tabular or Markov
    oracle; with a prompt also the conditional and the log-ratio against the case's alternative
    responses (:func:`text.text_oracle_case`). ``name``: the process's
    registered name (the report's)."""
    ev = config.eval
    text.check_num_sequences(config)
    est_names = text.names(ev.estimators, lk.ESTIMATORS, "eval.estimators", "estimator")
    case, orc, key = text.text_oracle_case(config, name, check_prompt=True)
    schedule = text.schedule_from_config(config.process)
    for i, est in enumerate(est_names):
        case.estimators.append(OracleEstimator(lk.masked_process(est, schedule, orc.vocab_size), orc,
                                               jax.random.fold_in(key, i)))
    return case


RULES: tuple[cr.Conditional, ...] = (
    *text.RULES,
    cr.Conditional("process.antithetic", "process.objective in ('t_dce', 'lambda_dce')",
                   cr.equals("process.objective", "t_dce", "lambda_dce")),
)

REGISTRATION = register(Registration(name="masked", task=MaskedTask, oracle_case=oracle_case,
                                     conditional=RULES, input_format="text"))
