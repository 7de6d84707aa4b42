"""Where the training metrics go besides ``W/metrics.jsonl``: ``config.train.log_to``.

``log_to`` is a comma-separated list (or a list) of:

* ``jsonl`` (the default): ``W/metrics.jsonl`` only. metrics.jsonl is always written: it is the
  run's own record (a resume truncates it to the checkpoint's step, reports read it).
* ``tensorboard``: event files in ``W/tensorboard/`` (TensorBoard's own writer,
  ``tensorboard.summary.Writer``; ``pip install 'infodiff[tensorboard]'``).
* ``wandb``: a Weights & Biases run in ``W/wandb/``, offline unless ``WANDB_MODE`` says otherwise
  (``wandb sync W/wandb/offline-run-*`` uploads it; ``pip install 'infodiff[wandb]'``). Its id
  is derived from the workdir, so a resumed run continues the same W&B run.

Every scalar of a metrics.jsonl record is mirrored as ``<split>/<name>`` (``train/loss``,
``train/bpc``, ``valid/loss``, ...) at the record's step, so a resumed run continues the same
curves. Steps past the checkpoint that an interrupted run had already written: TensorBoard
shows the resumed run's (a resume writes a SessionLog START event at the first new step, on
which TensorBoard's reader drops the older events of that step and later ones); W&B keeps the
first values of a step it already has.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import time
from typing import Any, Iterable

__all__ = ["LOG_TO", "TENSORBOARD_DIR", "parse_log_to", "check_available", "MetricSinks"]

LOG_TO = ("jsonl", "tensorboard", "wandb")
TENSORBOARD_DIR = "tensorboard"


def parse_log_to(value: Any) -> tuple[str, ...]:
    """``config.train.log_to`` as a tuple of names of :data:`LOG_TO` (in order, no repeats).

    Raises ValueError naming the value for an unknown name or an empty list."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    names = []
    for item in items:
        name = str(item).strip().lower()
        if not name:
            continue
        if name not in LOG_TO:
            raise ValueError(f"config.train.log_to={value!r}: {str(item).strip()!r} is not one of {', '.join(LOG_TO)} "
                             "(several: a comma-separated list, e.g. 'jsonl,tensorboard')")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"config.train.log_to={value!r} names no destination; give 'jsonl' (the default), "
                         "'tensorboard' or 'wandb' (several: comma-separated)")
    return tuple(names)


def _missing(extra: str, module: str) -> ValueError:
    return ValueError(f"config.train.log_to names {extra} but {module} is not installed: "
                       f"pip install 'infodiff[{extra}]' (or drop {extra} from config.train.log_to)")


def check_available(names: Iterable[str]) -> None:
    """ValueError (one line: what to install; a user error, so the command prints just that) if
    a library ``names`` needs is missing; called before any work."""
    for name in names:
        if name == "tensorboard":
            try:
                import tensorboard.summary  # noqa: F401
            except ImportError:
                raise _missing("tensorboard", "tensorboard") from None
        elif name == "wandb":
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise _missing("wandb", "wandb") from None


class MetricSinks:
    """The mirrors of metrics.jsonl that ``config.train.log_to`` names (jsonl itself is written
    by the loop). ``start_step``: the step the run starts or resumes at (its records are those
    of later steps). ``write(step, split, metrics)`` after each metrics.jsonl record;
    ``close()`` at the end (flushes). Only process 0 of a multi-process run makes one."""

    def __init__(self, names: Iterable[str], workdir: str, config: Any = None, start_step: int = 0):
        names = tuple(names)
        check_available(names)
        self._tb = self._wandb = None
        if "tensorboard" in names:
            import tensorboard.summary
            from tensorboard.compat.proto import event_pb2

            out = tensorboard.summary.DirectoryOutput(os.path.join(workdir, TENSORBOARD_DIR))
            # A session start (as TensorFlow wrote): on the second and later ones (a resume)
            # TensorBoard's reader drops the older events of this step and later ones.
            out._ev_writer.add_event(event_pb2.Event(  # DirectoryOutput's own EventFileWriter
                wall_time=time.time(), step=int(start_step) + 1,
                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
            self._tb = tensorboard.summary.Writer(out)
        if "wandb" in names:
            import wandb

            run_id = "infodiff-" + hashlib.sha256(os.path.abspath(workdir).encode()).hexdigest()[:12]
            self._wandb = wandb.init(
                dir=workdir, id=run_id, resume="allow", name=os.path.basename(os.path.abspath(workdir)),
                mode=os.environ.get("WANDB_MODE", "offline"),
                config=config.to_dict() if hasattr(config, "to_dict") else config)

    def write(self, step: int, split: str, metrics: dict) -> None:
        """Each number of ``metrics`` (a metrics.jsonl record's) as ``split/name`` at ``step``."""
        scalars = {f"{split}/{k}": float(v) for k, v in metrics.items()
                   if isinstance(v, numbers.Real) and not isinstance(v, bool)}
        if self._tb is not None:
            for tag, v in scalars.items():
                self._tb.add_scalar(tag, v, step=int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=int(step))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
