"""Which config keys a run reads: the rule "a key the chosen mode does not read is an error".

A shipped config (configs/*.py) may hold keys that its run reads only for some values of another
key: the manual proposal's ``process.loc`` only when ``process.proposal = 'manual'``, the
synthetic data's ``data.distribution`` only when ``data.name = 'synthetic'``, and so on. Each
such key is declared once with the condition under which it is read: in its process's
registration (``infodiff/tasks/<name>.py``, ``Registration.conditional``) or, for every
process, in :data:`CONDITIONAL`; :func:`rules` gives both.
:func:`check_overrides` refuses, before any work, a command-line override (``--config.K=V``) of
a key whose condition is false in the resolved config, naming the condition (train.py,
evaluate.py). Every other key of a config is read by its run: tests/test_config_usage.py runs
every config (tiny sizes) under :func:`track_reads` and checks that the keys left unread are
exactly the declared ones whose condition is false, so the table cannot drift from the code.
evaluate.py on a training run also refuses overrides outside ``eval.*`` (they must match the
checkpoint: ``ConfigMismatchError``).

    with track_reads(config) as reads:
        run(config)
    unread = leaf_keys(config) - reads      # dotted paths, e.g. {'process.loc'}
"""

from __future__ import annotations

import contextlib

import ml_collections

from infodiff import config_rules as cr
from infodiff.config_rules import Conditional

__all__ = ["Conditional", "CONDITIONAL", "rules", "REFUSED_BY_ENTRY", "READ_BY_ENTRY", "leaf_keys", "track_reads", "not_read",
           "check_overrides", "override_keys"]


def leaf_keys(config: ml_collections.ConfigDict, prefix: str = "") -> set[str]:
    """Dotted paths of the non-ConfigDict values of ``config`` (e.g. ``'eval.num_samples'``)."""
    out = set()
    for k, v in config.items(preserve_field_references=True):
        path = f"{prefix}{k}"
        if isinstance(v, ml_collections.ConfigDict):
            out |= leaf_keys(v, path + ".")
        else:
            out.add(path)
    return out


_TRACKED: dict[int, tuple[set, str]] = {}
_PAUSED = [0]  # > 0 inside a dump / copy / comparison of the whole config (not a read)


def _not_a_read(name):
    def method(self, *args, **kwargs):
        _PAUSED[0] += 1
        try:
            return getattr(ml_collections.ConfigDict, name)(self, *args, **kwargs)
        finally:
            _PAUSED[0] -= 1

    method.__name__ = name
    return method


class _Tracking(ml_collections.ConfigDict):
    """A ConfigDict node that records the dotted path of every value read through it."""

    def __getitem__(self, key):
        value = super().__getitem__(key)
        reads, prefix = _TRACKED.get(id(self), (None, ""))
        if reads is not None and not _PAUSED[0] and not isinstance(value, ml_collections.ConfigDict):
            reads.add(f"{prefix}{key}")
        return value

    for _name in ("to_dict", "to_json", "to_json_best_effort", "to_yaml", "__str__", "__repr__", "__eq__",
                  "__deepcopy__", "copy_and_resolve_references", "eq_as_configdict"):
        if hasattr(ml_collections.ConfigDict, _name):
            locals()[_name] = _not_a_read(_name)
    del _name


def _nodes(config, prefix=""):
    yield config, prefix
    for k, v in config.items(preserve_field_references=True):
        if isinstance(v, ml_collections.ConfigDict):
            yield from _nodes(v, f"{prefix}{k}.")


@contextlib.contextmanager
def track_reads(config: ml_collections.ConfigDict):
    """Record, in the yielded set, the dotted path of every leaf value read from ``config`` (by
    attribute, item or ``get``; ``items()`` / ``values()`` count, ``to_dict`` / ``to_json`` and
    ``in`` do not). The config's nodes are restored to their own class on exit. Not thread-safe;
    for tests and tools."""
    reads: set[str] = set()
    nodes = list(_nodes(config))
    classes = [type(n) for n, _ in nodes]
    try:
        for n, prefix in nodes:
            _TRACKED[id(n)] = (reads, prefix)
            object.__setattr__(n, "__class__", _Tracking)
        yield reads
    finally:
        for (n, _), cls in zip(nodes, classes):
            object.__setattr__(n, "__class__", cls)
            _TRACKED.pop(id(n), None)


# ----------------------------------------------------------------------------------------------
# Keys read only under a condition on other keys
# ----------------------------------------------------------------------------------------------
_ORACLE = cr.ORACLE
_NO_INPUT = cr.NO_INPUT

def _input_reads(key: str):
    """Test: scoring ``eval.input`` reads ``key`` (the detected input kind declares it:
    :func:`infodiff.evaluation.queries.reads_key`)."""

    def test(c) -> bool:
        from infodiff.evaluation import queries

        return queries.reads_key(c, key)

    return test


# The rules of every config; a process's own rules are its registration's (infodiff/tasks/<name>.py).
CONDITIONAL: tuple[Conditional, ...] = (
    # noise schedules, optimiser
    *cr.keys(("process.sigma_min", "process.sigma_max"), "process.schedule = 'geometric'",
             cr.equals("process.schedule", "geometric")),
    Conditional("process.eps", "process.schedule is not 'geometric'", cr.differs("process.schedule", "geometric")),
    *cr.keys(("optim.min_lr_ratio", "optim.decay_steps"), "optim.decay = 'cosine'", cr.equals("optim.decay", "cosine")),
    Conditional("train.max_loss_ratio", "train.divergence_guard is True",
                lambda c: bool(cr.get(c, "train.divergence_guard", True))),
    # scoring a user's file (evaluate.py --config.eval.input=FILE)
    # (each input kind declares the keys it reads: infodiff/evaluation/queries/<kind>.py, config_keys)
    *(Conditional(k, "eval.input is set and is not a multiple-choice .jsonl", _input_reads(k))
      for k in ("eval.input_unit", "eval.input_samples", "eval.target_se")),
    *(Conditional(k, "eval.input is a multiple-choice .jsonl ({\"prompt\", \"choices\", \"answer\"})", _input_reads(k))
      for k in ("eval.choice_confidence", "eval.choice_samples", "eval.choice_max_samples")),
    Conditional("eval.limit", "eval.input is set (the rows of a file)", _input_reads("eval.limit")),
    # where a trained run's evaluation writes (infodiff/evaluation/run.py: output_dir); oracle mode overwrites
    Conditional("eval.overwrite", "eval.mode = 'network' (a trained run)", cr.NETWORK),
    Conditional("eval.input_max_samples", "eval.input is set and eval.target_se > 0",
                lambda c: _input_reads("eval.input_max_samples")(c)
                and float(cr.get(c, "eval.target_se", 0.0) or 0.0) > 0),
    # the Markov-4 toys (experiments/paper.py): a table file, or a generated chain
    Conditional("toy.temperature", "toy.table is empty (a generated chain)", lambda c: not cr.get(c, "toy.table"),
                lambda c: cr.get(c, "toy.table") is not None),
    # the LLaDA tables (experiments/llada_tables.py): rows from text files, or random token ids
    Conditional("llada.tokenizer", "llada.pairs or llada.triplets is a file",
                lambda c: bool(cr.get(c, "llada.pairs")) or bool(cr.get(c, "llada.triplets"))),
    *cr.keys(("llada.prompt_len", "llada.response_len"), "llada.pairs or llada.triplets is empty (random ids)",
             lambda c: not cr.get(c, "llada.pairs") or not cr.get(c, "llada.triplets")),
    # oracle-mode samplers
    *cr.keys(("eval.num_generate", "eval.sampler_methods"), "eval.sampler_steps is not empty",
             lambda c: len(tuple(cr.get(c, "eval.sampler_steps", ()) or ())) > 0, _ORACLE),
)


def rules(config: ml_collections.ConfigDict) -> tuple[Conditional, ...]:
    """The conditional keys of ``config``: its process's (:func:`infodiff.tasks.conditional_keys`),
    then :data:`CONDITIONAL`."""
    from infodiff import tasks  # jax; imported when a config is checked

    return (*tasks.conditional_keys(config), *CONDITIONAL)


def not_read(config: ml_collections.ConfigDict) -> dict[str, Conditional]:
    """The keys of ``config`` that its run does not read: {dotted key: its declared condition},
    for the declared keys whose condition is false."""
    present = leaf_keys(config)
    return {r.key: r for r in rules(config) if r.key in present and r.scope(config) and not r.test(config)}


def override_keys(argv: list[str]) -> list[str]:
    """The dotted keys overridden on a command line: ``--config.eval.num_samples=8`` (or
    ``-config.eval.num_samples 8``, as absl also accepts, or a line of a ``--flagfile``) gives
    ``'eval.num_samples'``."""
    out = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        flag = a.lstrip("-") if a.startswith("-") else ""
        if flag.startswith("flagfile"):
            path = flag.split("=", 1)[1] if "=" in flag else (args[i + 1] if i + 1 < len(args) else "")
            try:
                with open(path) as f:
                    args[i + 1:i + 1] = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
            except OSError:
                pass  # absl reports a missing flagfile itself
        elif flag.startswith("config."):
            out.append(flag[len("config."):].split("=", 1)[0])
        i += 1
    return out


# Keys an entry point refuses to override although its config holds them: {entry: {key: why}}.
REFUSED_BY_ENTRY = {
    "train": {"eval.input": "eval.input is for evaluate.py --workdir W (scoring a file with a trained run); "
                            "training would save it into W/config.json"},
}


# Entries that read only some keys: {entry: (the keys it reads, what it is)}; another override is refused.
READ_BY_ENTRY = {
    "compare": (("eval.input", "eval.input_unit", "eval.input_samples", "eval.target_se", "eval.input_max_samples",
                 "eval.seed", "eval.batch_size", "eval.use_ema", "eval.estimator", "eval.overwrite"),
                "evaluate.py --compare (two runs scoring eval.input)"),
    "pretrained": (("eval.input", "eval.input_unit", "eval.input_samples", "eval.target_se", "eval.input_max_samples",
                    "eval.seed", "eval.batch_size", "eval.estimator", "eval.output_dir", "eval.overwrite",
                    "eval.limit", "pretrained.kind", "pretrained.tokenizer", "pretrained.dtype"),
                   "evaluate.py --pretrained DIR (a released checkpoint scoring eval.input)"),
}


def check_overrides(config: ml_collections.ConfigDict, keys: list[str], entry: str = "") -> None:
    """Refuse overrides of keys that the run of ``config`` (already overridden) will not read,
    those :data:`REFUSED_BY_ENTRY` lists for ``entry`` ('train', 'evaluate', 'experiment',
    'compare') and those outside its :data:`READ_BY_ENTRY` keys.

    Raises:
      ValueError: naming the first such key, its condition and the value that makes it false.
    """
    for k in keys:
        if k in REFUSED_BY_ENTRY.get(entry, {}):
            raise ValueError(f"config key {k} cannot be overridden here: {REFUSED_BY_ENTRY[entry][k]}")
    if entry in READ_BY_ENTRY:
        read, what = READ_BY_ENTRY[entry]
        for k in keys:
            if k not in read:
                raise ValueError(f"config key {k} is not read by {what}: drop --config.{k} (it reads "
                                 f"{', '.join(read)})")
    skip = not_read(config)
    for k in keys:
        if k in skip:
            r = skip[k]
            raise ValueError(f"config key {k} is not read by this run: it is read only when {r.when}; "
                             f"drop --config.{k} or change the setting it depends on")
