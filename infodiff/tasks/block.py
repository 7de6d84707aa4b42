"""The ``block`` process's registration: block diffusion (BD3-LM, arXiv 2503.09573) over masked
diffusion on text, blocks of ``config.process.block_size`` L' (:mod:`infodiff.processes.block`).

Network: the masked transformer with block-causal attention (``Transformer.block_size``). Loss:
the masked objective ``config.process.objective`` in every block given the clean blocks before
it, summed (nats per sequence): for a time-free network in one pass of BD3-LM's two-copy layout,
for a time-conditioned one a pass per block (each block's time conditions the whole input, as
the estimators' row-per-block calls do). Eval-mode denoiser: the masked :class:`Denoiser`
(block-causal); estimation process: :class:`block.BlockProcess` over the masked estimator
``eval.estimator``; report extras: the exact block likelihood (``eval.exact``) beside the NELBO,
or for a time-conditioned network the per-block interval, and why.
"""

from __future__ import annotations

import math
import time

import jax
import ml_collections

from infodiff import config_rules as cr
from infodiff import likelihood as lk
from infodiff.denoisers import NoParams
from infodiff.processes import block as block_lib
from infodiff.processes import masked as masked_lib
from infodiff.tasks import CalibrationCase, ContractCase, OracleEstimator, Registration, Task, register, repo_config
from infodiff.tasks import masked as masked_task
from infodiff.tasks import text

__all__ = ["BlockTask", "REGISTRATION", "exact_settings"]

LN2 = math.log(2.0)
WHY_NOT_EXACT = ("the network is time-conditioned: the subset recursion needs a time-free denoiser, so the "
                 "per-block interval of infodiff/orders.py is reported instead")


def exact_settings(config) -> dict:
    """The model's own likelihood settings of a block run's ``config.eval``, validated (one line
    naming the key): ``{"exact": bool, "time_conditioned", "max_block", "interval": bool,
    "orders", "level", "proposal", "sampler"}``. ``exact`` with a time-free network computes the exact block
    likelihood (ValueError with the cost when L' is over ``eval.exact_max_block_size``); with a
    time-conditioned one, and with ``eval.interval``, the per-block interval."""
    from infodiff import orders

    ev, L = config.eval, int(config.data.seq_len)
    Lb = int(config.process.block_size)
    out = {"exact": bool(ev.get("exact", False)), "time_conditioned": bool(config.model.time_conditioning),
           "max_block": None, "interval": False, "orders": None, "level": None, "proposal": None, "sampler": ""}
    if not isinstance(ev.get("exact", False), bool):
        raise ValueError(f"config.eval.exact={ev.exact!r} must be True or False")
    if not isinstance(ev.get("interval", False), bool):
        raise ValueError(f"config.eval.interval={ev.interval!r} must be True or False")
    if out["exact"] and not out["time_conditioned"]:
        cap = ev.exact_max_block_size
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= block_lib.MAX_EXACT_BLOCK:
            raise ValueError(f"config.eval.exact_max_block_size={cap!r} must be an integer in "
                             f"[1, {block_lib.MAX_EXACT_BLOCK}]")
        if Lb > cap:
            raise ValueError(f"the exact block likelihood of blocks of {Lb} costs 2^{Lb} - 1 = {(1 << Lb) - 1} passes "
                             f"per block, {block_lib.exact_cost(Lb, L)} per sequence of {L}: over "
                             f"config.eval.exact_max_block_size={cap}; raise it (at most {block_lib.MAX_EXACT_BLOCK}) "
                             "or set config.eval.exact=False (and eval.interval=True for the interval)")
        out["max_block"] = int(cap)
    out["interval"] = bool(ev.get("interval", False)) or (out["exact"] and out["time_conditioned"])
    out["sampler"] = str(ev.get("sampler_likelihood", "")) if cr.NO_INPUT(config) else ""
    if out["sampler"] not in ("",) + orders.SAMPLERS:
        raise ValueError(f"config.eval.sampler_likelihood={ev.sampler_likelihood!r}; choose '' (none) or one "
                         f"of {orders.SAMPLERS}")
    if out["interval"] or out["sampler"] == "ancestral":
        out.update(masked_task.interval_keys(ev, proposal=out["interval"], per="block",
                                            passes_each=2 * int(config.process.block_size)))
    return out


class BlockTask(masked_task.MaskedTask):
    """Block diffusion on text (module docstring). ``block_size`` L'; ``block_process`` the
    training :class:`block.BlockProcess`. Raises ValueError (one line) for an L' that does not
    divide ``data.seq_len``."""

    name = "block"
    exact_likelihood = True

    def __init__(self, config, data=None):
        super().__init__(config, data)
        self.block_size = block_lib.check_block_size(config.process.block_size, self.seq_len)
        self.model = self.model.clone(block_size=self.block_size)
        self.block_process = block_lib.BlockProcess(self.process, self.block_size)
        self._eval_denoiser = None

    @property
    def two_copy(self) -> bool:
        """Whether training runs every block in one two-copy pass (time-free networks)."""
        return not bool(self.config.model.time_conditioning)

    def network(self, params, key, train):
        """As :meth:`TextTask.network`, with ``apply_fn(z, t, x0=None)``: ``x0`` the clean sequence
        of the two-copy layout (``Transformer.x0_BxL``)."""
        model = self.model
        if train:
            k_loss, k_drop = jax.random.split(key)
            return k_loss, lambda z, t, x0=None: model.apply({"params": params}, z, t, train=True, x0_BxL=x0,
                                                             rngs={"dropout": k_drop})
        return key, lambda z, t, x0=None: model.apply({"params": params}, z, t, train=False, x0_BxL=x0)

    def loss_B(self, apply_fn, batch, key, *, train):
        if self.two_copy:
            return block_lib.two_copy_loss(self.block_process, lambda z, x0, t: apply_fn(z, t, x0), batch, key)
        return block_lib.training_loss(self.block_process, NoParams(apply_fn), None, batch, key)

    def denoiser(self, params):
        self._eval_denoiser = super().denoiser(params)
        return self._eval_denoiser

    def check_eval_config(self):
        Task.check_eval_config(self)
        if self.config.eval.estimator not in masked_lib.ESTIMATORS:
            raise ValueError(f"config.eval.estimator={self.config.eval.estimator!r}; "
                             f"choose from {masked_lib.ESTIMATORS}")
        block_lib.BlockProcess(lk.masked_process("k_dce", self.schedule_obj, self.vocab_size), self.block_size)
        if self.config.eval.estimator == "neyman":
            raise ValueError("config.eval.estimator='neyman' plans its strata per target count, not per block: "
                             "choose k_dce, stratified, time_free or t_dce for a block run")
        exact_settings(self.config)

    def order_settings(self):
        """No whole-sequence interval or sampler likelihood: a block run reports its own, per block
        (:meth:`eval_extras`)."""
        return {"interval": False, "orders": None, "level": None, "proposal": None, "sampler": "",
                "sample_steps": None}

    def order_model(self, params):
        raise ValueError("a block run's likelihood is per block: use Run.exact_nll (time-free networks) or "
                         "evaluate.py (the per-block interval); the whole-sequence interval does not apply")

    def estimation_process(self, key=None):
        return block_lib.BlockProcess(super().estimation_process(key), self.block_size)

    def scoring_process(self, estimator):
        return block_lib.BlockProcess(super().scoring_process(estimator), self.block_size)

    def process_info(self, process):
        return {**super().process_info(process), "name": self.name, "block_size": self.block_size,
                "training_layout": "two-copy (BD3-LM)" if self.two_copy else "a pass per block"}

    def generate(self, denoiser, key):
        ev = self.config.eval
        n_gen = int(ev.get("num_generate", 4))
        if n_gen <= 0:
            return {}
        sched, steps, V, L = self.schedule_obj, int(ev.sample_steps), self.vocab_size, self.seq_len

        @jax.jit
        def run(params, key):
            den = lambda z, t: denoiser.apply_params(params, z, t)  # noqa: E731
            return block_lib.block_sample(den, key, n_gen, L, V, sched, steps, self.block_size)

        return self._decoded(run(denoiser.params, key), f"block ancestral sampler (blocks of {self.block_size})",
                             steps)

    # ---- the model's own likelihood (report extras) ----
    def exact_nll(self, denoiser, x_BxL, *, target_BxL=None, pad_BxL=None, progress=False) -> dict:
        """:func:`infodiff.orders.exact_block_nll` of this run's blocks, within ``eval.exact_max_block_size``.
        ValueError for a time-conditioned network (:data:`WHY_NOT_EXACT`) or L' over the budget."""
        if bool(self.config.model.time_conditioning):
            raise ValueError(f"no exact block likelihood: {WHY_NOT_EXACT}")
        cap = int(self.config.eval.get("exact_max_block_size", block_lib.MAX_EXACT_BLOCK))
        from infodiff import orders

        return orders.exact_block_nll(denoiser, x_BxL, self.block_size, target_BxL=target_BxL, pad_BxL=pad_BxL,
                                         batch_size=int(self.config.eval.batch_size), max_block=cap, progress=progress)

    def eval_extras(self, est, x, generated):
        s = exact_settings(self.config)
        den = self._eval_denoiser
        out = {"block_size": self.block_size}
        if den is None or not (s["exact"] or s["interval"] or s["sampler"]):
            return out, []
        n, units = len(x), float(x.shape[0] * x.shape[1]) * LN2
        nelbo, nelbo_se = float(est.mean.sum()), float(est.total()[1])
        out.update(nelbo_nats=nelbo / n, nelbo_bits_per_char=nelbo / units)
        if s["exact"] and not s["time_conditioned"]:
            t0 = time.time()
            ex = self.exact_nll(den, x, progress=True)
            wall = time.time() - t0
            tot = float(ex["nll"].sum())
            passes = int(ex["forward_passes"].sum())
            out.update(exact_nats=tot / n, exact_bits_per_char=tot / units,
                       gap_nelbo_minus_exact_nats=(nelbo - tot) / n, gap_stderr_nats=nelbo_se / n,
                       gap_bits_per_char=(nelbo - tot) / units, gap_stderr_bits_per_char=nelbo_se / units,
                       exact_best_order_nats=float(ex["best_order_nll"].sum()) / n,
                       exact_forward_passes=passes, exact_wall_time_s=wall,
                       exact_passes_per_s=passes / max(wall, 1e-9),
                       exact_note="the network's own -log p (every block by the subset recursion, SE 0); the NELBO "
                                  "bounds it from above")
        elif s["exact"]:
            out["exact_note"] = f"not computed: {WHY_NOT_EXACT}"
        if s["interval"]:
            out.update(self._interval_extras(den, x, est, s, n, units))
        if s["sampler"]:
            out.update(self._sampler_extras(den, x, s, n, units))
        return out, []

    def _sampler_extras(self, den, x, s, n, units) -> dict:
        """-log p(x) of the unmasking sampler ``eval.sampler_likelihood`` run block after block
        (:func:`infodiff.orders.sampler_nll` on every (item, block) pair, summed): exact for a
        deterministic policy, the interval for 'ancestral' (``eval.sample_steps`` steps per block)."""
        from infodiff import orders

        xr, tgt, pad, _ = block_lib.block_rows(x, self.block_size)
        t0 = time.time()
        kw = dict(num_steps=int(self.config.eval.sample_steps), num_plans=s["orders"], level=s["level"]) \
            if s["sampler"] == "ancestral" else {}
        oi = orders.sampler_nll(den, xr, jax.random.fold_in(jax.random.PRNGKey(int(self.config.eval.seed)), 0x1D2),
                                sampler=s["sampler"], target_BxL=tgt, pad_BxL=pad, schedule=self.schedule_obj,
                                batch_size=int(self.config.eval.batch_size), progress=True, **kw)
        t = oi.total()  # over every (item, block) row: the sums and SEs of the items' sums
        name = f"sampler_{s['sampler']}"
        if s["sampler"] != "ancestral":
            return {f"{name}_nats": t["iw"] / n, f"{name}_bits_per_char": t["iw"] / units,
                    f"{name}_forward_passes": t["forward_passes"], f"{name}_wall_time_s": time.time() - t0}
        return {f"{name}_lower_nats": t["lower"] / n, f"{name}_upper_nats": t["upper"] / n,
                f"{name}_lower_bits_per_char": t["lower"] / units, f"{name}_upper_bits_per_char": t["upper"] / units,
                f"{name}_forward_passes": t["forward_passes"], f"{name}_wall_time_s": time.time() - t0}

    def _interval_extras(self, den, x, est, s, n, units) -> dict:
        """The per-block interval of :func:`infodiff.orders.nll_interval`, summed over blocks and
        items (sides' estimates summed, SEs in quadrature)."""
        from infodiff import orders

        xr, tgt, pad, _ = block_lib.block_rows(x, self.block_size)
        t0 = time.time()
        oi = orders.nll_interval(den, xr, jax.random.fold_in(jax.random.PRNGKey(int(self.config.eval.seed)), 0x1D1),
                                 target_BxL=tgt, pad_BxL=pad, num_orders=s["orders"], proposal=s["proposal"],
                                 level=s["level"], time_conditioned=s["time_conditioned"], schedule=self.schedule_obj,
                                 batch_size=int(self.config.eval.batch_size), progress=True)
        t = oi.total()  # over every (item, block) row: the sums and SEs of the items' sums
        return {"interval_lower_nats": t["lower"] / n, "interval_upper_nats": t["upper"] / n,
                "interval_lower_bits_per_char": t["lower"] / units, "interval_upper_bits_per_char": t["upper"] / units,
                "interval_level": s["level"], "interval_forward_passes": t["forward_passes"],
                "interval_wall_time_s": time.time() - t0}


def oracle_case(config):
    """The masked oracle case (:func:`masked.oracle_case`) with every estimator per block of
    ``process.block_size``."""
    case = masked_task.oracle_case(config, name="block")
    Lb = block_lib.check_block_size(config.process.block_size, case.x.shape[1])
    case.estimators = [OracleEstimator(block_lib.BlockProcess(e.process, Lb), e.denoiser, e.key, e.conditional,
                                       e.ratio) for e in case.estimators]
    case.process_info["block_size"] = Lb
    return case


def _interval(c) -> bool:
    return cr.get(c, "eval.interval") is True or (cr.get(c, "eval.exact") is True
                                                  and bool(cr.get(c, "model.time_conditioning")))


RULES: tuple[cr.Conditional, ...] = (
    *text.RULES,
    cr.Conditional("process.antithetic", "process.objective in ('t_dce', 'lambda_dce')",
                   cr.equals("process.objective", "t_dce", "lambda_dce")),
    cr.Conditional("eval.exact_max_block_size", "eval.exact is True and model.time_conditioning is False",
                   lambda c: cr.get(c, "eval.exact") is True and not cr.get(c, "model.time_conditioning"),
                   cr.NETWORK),
    cr.Conditional("eval.interval_proposal", "eval.interval is True, or eval.exact is True with a "
                   "time-conditioned network", _interval, cr.NETWORK),
    *cr.keys(("eval.interval_orders", "eval.interval_level"),
             "eval.interval is True, eval.exact is True with a time-conditioned network, or "
             "eval.sampler_likelihood = 'ancestral' (without eval.input)",
             lambda c: _interval(c) or (cr.NO_INPUT(c) and cr.get(c, "eval.sampler_likelihood") == "ancestral"),
             cr.NETWORK),
    cr.Conditional("eval.sampler_likelihood", "eval.input is not set (a split, not a file)", cr.NO_INPUT,
                   cr.NETWORK),
)

# ---- contract material (tests/test_processes.py, the resume test) ----
ESTIMATORS = ("t_dce", "k_dce", "time_free", "stratified")


def tiny_config() -> ml_collections.ConfigDict:
    """The tiny masked run (:data:`masked.TINY_RUN`) with blocks of 4."""
    return repo_config("block_text", {**masked_task.TINY_RUN, "process.name": "block"})


def contract_cases() -> list[ContractCase]:
    """Each estimator per block of 2 and 3 on the contract table (L = 6) with the exact tabular
    denoiser. The training law is checked by tests/test_block.py (a block sample is a row per
    block, which base.training_loss's one row per item does not lay out)."""
    from infodiff import schedules

    tab, x, truth = masked_task.contract_table()
    lin = schedules.LinearSchedule()
    return [ContractCase(f"block:{est}:b{Lb}", block_lib.BlockProcess(lk.masked_process(est, lin, tab.vocab_size), Lb),
                         None, tab, x, truth, None, 128 if est == "stratified" else 1024)
            for Lb in (2, 3) for est in ESTIMATORS]


def calibration_cases() -> list[CalibrationCase]:
    """k_dce per block of 3 at its ``min_samples`` (32) over the 400 tabular sequences of
    :func:`masked.calibration_laws` (L = 6: two blocks)."""
    import functools

    laws = functools.cache(masked_task.calibration_laws)

    def run():
        tab, x, truth = laws()[0]
        process = block_lib.BlockProcess(lk.masked_process("k_dce", None, tab.vocab_size), 3)
        S = process.min_samples
        return lk.nll(tab, x, jax.random.PRNGKey(30 + S), process=process, num_samples=S), truth

    return [CalibrationCase("block k_dce (blocks of 3)", run)]


REGISTRATION = register(Registration(name="block", task=BlockTask, oracle_case=oracle_case, conditional=RULES,
                                     input_format="text", contract_cases=contract_cases,
                                     calibration_cases=calibration_cases, tiny_config=tiny_config))
