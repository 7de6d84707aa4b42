"""One evaluation path: a trained network on a data split, or estimators against an exact oracle.

``evaluate(config, workdir)`` reads ``config.eval.mode``: 'network' (a training run in
``workdir``, any process) or 'oracle' (no network: the exact denoiser of a distribution whose
likelihood is known). Everything process-specific comes from the task (:mod:`infodiff.tasks`,
the only reader of ``config.process.name``); the Monte Carlo work is
:func:`infodiff.likelihood.nll` and friends; the report schema is
:mod:`infodiff.evaluation.report` (docs/report.md).
"""

from __future__ import annotations

import io
import json
import math
import os
import time
import warnings

import jax
import ml_collections
import numpy as np
from absl import logging

from infodiff import likelihood as lk
from infodiff import parallel, provenance, tasks, training
from infodiff.evaluation import report as report_lib

__all__ = ["evaluate", "evaluate_network", "evaluate_oracle", "MODES"]

MODES = ("network", "oracle")
LN2 = math.log(2.0)


def _check_saved_config(config, workdir: str) -> None:
    saved = training.saved_config(workdir)
    diff = training.config_differences(saved, json.loads(config.to_json_best_effort()), ignore_new_keys=True)
    if diff:
        raise training.ConfigMismatchError(
            f"the config differs from the one {workdir!r} was trained with in: {training.listed(diff)} "
            "(only eval.* may be overridden: give --workdir W without --config)")


def output_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
    """Where a trained run's evaluation writes: ``eval.output_dir`` if set, else the workdir (a
    split) or :func:`infodiff.evaluation.inputs.default_out_dir` (``eval.input``)."""
    from infodiff.evaluation import inputs

    ev = config.eval
    if str(ev.get("input", "")):
        return inputs.output_dir_of(config, workdir)
    return str(ev.get("output_dir", "") or "") or workdir


def _training_curves(task, workdir: str, out_dir: str | None = None) -> tuple[list, list, dict]:
    """``training_curves.png`` of ``workdir/metrics.jsonl``, drawn into memory to be written with
    the report as one unit (:func:`report.write_report`: after a kill at any moment the figure and
    report.json are from the same evaluation): ``([its path in out_dir], [], {name: PNG bytes})``,
    or ``([], [why not], {})`` (no metrics.jsonl, no validation record: the evaluation goes on,
    and the reason is logged and kept in the report's ``plot_notes``)."""
    png = os.path.join(out_dir or workdir, "training_curves.png")
    metrics = os.path.join(workdir, "metrics.jsonl")
    from infodiff.evaluation import plots as plots_lib

    buf = io.BytesIO()
    try:
        plots_lib.training_curves_png(buf, metrics, task.units, task.train_loss_is_nll)
    except (OSError, ValueError) as e:
        note = f"training_curves.png not drawn: {e}"
        training.log(logging.warning, "%s", note)
        return [], [note], {}
    return [png], [], {"training_curves.png": buf.getvalue()}


def _draw(figures: list, workdir: str) -> list[str]:
    """Draw a task's figures (:class:`tasks.Figure`) into ``workdir``; their paths."""
    if not figures:
        return []
    from infodiff.evaluation import plots as plots_lib

    paths = []
    for fig in figures:
        path = os.path.join(workdir, fig.name)
        plots_lib.FIGURES[fig.kind](path, *fig.args)
        paths.append(path)
    return paths


def evaluate_network(config: ml_collections.ConfigDict, workdir: str, out_dir: str | None = None) -> dict:
    """Likelihood of a trained model on ``eval.split`` with a standard error (any process).

    Loads the latest checkpoint (EMA parameters unless ``eval.use_ema`` is False), takes the
    task's evaluation items (text: non-overlapping chunks of ``data.seq_len``; counts: examples;
    ``eval.max_sequences`` / ``eval.max_examples`` > 0 keeps a random subset), runs
    :func:`likelihood.nll` with the task's estimation process and ``eval.num_samples`` Monte
    Carlo samples per item, and adds generated samples, the task's extras and plots, and the
    run's training curves (``training_curves.png`` from ``metrics.jsonl``; when they cannot be
    drawn the reason is in ``plot_notes`` and the evaluation goes on). Standard error:
    :meth:`likelihood.Estimate.split_mean` (Monte Carlo error for a whole split, at least the
    data + Monte Carlo spread for a subset), both kinds reported. Masked runs with
    ``eval.interval`` / ``eval.sampler_likelihood`` add the ``interval`` / ``sampler_likelihood``
    blocks on the same items (:mod:`infodiff.evaluation.intervals`). Raises FileNotFoundError for a
    workdir without checkpoints, ConfigMismatchError for a config that differs from the run's
    outside eval.*, ValueError for bad eval settings (before any work).

    ``nll`` is the trained network's NELBO, an upper bound on its own -log p (``bound``
    ``'nelbo'``, :data:`report.BOUNDS`). Figures go to ``out_dir`` (default the workdir);
    training_curves.png is returned as an attachment of the :class:`report.Report`, written with it.
    """
    t0 = time.time()
    ev = config.eval
    task = tasks.make_task(config)
    task.check_eval_config()
    order = task.order_settings()
    _check_saved_config(config, workdir)
    out_dir = out_dir or workdir
    report_lib.refuse_existing(out_dir, config)  # after the settings' checks, before any work
    x, data_info, subset = task.eval_items()
    params, meta = training.load_params(workdir, task, ema=bool(ev.use_ema))
    den = task.denoiser(params)
    process = task.estimation_process()
    nll_key, sample_key = task.eval_keys(int(ev.seed))
    t_nll = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # infinite variance is flagged in the report
        est = lk.nll(den, x, nll_key, process=process, num_samples=int(ev.num_samples),
                     batch_size=int(ev.batch_size), progress=True)
    t_nll = time.time() - t_nll
    s = est.split_mean(subset)
    u = task.units
    per = u["tokens_per_item"] * LN2
    se = report_lib.se_fields(est)
    blocks = {}
    if order and (order["interval"] or order["sampler"]):
        from infodiff.evaluation import intervals

        blocks = intervals.split_blocks(task, params, x, est, nll_key, order, int(ev.batch_size))
    gen = task.generate(den, sample_key)
    extras, figures = task.eval_extras(est, x, gen)
    if parallel.is_primary():
        os.makedirs(out_dir, exist_ok=True)
    plots = _draw(figures, out_dir)
    curves, notes, attachments = _training_curves(task, workdir, out_dir)
    return report_lib.Report(report_lib.NetworkReport(
        process=task.process_info(process), units=u,
        workdir=os.path.abspath(workdir), checkpoint_step=int(meta["step"]),
        params="ema" if bool(ev.use_ema) else "raw", data=data_info,
        estimator=est.estimator, infinite_variance=bool(est.infinite_variance),
        num_samples_per_item=est.num_samples, forward_passes=est.forward_passes * len(x),
        nll=s["mean"], bound="nelbo", nll_stderr=s["stderr"], stderr_kind=s["stderr_kind"],
        stderr_mc=s["stderr_mc"], stderr_data_and_mc=s["stderr_data_and_mc"],
        bits=s["mean"] / per, bits_stderr=s["stderr"] / per, terms=s["terms"],
        per_sample_std=float(np.sqrt(np.mean(est.per_sample_std**2))),
        nll_wall_time_s=t_nll,
        se_method=se["se_method"], se_note=se["se_note"], exact=se["exact"], min_samples=se["min_samples"],
        few_samples_per_item=se["few_samples"],
        uniform_nll=task.uniform_nll,
        warnings=report_lib.worse_than_uniform(s["mean"], s["stderr"], task.uniform_nll, u["nll"]),
        samples=gen.get("samples", []), sampler=gen.get("sampler"), sample_steps=gen.get("sample_steps", 0),
        extras=extras, plots=plots + curves, plot_notes=notes, **blocks,
        **report_lib.common(config, int(ev.seed), t0, checkpoint=provenance.checkpoint_info(meta),
                            data={"name": data_info.get("name"), "split": data_info.get("split"),
                                  "sha256": data_info.get("checksum")})).to_dict(), attachments=attachments)


def evaluate_oracle(config: ml_collections.ConfigDict) -> dict:
    """Estimators with an exact denoiser against the exact NLL (any process).

    The task's oracle case (:func:`tasks.oracle_case`) gives the items, their exact values and
    the estimators (a process and a denoiser each, with its own key). Unconditional -log p(x)
    always; with a prompt also -log p(y | x) and the log-ratio log p(y | x) - log p(y' | x),
    y' ~ p(. | x), coupled (shared noise, Eq. 18) and decoupled, for the estimators that support
    them; then the case's sampler checks (total variation of generated samples to the true law).
    Units: nats per item / response / ratio; every row's ``bound`` is ``'exact'`` (the
    denoiser is exact, :data:`report.BOUNDS`). Figures: the case's, and ``estimates.png`` (each
    estimator's bias +- 2 SE against the exact values, :func:`plots.oracle_estimates_png`).
    """
    t0 = time.time()
    ev = config.eval
    case = tasks.oracle_case(config)
    kw = dict(num_samples=int(ev.num_samples), batch_size=int(ev.batch_size))
    show = True  # a progress bar with ETA per estimator (stderr)
    results = {"unconditional": [], "conditional": [], "ratio": [], "samplers": []}
    x, P = case.x, case.prompt_len
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for e in case.estimators:
            est = lk.nll(e.denoiser, x, jax.random.fold_in(e.key, 0), process=e.process, progress=show, **kw)
            results["unconditional"].append(report_lib.oracle_row(est, case.truth_x))
            if P and e.conditional:
                prompt, y = x[:, :P], x[:, P:]
                est = lk.conditional_nll(e.denoiser, prompt, y, jax.random.fold_in(e.key, 1),
                                         process=e.process, progress=show, **kw)
                results["conditional"].append(report_lib.oracle_row(est, case.truth_c))
            if P and e.ratio:
                pair = {}
                for coupled in (True, False):
                    est = lk.log_ratio(e.denoiser, x[:, :P], x[:, P:], case.y_alt,
                                       jax.random.fold_in(e.key, 2 + coupled), coupled=coupled,
                                       process=e.process, **kw)
                    pair["coupled" if coupled else "decoupled"] = report_lib.oracle_row(est, case.truth_r)
                vc, vd = pair["coupled"]["per_sample_variance"], pair["decoupled"]["per_sample_variance"]
                # Undefined (NaN) when both are 0, e.g. a one-token response, where
                # k_dce / time_free / stratified are exact.
                results["ratio"].append(report_lib.RatioPair(
                    **pair, estimator=e.process.estimator,
                    variance_ratio_decoupled_over_coupled=(
                        vd / vc if vc > 0 else (float("inf") if vd > 0 else float("nan")))).to_dict())
    results["samplers"] = case.samplers()
    figures = case.plots(results, config.eval.output_dir)
    png = os.path.join(str(config.eval.output_dir) or ".", "estimates.png")
    try:
        from infodiff.evaluation import plots as plots_lib

        os.makedirs(os.path.dirname(png) or ".", exist_ok=True)
        if plots_lib.oracle_estimates_png(png, results):
            figures = [*figures, png]
    except OSError as e:
        warnings.warn(f"estimates.png not written: {e}")
    return report_lib.OracleReport(
        process=case.process_info, units=case.units, oracle=case.name, num_items=int(x.shape[0]),
        item_size=int(x.shape[1]), prompt_len=int(P), **case.info, results=results, plots=figures,
        **report_lib.common(config, int(ev.seed), t0)).to_dict()


def evaluate(config: ml_collections.ConfigDict, workdir: str | None, compare: str | None = None,
             pretrained: str | None = None) -> tuple[dict, str]:
    """``eval.mode`` 'network' (needs ``workdir``; writes to :func:`output_dir`: ``eval.output_dir``,
    else the workdir or, with ``eval.input`` (a user's file), ``workdir/scores/<file name>-<hash>/``;
    an existing report is refused unless ``eval.overwrite``; with ``compare`` another run's workdir, the
    file scored by both, :mod:`infodiff.evaluation.comparison`) or 'oracle' (writes to ``eval.output_dir``).
    Returns (report, output directory). Raises ValueError for an unknown mode or a missing
    workdir.

    With several devices (of one or many processes) the Monte Carlo rows of every estimator
    call are split over all of them (:func:`infodiff.parallel.rows_mesh`): the same draws,
    the single-device numbers to float rounding; figures are drawn by process 0 only.

    ``pretrained``: a released checkpoint's directory (:mod:`infodiff.pretrained`) scoring
    ``eval.input`` (``config`` from infodiff/pretrained/cli_config.py), alone or with ``compare``."""
    with parallel.rows_mesh(training.make_mesh()):
        if pretrained:
            return _evaluate_pretrained(config, workdir, compare, pretrained)
        return _evaluate(config, workdir, compare)


def _evaluate_pretrained(config, workdir, compare, pretrained: str) -> tuple[dict, str]:
    """evaluate.py --pretrained DIR: the checkpoint scores ``eval.input`` (or, with ``compare``,
    is run a of :func:`comparison.evaluate_compare`). Raises ValueError before any work."""
    from infodiff.evaluation import comparison, inputs
    from infodiff.pretrained import run as pretrained_run

    if workdir:
        raise ValueError("give --pretrained DIR or --workdir W, not both (--workdir W --compare DIR compares them)")
    if "pretrained" not in config:
        raise ValueError("--pretrained DIR takes its own config (infodiff/pretrained/cli_config.py): drop --config")
    if not str(config.eval.input):
        raise ValueError("--pretrained DIR scores a file: give it with --config.eval.input=FILE (.txt, one document "
                         "per line, or .jsonl {\"prompt\", \"response\"})")
    if not compare:  # before the weights are read
        report_lib.refuse_existing(inputs.output_dir_of(config, pretrained), config)
    run = pretrained_run.from_config(config)
    if compare:
        return comparison.evaluate_compare(config, pretrained, compare, run_a=run)
    return inputs.evaluate_input_with(config, pretrained, run)


def _evaluate(config: ml_collections.ConfigDict, workdir: str | None, compare: str | None = None) -> tuple[dict, str]:
    mode = str(config.eval.get("mode", "network"))
    if mode not in MODES:
        raise ValueError(f"config.eval.mode={mode!r}; choose from {MODES}")
    if mode == "oracle" and compare:
        raise ValueError("--compare compares two trained runs (network mode); drop it or --config.eval.mode=oracle")
    if mode == "oracle":
        # a text training config (masked_text.py and those built on it) has eval.output_dir for where a
        # trained run's results go, but none of the oracle keys (eval.num_sequences)
        if "output_dir" not in config.eval or ("input_samples" in config.eval and "num_sequences" not in config.eval):
            raise ValueError("config.eval.mode='oracle' needs an oracle config (configs/oracle_*.py: an exact "
                             "denoiser and its output_dir); this config is a training run's: use eval.mode='network'")
        out = str(config.eval.output_dir) or "."
        return evaluate_oracle(config), out
    if not workdir:
        raise ValueError("evaluating a trained model needs --workdir (the training run's directory)")
    if compare:
        from infodiff.evaluation import comparison  # two runs on a user's file (docs/scoring.md)

        _check_saved_config(config, workdir)
        return comparison.evaluate_compare(config, workdir, compare)
    out = output_dir(config, workdir)
    if str(config.eval.get("input", "")):
        from infodiff.evaluation import inputs  # a user's file (docs/scoring.md)

        _check_saved_config(config, workdir)
        return inputs.evaluate_input(config, workdir)
    return evaluate_network(config, workdir, out), out
