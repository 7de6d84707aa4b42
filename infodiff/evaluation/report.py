"""The report: one typed schema per report kind, a readable table, strict JSON on disk.

Schema (``version`` 2): the dataclasses below, one per kind (:class:`NetworkReport`,
:class:`OracleReport`, :class:`InputReport`), built from shared parts (:class:`Head`,
:class:`Provenance`, :class:`SEFields`) and row schemas (:class:`OracleRow`, :class:`InputRow`,
...). Each field carries a one-line description, its unit, whether it is required and how
report.txt shows it (``metadata``); report.json (``Schema.to_dict``), report.txt
(:func:`format_report`) and docs/report.md's key tables (:func:`docs_tables`,
``python scripts/report_docs.py``) are generated from them, and :func:`check_report` says
whether a report dict conforms. A new field is one :func:`key` in one class.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
import time
from typing import Callable, ClassVar

import numpy as np

from infodiff import files as files_lib
from infodiff import provenance
from infodiff.provenance import git_info
from infodiff.training import workdir as workdir_lib

__all__ = ["REPORT_VERSION", "COMMON_KEYS", "NETWORK_KEYS", "ORACLE_KEYS", "INPUT_KEYS", "ROW_KEYS", "TERMS", "env",
           "git_info", "oracle_row", "format_report", "table", "strict_json", "write_report", "exclusive", "Report",
           "ABSENT", "key", "Schema", "Head", "Provenance",
           "SEFields", "PerRowSE", "BOUNDS", "NetworkReport", "OracleReport", "InputReport", "OracleRow", "InputRow", "KINDS",
           "check_report", "docs_tables", "write_docs"]

REPORT_VERSION = 2
TERMS = ("diffusion", "prior", "recon", "total")
# An oracle row's SEs are flagged as miscalibrated when a test of calibration (coverage, bias)
# rejects at this level (two-sided): about 5 sigma, so that over the <= 20 rows of a report
# calibrated estimators are flagged by chance with probability about 4e-5.
SE_CHECK_P = 1e-6
SE_CHECK_EXACT_TOL = 1e-3  # an SE of 0 claims exactness: |estimate - exact| <= this x max(1, |exact|)
STDERR_BUDGET = 1024  # forward passes of an oracle row's `stderr_at_1024_forward_passes`

# What a likelihood number is: the values of the `bound` field of a network or input report and of
# an oracle row, {name: description}. The integral identities (I-MDCE / I-MDSE, arXiv 2510.24088;
# the Poisson NLL as an integral over the SNR, docs/poisson.md §2) give -log p exactly only with
# the exact denoiser; with a trained network the same estimators estimate its negative ELBO
# (docs/report.md, "What `nll` is"). Room for later values, e.g. "iw_orders" (importance-weighted
# over generation orders) and "interval".
BOUNDS = {
    "exact": "an unbiased Monte Carlo estimate of the exact value (-log p, or a log-ratio): the denoiser is the "
             "exact oracle, for which the integral identity holds with equality (the row's `bias` tests it)",
    "nelbo": "an unbiased estimate of the trained network's negative ELBO (NELBO), an upper bound on the network's "
             "own -log p; equal to it only for an exact denoiser",
    "nelbo_difference": "a log-ratio log p(a | prompt) - log p(b | prompt) estimated as NELBO(b) - NELBO(a): a "
                        "difference of two upper bounds, itself neither an upper nor a lower bound",
    "model_difference": "NELBO_a(x) - NELBO_b(x) of two trained runs on the same row (evaluate.py --compare): a "
                        "difference of two upper bounds, each on its own network's -log p, itself neither an upper nor "
                        "a lower bound",
}
# report.txt's name of each kind of number (the label of its row; before the comma: its short name).
BOUND_LABELS = {"exact": "NLL, exact (oracle denoiser)", "nelbo": "NELBO, upper bound on NLL",
                "nelbo_difference": "difference of two NELBOs, not a bound",
                "model_difference": "difference of two runs' NELBOs, not a bound"}
assert set(BOUND_LABELS) == set(BOUNDS)


def check_bound(bound: str) -> str:
    """``bound`` if it is a key of :data:`BOUNDS`; else ValueError naming the choices."""
    if bound not in BOUNDS:
        raise ValueError(f"bound={bound!r} is not one of {sorted(BOUNDS)} (report.BOUNDS)")
    return bound


def _bound_label(r) -> str:
    """report.txt's name of the report's number; an older report without ``bound``: "NLL"."""
    return BOUND_LABELS.get(r.get("bound"), "NLL")


def _bound_doc(*names: str) -> str:
    return "what the numbers are (\"What `nll` is\" above), a key of `report.BOUNDS`: " + "; ".join(
        f"`{n}`: {BOUNDS[n]}" for n in names)


def env() -> dict:
    """Versions, backend and time of this run."""
    import jax

    return {"jax": jax.__version__, "backend": jax.default_backend(), "devices": len(jax.devices()), "processes": jax.process_count(),
            "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def common(config, seed: int, t0: float, *, checkpoint: dict | None = None, data: dict | None = None) -> dict:
    """The keys every report ends with (``experiment``: the config's name; ``argv``: the command
    line; ``git``: :func:`git_info`; ``provenance``: :func:`infodiff.provenance.collect` with the
    ``checkpoint`` and ``data`` digests given, else, for a config with a ``data.path`` file, that
    file's SHA-256)."""
    path = "" if data is not None else str(config.get("data", {}).get("path", "") or "")  # read only when needed
    if path and os.path.isfile(path):
        from infodiff.data import text as text_data

        data = {"path": os.path.abspath(path), "sha256": text_data.sha256_file(path)}
    return {"experiment": str(config.get("experiment", "")), "seed": int(seed), "wall_time_s": time.time() - t0, "env": env(), "argv": list(sys.argv),
            "git": git_info(), "config": json.loads(config.to_json_best_effort()),
            "provenance": provenance.collect(checkpoint=checkpoint, data=data)}


def se_fields(est) -> dict:
    """How the SE of an Estimate was computed: ``se_method`` (a key of likelihood.SE_METHODS),
    ``se_note`` (what it means, and the Student-t scaling), ``exact``, the minimum samples of a
    calibrated per-item SE and whether this run had fewer."""
    from infodiff import likelihood as lk

    return {"se_method": est.se_method, "se_note": f"{lk.SE_METHODS[est.se_method]}; {lk.T_SCALING}",
            "exact": bool(est.is_exact), "min_samples": int(est.min_samples),
            "few_samples": bool(est.few_samples)}


def se_calibration(estimate: np.ndarray, truth: np.ndarray, stderr: np.ndarray, bias_z: float) -> dict:
    """Whether an oracle row's standard errors are shown by the exact values to be wrong.

    Tests (each two-sided at :data:`SE_CHECK_P`), on the items with SE > 0: (1) coverage: the
    count k of items with |estimate - exact| > 1.96 SE is Binomial(n, 0.05) when the per-item
    SEs are calibrated (they are Student-t scaled for this: ``likelihood.T_SCALING``); a k far
    above 0.05 n means the SEs are too small (the +- values under-state the error), far below
    that they are too large (conservative). Coverage is used rather than the mean z², whose
    variance is infinite for t-distributed z at the SE's few degrees of freedom (one item with a
    small sampled SE moves it arbitrarily). (2) bias: ``bias_z`` (the mean bias over its Monte
    Carlo SE) is N(0, 1) for an unbiased estimator with a calibrated SE. And on the items with
    SE = 0 (the estimator claims to be exact): |estimate - exact| <= :data:`SE_CHECK_EXACT_TOL`
    x max(1, |exact|). Returns ``{"miscalibrated", "direction" ('too_small' | 'too_large' |
    None), "why" (one sentence, or None), "items", "misses_95", "expected_misses_95",
    "coverage_p_value", "bias_p_value", "threshold_p"}`` (p-values None where not tested)."""
    from scipy import special

    err = np.asarray(estimate, np.float64) - np.asarray(truth, np.float64)
    se = np.asarray(stderr, np.float64)
    pos = se > 0
    n = int(pos.sum())
    out = {"miscalibrated": False, "direction": None, "why": None, "items": n, "misses_95": None,
           "expected_misses_95": 0.05 * n, "coverage_p_value": None, "bias_p_value": None,
           "threshold_p": SE_CHECK_P}
    whys = []
    if n:
        k = int(np.sum(np.abs(err[pos]) > 1.959963984540054 * se[pos]))
        p_hi = float(special.bdtrc(k - 1, n, 0.05)) if k > 0 else 1.0  # P(K >= k)
        p_lo = float(special.bdtr(k, n, 0.05))  # P(K <= k)
        p = min(1.0, 2.0 * min(p_hi, p_lo))
        out.update(misses_95=k, coverage_p_value=p)
        if p < SE_CHECK_P:
            small = k > 0.05 * n
            out["direction"] = "too_small" if small else "too_large"
            z2 = float(np.mean((err[pos] / se[pos]) ** 2))
            whys.append(f"{k} of {n} items lie outside ±1.96 SE (a calibrated SE: {0.05 * n:.0f} ± "
                        f"{math.sqrt(n * 0.0475):.0f}; p = {p:.1e}; mean z² {z2:.2f}): the SEs are "
                        + ("too small, the ± values under-state the error" if small else "too large (conservative)"))
    if math.isfinite(bias_z):
        pb = float(special.erfc(abs(bias_z) / math.sqrt(2.0)))
        out["bias_p_value"] = pb
        if pb < SE_CHECK_P:
            out["direction"] = out["direction"] or "too_small"
            whys.append(f"the mean bias is {bias_z:+.1f} of its SE (p = {pb:.1e}): biased, or the SE too small")
    if (~pos).any():
        t = np.asarray(truth, np.float64)[~pos]
        off = np.abs(err[~pos]) > SE_CHECK_EXACT_TOL * np.maximum(1.0, np.abs(t))
        if off.any():
            out["direction"] = out["direction"] or "too_small"
            k0 = int(off.sum())
            whys.append(f"{k0} item{'s' * (k0 != 1)} ha{'ve' if k0 != 1 else 's'} SE 0 (exact) but miss"
                        f"{'' if k0 != 1 else 'es'} the exact value by up to "
                        f"{float(np.max(np.abs(err[~pos]))):.4g} nats")
    if whys:
        out.update(miscalibrated=True, why="; ".join(whys))
    return SECalibration(**out).to_dict()




def oracle_row(est, truth: np.ndarray) -> dict:
    """One estimator against the exact values (an :class:`OracleRow`): bias and its SE,
    per-sample spread (nats), and the calibration of the per-item SEs: ``coverage_95`` =
    fraction of items with |estimate - exact| <= 1.96 SE, ``mean_z2`` = mean of ((estimate -
    exact) / SE)^2 (~1 when calibrated; NaN when an SE is 0, e.g. exact). ``per_sample_variance``
    is S x raw SE^2 averaged over items: the variance per draw of the estimator as its
    ``se_method`` measures it (for iid draws the sample variance; for strata it excludes the
    between-strata spread that stratification removes). ``bound`` is ``'exact'`` (:data:`BOUNDS`):
    the oracle's denoiser is exact."""
    bias = est.mean - truth
    bias_se = est.split_mean()["stderr_mc"]
    var_sample = float(np.mean(est.stderr_raw**2)) * est.num_samples
    pos = bool(np.all(est.stderr > 0))
    z = bias / est.stderr if pos else None
    fp_per_sample = est.forward_passes / est.num_samples if est.num_samples else 0.0
    return OracleRow(
        estimator=est.estimator,
        bound="exact",
        mean_estimate=float(est.mean.mean()),
        mean_exact=float(truth.mean()),
        bias=float(bias.mean()),
        bias_stderr=bias_se,
        # z is undefined (NaN -> null in report.json) when the estimator is exact (SE = 0).
        bias_z=float(bias.mean() / bias_se) if bias_se > 0 else float("nan"),
        max_abs_z_per_sequence=float(np.max(np.abs(z))) if pos else float("nan"),
        coverage_95=float(np.mean(np.abs(z) <= 1.96)) if pos else float("nan"),
        mean_z2=float(np.mean(z**2)) if pos else float("nan"),
        se_calibration=se_calibration(est.mean, truth, est.stderr,
                                      float(bias.mean() / bias_se) if bias_se > 0 else float("nan")),
        per_sample_std=math.sqrt(var_sample),
        per_sample_variance=var_sample,
        variance_per_forward_pass=var_sample * fp_per_sample,
        stderr_at_1024_forward_passes=math.sqrt(var_sample * fp_per_sample / STDERR_BUDGET),
        terms={k: float(v.mean()) for k, v in est.terms.items()},
        num_samples=est.num_samples,
        forward_passes=est.forward_passes,
        infinite_variance=est.infinite_variance,
        **se_fields(est),
    ).to_dict()


# report.txt's width: every line fits a 100-column terminal (format_report).
WIDTH = 100


def table(headers, rows, width: int = WIDTH) -> str:
    """Right-aligned plain-text table, at most ``width`` characters a line: a table wider than
    that is cut into column groups printed one under another, each led by the first column
    (the row's name or id)."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    groups, cur = [], []
    for i in range(1, len(headers)):
        if cur and widths[0] + sum(widths[j] + 2 for j in cur + [i]) > width:
            groups.append(cur)
            cur = []
        cur.append(i)
    groups = [[0] + g for g in groups + [cur]] if len(headers) > 1 else [[0]]
    blocks = []
    for cols in groups:
        out = ["  ".join(str(headers[j]).rjust(widths[j]) for j in cols), "  ".join("-" * widths[j] for j in cols)]
        out += ["  ".join(str(r[j]).rjust(widths[j]) for j in cols) for r in rows]
        blocks.append("\n".join(out))
    return "\n\n".join(blocks)


def _key_table(rows, width: int = WIDTH) -> list[str]:
    """report.txt's table of (label, value) rows, labels right-aligned, values left-aligned and
    wrapped to the rest of ``width`` (continuation lines under the value, two spaces in). Where
    the labels leave fewer than 30 columns, a value that does not fit is shown under the table
    instead (``label:`` and the value wrapped to ``width``), its row saying ``(below)``."""
    label_w = max([len("quantity"), *(len(str(label)) for label, _ in rows)])
    room = width - label_w - 2
    values = [str(v) for _, v in rows]
    out = ["quantity".rjust(label_w) + "  value",
           "-" * label_w + "  " + "-" * max(5, min(room, max([0, *(len(v) for v in values)])))]
    below = []
    for (label, _), value in zip(rows, values):
        if len(value) <= room:
            pieces = [value]
        elif room >= 30:
            pieces = _wrap(value, room)
        else:
            pieces = ["(below)"]
            below += ["", f"{label}:", *_wrap(value, width, "  ")]
        out.append(str(label).rjust(label_w) + "  " + pieces[0])
        out += [" " * (label_w + 2) + p for p in pieces[1:]]
    return [*out, *below]


def _wrap(line: str, width: int = WIDTH, indent: str = "") -> list[str]:
    """``line`` (after ``indent``) wrapped to ``width`` columns; continuation lines indented two
    more spaces; a word longer than a line (a path) is cut."""
    import textwrap

    return textwrap.wrap(line, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, drop_whitespace=True) or [""]


def _fit(text: str, width: int = WIDTH) -> str:
    """Every line of ``text`` at most ``width`` characters (longer ones wrapped, :func:`_wrap`)."""
    out = []
    for line in text.split("\n"):
        out += [line] if len(line) <= width else _wrap(line.lstrip(), width, " " * (len(line) - len(line.lstrip())))
    return "\n".join(out)


def worse_than_uniform(nll: float, stderr: float, uniform_nll: float | None, unit: str) -> list[str]:
    """The report's warnings about its NLL: not finite; a standard error that is not finite;
    more than 1.96 SE above the uniform model's NLL (``uniform_nll``, the same unit), or more than
    10x it whatever the SE (a heavy-tailed estimate's SE can be as large as the estimate)."""
    if not math.isfinite(nll):
        return [f"the NLL {nll} is not finite: the model is broken; do not report it"]
    out = [] if stderr is not None and math.isfinite(stderr) else [
        f"the standard error {stderr} is not finite (too few items or samples, or a diverging "
        "estimate): the ± is unknown; raise eval.num_samples / eval.max_sequences"]
    if uniform_nll is not None and (nll - 1.96 * (stderr or 0.0) > uniform_nll or nll > 10 * uniform_nll):
        out.append(f"the NLL {nll:.6g} ± {stderr:.3g} {unit} is above the uniform model's {uniform_nll:.6g}: "
                   "the model is worse than guessing uniformly (under-trained, diverged, or a broken "
                   "checkpoint); do not report it as a result, check the training curves")
    return out


# ---------------------------------------------------------------------------------------------
# The schema: one dataclass per report kind, built from shared parts. report.json is
# Schema(...).to_dict(), report.txt is format_report(report) and docs/report.md's key tables are
# docs_tables(): all three read the fields' metadata below, so they cannot drift apart.
# ---------------------------------------------------------------------------------------------
class _Absent:
    """The value of an optional field a report does not have: its key is left out of report.json."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


@dataclasses.dataclass(frozen=True)
class Rows:
    """report.txt: rows of the key table, ``render(report) -> [(label, value), ...]``."""

    render: Callable


@dataclasses.dataclass(frozen=True)
class Lines:
    """report.txt: lines under the key table, ``render(report) -> [str, ...]``."""

    render: Callable


@dataclasses.dataclass(frozen=True)
class Shown:
    """report.txt: shown in the row or lines of the field ``key`` (``"title"``: in the title)."""

    key: str


def row(label, fmt: Callable) -> Rows:
    """One row of the key table: ``label`` (str, or callable(report) -> str), ``fmt(report)``."""
    return Rows(lambda r: [(label(r) if callable(label) else label, fmt(r))])


def key(doc: str, *, unit: str = "", text: Rows | Lines | Shown | None = None, required: bool = True,
        rows: Callable | None = None, default=dataclasses.MISSING, init: bool = True):
    """A report field: ``doc`` (one line, docs/report.md), ``unit``, ``text`` (how report.txt
    shows it; None: named on the text's last line, ``also in report.json: ...``), ``required``
    (an optional field not set is left out of report.json), ``rows`` (value -> [(schema, dict),
    ...]: the rows it holds, checked against their schema by :func:`check_report`)."""
    if default is dataclasses.MISSING and not required:
        default = ABSENT
    return dataclasses.field(default=default, init=init, metadata={
        "doc": doc, "unit": unit, "text": text, "required": required, "rows": rows})


def _each(schema) -> Callable:
    return lambda v: [(schema, x) for x in v]


@dataclasses.dataclass(kw_only=True)
class Schema:
    """Base of every report part and row. ``TITLE``: report.txt's first line (a report kind);
    ``TEXT``: {field: Rows | Lines | Shown | None}, how this kind shows a shared part's field
    (overrides the field's own ``text``)."""

    TITLE: ClassVar[str] = ""
    TEXT: ClassVar[dict] = {}

    def __post_init__(self):
        if "bound" in self.__dataclass_fields__:  # a report or row that says what its numbers are
            check_bound(self.bound)

    @classmethod
    def keys(cls) -> list[dataclasses.Field]:
        """The fields in report order: :class:`Head`, the class's own fields, the shared parts
        it includes, :class:`Provenance`."""
        fs = dataclasses.fields(cls)
        head = [f for f in fs if issubclass(cls, Head) and f.name in Head.__dataclass_fields__]
        tail = [f for f in fs if issubclass(cls, Provenance) and f.name in Provenance.__dataclass_fields__]
        own = [f for f in fs if f.name in cls.__dict__.get("__annotations__", {}) and f not in head + tail]
        return head + own + [f for f in fs if f not in head + own + tail] + tail

    @classmethod
    def text(cls, f: dataclasses.Field):
        """How report.txt shows field ``f`` (:class:`Rows`, :class:`Lines`, :class:`Shown` or None)."""
        return cls.TEXT.get(f.name, f.metadata["text"])

    def to_dict(self) -> dict:
        """The report (or row) as report.json holds it: fields in :meth:`keys` order, optional
        fields not set left out."""
        return {f.name: getattr(self, f.name) for f in self.keys() if getattr(self, f.name) is not ABSENT}


# -- shared parts -----------------------------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class Head(Schema):
    """The first keys of every report; ``KIND`` names the report kind."""

    KIND: ClassVar[str] = ""
    version: int = key("the schema version, `2`", default=REPORT_VERSION, init=False, text=Shown("title"))
    kind: str = key("`network` (a trained run on a split, `eval.mode = \"network\"`), `oracle` (estimators with an "
                    "exact denoiser against exact values, `eval.mode = \"oracle\"`), `input` (a user's file scored "
                    "with a trained run, `eval.input`) or `compare` (a user's file scored with two runs, "
                    "`evaluate.py --compare`)", default="", init=False, text=Shown("title"))
    process: dict = key("`name` (`masked`, `sedd`, `poisson`) and its settings. Network and input mode: masked "
                        "`schedule`, `eps`, `objective`; SEDD `graph`, `score_param`, `lambda_sampling`, `lam_max`; "
                        "Poisson `sampler` (the log-SNR law of the estimate), `proposal` (loc, scale, clip), "
                        "`high_snr_guard`, `alpha_lo`, `alpha_top`, `recon_included`. Oracle mode: masked and SEDD "
                        "`schedule`, `eps` (each row names its estimator); Poisson `sampler`, `proposal`, "
                        "`se_method`, `channel_defensive`",
                        text=row("process", lambda r: ", ".join(f"{k} {v}" for k, v in r["process"].items())))
    units: dict = key("`item` (`sequence`, `example` or `row`), `nll` (e.g. `nats per sequence`; units only: what "
                      "the number is says `bound`); network and input mode add `bits` (`bits per character`, `bits per "
                      "byte` for byte runs, `bits per dimension`); network mode adds "
                      "`tokens_per_item` (L or D, the divisor of `bits`)", text=Shown("title"))

    def __post_init__(self):
        self.kind = self.KIND
        super().__post_init__()


@dataclasses.dataclass(kw_only=True)
class Provenance(Schema):
    """The last keys of every report: its figures and how it was made (:func:`common`)."""

    plots: list = key("paths of the figures written with the report (may be empty). Network mode: the task's "
                      "(Poisson: `samples.png`, generated samples) and `training_curves.png`: training loss (mean of "
                      "each log window) and validation loss (EMA parameters) in `units.nll` and `units.bits` against "
                      "step and wall-clock time (a resumed run's segments joined, each resume a dotted line), drawn "
                      "from `metrics.jsonl` again only when it changed. Oracle mode: `estimates.png`, each "
                      "estimator's mean estimate minus the exact mean ± 2 SE per section, exact rows as squares. "
                      "Input mode: `rows.png` (histogram of bits per character and NELBO ± 2 SE per row; ratios: "
                      "coupled and decoupled ± 2 SE per row and the SE ratio). Compare mode: `rows.png` (each row's difference ± 2 "
                      "paired SE, the unpaired ± 2 SE beside it, and the SE ratios)",
                      text=Lines(lambda r: [f"plot: {p}" for p in r["plots"]]))
    experiment: str = key("the config's `experiment` name")
    seed: int = key("the evaluation seed (`eval.seed`)")
    wall_time_s: float = key("seconds from the start of the evaluation to the report", unit="s",
                             text=row("wall time", lambda r: f"{r['wall_time_s']:.1f} s"))
    env: dict = key("`jax`, `backend`, `devices`, `processes`, `python`, `time` of the run")
    argv: list = key("the command line")
    git: dict | None = key("`{\"revision\", \"dirty\"}` of the infodiff git checkout (null outside one)")
    config: dict = key("the resolved config")
    provenance: dict = key("what made the report (infodiff/provenance.py): `packages` (versions of jax, jaxlib, flax, "
                           "optax, orbax-checkpoint, numpy, scipy, ml-collections, infodiff), `python`, `host`, "
                           "`devices` (`platform`, `kind`, `count`), `processes`, `checkpoint` (`step`, "
                           "`state_sha256`: the SHA-256 of its state's arrays written at save; null in oracle mode and for an "
                           "external denoiser; `--compare`: `{a, b}`), "
                           "`data` (the split's `sha256` or the input or table file's; null for generated data), "
                           "`argv`, `git` (`revision`, `dirty`; 'not a git checkout' when installed)")


def _network_se(r) -> str:
    return (r["se_method"] + (" (exact: every term enumerated)" if r["exact"] else "")
            + (f"; per-{r['units']['item']} SEs rest on fewer than {r['min_samples']} samples (flagged; the split "
               "SE pools them)" if r["few_samples_per_item"] else ""))


def _input_se(r) -> str:
    return r["se_method"] + ("" if r["infinite_variance"] or not r["few_samples"] else
                             f"; per-row SEs rest on fewer than {r['min_samples']} samples")


@dataclasses.dataclass(kw_only=True)
class SEFields(Schema):
    """How the standard errors were computed (:func:`se_fields`)."""

    se_method: str = key("how each item's SE is computed: a key of `likelihood.SE_METHODS` (`iid`: sample SD / √S; "
                         "`strata_pairs`: samples 2h, 2h + 1 are two draws of stratum h, SE = "
                         "sqrt(Σ_h (f_2h − f_2h+1)²)/S, the Poisson default, docs/poisson.md §3.5; `exact`: SE 0)")
    se_note: str = key("what `se_method` means, with the Student-t scaling of every SE "
                       "(docs/discrete_diffusion.md §6.10)")
    exact: bool = key("true when nothing was left to Monte Carlo (e.g. `neyman` enumerated every mask subset): "
                      "SE 0", text=Shown("se_method"))
    min_samples: int = key("the fewest samples at which the estimator's per-item SE was measured to be calibrated "
                           "(`tests/test_calibration.py`)", text=Shown("se_method"))


@dataclasses.dataclass(kw_only=True)
class PerRowSE(SEFields):
    """:class:`SEFields` of rows (an oracle row, an input report's rows)."""

    few_samples: bool = key("whether this run used fewer than `min_samples` samples (the per-item SEs are flagged)",
                            text=Shown("se_method"))


# -- network ---------------------------------------------------------------------------------------
def _data_row(r) -> str:
    d, u = r["data"], r["units"]
    return (f"{d['name']} / {d['split']}: {d['num_items']} of {d['total_items']} {u['item']}s"
            + (f" x {d['item_size']}" if d.get("item_size") else ""))


def _samples_lines(r) -> list[str]:
    if not (r["samples"] and isinstance(r["samples"][0], str)):
        return []
    return ["", f"samples ({r['sampler']}, {r['sample_steps']} steps):", *(f"  | {s}" for s in r["samples"])]


def _notes(prefix: str, name: str) -> Lines:
    """Lines ``prefix: item`` for each item of the list field ``name``."""
    return Lines(lambda r: [f"{prefix}: {n}" for n in r[name]])


_plot_notes_doc = ("why a figure was not drawn (e.g. `training_curves.png not drawn: W/metrics.jsonl has no "
                   "validation records ...`: no `metrics.jsonl`, no validation record, an unwritable workdir); the "
                   "evaluation is not affected. Empty otherwise")
_estimator_text = row("estimator", lambda r: r["estimator"] + (
    " (INFINITE VARIANCE: SE unreliable)" if r["infinite_variance"] else ""))


def _order_rows(name: str, label: str) -> Rows:
    """report.txt rows of an ``interval`` / ``sampler_likelihood`` block (infodiff/evaluation/intervals.py)."""
    def render(r):
        b = r[name]
        s, bits, per = b["settings"], b["bits"], "item" if "items" in b else "row"
        n = b.get("items", b.get("rows"))
        if not s["pilot_orders"]:  # a deterministic sampler: one path, exact
            rows = [(label, f"{s['sampler']}, {s['tokens_per_step']} token(s) per step, {n} {per}s, exact (one path)"),
                    (f"  -log p (nats / {per})", f"{b['iw']:.4f}  bits/char {bits['iw']:.5f}")]
        else:
            how = (f"{s['sampler']}, {s['orders']} orders + {s['pilot_orders']} pilot ({s['proposal']}), "
                   f"{n} {per}s, {b['exact_rows']} exact")
            rows = [(label, how),
                    (f"  [lower, upper] at {100 * s['level']:g}% (nats / {per})",
                     f"[{b['lower']:.4f}, {b['upper']:.4f}]  bits/char [{bits['lower']:.5f}, {bits['upper']:.5f}]"),
                    ("  IW (upper) / TUBE (lower)", f"{b['iw']:.4f} ± {b['iw_stderr']:.4f} / "
                                                    f"{b['tube']:.4f} ± {b['tube_stderr']:.4f}")]
        if "nelbo" in b:
            rows.append(("  NELBO, same items (MC SE)", f"{b['nelbo']:.4f} ± {b['nelbo_stderr']:.4f}  bits/char "
                                                         f"{bits['nelbo']:.5f}"))
        if not s["pilot_orders"]:
            rows.append(("  cost", f"{b['forward_passes']} passes, {b['wall_time_s']:.1f} s"))
            return rows
        k = b["pareto_k_max"]
        rows.append(("  ESS median / max k-hat (> 0.7)", f"{_fmt_opt(b['ess_median'], '.2f')} / "
                     f"{_fmt_opt(k, '.2f')} ({b['rows_pareto_k_above_0_7']} rows); {b['forward_passes']} passes, "
                     f"{b['wall_time_s']:.1f} s"))
        if b.get("rows_lower_clipped"):
            rows.append(("  WARNING", f"the lower end of {b['rows_lower_clipped']} {per}s fell below 0 and was clipped: "
                         "the TUBE side's SE is large there (too few orders for these weights; raise "
                         "eval.interval_orders)"))
        if b["rows_pareto_k_above_0_7"]:
            rows.append(("  WARNING", f"k-hat > 0.7 for {b['rows_pareto_k_above_0_7']} {per}s: the weights' variance "
                         "is effectively infinite there, so their SEs and this interval are not trustworthy (PSIS)"))
        return rows

    return Rows(render)


_ORDER_BLOCK_DOC = (
    "`settings` (`what` the bracketed quantity is, `sampler` (`any_order` or the sampler), `orders` K, "
    "`pilot_orders`, `proposal`, `level`, `temperature`, `time_conditioned`; samplers: `tokens_per_step`, "
    "`num_steps`), `{n}`, and as a mean per {per} (nats): `lower`, `upper` (the interval at `level`, each side at "
    "(1 − level)/2), `iw` ± `iw_stderr` (importance-weighted orders: upper side), `tube` ± `tube_stderr` (TUBE: "
    "lower side){nelbo}; `bits`: the same keys in bits per character; `exact_rows` (rows computed by the exact "
    "subset recursion), `rows_lower_clipped` (rows whose lower end fell below 0 and was clipped: a −log p is ≥ 0), "
    "`ess_median` (Kish), `pareto_k_max` (null for K < 25) and `rows_pareto_k_above_0_7` (their "
    "SEs are not trustworthy), `forward_passes`, `wall_time_s`. infodiff/orders.py")


@dataclasses.dataclass(kw_only=True)
class NetworkReport(Provenance, SEFields, Head):
    """A trained run evaluated on a split (``eval.mode = "network"``, ``run.evaluate_network``);
    the standard-error convention is docs/report.md's."""

    KIND: ClassVar[str] = "network"
    TITLE: ClassVar[str] = "infodiff likelihood report"
    TEXT: ClassVar[dict] = {"se_method": row("SE method", _network_se)}
    workdir: str = key("the run's directory")
    checkpoint_step: int = key("the step of the checkpoint evaluated",
                               text=row("checkpoint", lambda r: f"step {r['checkpoint_step']} ({r['params']} params)"))
    params: str = key("`ema` or `raw` parameters (`eval.use_ema`)", text=Shown("checkpoint_step"))
    data: dict = key("`name`, `split`, `checksum` (sha256 of the split), `item_size` (L or D), `num_items` evaluated, "
                     "`total_items` in the split; text adds `unigram_entropy_bits_per_char` of the training split, "
                     "counts add `event_shape`, `max_count`, `scaling`", text=row("data", _data_row))
    estimator: str = key("the estimator's name (`k_dce`, `imdse_absorb:defensive`, `poisson_logistic`, ...)",
                         text=_estimator_text)
    infinite_variance: bool = key("true when the estimator's variance is infinite and the SE is not trustworthy",
                                  text=Shown("estimator"))
    num_samples_per_item: int = key("Monte Carlo samples per item", text=row(
        lambda r: "MC samples / " + r["units"]["item"], lambda r: r["num_samples_per_item"]))
    forward_passes: int = key("total denoiser evaluations", text=row("forward passes", lambda r: r["forward_passes"]))
    nll: float = key("mean over items of the estimate of −log p(item); what it is: `bound`", unit="units.nll",
                     text=row(lambda r: f"{_bound_label(r)} ({r['units']['nll']})",
                              lambda r: f"{r['nll']:.4f} ± {r['nll_stderr']:.4f}  [{r['stderr_kind']}]"))
    bound: str = key(_bound_doc("nelbo"), text=Shown("nll"))
    nll_stderr: float = key("the standard error of `nll` (one standard-error convention, below)", unit="units.nll",
                            text=Shown("nll"))
    stderr_kind: str = key("which standard error `nll_stderr` is (`mc ...`: a whole split; `data+mc ...`: a subset)",
                           text=Shown("nll"))
    bits: float = key("`nll` / (`units.tokens_per_item` · ln 2)", unit="units.bits",
                      text=row(lambda r: f"{r['units']['bits']} ({_bound_label(r).split(',')[0]})", lambda r: f"{r['bits']:.5f} ± {r['bits_stderr']:.5f}"))
    bits_stderr: float = key("`nll_stderr` / (`units.tokens_per_item` · ln 2)", unit="units.bits", text=Shown("bits"))
    terms: dict = key("`diffusion` (the Monte Carlo integral), `prior`, `recon` (exact terms; 0 where the process has "
                      "none) and `total` (= `nll`), mean over items", unit="nats",
                      text=row("terms (nats)", lambda r: ", ".join(
                          f"{k} {v:.6g}" for k, v in r["terms"].items() if k != "total")))
    stderr_mc: float = key("the Monte Carlo standard error, always reported", unit="units.nll", text=row(
        "SE: mc / data+mc", lambda r: f"{r['stderr_mc']:.4f} / {r['stderr_data_and_mc']:.4f}"))
    stderr_data_and_mc: float = key("the data + Monte Carlo standard error, always reported", unit="units.nll",
                                    text=Shown("stderr_mc"))
    per_sample_std: float = key("root mean square over items of the standard deviation of one Monte Carlo sample",
                                unit="units.nll")
    few_samples_per_item: bool = key("whether this run used fewer than `min_samples` samples per item (the split SE "
                                     "pools the items and stays valid)", text=Shown("se_method"))
    nll_wall_time_s: float = key("seconds spent in the Monte Carlo estimate", unit="s")
    extras: dict = key("process- and data-specific numbers, e.g. for synthetic counts "
                       "`exact_entropy_nats_per_example`, `gap_paired_nats` ± `gap_paired_stderr` (model NELBO − exact "
                       "−log p on the same items), `wasserstein1` and its `w1_noise_floor`",
                       text=Rows(lambda r: [(k.replace("_", " "), f"{v:.5g}" if isinstance(v, float) else v)
                                            for k, v in r["extras"].items() if isinstance(v, (int, float, str))]))
    uniform_nll: float | None = key("the NLL of the uniform distribution over the data's support (text: `L ln V`; "
                                    "counts: `D ln(K + 1)`)", unit="units.nll")
    samples: list = key("`eval.num_generate` generated items (text: strings; counts: the first 16 arrays)",
                        text=Lines(_samples_lines))
    sampler: str | None = key("the generator that made `samples` (not the log-SNR law of `process.sampler`)",
                              text=Shown("samples"))
    sample_steps: int = key("the generator's steps", text=Shown("samples"))
    interval: dict = key(
        "with `eval.interval` only (masked runs): an interval for the trained network's own −log p (the mixture "
        "over generation orders, which `nll`, a NELBO, bounds from above) on the same items. "
        + _ORDER_BLOCK_DOC.format(n="items", per="item", nelbo=", `nelbo` ± `nelbo_stderr` (`nll` of the same items, "
                                  "Monte Carlo SE)"), unit="units.nll", required=False,
        text=_order_rows("interval", "NLL interval (any order)"))
    sampler_likelihood: dict = key(
        "with `eval.sampler_likelihood` only (masked runs): −log p(x) of that unmasking sampler, the same keys as "
        "`interval` (a deterministic policy: exact, `lower` = `upper`)", unit="units.nll", required=False,
        text=_order_rows("sampler_likelihood", "sampler likelihood"))
    plot_notes: list = key(_plot_notes_doc, text=_notes("note", "plot_notes"))
    warnings: list = key("printed as `WARNING:` lines: an NLL or SE that is not finite, an NLL more than 1.96 SE "
                         "above `uniform_nll` or more than 10x it whatever the SE (under-trained, diverged, or a broken "
                         "checkpoint). Empty otherwise",
                         text=_notes("WARNING", "warnings"))


# -- oracle ----------------------------------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class SECalibration(Schema):
    """Whether the exact values refute an oracle row's SEs (:func:`se_calibration`)."""

    miscalibrated: bool = key("true when a test below rejects at `threshold_p`")
    direction: str | None = key("`too_small`, `too_large` or null")
    why: str | None = key("one sentence, or null")
    items: int = key("items with SE > 0 (the coverage test's)")
    misses_95: int | None = key("items outside ±1.96 SE")
    expected_misses_95: float = key("0.05 × `items`")
    coverage_p_value: float | None = key("two-sided binomial test of `misses_95` against Binomial(items, 0.05)")
    bias_p_value: float | None = key("two-sided, of the row's `bias_z` against N(0, 1)")
    threshold_p: float = key("1e-6: about 5 sigma, so a calibrated estimator is flagged by chance about once in "
                             "25,000 reports of 20 rows")


@dataclasses.dataclass(kw_only=True)
class OracleRow(PerRowSE):
    """One estimator against the exact values (:func:`oracle_row`); values in nats per item,
    response or ratio."""

    estimator: str = key("the estimator's name (`t_dce`, `imdse_absorb:defensive`, ...)")
    bound: str = key(_bound_doc("exact"))
    mean_estimate: float = key("mean over items of the estimate", unit="nats")
    mean_exact: float = key("mean over items of the exact value", unit="nats")
    bias: float = key("`mean_estimate` − `mean_exact`", unit="nats")
    bias_stderr: float = key("the Monte Carlo SE of `bias`", unit="nats")
    bias_z: float | None = key("`bias` / `bias_stderr` (null when the SE is 0)")
    max_abs_z_per_sequence: float | None = key("the largest |estimate − exact| / SE over items (null when an SE is 0)")
    coverage_95: float | None = key("fraction of items with |estimate − exact| ≤ 1.96 SE: 0.95 when calibrated (null "
                                    "when an SE is 0)")
    mean_z2: float | None = key("mean of ((estimate − exact)/SE)²: ≈ 1 when calibrated (null when an SE is 0)")
    se_calibration: dict = key("whether the exact values refute the SEs (a row marked `(SE MISCALIBRATED)` in "
                               "report.txt, with a `warning:` line): the keys of the table `se_calibration`",
                               rows=lambda v: [(SECalibration, v)])
    per_sample_std: float = key("sqrt(`per_sample_variance`)", unit="nats")
    per_sample_variance: float = key("S × SE² (unscaled) averaged over items: the variance per draw as the SE method "
                                     "measures it (strata: without the spread between strata)", unit="nats²")
    variance_per_forward_pass: float = key("`per_sample_variance` × forward passes per sample: the variance at a "
                                           "budget of one pass, the fair comparison", unit="nats²")
    stderr_at_1024_forward_passes: float = key("the SE per item at 1024 forward passes", unit="nats")
    terms: dict = key("`diffusion`, `prior`, `recon`, `total`, mean over items", unit="nats")
    num_samples: int = key("Monte Carlo samples per item")
    forward_passes: int = key("denoiser evaluations per item")
    infinite_variance: bool = key("true when the estimator's variance is infinite and its SE is not trustworthy")


@dataclasses.dataclass(kw_only=True)
class RatioPair(Schema):
    """One estimator's log-ratio rows, coupled and decoupled."""

    coupled: dict = key("an oracle row: shared noise for y and y' (Eq. 18)", rows=lambda v: [(OracleRow, v)])
    decoupled: dict = key("an oracle row: independent noise", rows=lambda v: [(OracleRow, v)])
    estimator: str = key("the estimator's name")
    variance_ratio_decoupled_over_coupled: float | None = key("per-sample variance decoupled / coupled (null when "
                                                              "both are 0)")


@dataclasses.dataclass(kw_only=True)
class SamplerCheck(Schema):
    """Generated samples against the true law (an oracle case's ``samplers()``)."""

    steps: list = key("the step counts checked")
    tv: dict = key("{sampler: total variation to the true law per step count}")
    w1: dict = key("counts: {sampler: Wasserstein-1 distance per step count}", required=False)
    num_generate: int = key("samples per check")
    tv_of_exact_sample: float = key("the TV of an exact sample of that size (the Monte Carlo floor)")


@dataclasses.dataclass(kw_only=True)
class OracleResults(Schema):
    """An oracle report's ``results``: rows per quantity."""

    unconditional: list = key("one row per estimator for −log p(x)", rows=_each(OracleRow))
    conditional: list = key("one row per estimator for −log p(y | x) (empty without a prompt)", rows=_each(OracleRow))
    ratio: list = key("per estimator: log p(y | x) − log p(y' | x), y' ~ p(· | x)", rows=_each(RatioPair))
    samplers: list = key("per check", rows=_each(SamplerCheck))


def _rows_table(items) -> str:
    headers = ["estimator", "estimate", "exact", "bias ± SE", "z", "sd/sample", "var/fwd", "SE@1024",
               "SE method", "cover95", "mean z²"]
    flagged = [x for x in items if (x.get("se_calibration") or {}).get("miscalibrated")]
    rows = [[x["estimator"] + (" (inf. var.)" if x["infinite_variance"] else "")
             + (" (exact)" if x["exact"] else "") + (" (few samples)" if x["few_samples"] else "")
             + (" (SE MISCALIBRATED)" if any(x is f for f in flagged) else ""),
             f"{x['mean_estimate']:.4f}", f"{x['mean_exact']:.4f}",
             f"{x['bias']:+.4f} ± {x['bias_stderr']:.4f}", _fmt_opt(x["bias_z"], "+.2f"),
             f"{x['per_sample_std']:.3f}", f"{x['variance_per_forward_pass']:.3f}",
             f"{x['stderr_at_1024_forward_passes']:.4f}", x["se_method"],
             _fmt_opt(x["coverage_95"], ".3f"), _fmt_opt(x["mean_z2"], ".2f")] for x in items]
    return table(headers, rows) + "".join(f"\nwarning: {x['estimator']}: SE miscalibrated: {x['se_calibration']['why']}"
                                          for x in flagged)


def _fmt_opt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _rows_bound(items) -> str:
    """What a section's estimates are (its rows' ``bound``; "" for rows without one)."""
    names = list(dict.fromkeys(x["bound"] for x in items if "bound" in x))
    return "".join(f"; {BOUND_LABELS.get(n, n)}" for n in names)


def _results_lines(r) -> list[str]:
    u, res = r["units"], r["results"]
    parts = ["", f"-log p(x), {u['nll']}{_rows_bound(res['unconditional'])}", _rows_table(res["unconditional"])]
    if res["conditional"]:
        parts += ["", f"-log p(y | x), nats per response{_rows_bound(res['conditional'])}",
                  _rows_table(res["conditional"])]
    if res["ratio"]:
        items = [dict(pair[kind], estimator=f"{pair['estimator']}:{kind}")
                 for pair in res["ratio"] for kind in ("coupled", "decoupled")]
        parts += ["", f"log p(y | x) - log p(y' | x), nats{_rows_bound(items)}", _rows_table(items),
                  "variance ratio decoupled / coupled: " + ", ".join(
                      f"{p['estimator']} {p['variance_ratio_decoupled_over_coupled']:.1f}x" for p in res["ratio"])]
    for s in res["samplers"]:
        rows = [[name, *[f"{v:.4f}" for v in vals]] for name, vals in s["tv"].items()]
        parts += ["", f"sampler total variation to the true law ({s['num_generate']} samples; an exact sample of "
                      f"that size has TV {s['tv_of_exact_sample']:.4f}):",
                  table(["sampler", *[f"{c} steps" for c in s["steps"]]], rows)]
    return parts


@dataclasses.dataclass(kw_only=True)
class OracleReport(Provenance, Head):
    """Estimators with an exact denoiser against the exact values (``eval.mode = "oracle"``,
    ``run.evaluate_oracle``); the oracle case's ``info`` adds the optional fields."""

    KIND: ClassVar[str] = "oracle"
    TITLE: ClassVar[str] = "infodiff oracle report"
    oracle: str = key("the distribution (`tabular`, `markov`, or the synthetic count law's name)",
                      text=row("oracle", lambda r: r["oracle"]))
    num_items: int = key("items drawn from it", text=row("items", lambda r: (
        f"{r['num_items']} {r['units']['item']}s" + (f" of length {r['item_size']}" if r["item_size"] else "")
        + (f", prompt {r['prompt_len']}" if r["prompt_len"] else ""))))
    item_size: int = key("their length (L or D)", text=Shown("num_items"))
    prompt_len: int = key("the prompt length of the conditional and ratio rows (0: none)", text=Shown("num_items"))
    results: dict = key("`unconditional`, `conditional`, `ratio`, `samplers`: the tables `OracleResults`, "
                        "`OracleRow`, `RatioPair`, `SamplerCheck`", unit="nats",
                        text=Lines(_results_lines), rows=lambda v: [(OracleResults, v)])
    table: str = key("text oracles: the table file (a generated table is saved beside the report)", required=False)
    alphabet: str = key("text oracles: the alphabet", required=False)
    order: int | None = key("text oracles: the Markov order (null for a table)", required=False)
    lam_max: float = key("SEDD: the end of the noise-level integral", required=False)
    distribution: str = key("count oracles: the law (`file:<name>` for `data.path`)", required=False)
    pmf_file: str | None = key("count oracles: the pmf file of `data.path`, else null", required=False)
    dim: int = key("count oracles: dimensions per example", required=False)
    support_size: int = key("count oracles: points of the law's support", required=False)
    max_count: int = key("count oracles: the largest count", required=False)
    truncated_mass: float = key("count oracles: probability left out by the truncation", required=False)
    exact_entropy_nats: float = key("count oracles: the law's entropy", unit="nats", required=False)


# -- input -----------------------------------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class InputRow(Schema):
    """One row of a user's file (rows.jsonl, rows.csv, an input report's ``rows_preview``)."""

    id: str = key("the row's id (the line number, or the jsonl `id`)")
    value: float = key("−log p of the row, or the coupled log-ratio (ratios); what it is: the report's `bound`",
                       unit="nats")
    se: float = key("its standard error", unit="nats")
    samples: int = key("Monte Carlo samples per window")
    windows: int = key("windows of the model's length the row was cut into (not counts)", required=False)
    forward_passes: int = key("denoiser evaluations for the row")
    changed_chars: int = key("characters changed by the text8 cleaning (not counts)", required=False)
    prompt_chars: int = key("pairs and ratios: the prompt's characters with its joining space", required=False)
    context_chars: int = key("pairs and ratios: how many of them the first window saw (a and b see the same)",
                             required=False)
    chars: int = key("text and pairs, character runs: characters scored", required=False)
    bits_per_char: float = key("text and pairs, character runs: `value` / (`chars` · ln 2)",
                               unit="bits per character", required=False)
    bits_per_char_stderr: float = key("its standard error, `se` / (`chars` · ln 2)", unit="bits per character",
                                      required=False)
    bytes: int = key("text and pairs, byte runs: UTF-8 bytes scored", required=False)
    bits_per_byte: float = key("text and pairs, byte runs: `value` / (`bytes` · ln 2), lm-eval's `bits_per_byte`",
                               unit="bits per byte", required=False)
    bits_per_byte_stderr: float = key("its standard error, `se` / (`bytes` · ln 2)", unit="bits per byte",
                                      required=False)
    byte_perplexity: float = key("byte runs: exp(`value` / `bytes`), lm-eval's `byte_perplexity`", required=False)
    byte_perplexity_stderr: float = key("its standard error by the delta method, `byte_perplexity` · `se` / `bytes`",
                                        required=False)
    dims: int = key("counts: dimensions", required=False)
    bits_per_dim: float = key("counts: `value` / (`dims` · ln 2)", unit="bits per dimension", required=False)
    value_decoupled: float = key("ratios: the decoupled log-ratio", unit="nats", required=False)
    se_decoupled: float = key("ratios: its standard error", unit="nats", required=False)
    resolved_2se: bool = key("ratios: |value| > 2 `se`", required=False)
    log_p_a: float = key("ratios: log p(a | prompt) (minus its NELBO), from the draws of `value`", unit="nats",
                         required=False)
    log_p_a_se: float = key("ratios: its standard error", unit="nats", required=False)
    log_p_b: float = key("ratios: log p(b | prompt), the same draws (`value` = `log_p_a` − `log_p_b`)", unit="nats",
                         required=False)
    log_p_b_se: float = key("ratios: its standard error", unit="nats", required=False)
    document: str = key("text: the row (a line, or the file) as given (byte runs: bytes that are not UTF-8 as "
                        "`\\xNN`)", required=False)
    prompt: str = key("pairs and ratios: the prompt as given", required=False)
    response: str = key("pairs: the response as given", required=False)
    a: str = key("ratios: a as given", required=False)
    b: str = key("ratios: b as given", required=False)
    document_cleaned: str = key("runs that clean (text8): the document as scored", required=False)
    prompt_cleaned: str = key("runs that clean: the prompt as scored", required=False)
    response_cleaned: str = key("runs that clean: the response as scored", required=False)
    a_cleaned: str = key("runs that clean: a as scored", required=False)
    b_cleaned: str = key("runs that clean: b as scored", required=False)
    lower: float = key("with `eval.interval`: the interval's lower end for the row's −log p (any order)",
                       unit="nats", required=False)
    upper: float = key("with `eval.interval`: its upper end", unit="nats", required=False)
    iw: float = key("with `eval.interval`: the importance-weighted estimate (upper side); summed over windows",
                    unit="nats", required=False)
    iw_stderr: float = key("with `eval.interval`: its SE (windows in quadrature)", unit="nats", required=False)
    tube: float = key("with `eval.interval`: the TUBE estimate (lower side)", unit="nats", required=False)
    tube_stderr: float = key("with `eval.interval`: its SE", unit="nats", required=False)
    ess: float = key("with `eval.interval`: Kish's ESS of the orders' weights (the smallest over windows; NaN "
                     "where exact)", required=False)
    pareto_k: float = key("with `eval.interval`: Pareto k-hat (the largest over windows; NaN for K < 25)",
                          required=False)
    exact: bool = key("with `eval.interval`: every window computed by the exact subset recursion", required=False)
    interval_forward_passes: int = key("with `eval.interval`: denoiser evaluations of the interval", required=False)
    options: int = key("choices: the question's number of options", required=False)
    choice: int = key("choices: the chosen option (smallest −log p), 0-based", required=False)
    runner_up: int = key("choices: the next option; `value` ± `se` is its margin −log p(runner-up) + log p(choice)",
                         required=False)
    decided: bool = key("choices: the choice beat every rival at `eval.choice_confidence` (Bonferroni over rivals "
                        "and rounds)", required=False)
    p_flip: float = key("choices: the probability that more samples would change the choice (1 − p_best of it)",
                        required=False)
    p_best: list = key("choices: per option, the probability that it is the best with unlimited samples",
                       required=False)
    rounds: int = key("choices: adaptive rounds drawn", required=False)
    option_nll: list = key("choices: −log p(option | prompt) of every option (NELBO)", unit="nats", required=False)
    option_se: list = key("choices: their standard errors", unit="nats", required=False)
    answer: int = key("choices with answers: the right option", required=False)
    correct: bool = key("choices with answers: `choice` = `answer`", required=False)


def _input_summary_rows(r) -> list:
    from infodiff.evaluation import queries

    return queries.get(r["input"]["format"]).summary_lines(r)


def nll_summary_rows(r, per: tuple | None = None) -> list:
    """report.txt's summary rows of -log p rows: the total ± SE and bits per unit (``per``: (label,
    summary key, count key); None: bits per byte or character, as the summary holds)."""
    s = r["summary"]
    per = per or (("bits per byte", "bits_per_byte", "bytes") if "bits_per_byte" in s else (
        "bits per character", "bits_per_char", "characters"))
    out = [(f"total {_bound_label(r).split(',')[0]} (nats)", f"{s['total_nats']:.3f} ± {s['total_stderr']:.3f}"),
           (per[0], f"{s[per[1]]:.4f} ± {s[per[1] + '_stderr']:.4f} ({s[per[2]]} {per[2]})")]
    if "byte_perplexity" in s:
        out.append(("byte perplexity", f"{s['byte_perplexity']:.4f} ± {s['byte_perplexity_stderr']:.4f}"))
    if "nll_per_token" in s:
        out.append(("nats per token", f"{s['nll_per_token']:.4f} ± {s['nll_per_token_stderr']:.4f} "
                                      f"({s['tokens']} tokens)"))
    return out


def _cleaning_row(r) -> str:
    c = r["cleaning"]
    return (c["statement"] + "; " if "statement" in c else "") + f"{c['rows_changed']} rows changed; characters: " + (", ".join(
        f"{k!r} x{v}" for k, v in sorted(c["characters"].items(), key=lambda kv: -kv[1])[:12]) or "none")


def _preview_lines(r) -> list[str]:
    from infodiff.evaluation import queries

    prev, fmt = r["rows_preview"], r["input"]["format"]
    if not prev:
        return []
    name = _bound_label(r).split(",")[0]
    hdr, body = queries.get(fmt).preview(prev, name)
    return ["", f"first {len(prev)} of {r['input']['rows']} rows:", table(hdr, body)]


def nll_preview(prev: list, name: str) -> tuple[list, list]:
    """(header, body) of report.txt's row table of -log p rows (documents, responses): bits per byte
    or character, as the rows hold."""
    if "bits_per_byte" in prev[0]:
        hdr = ["id", f"{name} (nats)", "SE", "bytes", "bits/byte", "SE", "windows"]
        body = [[p["id"], f"{p['value']:.3f}", f"{p['se']:.3f}", p["bytes"], f"{p['bits_per_byte']:.3f}",
                 f"{p['bits_per_byte_stderr']:.3f}", p["windows"]] for p in prev]
    else:
        hdr = ["id", f"{name} (nats)", "SE", "chars", "bits/char", "windows", "changed"]
        body = [[p["id"], f"{p['value']:.3f}", f"{p['se']:.3f}", p["chars"], f"{p['bits_per_char']:.3f}",
                 p["windows"], p["changed_chars"]] for p in prev]
    return hdr, body


@dataclasses.dataclass(kw_only=True)
class InputReport(Provenance, PerRowSE, Head):
    """A user's file scored with a trained run (``eval.input``, docs/scoring.md); written to
    ``eval.output_dir`` or ``W/scores/<file name>-<folder hash>/`` with rows.jsonl, rows.csv and
    rows.png. SE fields per row."""

    KIND: ClassVar[str] = "input"
    TITLE: ClassVar[str] = "infodiff input report"
    TEXT: ClassVar[dict] = {"se_method": row("SE method", _input_se), "plots": Shown("files")}
    input: dict = key("`path`, `sha256`, `format` (`text`, `pairs`, `ratios`, `choices`; a Poisson run's `counts`), "
                      "`unit` "
                      "(`eval.input_unit`), `rows`", text=row("input", lambda r: (
                          f"{r['input']['path']} ({r['input']['format']}, {r['input']['rows']} rows)")))
    quantity: str = key("`-log p(document)`, `-log p(response | prompt)`, the coupled `log p(a | prompt) - "
                        "log p(b | prompt)` or `-log P(x)` (counts)",
                        text=row("quantity", lambda r: f"{r['quantity']}, {r['units']['nll']}; {_bound_label(r)}"))
    bound: str = key(_bound_doc("nelbo", "nelbo_difference") + " (the ratios format)", text=Shown("quantity"))
    workdir: str = key("the run's directory")
    checkpoint_step: int = key("the step of the checkpoint used", text=row("checkpoint", lambda r: (
        f"step {r['checkpoint_step']} ({r['params']} params), model length {r['model_length']}")))
    params: str = key("`ema` or `raw` parameters (`eval.use_ema`)", text=Shown("checkpoint_step"))
    model_length: int = key("the model's length L (D for counts)", text=Shown("checkpoint_step"))
    estimator: str = key("the estimator (one pass per sample)", text=row("estimator", lambda r: (
        f"{r['estimator']}, {r['num_samples_per_window']} samples per window"
        + (" (INFINITE VARIANCE: SEs unreliable)" if r["infinite_variance"] else ""))))
    infinite_variance: bool = key("true for lambda_dce: SEs unreliable", text=Shown("estimator"))
    num_samples_per_window: int = key("Monte Carlo samples per window (`eval.input_samples`)", text=Shown("estimator"))
    forward_passes: int = key("total denoiser evaluations", text=row("forward passes", lambda r: r["forward_passes"]))
    summary: dict = key("counts: `total_nats`, `total_stderr`, `mean_nll_per_row`, `dimensions`, `bits_per_dim`, "
                        "`bits_per_dim_stderr`; text and pairs: `total_nats`, `total_stderr`, `mean_nll_per_row`, "
                        "`characters`, `bits_per_char`, `bits_per_char_stderr` (byte runs instead: `bytes`, "
                        "`bits_per_byte`, `bits_per_byte_stderr`, `byte_perplexity`, `byte_perplexity_stderr`: "
                        "lm-eval's definitions, total NLL over UTF-8 bytes; a released checkpoint's subword "
                        "tokenizer: bits per byte of the original UTF-8 text and `tokens`, `nll_per_token`, "
                        "`nll_per_token_stderr`); ratios: `mean_log_ratio` (± "
                        "`mean_log_ratio_stderr`), `fraction_resolved_2se` (coupled and `_decoupled`), "
                        "`fraction_a_more_likely`, `se_ratio_decoupled_over_coupled_median`; pairs and ratios: "
                        "`rows_prompt_cut` (rows that saw only the end of their prompt), `rows_prompt_unseen` (saw "
                        "none of it); choices: `questions`, `fraction_decided`, `forward_passes_per_question_mean` "
                        "(`_median`, `_max`), `samples_per_option_mean`, `expected_flips` (the sum of `p_flip`), "
                        "`confidence`, `adaptive`, `coupled`, `first_samples`, `max_samples`, `estimator`, "
                        "`accuracy_mc_stderr` (a bound on the accuracy's Monte Carlo error: sqrt(sum over questions "
                        "of max_j p_best (1 - p_best)) / questions, infodiff.choices) and with answers `accuracy`, "
                        "`accuracy_stderr` (from the sample of questions, lm-eval's; null for one question)", unit="nats", text=Rows(_input_summary_rows))
    cleaning: dict = key("runs that clean their input (text8): `statement` (that a cleaned copy is scored, "
                         "not the input as given), `rules`, `rows_changed`, `characters` ({character: count} "
                         "outside a-z and space, changed by the text8 cleaning); absent for byte runs (nothing "
                         "cleaned)", required=False,
                         text=row("CLEANED TEXT SCORED", _cleaning_row))
    target_se: float = key("with `eval.target_se` > 0 only: the target SE", unit="nats", required=False,
                           text=row("target SE", lambda r: (
                               f"{r['target_se']:.4g} nats, " + ("reached by every row" if r["target_se_reached"]
                                                                 else "NOT reached by every row")
                               + f" (at most {r['max_samples_per_window']} samples per window)")))
    target_se_reached: bool = key("with `eval.target_se` > 0 only: whether every row reached it", required=False,
                                  text=Shown("target_se"))
    max_samples_per_window: int = key("with `eval.target_se` > 0 only: the bound `eval.input_max_samples`",
                                      required=False, text=Shown("target_se"))
    interval: dict = key(
        "with `eval.interval` only (masked runs, text and pairs): the interval of the rows' total −log p (any order). "
        + _ORDER_BLOCK_DOC.format(n="rows", per="row", nelbo=", `nelbo` ± `nelbo_stderr` (the rows' NELBO)"),
        unit="nats", required=False, text=_order_rows("interval", "NLL interval (any order)"))
    rows_preview: list = key("the first 10 rows of `rows.jsonl` (the table `InputRow`)", text=Lines(_preview_lines),
                             rows=_each(InputRow))
    notes: list = key("e.g. how many rows saw only part of their prompt (and which saw none), or a `target_se` not "
                      "reached", required=False, text=_notes("note", "notes"))
    files: list = key("the files written with the report (rows.jsonl, rows.csv, rows.png; with `eval.interval` "
                      "intervals.png)",
                      text=_notes("file", "files"))
    plot_notes: list = key(_plot_notes_doc, required=False, text=_notes("note", "plot_notes"))


# -- compare ---------------------------------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class CompareRow(Schema):
    """One row of a comparison (rows.jsonl, rows.csv, a compare report's ``rows_preview``)."""

    id: str = key("the row's id (the line number, or the jsonl `id`)")
    nll_a: float = key("−log p of the row under run a (its NELBO)", unit="nats")
    se_a: float = key("its standard error", unit="nats")
    nll_b: float = key("−log p of the row under run b (its NELBO)", unit="nats")
    se_b: float = key("its standard error", unit="nats")
    difference: float = key("`nll_a` − `nll_b` (> 0: run b gives the row more probability)", unit="nats")
    se_paired: float = key("the SE of the per-sample differences (shared draws); `se_unpaired` when not coupled",
                           unit="nats")
    se_unpaired: float = key("sqrt(`se_a`² + `se_b`²): the SE of two independent evaluations", unit="nats")
    resolved_2se: bool = key("|`difference`| > 2 `se_paired`")
    samples: int = key("Monte Carlo samples per window (each run)")
    windows_a: int = key("windows of run a's length the row was cut into")
    windows_b: int = key("windows of run b's length")
    forward_passes: int = key("denoiser evaluations for the row, both runs")
    changed_chars: int = key("characters changed by the text8 cleaning (prompt and response for pairs)")
    chars: int = key("characters scored (the response for pairs)")


def _run_row(side: str) -> Rows:
    def render(r):
        x = r["runs"][side]
        return [(f"run {side}", f"{x['workdir']}: step {x['checkpoint_step']} ({x['params']} params), L {x['model_length']}, "
                                f"{x['estimator']}")]
    return Rows(render)


def _compare_summary_rows(r) -> list:
    s = r["summary"]
    ratio = s["se_ratio_unpaired_over_paired"]
    med = s["se_ratio_unpaired_over_paired_median"]
    return [("total difference (nats)", f"{s['total_difference']:+.3f} ± {s['total_stderr_paired']:.3f} paired "
                                        f"(± {s['total_stderr_unpaired']:.3f} unpaired)"),
            ("SE unpaired / paired", ("n/a (paired SE 0)" if ratio is None or not math.isfinite(ratio) else
                                      f"{ratio:.2f} total") + ("" if med is None or not math.isfinite(med) else
                                                               f", {med:.2f} median per row")),
            ("total -log p a / b (nats)", f"{s['total_nll_a']:.3f} ± {s['total_nll_a_stderr']:.3f} / "
                                          f"{s['total_nll_b']:.3f} ± {s['total_nll_b_stderr']:.3f}"),
            ("rows", f"{s['rows']}; resolved at 2 SE {s['fraction_resolved_2se']:.0%}, b more likely "
                     f"{s['fraction_b_more_likely']:.0%}")]


def _compare_preview(r) -> list[str]:
    prev = r["rows_preview"]
    hdr = ["id", "-log p a", "-log p b", "difference", "SE paired", "SE unpaired", "chars"]
    body = [[p["id"], f"{p['nll_a']:.3f}", f"{p['nll_b']:.3f}", f"{p['difference']:+.3f}", f"{p['se_paired']:.3f}",
             f"{p['se_unpaired']:.3f}", p["chars"]] for p in prev]
    return ["", f"first {len(prev)} of {r['input']['rows']} rows (nats):", table(hdr, body)]


@dataclasses.dataclass(kw_only=True)
class CompareReport(Provenance, PerRowSE, Head):
    """A user's file scored with two runs and their per-row difference with a paired SE
    (``evaluate.py --workdir W1 --compare W2 --config.eval.input=F``, docs/scoring.md); written to
    ``W1/scores/<file name>.vs.<W2's name>/`` with rows.jsonl, rows.csv and rows.png. SE fields:
    the paired difference's (run a's when not coupled)."""

    KIND: ClassVar[str] = "compare"
    TITLE: ClassVar[str] = "infodiff comparison report"
    TEXT: ClassVar[dict] = {"se_method": row("SE method", _input_se), "plots": Shown("files")}
    input: dict = key("`path`, `sha256`, `format` (`text` or `pairs`), `unit` (`eval.input_unit`), `rows`",
                      text=row("input", lambda r: (
                          f"{r['input']['path']} ({r['input']['format']}, {r['input']['rows']} rows)")))
    quantity: str = key("`-log p_a(document) - (-log p_b(document))` or the same of `-log p(response | prompt)`",
                        text=row("quantity", lambda r: f"{r['quantity']}, {r['units']['nll']}; {_bound_label(r)}"))
    bound: str = key(_bound_doc("model_difference"), text=Shown("quantity"))
    runs: dict = key("`a` (`--workdir`) and `b` (`--compare`), each: `workdir`, `checkpoint_step`, `params` (`ema` or "
                     "`raw`), `model_length`, `estimator`, `process`",
                     text=Rows(lambda r: _run_row("a").render(r) + _run_row("b").render(r)))
    coupling: dict = key("`coupled` (both runs drew the same noise: same process family and estimator, same L), "
                         "`why_not` (empty when coupled), `same_noise` (the processes are equal: identical masks and "
                         "times), `batch_size` (run a's `eval.batch_size`, the chunk layout of both)",
                         text=row("coupling", lambda r: (
                             ("paired: same windows, key, samples and chunk layout"
                              + (" (identical noise)" if r["coupling"]["same_noise"] else
                                 " (same random numbers, different noise laws)"))
                             if r["coupling"]["coupled"] else f"independent draws: {r['coupling']['why_not']}")))
    num_samples_per_window: int = key("Monte Carlo samples per window of each run (`eval.input_samples`, the "
                                      "larger of the two runs')",
                                      text=row("samples per window", lambda r: r["num_samples_per_window"]))
    infinite_variance: bool = key("true for lambda_dce: SEs unreliable", text=Shown("se_method"))
    forward_passes: int = key("total denoiser evaluations, both runs",
                              text=row("forward passes", lambda r: r["forward_passes"]))
    summary: dict = key("`total_difference` (Σ rows) ± `total_stderr_paired` (pooled per-sample differences) and "
                        "`total_stderr_unpaired` (sqrt of the runs' squared total SEs), "
                        "`se_ratio_unpaired_over_paired` (of the totals; null when the paired SE is 0) and its "
                        "`_median` over rows, `total_nll_a` ± `total_nll_a_stderr`, `total_nll_b` ± "
                        "`total_nll_b_stderr`, `fraction_resolved_2se`, `fraction_b_more_likely`, `rows`",
                        unit="nats", text=Rows(_compare_summary_rows))
    cleaning: dict = key("`rules`, `rows_changed`, `characters` ({character: count} changed by the text8 cleaning)",
                         text=row("cleaned (text8 rules)", _cleaning_row))
    target: dict = key("with `eval.target_se` > 0 only: `target_se` (nats, every row's paired SE), `reached`, "
                       "`max_samples_per_window`", required=False, text=row("target SE", lambda r: (
                           f"{r['target']['target_se']:.4g} nats (paired), "
                           + ("reached by every row" if r["target"]["reached"] else "NOT reached by every row")
                           + f" (at most {r['target']['max_samples_per_window']} samples per window)")))
    rows_preview: list = key("the first 10 rows of `rows.jsonl` (the table `CompareRow`)",
                             text=Lines(_compare_preview), rows=_each(CompareRow))
    notes: list = key("e.g. why the runs could not share draws, or a `target_se` not reached", required=False,
                      text=_notes("note", "notes"))
    files: list = key("the files written with the report (rows.jsonl, rows.csv, rows.png: each row's difference ± 2 "
                      "paired SE, the unpaired ± 2 SE beside it)", text=_notes("file", "files"))
    plot_notes: list = key(_plot_notes_doc, required=False, text=_notes("note", "plot_notes"))


KINDS = {s.KIND: s for s in (NetworkReport, OracleReport, InputReport, CompareReport)}


def _names(schema, parts=(), required=True) -> tuple:
    return tuple(f.name for f in schema.keys() if (f.metadata["required"] or not required)
                 and not any(f.name in p.__dataclass_fields__ for p in parts))


# The required keys (tests, readers): of every report, of each kind beyond those, of an oracle row.
COMMON_KEYS = _names(Head) + _names(Provenance)
NETWORK_KEYS = _names(NetworkReport, (Head, Provenance))
ORACLE_KEYS = _names(OracleReport, (Head, Provenance))
INPUT_KEYS = _names(InputReport, (Head, Provenance))
ROW_KEYS = _names(OracleRow)


def format_report(report: dict) -> str:
    """Readable text of a report (what evaluate.py prints, report.txt), from its kind's schema:
    the title, a table of the fields shown as rows, the lines of the others (rows of an oracle
    report, a preview of an input report's rows, notes, warnings), then the names of the fields
    only report.json holds. Every line fits :data:`WIDTH` (100) columns: long values are
    wrapped in the table (:func:`_key_table`), wide tables are cut into column groups
    (:func:`table`), long lines wrapped."""
    schema = KINDS[report["kind"]]
    rows, lines, only_json = [], [], []
    for f in schema.keys():
        if f.name not in report:
            continue
        how = schema.text(f)
        if isinstance(how, Rows):
            rows += [list(x) for x in how.render(report)]
        elif isinstance(how, Lines):
            lines += how.render(report)
        elif how is None:
            only_json.append(f.name)
    out = [schema.TITLE, *_key_table(rows), *lines]
    if only_json:
        out.append(f"also in report.json: {', '.join(only_json)}")
    return _fit("\n".join(out))


def check_report(report: dict, schema=None, where: str = "") -> list[str]:
    """What is wrong with ``report`` (a report dict, or a row with its ``schema``): keys its
    schema does not declare, required fields missing, the same for the rows it holds (oracle
    rows, input rows); [] when it conforms. Each problem is one line naming the key path."""
    if schema is None:
        schema = KINDS.get(report.get("kind"))
        if schema is None:
            return [f"kind {report.get('kind')!r} is not one of {sorted(KINDS)}"]
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out = [f"{where}{k}: not a field of {schema.__name__}" for k in report if k not in fields]
    out += [f"{where}{k}: required by {schema.__name__}, missing" for k, f in fields.items()
            if f.metadata["required"] and k not in report]
    for k, f in fields.items():
        if k in report and f.metadata["rows"] is not None:
            for i, (sub, item) in enumerate(f.metadata["rows"](report[k])):
                out += check_report(item, sub, f"{where}{k}[{i}].")
    return out


# docs/report.md: each table between <!-- schema:NAME --> and <!-- /schema:NAME -->.
DOC_TABLES = {"common": (Head, Provenance), "network": (NetworkReport,), "input": (InputReport,),
              "input_row": (InputRow,), "compare": (CompareReport,), "compare_row": (CompareRow,), "oracle": (OracleReport,), "oracle_results": (OracleResults, RatioPair,
                                                                                        SamplerCheck),
              "oracle_row": (OracleRow,), "se_calibration": (SECalibration,)}


def _doc_row(schema, f) -> str:
    how = schema.text(f)
    shown = f"with `{how.key}`" if isinstance(how, Shown) else {Rows: "row", Lines: "lines"}.get(type(how), "—")
    doc = (f.metadata["doc"] or "").replace("|", "\\|")
    return (f"| `{f.name}` | {'yes' if f.metadata['required'] else 'no'} | {f.metadata['unit'] or ''} | {shown} "
            f"| {doc} |")


def docs_tables() -> dict[str, str]:
    """docs/report.md's key tables {marker name: markdown}, generated from the schema: per
    field its key, whether it is required, its unit, how report.txt shows it and its meaning."""
    out = {}
    for name, schemas in DOC_TABLES.items():
        lines = []
        for s in schemas:
            if len(schemas) > 1:
                lines += [f"`{s.__name__}`: {s.__doc__.splitlines()[0]}", ""]
            own = [f for f in s.keys() if name == "common" or not (
                f.name in Head.__dataclass_fields__ or f.name in Provenance.__dataclass_fields__)]
            lines += ["| key | required | unit | report.txt | meaning |", "|---|---|---|---|---|",
                      *(_doc_row(s, f) for f in own), ""]
        out[name] = "\n".join(lines).rstrip("\n")
    return out


def write_docs(path: str, check: bool = False) -> bool:
    """Replace the key tables of docs/report.md (``path``) by :func:`docs_tables`; with
    ``check`` only compare. Returns whether the file was (or would be) unchanged. Raises
    ValueError naming a marker missing from the file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = text
    for name, body in docs_tables().items():
        begin, end = f"<!-- schema:{name} -->", f"<!-- /schema:{name} -->"
        i, j = new.find(begin), new.find(end)
        if i < 0 or j < i:
            raise ValueError(f"{path}: markers {begin} ... {end} not found; add them where the table goes")
        new = new[:i + len(begin)] + "\n" + body + "\n" + new[j:]
    if new != text and not check:
        workdir_lib.atomic_write_bytes(path, new.encode("utf-8"))
    return new == text


def strict_json(obj):
    """NaN / inf -> None so report.json is strict JSON (jq, JavaScript)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


class Report(dict):
    """A report (a plain dict: JSON, the table) with the files that belong to it, written with it
    as one unit by :func:`write_report`: ``attachments`` {file name: bytes} (input mode's
    rows.jsonl, rows.csv, rows.png)."""

    def __init__(self, *args, attachments: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.attachments = dict(attachments or {})


def refuse_existing(out_dir: str, config, elsewhere: str = "--config.eval.output_dir=DIR to write elsewhere") -> None:
    """ValueError (one line naming the folder and the fix) when ``out_dir`` already holds a
    report.json and ``config.eval.overwrite`` is False: a rerun never replaces a report silently.
    Called by a trained run's evaluation after its settings are checked, before any work."""
    if bool(config.eval.get("overwrite", False)):
        return
    current = os.path.join(out_dir, files_lib.UNIT_DIR, files_lib.CURRENT)  # held even if report.json was removed
    if os.path.lexists(os.path.join(out_dir, "report.json")) or os.path.lexists(current):
        what = "report.json" if os.path.lexists(os.path.join(out_dir, "report.json")) else \
            f"{files_lib.UNIT_DIR}/{files_lib.CURRENT}; report.json was removed, its unit was not"
        raise ValueError(f"{out_dir} already holds a report ({what}): pass --config.eval.overwrite=True to "
                         f"replace it, or {elsewhere}")


def exclusive(config) -> bool:
    """Whether an evaluation's report must not replace one committed by another evaluation
    while it ran (:func:`write_report`'s ``exclusive``): a trained run's (network mode) without
    ``eval.overwrite``; oracle mode always writes."""
    return str(config.eval.get("mode", "network")) != "oracle" and not bool(config.eval.get("overwrite", False))


def write_report(report: dict, out_dir: str, exclusive: bool = False) -> tuple[str, str]:
    """Write report.json (strict JSON: undefined numbers are null), report.txt and the report's
    ``attachments`` (:class:`Report`) into out_dir as one unit (:func:`infodiff.files.write_together`: after a
    crash or kill -9 at any moment they are all from the same evaluation, old or new); return
    the paths of report.json and report.txt.

    Raises StorageError (one line naming report.json and the errno) if out_dir is full,
    read-only or not writable: print the report first (evaluate.py does), so that nothing is
    lost; the previous files stay as they were. ``exclusive`` (:func:`exclusive` of the config):
    if another evaluation committed a report in out_dir after this one started (two evaluations
    of one workdir at once), raises :class:`infodiff.files.UnitExistsError` (one line naming it
    and where this report's files are kept), checked atomically at the commit. In a
    multi-process run only process 0 writes (the others return the same paths)."""
    from infodiff import parallel

    if not parallel.is_primary():
        return os.path.join(out_dir, "report.json"), os.path.join(out_dir, "report.txt")
    files = {"report.json": json.dumps(strict_json(report), indent=2, allow_nan=False).encode("utf-8"),
             "report.txt": (format_report(report) + "\n").encode("utf-8")}
    files.update(getattr(report, "attachments", {}))
    try:
        with workdir_lib.storage_guard(os.path.join(out_dir, "report.json")):
            paths = files_lib.write_together(out_dir, files, exclusive=exclusive)
    except workdir_lib.StorageError as e:
        extra = [n for n in files if n not in ("report.json", "report.txt")]
        if not extra:
            raise
        raise workdir_lib.StorageError(e.errno, e.filename, note=f"none of the files the report lists ({', '.join(extra)}) "
                                       "was written either") from e
    except files_lib.UnitExistsError as e:
        raise e.with_hint("the report printed above is this evaluation's: give each evaluation its own "
                          "--config.eval.output_dir, or pass --config.eval.overwrite=True to let the newest replace "
                          "the report") from None
    return paths[0], paths[1]
