"""The Process protocol says everything the driver reads (infodiff/processes/base.py).

(a) every process the library constructs exposes every declared member with its type;
(b) the driver (infodiff/likelihood.py) probes no process with getattr / hasattr / isinstance;
(c) every Estimate the driver builds carries its process's facts (se_method, min_samples, ...),
    paired and ratio estimates included; a process declaring only the required members runs.
"""

import ast
import dataclasses
import pathlib
import re
import types
import typing
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from infodiff import likelihood as lk
from infodiff import oracles
from infodiff import schedules
from infodiff.count_oracles import FiniteCountOracle
from infodiff.processes import base
from infodiff.processes import masked
from infodiff.processes import poisson as P
from infodiff.processes import score_entropy as se

ROOT = pathlib.Path(__file__).resolve().parents[1]
V = 4
L = 5


def _protocol_members():
    """(typed attributes {name: type}, method names) declared by base.Process."""
    hints = typing.get_type_hints(base.Process)
    methods = sorted(n for n, v in vars(base.Process).items()
                     if callable(v) and not n.startswith("_") and n not in hints)
    return hints, methods


def _all_processes():
    """Every process the process modules construct: each masked estimator and objective (and
    neyman's pilot and planned stages), each SEDD graph x noise law, each Poisson sampler and the
    training law -- generated from the modules' own tables."""
    target = np.ones((2, L), bool)
    out = {}
    for name in masked.ESTIMATORS:
        out[f"masked/{name}"] = lk.masked_process(name, vocab_size=V)
    for name in masked.OBJECTIVES:
        out[f"masked-train/{name}"] = masked.MaskedProcess(masked.MaskSpec(name=name), V)
    ney = lk.masked_process("neyman", vocab_size=V)
    pilot, _, _ = ney.pilot_stage(np.ones((2, 12), bool), 8)
    out["masked/neyman-pilot"] = pilot
    out["masked/neyman-planned"] = ney.plan(None, target, 64)[0]
    for graph in se.GRAPHS:
        for law in se.NOISE_LAWS:
            sched = schedules.LinearSchedule() if law == "time" else None
            out[f"sedd/{graph}/{law}"] = se.ScoreEntropyProcess(graph=graph, vocab_size=V, noise_law=law,
                                                                lam_max=0.9, schedule=sched)
    for sampler in P.SAMPLERS:
        with warnings.catch_warnings():  # 'grid' warns that its SE is not calibrated
            warnings.simplefilter("ignore")
            out[f"poisson/{sampler}"] = P.estimation_process(600, sampler)
    out["poisson/train"] = P.PoissonProcess(weighting="paper")
    return out


PROCESSES = _all_processes()


def test_the_protocol_declares_what_the_docstring_lists():
    hints, methods = _protocol_members()
    doc = base.__doc__
    for name in list(hints) + methods:
        assert f"``{name}" in doc, f"base.py's docstring does not list {name}"
    for name in hints:  # each default as the docstring states it: ``name: type`` = default
        if name in vars(base.Process):
            stated = re.search(rf"``{name}: [^`]+`` = (\S+)", doc)
            assert stated and stated.group(1) == repr(getattr(base.Process, name)), (name, stated)
    assert {"needs_plan", "se_method", "min_samples", "vocab_size", "pad_id", "checks_normalised",
            "per_input_targets", "infinite_variance", "chunk_order", "row_wise", "estimator"} <= set(hints)
    assert {"extra_passes", "pilot_stage", "plan", "draw_noise", "integrand", "exact_terms",
            "passes_per_sample", "validate", "check_target"} <= set(methods)


@pytest.mark.parametrize("label", sorted(PROCESSES))
def test_every_process_exposes_every_member(label):
    proc = PROCESSES[label]
    assert isinstance(proc, base.Process), label
    hints, methods = _protocol_members()
    for name, tp in hints.items():
        value = getattr(proc, name)
        assert isinstance(value, tp), f"{label}.{name} = {value!r} is not {tp}"
        if tp is int or tp == (int | None):
            assert not isinstance(value, bool), f"{label}.{name} is a bool"
    for name in methods:
        assert callable(getattr(proc, name)), f"{label}.{name}"
    assert proc.estimator and proc.denoiser_inputs
    assert proc.se_method in lk.SE_METHODS and proc.chunk_order in base.CHUNK_ORDERS
    assert proc.min_samples >= 2
    assert isinstance(proc.extra_passes(), int) and proc.extra_passes() >= 0
    assert proc.pad_id is None or proc.pad_id >= (proc.vocab_size or 0)
    assert not proc.checks_normalised or proc.vocab_size is not None
    target = np.ones((2, L if proc.vocab_size is not None else 1), bool)
    if label != "masked/neyman-pilot":  # a pilot is built for its own target count
        assert proc.check_target(target) is None
        per = proc.passes_per_sample(target)
        assert isinstance(per, int) and per >= 0
    hash(proc)  # a static jit argument


def test_a_dataclass_field_does_not_inherit_a_protocol_default():
    """``dataclasses`` takes an inherited class attribute as the default of a field declared
    without one: every process field named like a protocol member with a default must write its
    default in its own class body (vocab_size, a field of most processes, has no default)."""
    assert "vocab_size" not in vars(base.Process)
    with_default = {n for n in typing.get_type_hints(base.Process) if n in vars(base.Process)}
    for cls in {type(p) for p in PROCESSES.values()}:
        for f in dataclasses.fields(cls):
            if f.name in with_default:
                assert f.default is dataclasses.MISSING or f.name in vars(cls), (cls.__name__, f.name)


# ---------------------------------------------------------------------------------------------
# (b) the driver reads declared members only
# ---------------------------------------------------------------------------------------------
PROCESS_MODULES = ("masked", "poisson", "se", "base")


def process_probes(source: str) -> list[str]:
    """Sites in ``source`` that probe a process instead of reading a declared member: any
    ``getattr`` / ``hasattr`` call, and ``isinstance`` whose object names a process or whose
    class comes from a process module. Returns 'line: text' strings."""
    tree = ast.parse(source)
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        fn = node.func.id
        if fn in ("getattr", "hasattr"):
            bad.append(f"{node.lineno}: {ast.unparse(node)}")
        elif fn == "isinstance" and len(node.args) == 2:
            obj, cls = (ast.unparse(a) for a in node.args)
            if "process" in obj or "pilot" in obj or any(f"{m}." in cls for m in PROCESS_MODULES):
                bad.append(f"{node.lineno}: {ast.unparse(node)}")
    return bad


# The probing sites of likelihood.py before the protocol declared them (main at daf7efc).
OLD_DRIVER = '''
def _pad(pad_BxL, x_BxL, process):
    if not isinstance(process, masked.MaskedProcess):
        raise NotImplementedError("padding")
def default_num_samples(process, target_BxL):
    two_stage = getattr(process, "needs_plan", False)
def nll(process, check_normalised, S, target, pilot_passes):
    if check_normalised and isinstance(process, masked.MaskedProcess):
        pass
    passes = S * process.passes_per_sample(target) + getattr(process, "extra_passes", lambda: 0)() + pilot_passes
    return dict(se_method=getattr(process, "se_method", "iid"))
def _min_samples(process) -> int:
    return int(getattr(process, "min_samples", DEFAULT_MIN_SAMPLES))
def _planned(process):
    if not getattr(process, "needs_plan", False):
        return process
def _vocab(denoiser, process, vocab_size):
    if process is not None and getattr(process, "vocab_size", None) is not None:
        return int(process.vocab_size)
def paired_nll(target, process):
    if target.ndim == 3 and (getattr(process, "needs_plan", False) or process.estimator == "stratified"):
        raise ValueError
def _paired(process, S, target, pilot_passes):
    return S * process.passes_per_sample(target) + getattr(process, "extra_passes", lambda: 0)() + pilot_passes // 2
def fine(rows_per_slice, num_samples):
    return isinstance(rows_per_slice, bool) or isinstance(num_samples, (int, np.integer))
'''


def test_the_probe_finder_flags_the_old_driver():
    sites = process_probes(OLD_DRIVER)
    assert len(sites) == 10, sites  # the 8 getattr and 2 isinstance sites of issue 25


def test_the_driver_probes_no_process():
    source = (ROOT / "infodiff" / "likelihood.py").read_text()
    assert process_probes(source) == []
    assert 'estimator == "' not in source and "estimator in (" not in source


# ---------------------------------------------------------------------------------------------
# (c) every Estimate carries its process's facts
# ---------------------------------------------------------------------------------------------
def _facts(est):
    return est.estimator, est.se_method, est.min_samples, est.infinite_variance


def _check_facts(est, proc):
    assert _facts(est) == (proc.estimator, proc.se_method, proc.min_samples, proc.infinite_variance)


@pytest.fixture(scope="module")
def counts():
    sc = P.CountScaling(5, low=0.0, high=5.0)
    orc = FiniteCountOracle(sc.scale(np.array([0, 1, 2, 5])), np.array([0.4, 0.3, 0.2, 0.1]))
    return orc, sc, sc.scale(np.array([[0], [1], [5]]))


def test_paired_poisson_estimates_carry_the_se_method(counts):
    """The drift of issue 25: _paired built its Estimates without se_method (the stratified
    sampler's strata_pairs SE became an iid one), and a Poisson pair failed on its missing
    vocab_size. The coupled pair shares the single estimate's draws (same chunks), so its
    first input gives the same values and SE."""
    orc, sc, x = counts
    proc = P.estimation_process(8, "stratified", scaling=sc)
    assert proc.se_method == "strata_pairs"
    one = np.ones(x.shape, bool)
    single = lk.nll(orc, x, jax.random.key(0), process=proc, num_samples=8)
    for coupled in (True, False):
        ea, eb = lk.paired_nll(orc, x, x[::-1], jax.random.key(0), target_a_BxL=one, target_b_BxL=one,
                               process=proc, num_samples=8, coupled=coupled)
        for e in (single, ea, eb):
            _check_facts(e, proc)
            assert e.forward_passes == 8
        if coupled:
            np.testing.assert_allclose(ea.samples, single.samples, rtol=1e-6)
            np.testing.assert_allclose(ea.stderr, single.stderr, rtol=1e-6)


class _PairsMasked(masked.MaskedProcess):
    """k_dce declaring another SE method and sample floor: what a ratio must carry through."""

    se_method = "strata_pairs"
    min_samples = 6


def test_ratio_and_paired_estimates_carry_every_process_fact():
    mk = oracles.random_markov(np.random.default_rng(12), "ACGT", order=2)
    x = mk.sample(np.random.default_rng(3), 2, length=8)
    proc = _PairsMasked(masked.MaskSpec(name="k_dce"), V)
    key = jax.random.key(1)
    for e in lk.paired_conditional_nll(mk, x[:, :4], x[:, 4:], x[::-1, 4:], key, process=proc, num_samples=4):
        _check_facts(e, proc)
    r = lk.log_ratio(mk, x[:, :4], x[:, 4:], x[::-1, 4:], key, process=proc, num_samples=4)
    assert (r.se_method, r.min_samples) == ("strata_pairs", 6) and r.few_samples
    _check_facts(lk.conditional_nll(mk, x[:, :4], x[:, 4:], key, process=proc, num_samples=4), proc)


def test_sedd_estimates_carry_the_process_facts():
    tab = oracles.random_tabular(np.random.default_rng(10), "ACGT", seq_len=L, num_seqs=16)
    x = tab.sample(np.random.default_rng(0), 2)
    proc = se.ScoreEntropyProcess(graph="absorb", vocab_size=V, lam_max=0.9)
    score = se.OracleScore(tab, "absorb")
    one = np.ones(x.shape, bool)
    single = lk.nll(score, x, jax.random.key(0), process=proc, num_samples=4)
    pair = lk.paired_nll(score, x, x[::-1], jax.random.key(0), target_a_BxL=one, target_b_BxL=one,
                         process=proc, num_samples=4)
    for e in (single,) + pair:
        _check_facts(e, proc)
        assert e.forward_passes == 4 + proc.extra_passes() == 5  # the absorbing prior's pass


@pytest.mark.parametrize("label", ["poisson/stratified"])
def test_padding_without_a_pad_token_is_one_line_naming_the_process(label, counts):
    proc = PROCESSES[label]
    x = counts[2] if proc.vocab_size is None else np.zeros((2, L), np.int32)
    with pytest.raises(NotImplementedError) as err:
        lk.nll(lambda *a: None, x, 0, process=proc, pad_BxL=np.zeros(np.shape(x), bool), num_samples=4)
    msg = str(err.value)
    assert "\n" not in msg and type(proc).__name__ in msg and "pad_BxL" in msg and proc.estimator in msg


def test_per_input_targets_refuses_differing_targets_for_stratified_laws():
    mk = oracles.random_markov(np.random.default_rng(12), "ACGT", order=2)
    x = mk.sample(np.random.default_rng(3), 2, length=6)
    ta = np.ones(x.shape, bool)
    tb = ta.copy()
    tb[:, 0] = False
    names = [n for n, law in masked.LAWS.items() if not law.per_input_targets]
    assert {"stratified", "neyman"} <= set(names)
    for name in names:
        assert not lk.masked_process(name, vocab_size=V).per_input_targets
        with pytest.raises(ValueError, match=f"the {name} estimator needs the same target positions"):
            lk.paired_nll(mk, x, x, 0, target_a_BxL=ta, target_b_BxL=tb, estimator=name, num_samples=4)


# ---------------------------------------------------------------------------------------------
# A process that declares only the required members runs through the driver on the defaults
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _UniformBits(base.Process):
    """-log p(x) = ln 2 nats per position of a uniform law on {0, 1}, estimated as
    2 ln 2 u per position with u ~ U(0, 1) (mean ln 2; the denoiser is not called)."""

    estimator: str = "toy_uniform_bits"
    denoiser_inputs: str = "unused"
    vocab_size: int = 2

    def draw_noise(self, key, target_RxL, sample_R=None):
        return jax.random.uniform(key, target_RxL.shape)

    def integrand(self, apply_fn, params, x_RxL, noise, target_RxL=None):
        return jnp.sum(jnp.where(target_RxL, 2.0 * jnp.log(2.0) * noise, 0.0), axis=-1)

    def passes_per_sample(self, target_BxL):
        return 1

    def validate(self, x):
        return np.asarray(x, np.int32)


def test_a_process_with_only_the_required_members_runs_on_the_defaults():
    proc = _UniformBits()
    x = np.zeros((3, 6), np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = lk.nll(lambda z, t: z, x, jax.random.key(0), process=proc, num_samples=256)
    truth = 6 * np.log(2.0)
    assert np.all(np.abs(est.mean - truth) < 4 * est.stderr), (est.mean, est.stderr)
    assert est.forward_passes == 256 and est.exact == {} and est.se_method == "iid"
    assert est.min_samples == base.DEFAULT_MIN_SAMPLES and not est.infinite_variance
    # the defaults refuse what the process did not declare
    target = np.ones(x.shape, bool)
    target[:, 0] = False
    with pytest.raises(NotImplementedError, match="_UniformBits .toy_uniform_bits. has no conditional"):
        lk.nll(lambda z, t: z, x, 0, process=proc, target_BxL=target, num_samples=4)
    with pytest.raises(NotImplementedError, match="padding"):
        lk.nll(lambda z, t: z, x, 0, process=proc, pad_BxL=~target, num_samples=4)
    assert lk.default_num_samples(proc, target) == lk.DEFAULT_PASSES
    assert isinstance(proc, base.Process) and not isinstance(types.SimpleNamespace(), base.Process)


# ---------------------------------------------------------------------------------------------
# Padding is generic over pad_id
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _PaddedBits(_UniformBits):
    """_UniformBits that declares pad token 2 and adds 1 nat per position holding it: the
    driver must place ``pad_id`` at exactly the pads."""

    pad_id: int = 2

    def integrand(self, apply_fn, params, x_RxL, noise, target_RxL=None):
        return super().integrand(apply_fn, params, x_RxL, noise, target_RxL) + jnp.sum(x_RxL == 2, axis=-1)

    def check_target(self, target_BxL):
        return None


def test_the_driver_puts_pad_id_at_the_pads():
    x = np.ones((2, 6), np.int32)
    pad = np.zeros(x.shape, bool)
    pad[0, -2:] = True
    pad[1, -1:] = True
    est = lk.nll(lambda z, t: z, x, jax.random.key(3), process=_PaddedBits(), pad_BxL=pad, num_samples=256)
    truth = (~pad).sum(1) * np.log(2.0) + pad.sum(1)  # the unpadded positions' ln 2 + 1 per pad
    assert np.all(np.abs(est.mean - truth) < 4 * est.stderr), ((est.mean - truth) / est.stderr)


@pytest.mark.parametrize("graph", ["absorb", "uniform"])
def test_sedd_pads_give_the_marginal_likelihood_of_the_rest(graph):
    """Pads (pad_id = V: MASK under the absorbing graph, pure noise under the uniform graph)
    through lk.nll: the estimate is -log p(x[:k]) of the unpadded positions, the oracle's exact
    marginal, within 4 SE."""
    tab = oracles.random_tabular(np.random.default_rng(10), "ACGT", seq_len=L, num_seqs=16)
    x = tab.sample(np.random.default_rng(4), 3)
    pad = np.zeros(x.shape, bool)
    pad[:, 3:] = True
    truth = -tab.log_marginal(np.where(pad, V, x))
    proc = se.ScoreEntropyProcess(graph=graph, vocab_size=V, lam_max=0.999)
    assert proc.pad_id == V
    est = lk.nll(se.OracleScore(tab, graph), x, jax.random.key(5), process=proc, pad_BxL=pad,
                 num_samples=proc.min_samples)
    assert np.all(np.abs(est.mean - truth) < 4 * est.stderr), ((est.mean - truth) / est.stderr)
