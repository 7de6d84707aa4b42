"""Input kinds: what ``evaluate.py --workdir W --config.eval.input=FILE`` scores, one file each.

Each kind registers one :class:`Query` (``queries/text.py``, ``pairs.py``, ``ratios.py``,
``choices.py``, ``counts.py``): how its file is detected (extension and, for a ``.jsonl``, the keys
of the first row), read, scored through the run (:class:`infodiff.scoring.Run` or, for counts, the
task's denoiser), summarised, written as rows, drawn in rows.png and described in report.txt, and
which ``eval.*`` keys it reads. :data:`REGISTRY` maps the report's ``input.format`` to the query;
:func:`detect` is the only place a file's kind is decided, and nothing else compares kind names.

Adding an input kind: a ``queries/<name>.py`` that calls :func:`register` (every module of this
package is imported), and its test. The common parts (decoding, empty rows, the report's head,
rows files) live in :mod:`infodiff.evaluation.inputs`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

__all__ = ["Query", "REGISTRY", "register", "get", "detect", "serving", "reads_key", "INPUT_KEYS"]


@dataclasses.dataclass(frozen=True)
class Query:
    """What the evaluation needs to know about one input kind.

    Attributes:
      name: the kind, the report's ``input.format``.
      extension: the file name ending it reads ('.txt', '.jsonl', '.npy').
      input_format: the runs that score it: a process registration's ``input_format``
        (:data:`infodiff.tasks.INPUT_FORMATS`: 'text' or 'counts').
      detects: ``detects(first_row) -> bool`` for a ``.jsonl`` kind: whether a file whose first
        non-empty line is the JSON object ``first_row`` is of this kind (None: by extension only).
      row_keys: the keys of every row besides "id" of a kind read by the shared keyed .jsonl
        reader (:func:`infodiff.evaluation.inputs.read_input`), sorted; () otherwise.
      scored: the columns whose text is scored (a row empty in one of them is skipped).
      shown: the columns written to rows.jsonl as what the row scored.
      read: ``read(path, lines) -> (kind, ids, cols)`` for a kind with its own reader (choices);
        None: the shared readers of :mod:`infodiff.evaluation.inputs`.
      evaluate: ``evaluate(config, workdir, t0) -> (report, output dir)``: the whole path of a file
        of this kind (text kinds share :func:`infodiff.evaluation.inputs.evaluate_text`, which
        reads the file and hands it to the kind's ``score``).
      score: ``score(request) -> (report, output dir)`` of a file read by ``evaluate_text``
        (:class:`infodiff.evaluation.inputs.Request`); None for a kind whose ``evaluate`` does all.
      scoring: what the shared text scorer (:func:`infodiff.evaluation.inputs.score_rows`) needs
        of the kind (:class:`infodiff.evaluation.inputs.TextScoring`); None: its own ``score``.
      load: ``load(path) -> rows``: read a file of this kind with default settings (contract tests).
      draw: ``draw(axes, rows, quantity, bits)``: the two panels of rows.png.
      summary_lines: ``summary_lines(report, bound_name) -> [(label, value)]`` for report.txt.
      preview: ``preview(rows_preview, bound_name) -> (header, body)``: report.txt's row table.
      config_keys: the ``eval.*`` keys of :data:`INPUT_KEYS` it reads (the rest are refused,
        :mod:`infodiff.config_usage`).
      compare: ``compare(cols) -> (rows kwargs of infodiff.compare.compare, scored texts, quantity)``
        for ``--compare``; None: refused with ``compare_refusal``.
      compare_refusal: the one-line reason ``--compare`` refuses this kind (``{path}`` filled in).
      few_samples_key: the config key named when the samples are below the estimator's minimum.
      sample: ``sample(dir) -> path``: write a small valid file of this kind (contract tests).
      malformed: ``malformed(dir) -> path``: a file of this kind with one bad row (contract tests).
    """

    name: str
    extension: str
    input_format: str
    evaluate: Callable[[Any, str, float], tuple]
    score: Callable[[Any], tuple] | None
    draw: Callable
    summary_lines: Callable
    preview: Callable
    config_keys: tuple[str, ...]
    detects: Callable[[dict], bool] | None = None
    row_keys: tuple[str, ...] = ()
    scored: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()
    read: Callable | None = None
    scoring: Any = None
    load: Callable[[str], list] | None = None
    compare: Callable | None = None
    compare_refusal: str = ""
    few_samples_key: str = "eval.input_samples"
    sample: Callable[[str], str] | None = None
    malformed: Callable[[str], str] | None = None


REGISTRY: dict[str, Query] = {}

# The conditional eval.* keys of scoring a file: each read only by the kinds that declare it.
INPUT_KEYS = ("eval.input_unit", "eval.input_samples", "eval.target_se", "eval.input_max_samples",
              "eval.choice_confidence", "eval.choice_samples", "eval.choice_max_samples")


def register(query: Query) -> Query:
    """Add ``query`` to :data:`REGISTRY` under ``query.name`` (replacing one of that name) and return it.
    Raises ValueError for a config key outside :data:`INPUT_KEYS` and ``eval.limit``."""
    bad = [k for k in query.config_keys if k not in INPUT_KEYS + ("eval.limit",)]
    if bad:
        raise ValueError(f"Query({query.name!r}).config_keys: {bad} not in {INPUT_KEYS + ('eval.limit',)}")
    REGISTRY[query.name] = query
    return query


def get(name: str) -> Query:
    """The query of a report's ``input.format`` ``name`` (KeyError naming it otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"input format {name!r}; registered: {tuple(REGISTRY)}") from None


def serving(input_format: str) -> list[Query]:
    """The queries a run of process input format ``input_format`` scores, in registration order."""
    return [q for q in REGISTRY.values() if q.input_format == input_format]


def first_row(path: str):
    """The first non-empty line of ``path`` as JSON (a UTF-8 BOM allowed); None for a line that is
    not JSON or no line; ``...`` (Ellipsis) for a path that is not a readable regular file (its
    own error is reported where it is read)."""
    if not os.path.isfile(str(path)):
        return ...  # missing, a directory, a FIFO (never opened: it would wait for a writer), a device
    try:
        with open(str(path), encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                if line.strip():
                    try:
                        return json.loads(line)
                    except (ValueError, RecursionError):
                        return None
    except OSError:
        return ...
    return None


def detect(path, input_format: str = "text") -> Query | None:
    """The query of the file ``path`` for a run of ``input_format``: the only kind of that format,
    else by extension and (``.jsonl``) the first row's keys (each query's ``detects``); a ``.jsonl``
    that cannot be opened goes to the kind with its own reader that detects anything (its own error
    is then reported where it is read). None: no kind claims it (its reader names why)."""
    candidates = serving(input_format)
    if len(candidates) == 1:
        return candidates[0]
    ext = os.path.splitext(str(path or ""))[1].lower()
    by_ext = [q for q in candidates if q.extension == ext]
    if len(by_ext) <= 1:
        return by_ext[0] if by_ext else None
    obj = first_row(path)
    for q in by_ext:
        unreadable = obj is ... and q.read is not None
        if q.detects is not None and (unreadable or (isinstance(obj, dict) and q.detects(obj))):
            return q
    return None


def reads_key(config, key: str) -> bool:
    """Whether scoring ``config.eval.input`` reads ``key`` (one of :data:`INPUT_KEYS` or ``eval.limit``):
    the detected kind declares it; a file no kind claims reads the keys of the keyed .jsonl kinds
    (their reader names the bad line)."""
    from infodiff import config_rules as cr

    path = cr.get(config, "eval.input")
    if not path:
        return False
    q = detect(path, "text") if str(path).lower().endswith((".txt", ".jsonl")) else None
    if q is None:  # an unclaimed file: read (and refused) by the shared readers, as a text file
        keys = {k for q in serving("text") if q.read is None for k in q.config_keys}
        return key in keys
    return key in q.config_keys


# Every module of this package is imported, so each kind's registration runs (a new kind is a new
# file here: nothing to add to this file).
def _import_registrations() -> None:
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


_import_registrations()
