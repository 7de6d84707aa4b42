"""``evaluate.py --workdir W --config.eval.input=FILE``: score a user's file with a trained
run and write a report, per-row files and plots. What a run scores is its process
registration's ``input_format`` (:mod:`infodiff.tasks`): 'text' (masked and SEDD runs, through
:mod:`infodiff.scoring`) or 'counts' (Poisson runs: a ``.npy`` of counts [N, *event_shape] or
[N, D] -> -log P(x) per example). Each input kind is one file of :mod:`infodiff.evaluation.queries`
(detection, reading, scoring, rows, plots, report.txt lines, config keys); this module holds the
parts they share: decoding, empty rows, the keyed .jsonl reader, the text scorer
(:func:`score_rows`), the report (:func:`input_report`) and the rows files.
Every -log p is the trained network's NELBO (an upper bound on
its -log p); a ratio is a difference of two NELBOs, not a bound. The report's ``bound`` says
which (``'nelbo'`` or ``'nelbo_difference'``, :data:`report.BOUNDS`); ``units`` are units only.

Text formats (by extension):
  * ``.txt``: one document per line (``eval.input_unit = 'line'``, empty lines skipped; ids are
    line numbers) or the whole file as one document (``'file'``): -log p(document);
  * ``.jsonl``, every line ``{"prompt", "response"}``: -log p(response | prompt);
  * ``.jsonl``, every line ``{"prompt", "a", "b"}``: the coupled log p(a | prompt) -
    log p(b | prompt), with the decoupled estimate's SE beside it.
  An optional ``"id"`` per JSONL line names the row. A row whose scored text (a line, a response,
  a or b) is empty after the run's tokenizer (text8: only punctuation, digits aside) is skipped with
  a note naming it; a file left with no rows is an error. ``eval.limit`` = N > 0 scores the first N
  rows. Output in ``eval.output_dir`` or else ``W/scores/<file name>-<8 hex digits of its folder's
  absolute path>/`` (:func:`default_out_dir`): report.json / report.txt (schema: docs/report.md, kind
  'input'), rows.jsonl, rows.csv (every row with the text it scored) and rows.png. A folder that
  already holds a report is refused unless ``eval.overwrite`` (infodiff.evaluation.run).

Byte runs (``data.name = 'bytes'``, tokenizer :data:`infodiff.scoring.BYTES`) read the file as bytes
and score each row's bytes as they are, invalid UTF-8 included (named in a note); they report bits
per byte (lm-eval's ``bits_per_byte``: total -log2 p / UTF-8 bytes) and byte perplexity. The Monte Carlo budget is ``eval.input_samples`` samples per window; with
  ``eval.target_se`` > 0 (nats) rounds are added until every row's SE is at most it, up to
  ``eval.input_max_samples`` per window.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import stat
import sys
import time

import numpy as np

from infodiff import provenance, scoring
from infodiff.validation import check_num_samples
from infodiff.evaluation import intervals, plots
from infodiff.evaluation.jsonl import json_rows, row_id  # noqa: F401  (re-exported)
from infodiff.evaluation import report as report_lib

__all__ = ["read_input", "evaluate_input", "evaluate_input_with", "evaluate_text", "unit_count", "score_rows", "TextScoring", "Request", "ReportContext",
           "INPUT_UNITS", "row_attachments", "row_errors", "sha256", "run_checkpoint",
           "default_out_dir", "shown", "json_rows", "row_id"]

INPUT_UNITS = ("line", "file")
LN2 = math.log(2.0)


def _decode_bytes(path: str, data: bytes, notes: list | None) -> str:
    """The text of a user file for a byte run: UTF-8, bytes that are not UTF-8 kept as lone
    surrogates (``errors='surrogateescape'``), so :data:`infodiff.scoring.BYTES` scores the file's
    own bytes; a note names the lines that are not UTF-8. A leading byte order mark (EF BB BF)
    is not scored (it marks the encoding, not the text; a file saved with and without one scores
    the same), and a note says so."""
    text = data.decode("utf-8-sig", errors="surrogateescape")
    if data.startswith(b"\xef\xbb\xbf") and notes is not None:
        notes.append(f"eval.input {path}: its leading UTF-8 byte order mark (3 bytes, EF BB BF) is not scored: it "
                     "marks the encoding, not the text")
    bad = []
    for i, raw in enumerate(data.split(b"\n"), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    if bad:
        shown_ = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
        note = (f"eval.input {path}: line{'s' * (len(bad) != 1)} {shown_} {'are' if len(bad) != 1 else 'is'} not "
                "valid UTF-8: its bytes are scored as they are, not replaced (rows.jsonl shows them as \\xNN)")
        if notes is not None:
            notes.append(note)
    return text


def shown(text: str) -> str:
    """``text`` for rows.jsonl / rows.csv: itself, with bytes that are not UTF-8 (lone surrogates of a
    byte run's file) written as ``\\xNN``."""
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="backslashreplace")


def _decode(path: str, data: bytes, notes: list | None) -> str:
    """The text of a user file: UTF-8 (a BOM is dropped). Bytes that are not UTF-8 are replaced
    by U+FFFD (which the text8 cleaning then removes), with one warning naming the file, the
    lines and the count, also appended to ``notes`` (the report's)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    text = data.decode("utf-8-sig", errors="replace")
    bad, count = [], 0
    for i, raw in enumerate(data.split(b"\n"), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)  # replacement characters, less the file's own U+FFFD (bytes EF BF BD)
            count += raw.decode("utf-8", errors="replace").count("\ufffd") - raw.count(b"\xef\xbf\xbd")
    shown = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
    note = (f"eval.input {path}: not UTF-8: {count} invalid byte sequence{'s' * (count != 1)} on {len(bad)} "
            f"line{'s' * (len(bad) != 1)} (line{'s' * (len(bad) != 1)} {shown}), each replaced by U+FFFD, which "
            "the text8 cleaning removes: the scored text differs there (re-encode the file as UTF-8, e.g. "
            "iconv -f latin1 -t utf-8)")
    from absl import logging

    logging.warning("%s", note)
    if notes is not None:
        notes.append(note)
    return text


def _empty_why(tokenizer) -> str:
    return ("after cleaning to the text8 alphabet (a-z and space)" if tokenizer.name == "text8"
            else f"after {tokenizer.name} tokenization")


def _skip_empty(path: str, kind: str, ids: list, cols: dict, lines: list, tokenizer, notes: list | None):
    """Drop the rows whose scored text (a line, a response, a or b) is empty after ``tokenizer``
    (text8: nothing but punctuation): a note names their lines. ValueError if no row is left."""
    names = queries.get(kind).scored
    empty = [i for i in range(len(ids)) if any(len(tokenizer.encode(cols[n][i])[0]) == 0 for n in names)]
    if not empty:
        return ids, cols
    where = [str(lines[i]) for i in empty]
    if len(empty) == len(ids):
        raise ValueError(f"eval.input {path}: every row is empty {_empty_why(tokenizer)} (lines "
                         f"{', '.join(where[:10])}{', ...' if len(where) > 10 else ''}): nothing to score; give "
                         "the rows letters")
    note = (f"eval.input {path}: skipped {len(empty)} row{'s' * (len(empty) != 1)} whose "
            f"{' or '.join(names)} is empty {_empty_why(tokenizer)}, not scored: line{'s' * (len(empty) != 1)} "
            f"{', '.join(where[:10])}{', ...' if len(where) > 10 else ''}")
    from absl import logging

    logging.warning("%s", note)
    if notes is not None:
        notes.append(note)
    keep = [i for i in range(len(ids)) if i not in set(empty)]
    return [ids[i] for i in keep], {k: [v[i] for i in keep] for k, v in cols.items()}


def check_input_path(path: str, what: str = "eval.input") -> None:
    """Refuse, without reading it, a path that is not a regular file, naming what it is: missing
    (FileNotFoundError), a directory, a FIFO (reading one would wait for a writer), a device
    (/dev/zero never ends), a socket or a loop of symbolic links (ValueError, one line)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        why = " (a symbolic link to a missing file)" if os.path.islink(path) else ""
        raise FileNotFoundError(f"{what}: file not found: {path!r}{why}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{what} {path!r} is a loop of symbolic links: give a regular file") from None
        raise
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(st.st_mode):
            raise ValueError(f"{what} {path!r} is {kind}, not a regular file: give a .txt or .jsonl file")


def read_input(path: str, unit: str = "line", notes: list | None = None,
               tokenizer: scoring.Tokenizer = scoring.TEXT8) -> tuple[str, list[str], dict]:
    """(kind 'text' | 'pairs' | 'ratios', row ids, columns {name: list of str}) of a user file.

    ``tokenizer``: the run's (:class:`infodiff.scoring.Tokenizer`). Text8: the file is read as
    UTF-8; bytes that are not are replaced by U+FFFD with a one-line warning naming the file, its
    lines and the count. Bytes (:data:`infodiff.scoring.BYTES`): bytes that are not UTF-8 are kept
    (:func:`_decode_bytes`). Rows empty after ``tokenizer`` are skipped (:func:`_skip_empty`). Notes
    are appended to ``notes`` when given.
    Raises FileNotFoundError for a missing file; ValueError (naming the file and line) for an
    unknown extension or unit, a line that is not a JSON object, missing or non-string fields,
    lines of different kinds, a whole file (``unit='file'``) or every row empty after
    ``tokenizer``, or a file with no rows."""
    check_input_path(path)
    if unit not in INPUT_UNITS:
        raise ValueError(f"config.eval.input_unit={unit!r}; choose from {INPUT_UNITS}")
    ext = os.path.splitext(path)[1].lower()
    with open(path, "rb") as f:
        text = (_decode if tokenizer.cleans else _decode_bytes)(path, f.read(), notes)
    # lines end at \n (or \r\n) only: other Unicode line breaks stay inside a line or string
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    if ext == ".txt":
        if unit == "file":
            if len(tokenizer.encode(text)[0]) == 0:
                raise ValueError(f"{path}: the file is empty {_empty_why(tokenizer)}: nothing to score; give it "
                                 "letters")
            return "text", ["file"], {"text": [text]}
        rows = [(str(i + 1), ln) for i, ln in enumerate(lines) if ln.strip()]
        if not rows:
            raise ValueError(f"eval.input {path!r} has no non-empty lines")
        ids, cols = _skip_empty(path, "text", [r[0] for r in rows], {"text": [r[1] for r in rows]},
                                [r[0] for r in rows], tokenizer, notes)
        return "text", ids, cols
    if ext != ".jsonl":
        raise ValueError(f"eval.input {path!r}: unknown format {ext or '(no extension)'!r}; use .txt (one "
                         "document per line) or .jsonl ({\"prompt\", \"response\"} or {\"prompt\", \"a\", \"b\"})")
    if unit != "line":
        raise ValueError("config.eval.input_unit='file' applies to .txt inputs only")
    own = queries.detect(path)  # a kind with its own reader (multiple choice), by its first row
    if own is not None and own.read is not None:
        return own.read(path, lines)
    kinds = {q.row_keys: q.name for q in queries.serving("text") if q.row_keys}
    kind, ids, cols = None, [], {}
    seen, line_of = {}, []
    for i, obj in json_rows(path, lines):
        keys = tuple(sorted(k for k in obj if k != "id"))
        k = kinds.get(keys)
        if k is None:
            raise ValueError(f"{path}:{i}: keys {sorted(obj)}; expected {{\"prompt\", \"response\"}} or "
                             "{\"prompt\", \"a\", \"b\"} (and optionally \"id\")")
        if kind is not None and k != kind:
            raise ValueError(f"{path}:{i}: a {k} line in a file of {kind} (line 1): use one kind per file")
        kind = k
        for name in keys:
            if not isinstance(obj[name], str):
                raise ValueError(f"{path}:{i}: {name!r} must be a string, got {type(obj[name]).__name__}")
            cols.setdefault(name, []).append(obj[name])
        ids.append(row_id(path, i, obj, seen))
        line_of.append(i)
    if kind is None:
        raise ValueError(f"eval.input {path!r} has no rows")
    ids, cols = _skip_empty(path, kind, ids, cols, line_of, tokenizer, notes)
    return kind, ids, cols


def default_out_dir(workdir: str, path: str) -> str:
    """``W/scores/<file name>-<first 8 hex digits of sha256(absolute path of its folder)>/``: the
    extension is kept (docs.txt and docs.jsonl do not collide), and files of one name in different
    folders do not either."""
    folder = os.path.dirname(os.path.abspath(path))
    tag = hashlib.sha256(folder.encode("utf-8", errors="surrogateescape")).hexdigest()[:8]
    return os.path.join(workdir, "scores", f"{os.path.basename(path)}-{tag}")


def output_dir_of(config, workdir: str) -> str:
    """Where an input evaluation writes: ``eval.output_dir`` if set, else :func:`default_out_dir`."""
    chosen = str(config.eval.get("output_dir", "") or "")
    return chosen or default_out_dir(workdir, str(config.eval.input))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def row_errors(fn, ids):
    """Re-raise a scoring ValueError about row i (texts[3], a[0], ...) naming the row's id."""
    import re

    try:
        return fn()
    except ValueError as e:
        m = re.match(r"(\w+)\[(\d+)\] (.*)", str(e))
        if m and int(m.group(2)) < len(ids):
            raise ValueError(f"row {ids[int(m.group(2))]!r}: {m.group(1)} {m.group(3)}") from None
        raise


def apply_limit(config, rows, n: int):
    """(the first ``eval.limit`` rows, [a note]) when 0 < limit < n; ``eval.limit`` = 0: all rows.
    ``rows``: a list, or a dict of lists (columns). ValueError for a negative limit."""
    limit = int(config.eval.get("limit", 0) or 0)
    if limit < 0:
        raise ValueError(f"config.eval.limit={limit} must be >= 0 (0: every row)")
    if not limit or limit >= n:
        return rows, []
    cut = {k: v[:limit] for k, v in rows.items()} if isinstance(rows, dict) else rows[:limit]
    return cut, [f"config.eval.limit={limit}: the first {limit} of {n} rows scored"]


def run_checkpoint(run) -> dict | None:
    """``{"step", "state_sha256"}`` of the checkpoint a :class:`scoring.Run` scores with (its
    report's ``provenance.checkpoint``); None for an external denoiser (no checkpoint)."""
    if run.checkpoint_step is None:
        return None
    return {"step": run.checkpoint_step, "state_sha256": run.checkpoint_sha256}


@dataclasses.dataclass
class ReportContext:
    """What an input report is built from (:func:`_report`).

    Attributes:
      config: the run's config (``eval.*`` read: input_unit, use_ema, seed).
      kind: the input kind (a :data:`queries.REGISTRY` name; the report's ``input.format``).
      quantity: what a row's value is, in words.
      units: the report's ``units`` ({'item', 'nll', 'bits'}).
      bound: :data:`report.BOUNDS` ('nelbo' or 'nelbo_difference').
      path: the scored file; n_rows: its rows scored.
      workdir: the run's directory.
      checkpoint: :func:`provenance.checkpoint_info` of the checkpoint scored with (None for an
        external denoiser).
      model_length: the model's length (tokens L or dimensions D).
      est: the Estimate (or what the report reads of one: estimator, samples, SE method).
      summary: the report's ``summary``; process_info: its ``process``; cleaning: its
        ``cleaning`` (None: absent).
      rows: the per-row dicts (rows.jsonl / rows.csv); out_dir: where the report goes.
      t0: the start time (time.time()).
      interval: the report's ``interval`` block (absent by default).
      figures: more (file name, draw(binary file)) beside rows.png.
    """

    config: object
    kind: str
    quantity: str
    units: dict
    bound: str
    path: str
    n_rows: int
    workdir: str
    checkpoint: dict | None
    model_length: int
    est: object
    summary: dict
    process_info: dict
    cleaning: dict | None
    rows: list
    out_dir: str
    t0: float
    interval: object = report_lib.ABSENT
    figures: tuple = ()


def input_report(ctx: ReportContext) -> dict:
    """The input report of ``ctx`` (a :class:`report.Report` carrying rows.jsonl, rows.csv and
    the figures)."""
    config, kind, quantity, units, bound, path = ctx.config, ctx.kind, ctx.quantity, ctx.units, ctx.bound, ctx.path
    n_rows, workdir, checkpoint, model_length, est = ctx.n_rows, ctx.workdir, ctx.checkpoint, ctx.model_length, ctx.est
    summary, process_info, cleaning, rows, out_dir = ctx.summary, ctx.process_info, ctx.cleaning, ctx.rows, ctx.out_dir
    t0, interval, figures = ctx.t0, ctx.interval, ctx.figures
    ev = config.eval
    sha = sha256(path)
    attachments, plot_notes = row_attachments(rows, [
        ("rows.png", lambda buf: plots.input_rows_png(buf, rows, kind, quantity, units.get("bits", "bits per character"))),
        *figures])
    files = [os.path.join(out_dir, name) for name in attachments]
    rep = report_lib.InputReport(
        quantity=quantity, bound=bound, process=process_info, units=units,
        input={"path": os.path.abspath(path), "sha256": sha, "format": kind,
               "unit": str(ev.get("input_unit", "line")), "rows": n_rows},
        workdir=os.path.abspath(workdir), checkpoint_step=None if checkpoint is None else checkpoint["step"],
        params="ema" if bool(ev.use_ema) else "raw", model_length=model_length,
        estimator=est.estimator, infinite_variance=bool(est.infinite_variance),
        num_samples_per_window=int(est.num_samples),
        forward_passes=int(sum(r["forward_passes"] for r in rows)), **report_lib.se_fields(est), summary=summary,
        rows_preview=rows[:10], cleaning=report_lib.ABSENT if cleaning is None else cleaning,
        plot_notes=plot_notes or report_lib.ABSENT, interval=interval, files=files,
        plots=[p for p in files if p.endswith(".png")],
        **report_lib.common(config, int(ev.seed), t0, checkpoint=checkpoint,
                            data={"path": os.path.abspath(path), "sha256": sha}))
    out = report_lib.Report(rep.to_dict(), attachments=attachments)
    if est.few_samples and not est.infinite_variance:
        key = queries.get(kind).few_samples_key
        out.setdefault("notes", []).append(
            f"config.{key}={est.num_samples} is below the estimator's min_samples={est.min_samples}: the per-row "
            f"SEs are too small (few_samples); use --config.{key}={est.min_samples} or more")
    return out


def evaluate_input(config, workdir: str) -> tuple[dict, str]:
    """Score ``config.eval.input`` with the run in ``workdir``; returns (report, output dir).
    Writes nothing: the report (a :class:`report.Report`) carries rows.jsonl, rows.csv and
    rows.png, written with report.json and report.txt as one unit by the caller
    (:func:`report.write_report`), after it has printed the table. One path: the file's query
    (:func:`queries.detect` for the run's process input format) scores it; a file no kind claims
    goes to the format's first reader, which names why it is refused."""
    from infodiff import tasks

    fmt = tasks.registration(config).input_format
    query = queries.detect(str(config.eval.input), fmt) or queries.serving(fmt)[0]
    return query.evaluate(config, workdir, time.time())


def evaluate_input_with(config, directory: str, run) -> tuple[dict, str]:
    """Score ``config.eval.input`` with a Run already loaded (a released checkpoint in ``directory``,
    :mod:`infodiff.pretrained`): the report of :func:`evaluate_input`, written by the caller."""
    return evaluate_text(config, directory, time.time(), run=run)


@dataclasses.dataclass
class Request:
    """A text file read for scoring (:func:`evaluate_text`), handed to its query's ``score``.

    Attributes: config, workdir, t0 (start time), path (the file), kind (its query's name), ids
    (row ids), cols ({column: list}), run (:class:`infodiff.scoring.Run`), order (the run's
    any-order settings or None), notes (the reader's and ``eval.limit``'s)."""

    config: object
    workdir: str
    t0: float
    path: str
    kind: str
    ids: list
    cols: dict
    run: object
    order: dict | None
    notes: list


def evaluate_text(config, workdir, t0, run=None) -> tuple[dict, str]:
    """A text run's file (.txt / .jsonl): read (:func:`read_input`), then scored by its kind's
    query (``queries.get(kind).score``) through :mod:`infodiff.scoring`. ``run``: a Run already
    loaded (a released checkpoint, :mod:`infodiff.pretrained`; ``workdir`` its directory), else the
    run in ``workdir``."""
    from infodiff import tasks

    ev = config.eval
    path = str(ev.input)
    read_notes: list = []
    tokenizer = run.tokenizer if run is not None else tasks.make_task(config).tokenizer
    kind, ids, cols = read_input(path, str(ev.input_unit), notes=read_notes, tokenizer=tokenizer)
    (ids, cols), limit_notes = _limit_rows(config, ids, cols)
    run = run if run is not None else scoring.load_run(workdir, config=config)
    order = run.task.order_settings()
    return queries.get(kind).score(Request(config, workdir, t0, path, kind, ids, cols, run, order,
                                           read_notes + limit_notes))


@dataclasses.dataclass(frozen=True)
class TextScoring:
    """How :func:`score_rows` scores one kind of text rows (a query's part of the shared path).

    Attributes:
      quantity: what a row's value is, in words (the report's ``quantity``).
      estimate: ``estimate(run, ids, cols, tse, per) -> (est, chars or None, summary, extra)``
        (``per``: the tokenizer's unit names, :func:`_per_unit`).
      row: ``row(est, i, extra) -> dict``: the kind's own fields of row i (bits per unit aside).
      interval: ``interval(run, cols, kw)``: the any-order interval (None: the kind gets none).
      interval_refusal: the one-line error for ``eval.interval=True`` (``{path}`` filled in)
        where ``interval`` is None.
      prompted: whether rows have a prompt (prompt_chars / context_chars, the cut-prompt note).
    """

    quantity: str
    estimate: object
    row: object = None
    interval: object = None
    interval_refusal: str = ""
    prompted: bool = True


def score_rows(req: Request) -> tuple[dict, str]:
    """-log p (or a log-ratio) per row of a text file of a kind with :class:`TextScoring`
    (``queries.get(kind).scoring``)."""
    config, workdir, t0, path, kind, ids, cols = req.config, req.workdir, req.t0, req.path, req.kind, req.ids, req.cols
    run, order, notes = req.run, req.order, req.notes
    how = queries.get(kind).scoring
    ev = config.eval
    if order and order["interval"] and how.interval is None:
        raise ValueError(how.interval_refusal.format(path=path))
    out_dir = output_dir_of(config, workdir)
    report_lib.refuse_existing(out_dir, config)  # after the file's and the settings' checks, before any work
    rows, summary = [], {}
    per = _per_unit(run.tokenizer)
    tse = float(ev.target_se) or None
    if tse is not None and tse < 0:
        raise ValueError(f"config.eval.target_se={ev.target_se} must be >= 0 (0: a fixed budget)")
    est, chars, summary, extra = how.estimate(run, ids, cols, tse, per)
    changed = run.last_changed
    oi, t_interval = None, time.time()
    if order and order["interval"]:
        kw = dict(orders=order["orders"], level=order["level"], proposal=order["proposal"], progress=True, nelbo=est)
        oi = how.interval(run, cols, kw)
        run.last_changed = changed
    t_interval = time.time() - t_interval
    passes = est.info["forward_passes_per_row"]
    for i, rid in enumerate(ids):
        r = {"id": rid, "value": float(est.mean[i]), "se": float(est.stderr[i]), "samples": int(est.num_samples),
             "windows": int(est.info["windows_per_row"][i]), "forward_passes": int(passes[i]),
             "changed_chars": int(sum(changed[i].values()))}
        if how.prompted:
            r.update(prompt_chars=int(run.last_context[i]), context_chars=int(est.info["context_per_row"][i]))
        if chars is not None:
            r.update(_per_row(per, float(est.mean[i]), float(est.stderr[i]), int(chars[i])))
        if how.row is not None:
            r.update(how.row(est, i, extra))
        if oi is not None:
            r.update(intervals.row_fields(oi, i))
        r.update(_scored_text(kind, cols, i, run.tokenizer))
        rows.append(r)
    all_changed: dict = {}
    for c in changed:
        for k, v in c.items():
            all_changed[k] = all_changed.get(k, 0) + v
    quantity = how.quantity
    cleaning = None
    if run.tokenizer.cleans:
        cleaning = {"statement": (f"a CLEANED copy is scored, not the input as given ({run.tokenizer.name}: case "
                                  "folded, digits spelled out, other characters a space"
                                  + ("; bits per cleaned character" if chars is not None else "")
                                  + "; rows.jsonl: original and cleaned)"),
                    "rules": "text8 (infodiff.data.text.CLEANING_RULES)",
                    "rows_changed": int(sum(1 for c in changed if c)), "characters": all_changed}
    if how.prompted:
        cut = [r for r in rows if r["context_chars"] < r["prompt_chars"]]
        unseen = [r["id"] for r in rows if r["prompt_chars"] > 0 and r["context_chars"] == 0]
        summary.update(rows_prompt_cut=len(cut), rows_prompt_unseen=len(unseen))
    rep = input_report(ReportContext(
        config, kind, quantity, {"item": "row", "nll": "nats per row", "bits": f"bits per {per['unit']}"},
        est.info["bound"], path, len(ids), workdir, run_checkpoint(run), run.seq_len, est, summary,
        run.task.process_info(run.process), cleaning, rows, out_dir, t0, **({} if oi is None else {
            "interval": intervals.block(oi, chars, t_interval, count="rows", nelbo_total_stderr=est.total()[1]),
            "figures": [("intervals.png", lambda buf: plots.intervals_png(buf, rows, quantity, oi.level))]})))
    if notes:
        rep.setdefault("notes", []).extend(notes)
    if tse is not None:
        rep.update(target_se=tse, target_se_reached=bool(est.info["target_se_reached"]),
                   max_samples_per_window=int(est.info["max_samples"]))
        if not est.info["target_se_reached"]:
            rep.setdefault("notes", []).append(
                f"target_se {tse} not reached by every row at {est.num_samples} samples per window "
                f"(config.eval.input_max_samples); the largest SE is {float(est.stderr.max()):.4g}")
    if how.prompted and cut:
        rep.setdefault("notes", []).append(
            f"{len(cut)} of {len(rows)} rows saw only the last characters of their prompt (the model sees "
            f"{run.seq_len} characters: the response's first window keeps L - its length; rows.jsonl: context_chars)"
            + (f"; {len(unseen)} rows saw none of it (a response of {run.seq_len} characters or more): ids "
               f"{', '.join(unseen[:10])}" if unseen else ""))
    return rep, out_dir


def _limit_rows(config, ids, cols):
    """((ids, cols) of the first ``eval.limit`` rows, notes): :func:`_limit` of a text file's rows."""
    kept, notes = apply_limit(config, {"__id": ids, **cols}, len(ids))
    kept = dict(kept)
    return (kept.pop("__id"), kept), notes


def _scored_text(kind: str, cols: dict, i: int, tokenizer) -> dict:
    """What row i scored: its fields as given (:func:`shown`) and, for a tokenizer that cleans, each
    as scored (``<field>_cleaned``)."""
    names = queries.get(kind).shown
    field = {"text": "document"}  # a row's key 'text' would shadow the report schema's Schema.text
    out = {field.get(n, n): shown(cols[n][i]) for n in names}
    if tokenizer.cleans and tokenizer.cleaned is not None:
        out.update({f"{field.get(n, n)}_cleaned": tokenizer.cleaned(cols[n][i]) for n in names})
    return out



# Per-unit names of a text run's counts and rates (the tokenizer's unit): rows, then the summary.
_UNITS = {"character": {"unit": "character", "count": "chars", "bits": "bits_per_char", "total": "characters"},
          # a subword tokenizer (a released checkpoint's): bits per byte of the original UTF-8 text
          "token": {"unit": "byte", "count": "bytes", "bits": "bits_per_byte", "total": "bytes",
                    "perplexity": "byte_perplexity"},
          "byte": {"unit": "byte", "count": "bytes", "bits": "bits_per_byte", "total": "bytes",
                   "perplexity": "byte_perplexity"}}


def unit_count(run, text: str) -> int:
    """The units of ``text`` its bits are per: tokens of a character or byte tokenizer, UTF-8 bytes
    of the original text for a subword tokenizer (unit 'token')."""
    if run.tokenizer.unit == "token":
        return len(text.encode("utf-8", errors="surrogateescape"))
    return len(run.encode(text))


def _per_unit(tokenizer) -> dict:
    return _UNITS.get(tokenizer.unit, _UNITS["character"])


def _rates(per: dict, nats: float, se: float, n: int) -> dict:
    """Bits per unit (``nats`` / (n ln 2)) with its SE; for bytes also the byte perplexity exp(nats / n),
    lm-eval's ``byte_perplexity``, its SE by the delta method (exp(nats / n) se / n)."""
    out = {per["bits"]: nats / (n * LN2), per["bits"] + "_stderr": se / (n * LN2)}
    if "perplexity" in per:
        ppl = math.exp(nats / n)
        out.update({per["perplexity"]: ppl, per["perplexity"] + "_stderr": ppl * se / n})
    return out


def _per_row(per: dict, nats: float, se: float, n: int) -> dict:
    return {per["count"]: n, **_rates(per, nats, se, n)}


def totals(est, chars, per: dict = _UNITS["character"], run=None, texts=()) -> dict:
    total, total_se = est.total()
    n = int(chars.sum())
    out = {"total_nats": total, "total_stderr": total_se, "mean_nll_per_row": float(est.mean.mean()),
           per["total"]: n, **_rates(per, total, total_se, n)}
    if run is not None and run.tokenizer.unit == "token":  # a subword tokenizer: also nats per token
        tokens = int(sum(len(run.encode(t)) for t in texts))
        out.update(tokens=tokens, nll_per_token=total / tokens, nll_per_token_stderr=total_se / tokens)
    return out


def row_attachments(rows: list[dict], figures) -> tuple[dict, list[str]]:
    """({file name: bytes} of rows.jsonl, rows.csv and the ``figures`` [(name, draw(binary file))]
    that could be drawn, [why each other figure was not drawn])."""
    attachments, notes = _rows_files(rows), []
    for name, draw in figures:
        buf = io.BytesIO()
        try:
            draw(buf)
            attachments[name] = buf.getvalue()
        except (OSError, ValueError) as e:
            notes.append(f"{name} not drawn: {e}")
    return attachments, notes


def _rows_files(rows: list[dict]) -> dict:
    """rows.jsonl and rows.csv as bytes (written with the report, as one unit: report.write_report)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    return {"rows.jsonl": "".join(json.dumps(report_lib.strict_json(r)) + "\n" for r in rows).encode("utf-8"),
            "rows.csv": buf.getvalue().encode("utf-8")}


# The input kinds (imported last: each kind's file uses the helpers above).
from infodiff.evaluation import queries  # noqa: E402
