"""Figures written beside report.json (matplotlib is imported here only, when a plot is drawn)."""

from __future__ import annotations

import io
import math
import os

import numpy as np

__all__ = ["FIGURES", "count_samples_png", "training_curves", "training_curves_png", "input_rows_png", "intervals_png",
           "oracle_estimates_png", "compare_rows_png"]

# Labels of the bits metric a task logs (Task.metric) when the report's units are not given.
_BITS_UNITS = {"bpc": {"nll": "nats per sequence", "bits": "bits per character"},
               "bpd": {"nll": "nats per example", "bits": "bits per dimension"}}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> None:
    """Write ``fig`` to ``path`` (process 0 only in a multi-process run), atomically (a run
    killed while drawing leaves the previous figure, never a cut-short one), and close it. The
    format is the path's extension (png by default). ``path`` may be a binary file object
    (png, every process: the caller writes the bytes). Raises StorageError or OSError."""
    from infodiff import parallel
    from infodiff.training import workdir as workdir_lib

    try:
        if hasattr(path, "write"):
            fig.savefig(path, dpi=110, format="png")
        elif parallel.is_primary():
            buf = io.BytesIO()
            fig.savefig(buf, dpi=110, format=os.path.splitext(path)[1][1:] or "png")
            workdir_lib.atomic_write_bytes(path, buf.getvalue())
    finally:
        _pyplot().close(fig)


def count_samples_png(path: str, data, samples_NxD: np.ndarray, dist=None) -> None:
    """Generated count samples next to the truth: a 2-D histogram (2-D synthetic laws), a bar
    chart of the pmf (1-D laws, randhie), rolls (chorales) or image tiles (digits, Fashion-MNIST)."""
    from infodiff.data import counts

    plt = _pyplot()
    shape = data.event_shape
    kind = counts.figure_kind(data.name)
    if kind == "histogram" and data.dim == 2 and dist is not None and dist.dim == 2:
        K = data.max_count + 1
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.8))
        h = np.zeros((K, K))
        np.add.at(h, (samples_NxD[:, 0], samples_NxD[:, 1]), 1.0 / len(samples_NxD))
        t = np.zeros((K, K))
        sup = np.asarray(dist.support)
        t[sup[:, 0], sup[:, 1]] = dist.probs
        m = int(min(K, max(np.argwhere(t > 1e-4).max(), samples_NxD.max()) + 2))
        for ax, img, title in ((axes[0], h, "generated"), (axes[1], t, "true pmf")):
            ax.imshow(img[:m, :m].T, origin="lower", cmap="viridis", vmin=0, vmax=t.max())
            ax.set_title(f"{data.name} {title}")
            ax.set_xlabel("x1")
            ax.set_ylabel("x2")
    elif kind == "histogram":
        fig, ax = plt.subplots(figsize=(6, 3.5))
        s = samples_NxD.reshape(-1)
        K = data.max_count + 1
        ax.bar(np.arange(K) - 0.2, np.bincount(s, minlength=K)[:K] / s.size, width=0.4, label="generated")
        if dist is not None:
            ax.bar(np.asarray(dist.support)[:, 0] + 0.2, dist.probs, width=0.4, label="true pmf")
        else:
            t = data.flat("test").reshape(-1)
            ax.bar(np.arange(K) + 0.2, np.bincount(t, minlength=K)[:K] / t.size, width=0.4, label="test data")
        ax.set_xlabel("count")
        ax.set_ylabel("probability")
        ax.set_title(f"{data.name}: {s.size} generated values")
        ax.legend()
    elif kind == "rolls":
        # top row: real test windows; below: generated (pitch upwards, time to the right)
        real = data.flat("test")[np.linspace(0, len(data.test) - 1, 4).astype(int)]
        gen = samples_NxD[:8]
        panels = [(r, "test") for r in real] + [(g, "generated") for g in gen]
        rows = int(math.ceil(len(panels) / 4))
        fig, axes = plt.subplots(rows, 4, figsize=(12, 2.6 * rows), squeeze=False)
        for i, ax in enumerate(axes.flat):
            ax.set_xticks([])
            ax.set_yticks([])
            if i < len(panels):
                img, title = panels[i]
                ax.imshow(img.reshape(shape), cmap="Greys", vmin=0, vmax=2, origin="lower",
                          interpolation="nearest", aspect="auto")
                ax.set_title(title, fontsize=8)
            else:
                ax.axis("off")
        fig.suptitle("chorales (voice counts, 46 pitches x 32 eighth notes): test windows vs "
                     "increment-sampler samples")
    else:
        n = len(samples_NxD)
        cols = min(8, n)
        rows = int(math.ceil(n / cols))
        fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.2, rows * 1.3), squeeze=False)
        for i, ax in enumerate(axes.flat):
            ax.axis("off")
            if i < n:
                ax.imshow(samples_NxD[i].reshape(shape), cmap="gray", vmin=0, vmax=data.max_count,
                          interpolation="nearest")
        fig.suptitle(f"{data.name}: increment-sampler samples")
    fig.tight_layout()
    _save(fig, path)


# The figures a task may ask for (infodiff.tasks.Figure.kind): kind -> draw(path, *args).
FIGURES = {"count_samples": count_samples_png}


def training_curves(records: list[dict]) -> dict:
    """The curves of a run's metrics.jsonl records (:func:`infodiff.training.read_metrics`).

    Returns ``{"train": c, "valid": c, "bits_key": 'bpc' | 'bpd' | None, "resumes_s": [...]}``,
    each ``c`` a dict of arrays over its split's records sorted by step: float64 ``step``,
    ``time_s`` (wall-clock seconds of training: each session's ``wall_time``, seconds since its
    own start, continues from the previous session's last record; a session starts where
    ``wall_time`` goes back), ``loss`` (nats per item), ``bits`` (NaN without a bits key); bool
    ``partial`` (a window cut by a resume or an interruption); int ``session`` (0, 1, ... per
    (re)start). ``resumes_s``: the joined times at which the later sessions started. A step
    recorded twice in a split (a finished run started again validates its last step again)
    keeps the last record. Records without ``step`` / ``split`` / ``metrics`` are skipped.
    """
    offset, prev, resumes = 0.0, None, []
    rows = {"train": {}, "valid": {}}
    keys = {k for r in records for k in (r.get("metrics") or {}) if k in _BITS_UNITS}
    bits_key = next((k for k in _BITS_UNITS if k in keys), None)
    for r in records:
        m, split = r.get("metrics"), r.get("split")
        if split not in rows or not isinstance(m, dict) or "step" not in r:
            continue
        t = float(r.get("wall_time", 0.0))
        if prev is not None and t < prev:  # a new session of a resumed run
            offset += prev
            resumes.append(offset)
        prev = t
        rows[split][int(r["step"])] = (offset + t, float(m.get("loss", np.nan)),
                                       float(m.get(bits_key, np.nan)) if bits_key else np.nan,
                                       bool(r.get("partial", False)), len(resumes))
    out = {"bits_key": bits_key, "resumes_s": resumes}
    for split, by_step in rows.items():
        steps = sorted(by_step)
        vals = [by_step[s] for s in steps]
        out[split] = {"step": np.asarray(steps, np.float64),
                      "time_s": np.asarray([v[0] for v in vals], np.float64),
                      "loss": np.asarray([v[1] for v in vals], np.float64),
                      "bits": np.asarray([v[2] for v in vals], np.float64),
                      "partial": np.asarray([v[3] for v in vals], bool),
                      "session": np.asarray([v[4] for v in vals], np.int64)}
    return out


def _line(curve: dict, xkey: str, ykey: str, div: float) -> tuple[np.ndarray, np.ndarray]:
    """x / div, y of a curve; on the time axis with NaN between sessions (no line across a
    restart, whose start-up time is not training)."""
    x, y = curve[xkey] / div, curve[ykey]
    if xkey != "time_s":
        return x, y
    cut = np.flatnonzero(np.diff(curve["session"])) + 1
    return np.insert(x, cut, np.nan), np.insert(y, cut, np.nan)


def _time_unit(seconds: float) -> tuple[str, float]:
    if seconds < 120:
        return "s", 1.0
    return ("min", 60.0) if seconds < 7200 else ("h", 3600.0)


def training_curves_png(path: str, metrics_jsonl_path: str, units: dict | None = None,
                        train_loss_is_nll: bool = True) -> str:
    """Draw a run's training curves from its metrics.jsonl into the PNG ``path``; returns ``path``.

    A 2 x 2 figure: training loss (mean of each log window, raw parameters) and validation
    loss (fixed batches, EMA parameters) in ``units['nll']``, and the same in ``units['bits']``
    (bits per character / dimension), against the training step (left) and against the
    training wall-clock time (right; resumed sessions joined, each resume a dotted line, no line
    drawn across it: :func:`training_curves`). Partial windows are drawn as open circles.

    Args:
      path: the PNG to write (matplotlib, Agg).
      metrics_jsonl_path: the run's ``metrics.jsonl`` (:func:`infodiff.training.train`).
      units: the report's ``units`` (keys ``nll``, ``bits``); default from the bits key of the
        records ('bpc': nats per sequence, bits per character; 'bpd': per example / dimension).
      train_loss_is_nll: False when the training loss is not a likelihood (the Poisson task's
        'paper' weighting): the training curves are labelled as not in those units.

    Raises:
      FileNotFoundError: no ``metrics_jsonl_path``.
      ValueError: it has no validation record (nothing to draw the training loss against).
      OSError: the PNG cannot be written.
    """
    from infodiff import training

    c = training_curves(training.read_metrics(metrics_jsonl_path))
    tr, va, bits_key = c["train"], c["valid"], c["bits_key"]
    if not len(va["step"]):
        raise ValueError(f"{metrics_jsonl_path} has no validation records (split 'valid'; one is "
                         "written every train.eval_every steps and at the end of a run)")
    units = dict(_BITS_UNITS.get(bits_key, {"nll": "nats per item", "bits": "bits"}), **(units or {}))
    rows = [("loss", f"loss ({units['nll']})")]
    if bits_key:
        rows.append(("bits", units["bits"]))
    t_unit, t_div = _time_unit(float(max(tr["time_s"].max(initial=0.0), va["time_s"].max())))
    train_label = "train (window mean)" if train_loss_is_nll else "train (training weighting: not these units)"
    plt = _pyplot()
    from matplotlib import ticker

    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.6 * len(rows)), squeeze=False)
    for i, (key, ylabel) in enumerate(rows):
        for j, (xkey, div, xlabel) in enumerate((
                ("step", 1.0, "training step"),
                ("time_s", t_div, f"training wall-clock time ({t_unit}; resumed sessions joined)"))):
            ax = axes[i, j]
            if len(tr["step"]):
                ax.plot(*_line(tr, xkey, key, div), "-", color="C0", lw=1.2, label=train_label,
                        marker="." if len(tr["step"]) <= 60 else None)
                part = tr["partial"]
                if part.any():
                    ax.plot(tr[xkey][part] / div, tr[key][part], "o", mfc="none", color="C0",
                            label="partial window (resume / interruption)")
            ax.plot(*_line(va, xkey, key, div), "o-", color="C1", lw=1.5,
                    ms=4, label="validation (EMA)")
            if xkey == "time_s":
                for k, t in enumerate(c["resumes_s"]):
                    ax.axvline(t / div, color="0.5", ls=":", lw=1, label="resumed" if k == 0 else None)
            # from the run's start (step 0; the time before its first record) to its last record
            xmax = max(tr[xkey].max(initial=0.0), va[xkey].max()) / div
            ax.set_xlim(0, 1.03 * xmax if xmax > 0 else 1.0)
            if xkey == "step":
                ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if i == 0 and (j == 0 or c["resumes_s"]):
                ax.legend(fontsize=8)
    last = int(va["step"][-1])
    final = (f"{va['bits'][-1]:.4f} {units['bits']}" if bits_key else f"{va['loss'][-1]:.4f} {units['nll']}")
    name = os.path.basename(os.path.dirname(os.path.abspath(metrics_jsonl_path)))
    fig.suptitle(f"training curves of {name}: validation at step {last}: {final}")
    fig.tight_layout()
    _save(fig, path)
    return path


def input_rows_png(path, rows: list[dict], kind: str, quantity: str, bits: str = "bits per character") -> None:
    """The rows of a scored input file (:mod:`infodiff.evaluation.inputs`; ``path`` a file name
    or a binary file object): for documents and
    responses a histogram of bits per character and each row's NELBO (nats) +- 2 SE against its
    length (counts: against the row); for ratios each row's coupled log-ratio +- 2 SE, with the decoupled +- 2 SE beside it:
    the two panels are the kind's query's ``draw`` (:mod:`infodiff.evaluation.queries`)."""
    from infodiff.evaluation import queries

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    queries.get(kind).draw(axes, rows, quantity, bits)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def integer_axis(axis) -> None:
    """Integer ticks only on ``axis`` (an Axes' xaxis / yaxis: counts, 1-based rows)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def nll_rows_axes(axes, rows: list[dict], quantity: str, bits: str, counts: bool = False) -> None:
    """rows.png's panels of -log p rows (documents, responses; ``counts``: a Poisson run's examples):
    a histogram of bits per character / byte / dimension, and each row's NELBO (nats) +- 2 SE
    against its length (counts: against the row)."""
    from matplotlib.ticker import MaxNLocator

    v = np.array([r["value"] for r in rows])
    se = np.array([r["se"] for r in rows])
    bpc = np.array([r["bits_per_dim" if counts else "bits_per_byte" if "bits_per_byte" in r
                      else "bits_per_char"] for r in rows])
    axes[0].hist(bpc, bins=min(30, max(5, len(rows) // 2)), color="C0", edgecolor="white")
    axes[0].set_xlabel(bits)
    axes[0].set_ylabel("rows")
    axes[0].set_title(f"{quantity}: {len(rows)} rows")
    count = "bytes" if rows and "bytes" in rows[0] else "chars"
    n = np.arange(1, len(rows) + 1) if counts else np.array([r[count] for r in rows])
    axes[1].errorbar(n, v, yerr=2 * se, fmt="o", ms=3, capsize=2, color="C0")
    axes[1].set_xlabel(("bytes" if count == "bytes" else "characters") + " scored" if not counts else "row")
    axes[1].set_ylabel("NELBO (nats) ± 2 SE")  # an upper bound on the NLL
    axes[1].set_title("per row")
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))  # row counts


def compare_rows_png(path, rows: list[dict]) -> None:
    """The rows of a comparison of two runs (:mod:`infodiff.evaluation.comparison`; ``path`` a
    file name or a binary file object): each row's difference -log p_a - (-log p_b) +- 2 paired
    SE, the unpaired +- 2 SE beside it (nats), and a histogram of unpaired / paired SE per row."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    i = np.arange(1, len(rows) + 1)  # row numbers as in rows.jsonl (1-based)
    d = np.array([r["difference"] for r in rows])
    sp = np.array([r["se_paired"] for r in rows])
    su = np.array([r["se_unpaired"] for r in rows])
    axes[0].errorbar(i + 0.2, d, yerr=2 * su, fmt="none", capsize=0, color="C1", alpha=0.5, label="± 2 SE unpaired")
    axes[0].errorbar(i, d, yerr=2 * sp, fmt="o", ms=3, capsize=2, color="C0", label="± 2 SE paired")
    axes[0].axhline(0.0, color="grey", lw=0.8)
    axes[0].set_xlabel("row (1-based)")
    axes[0].set_ylabel("-log p_a - (-log p_b) (nats)")
    if len(rows) <= 30:  # the rows' ids
        axes[0].set_xticks(i, [str(r["id"]) for r in rows], rotation=90, fontsize=7)
        axes[0].set_xlabel("row id")
    else:
        axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_title(f"{len(rows)} rows; total {d.sum():+.2f} nats")
    axes[0].legend()
    ratio = su / np.where(sp > 0, sp, np.nan)
    if np.isfinite(ratio).any():
        axes[1].hist(ratio[np.isfinite(ratio)], bins=min(30, max(5, len(rows) // 2)), color="C2", edgecolor="white")
    axes[1].set_xlabel("SE unpaired / SE paired")
    axes[1].set_ylabel("rows")
    axes[1].set_title("what the pairing saves")
    axes[1].yaxis.set_major_locator(MaxNLocator(integer=True))  # row counts
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def intervals_png(path, rows: list[dict], quantity: str, level: float) -> None:
    """Per row of a scored input file (x: the rows, ids as ticks up to 30 rows; ``path`` a file
    name or a binary file object): its interval [``lower``, ``upper``] for the model's own -log p
    (infodiff/orders.py) as a bar (a square where it was computed exactly), and its NELBO
    ``value`` +- 2 ``se`` as a point, nats."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, min(16.0, 0.35 * len(rows) + 3)), 4))
    i = np.arange(1, len(rows) + 1)  # 1-based, as the rows
    lo = np.array([r["lower"] for r in rows])
    hi = np.array([r["upper"] for r in rows])
    exact = np.array([bool(r.get("exact")) for r in rows])
    ax.bar(i[~exact], (hi - lo)[~exact], bottom=lo[~exact], width=0.6, color="C0", alpha=0.45,
           label=f"{100 * level:g}% interval for the model's -log p (any order)")
    if exact.any():
        ax.plot(i[exact], lo[exact], "s", color="C0", ms=6, label="the model's -log p, exact (subset recursion)")
    ax.errorbar(i, [r["value"] for r in rows], yerr=[2 * r["se"] for r in rows], fmt="o", ms=3, capsize=2,
                color="C3", label="NELBO ± 2 SE")
    ax.set_xlabel("row")
    ax.set_ylabel(f"{quantity} (nats)")
    if len(rows) <= 30:
        ax.set_xticks(i, [str(r["id"]) for r in rows], rotation=90, fontsize=7)
        ax.set_xlabel("row id")
    ax.set_title(f"{len(rows)} rows: the model's own -log p and its NELBO (an upper bound)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def oracle_estimates_png(path: str, results: dict) -> bool:
    """An oracle report's estimators against the exact values: per section (-log p(x),
    -log p(y | x), the coupled and decoupled log-ratios) each estimator's mean estimate minus the
    exact mean (nats) +- 2 of its SEs, a line at 0; exact rows (SE 0) drawn as squares. Returns
    False (nothing written) when the report has no estimator rows."""
    sections = [(name, results.get(key, [])) for key, name in
                (("unconditional", "-log p(x)"), ("conditional", "-log p(y | x)"))]
    ratio = [dict(p[k], estimator=f"{p['estimator']}:{k}") for p in results.get("ratio", []) for k in ("coupled", "decoupled")]
    sections.append(("log p(y | x) - log p(y' | x)", ratio))
    sections = [(n, rows) for n, rows in sections if rows]
    if not sections:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(sections), figsize=(4.2 * len(sections) + 1, 4.2), squeeze=False)
    for ax, (name, rows) in zip(axes[0], sections):
        i = np.arange(len(rows))
        bias = np.array([r["bias"] for r in rows])
        se = np.array([r["bias_stderr"] for r in rows])
        exact = np.array([bool(r.get("exact")) for r in rows])
        ax.errorbar(i[~exact], bias[~exact], yerr=2 * se[~exact], fmt="o", ms=4, capsize=3, color="C0",
                    label="estimate - exact ± 2 SE")
        if exact.any():
            ax.plot(i[exact], bias[exact], "s", color="C2", label="exact (all subsets enumerated)")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xticks(i, [r["estimator"] for r in rows], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("bias (nats)")
        ax.set_title(f"{name}\nexact mean {rows[0]['mean_exact']:.3f} nats", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    return True
