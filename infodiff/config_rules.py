"""Config keys read only under a condition on other keys: :class:`Conditional` and the small
predicates its rules are written with.

A generic rule lives in :data:`infodiff.config_usage.CONDITIONAL`; a process's own rules live in
its registration (``infodiff/tasks/<name>.py``, ``Registration.conditional``), beside the code
that reads the keys. :func:`infodiff.config_usage.not_read` applies both.
"""

from __future__ import annotations

import os
import dataclasses
from typing import Callable

import ml_collections

__all__ = ["Conditional", "get", "equals", "differs", "all_of", "keys", "ORACLE", "NETWORK", "NO_INPUT"]

Test = Callable[[ml_collections.ConfigDict], bool]


@dataclasses.dataclass(frozen=True)
class Conditional:
    """Config key ``key`` (dotted path) is read only when ``test(config)`` holds, which ``when``
    says in words (shown in the error); the rule applies to configs where ``scope(config)``
    holds, elsewhere the key is read as usual."""

    key: str
    when: str
    test: Test
    scope: Test = lambda c: True


def get(config, path: str, default=None):
    """The value at dotted ``path`` of ``config``, or ``default`` where a part is absent."""
    node = config
    for part in path.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return default
        node = node[part]
    return node


def equals(path: str, *values) -> Test:
    """Test: the value at ``path`` is one of ``values``."""
    return lambda c: get(c, path) in values


def differs(path: str, *values) -> Test:
    """Test: the value at ``path`` is none of ``values``."""
    return lambda c: get(c, path) not in values


def all_of(*tests: Test) -> Test:
    return lambda c: all(t(c) for t in tests)


def keys(names, when: str, test: Test, scope: Test = lambda c: True) -> tuple[Conditional, ...]:
    """One :class:`Conditional` per key of ``names``, all with the same condition and scope."""
    return tuple(Conditional(k, when, test, scope) for k in names)


NETWORK = differs("eval.mode", "oracle")
ORACLE = equals("eval.mode", "oracle")
NO_INPUT: Test = lambda c: not get(c, "eval.input")  # noqa: E731


RUN_SECTIONS = ("process", "model", "data", "train", "eval")  # what every training run's config.json holds


def check_run_config(saved, workdir: str) -> None:
    """ValueError (one line) when ``saved``, the JSON of ``workdir/config.json``, is not an infodiff
    training run's config: a released checkpoint's (``--pretrained``, docs/pretrained.md) or another
    program's."""
    missing = [k for k in RUN_SECTIONS if not isinstance(saved, dict) or not isinstance(saved.get(k), dict)]
    if not missing:
        return
    keys = ", ".join(sorted(saved)[:6]) if isinstance(saved, dict) else type(saved).__name__
    weights = any(os.path.isfile(os.path.join(workdir, n)) for n in
                  ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))
    what = ("a released checkpoint's: evaluate it with --pretrained " + repr(workdir) + " (docs/pretrained.md)"
            if weights else "not an infodiff run's (give the workdir of python train.py)")
    raise ValueError(f"{workdir!r} is not an infodiff training run: its config.json has no "
                     f"{', '.join(repr(k) for k in missing)} section (keys: {keys}); that config is {what}")
