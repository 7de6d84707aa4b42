"""Input kind 'counts': a Poisson run's ``.npy`` of counts [N, *event_shape] or [N, D]: -log P(x)
per example (nats) through the task's denoiser and estimation process
(:func:`infodiff.likelihood.nll`), bits per dimension."""

from __future__ import annotations

import os

import numpy as np

from infodiff import provenance
from infodiff.evaluation import inputs, plots
from infodiff.evaluation import report as report_lib
from infodiff.evaluation.queries import Query, register
from infodiff.validation import check_num_samples

__all__ = ["read_counts", "evaluate_counts", "QUERY"]

LN2 = inputs.LN2


def read_counts(path: str, event_shape: tuple, max_count: int) -> np.ndarray:
    """int64 [N, D] counts of a ``.npy`` file of shape [N, *event_shape] or [N, D].
    Raises FileNotFoundError; ValueError naming the file for another extension, a wrong shape,
    non-integer, negative or too large counts, or no rows."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"eval.input: file not found: {path!r}")
    if os.path.splitext(path)[1].lower() != ".npy":
        raise ValueError(f"eval.input {path!r}: a Poisson run scores counts: give a .npy array of shape "
                         f"[N, {', '.join(map(str, event_shape))}]")
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise ValueError(f"eval.input {path!r} is not a numeric .npy array ({e})") from None
    D = int(np.prod(event_shape))
    if arr.ndim < 1 or arr.shape[0] == 0 or int(np.prod(arr.shape[1:])) != D or \
            tuple(arr.shape[1:]) not in (tuple(event_shape), (D,)):
        raise ValueError(f"eval.input {path!r} has shape {arr.shape}; expected [N, {', '.join(map(str, event_shape))}] "
                         f"or [N, {D}] with N >= 1")
    flat = arr.reshape(arr.shape[0], D)
    if not np.issubdtype(flat.dtype, np.number) or not np.all(np.isfinite(flat)) or np.any(flat != np.round(flat)):
        raise ValueError(f"eval.input {path!r}: counts must be finite integers")
    from infodiff import tasks

    tasks.check_counts(flat, max_count, f"eval.input {path!r}")
    return flat.astype(np.int64)


def evaluate_counts(config, workdir, t0) -> tuple[dict, str]:
    """A Poisson run's -log P(x) per row of a .npy of counts (nats per example, bits per dim)."""
    import jax

    from infodiff import likelihood as lk
    from infodiff import tasks, training

    ev = config.eval
    path = str(ev.input)
    task = tasks.make_task(config)
    check_num_samples(ev.num_samples, "config.eval.num_samples")  # the split's other eval keys are not read here
    if int(ev.batch_size) < 1:
        raise ValueError(f"config.eval.batch_size={ev.batch_size} must be >= 1 (rows per denoiser call)")
    x = read_counts(path, tuple(task.data.event_shape), int(task.data.max_count))
    x, limit_notes = inputs.apply_limit(config, x, len(x))
    report_lib.refuse_existing(inputs.output_dir_of(config, workdir), config)
    params, meta = training.load_params(workdir, task, ema=bool(ev.use_ema))
    den = task.denoiser(params)
    process = task.estimation_process()
    est = lk.nll(den, task.scaling.scale(x), jax.random.fold_in(jax.random.key(int(ev.seed)), 0), process=process,
                 num_samples=int(ev.num_samples), batch_size=int(ev.batch_size), progress=True)
    D = x.shape[1]
    rows = [{"id": str(i + 1), "value": float(est.mean[i]), "se": float(est.stderr[i]), "samples": int(est.num_samples),
             "forward_passes": int(est.forward_passes), "dims": D,
             "bits_per_dim": float(est.mean[i] / (D * LN2))} for i in range(len(x))]
    total, total_se = est.total()
    summary = {"total_nats": total, "total_stderr": total_se, "mean_nll_per_row": float(est.mean.mean()),
               "dimensions": int(D * len(x)), "bits_per_dim": total / (D * len(x) * LN2),
               "bits_per_dim_stderr": total_se / (D * len(x) * LN2)}
    out_dir = inputs.output_dir_of(config, workdir)
    rep = inputs.input_report(inputs.ReportContext(
        config, "counts", "-log P(x)", {"item": "example", "nll": "nats per example", "bits": "bits per dimension"},
        "nelbo", path, len(x), workdir, provenance.checkpoint_info(meta), D, est, summary, task.process_info(process),
        None, rows, out_dir, t0))
    if limit_notes:
        rep.setdefault("notes", []).extend(limit_notes)
    return rep, out_dir


def _preview(prev, name):
    hdr = ["row", f"{name} (nats)", "SE", "bits/dim"]
    body = [[p["id"], f"{p['value']:.3f}", f"{p['se']:.3f}", f"{p['bits_per_dim']:.4f}"] for p in prev]
    return hdr, body


def _sample(folder: str) -> str:
    path = os.path.join(folder, "counts.npy")
    np.save(path, np.array([[1], [3]], dtype=np.int64))
    return path


def _malformed(folder: str) -> str:
    path = os.path.join(folder, "bad_counts.npy")
    np.save(path, np.array([[1.5], [3.0]]))
    return path


QUERY = register(Query(
    name="counts", extension=".npy", input_format="counts", evaluate=evaluate_counts, score=None,
    load=lambda path: list(read_counts(path, (1,), 1000)),
    draw=lambda axes, rows, quantity, bits: plots.nll_rows_axes(axes, rows, quantity, bits, counts=True),
    summary_lines=lambda r: report_lib.nll_summary_rows(r, ("bits per dimension", "bits_per_dim", "dimensions")),
    preview=_preview, config_keys=("eval.limit",),
    compare_refusal="{path}: --compare scores a text run's documents or pairs, not counts",
    few_samples_key="eval.num_samples", sample=_sample, malformed=_malformed))
