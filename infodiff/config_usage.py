"""Which config keys a run reads: the rule "a key the chosen mode does not read is an error".

A shipped config (configs/*.py) may hold keys that its run reads only for some values of another
key: the manual proposal's ``process.loc`` only when ``process.proposal = 'manual'``, the
synthetic data's ``data.distribution`` only when ``data.name = 'synthetic'``, and so on. Each
such key is declared once in :data:`CONDITIONAL` with the condition under which it is read.
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
import dataclasses
from typing import Callable

import ml_collections

__all__ = ["Conditional", "CONDITIONAL", "REFUSED_BY_ENTRY", "leaf_keys", "track_reads", "not_read",
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
@dataclasses.dataclass(frozen=True)
class Conditional:
    """Config key ``key`` (dotted path) is read only when ``test(config)`` holds, which ``when``
    says in words (shown in the error); the rule applies to configs where ``scope(config)``
    holds (e.g. Poisson runs), elsewhere the key is read as usual."""

    key: str
    when: str
    test: Callable[[ml_collections.ConfigDict], bool]
    scope: Callable[[ml_collections.ConfigDict], bool] = lambda c: True


def _get(config, path, default=None):
    node = config
    for part in path.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return default
        node = node[part]
    return node


def _is(path, *values):
    return lambda c: _get(c, path) in values


def _is_not(path, *values):
    return lambda c: _get(c, path) not in values


def _all(*tests):
    return lambda c: all(t(c) for t in tests)


def _keys(keys, when, test, scope=lambda c: True):
    return tuple(Conditional(k, when, test, scope) for k in keys)


_POISSON = _is("process.name", "poisson")
_NETWORK = _is_not("eval.mode", "oracle")
_ORACLE = _is("eval.mode", "oracle")
_SYNTHETIC = "data.name = 'synthetic'"
_NO_INPUT = lambda c: not _get(c, "eval.input")  # noqa: E731

CONDITIONAL: tuple[Conditional, ...] = (
    # Poisson data sources (oracle mode reads its law from data.path / distribution / max_count / dim)
    *_keys(("data.distribution", "data.max_count", "data.dim"), f"{_SYNTHETIC} or eval.mode = 'oracle'",
           lambda c: _ORACLE(c) or _get(c, "data.name") == "synthetic", _POISSON),
    *_keys(("data.num_train", "data.num_valid", "data.num_test", "data.seed"), _SYNTHETIC,
           _is("data.name", "synthetic"), _POISSON),
    Conditional("data.window", "data.name = 'chorales'", _is("data.name", "chorales"), _POISSON),
    Conditional("data.path", "data.name = 'chorales' or eval.mode = 'oracle'",
                lambda c: _ORACLE(c) or _get(c, "data.name") == "chorales", _POISSON),
    Conditional("data.cache_dir", "data.name in ('digits', 'fashion_mnist', 'randhie')",
                _is("data.name", "digits", "fashion_mnist", "randhie"), _POISSON),
    # Poisson networks
    *_keys(("model.hidden", "model.num_layers"), "model.arch = 'mlp'", _is("model.arch", "mlp"), _POISSON),
    *_keys(("model.channels", "model.num_blocks"), "model.arch in ('conv', 'seqconv')",
           _is("model.arch", "conv", "seqconv"), _POISSON),
    # text networks: the float16 opt-in
    Conditional("model.allow_float16", "model.dtype = 'float16'", _is("model.dtype", "float16"),
                _is_not("process.name", "poisson")),
    # Poisson log-SNR proposals and the high-SNR guard
    *_keys(("process.loc", "process.scale", "process.clip"), "process.proposal = 'manual'",
           _is("process.proposal", "manual"), _POISSON),
    *_keys(("eval.loc", "eval.scale", "eval.clip"), "eval.proposal = 'manual'",
           _is("eval.proposal", "manual"), _POISSON),
    Conditional("eval.alpha_guard", "eval.high_snr_guard = 'round'", _is("eval.high_snr_guard", "round"), _POISSON),
    *_keys(("eval.sampler_steps", "eval.output_dir"), "eval.mode = 'oracle'", _ORACLE, _POISSON),
    Conditional("eval.channel_shift", "eval.channel_defensive > 0",
                lambda c: float(_get(c, "eval.channel_defensive", 0.0)) > 0, _POISSON),
    Conditional("model.init_prior", "model.head = 'categorical'", _is("model.head", "categorical"), _POISSON),
    *_keys(("eval.max_examples", "eval.split", "eval.num_generate", "eval.sample_steps", "eval.gamma_min",
            "eval.gamma_max", "eval.decision"), "eval.input is not set (network mode)", _NO_INPUT,
           _all(_POISSON, _NETWORK)),
    Conditional("data.dim", "the law data.distribution is 1-D (a 2-D law has its own dimension)",
                lambda c: _law_is_1d(c), _POISSON),
    *_keys(("eval.gamma_min", "eval.gamma_max", "eval.decision", "eval.sample_steps"), "eval.num_generate > 0",
           lambda c: int(_get(c, "eval.num_generate", 0)) > 0, _all(_POISSON, _NETWORK)),
    *_keys(("eval.gamma_min", "eval.gamma_max", "eval.decision"), "eval.sampler_steps is not empty",
           lambda c: len(tuple(_get(c, "eval.sampler_steps", ()) or ())) > 0, _all(_POISSON, _ORACLE)),
    # generated samples of text runs
    *_keys(("eval.sample_steps", "eval.sampler"), "eval.num_generate > 0",
           lambda c: int(_get(c, "eval.num_generate", 0)) > 0, _all(_NETWORK, _is_not("process.name", "poisson"))),
    # noise schedules, objectives, optimiser
    *_keys(("process.sigma_min", "process.sigma_max"), "process.schedule = 'geometric'",
           _is("process.schedule", "geometric")),
    Conditional("process.eps", "process.schedule is not 'geometric'", _is_not("process.schedule", "geometric")),
    Conditional("process.antithetic", "process.objective in ('t_dce', 'lambda_dce')",
                _is("process.objective", "t_dce", "lambda_dce"), _is("process.name", "masked")),
    *_keys(("optim.min_lr_ratio", "optim.decay_steps"), "optim.decay = 'cosine'", _is("optim.decay", "cosine")),
    Conditional("train.max_loss_ratio", "train.divergence_guard is True",
                lambda c: bool(_get(c, "train.divergence_guard", True))),
    # text oracles: a table file, or the generation keys
    *_keys(("data.seed", "data.temperature", "data.seq_len", "data.num_support", "data.order",
            "data.generated_alphabet"), "data.path is empty (a generated table)", lambda c: not _get(c, "data.path"),
           _all(_ORACLE, _is_not("process.name", "poisson"))),
    Conditional("data.alphabet", "data.path is set (a table file)", lambda c: bool(_get(c, "data.path")),
                _all(_ORACLE, _is_not("process.name", "poisson"))),
    # scoring a user's file (evaluate.py --config.eval.input=FILE)
    *_keys(("eval.input_unit", "eval.input_samples", "eval.target_se"), "eval.input is set",
           lambda c: bool(_get(c, "eval.input"))),
    Conditional("eval.input_max_samples", "eval.input is set and eval.target_se > 0",
                lambda c: bool(_get(c, "eval.input")) and float(_get(c, "eval.target_se", 0.0) or 0.0) > 0),
    *_keys(("eval.num_samples", "eval.max_sequences", "eval.split", "eval.num_generate", "eval.sample_steps"),
           "eval.input is not set (in input mode the budget is eval.input_samples)", _NO_INPUT,
           _all(_NETWORK, _is_not("process.name", "poisson"))),
    # the Markov-4 toys (experiments/paper.py): a table file, or a generated chain
    Conditional("toy.temperature", "toy.table is empty (a generated chain)", lambda c: not _get(c, "toy.table"),
                lambda c: _get(c, "toy.table") is not None),
    # oracle-mode samplers
    *_keys(("eval.num_generate", "eval.sampler_methods"), "eval.sampler_steps is not empty",
           lambda c: len(tuple(_get(c, "eval.sampler_steps", ()) or ())) > 0, _ORACLE),
)


def _law_is_1d(config) -> bool:
    """Whether a Poisson config's count law is 1-D (a pmf file always is; an unknown name counts
    as 1-D here and is refused where the law is built)."""
    if _ORACLE(config) and _get(config, "data.path"):
        return True
    from infodiff.data import count_synthetic as cs

    name = str(_get(config, "data.distribution", "") or "zip")
    try:
        return cs.get_distribution(name).dim == 1
    except (KeyError, ValueError):
        return True


def not_read(config: ml_collections.ConfigDict) -> dict[str, Conditional]:
    """The keys of ``config`` that its run does not read: {dotted key: its declared condition},
    for the declared keys whose condition is false."""
    present = leaf_keys(config)
    return {r.key: r for r in CONDITIONAL if r.key in present and r.scope(config) and not r.test(config)}


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


def check_overrides(config: ml_collections.ConfigDict, keys: list[str], entry: str = "") -> None:
    """Refuse overrides of keys that the run of ``config`` (already overridden) will not read,
    and those :data:`REFUSED_BY_ENTRY` lists for ``entry`` ('train', 'evaluate', 'experiment').

    Raises:
      ValueError: naming the first such key, its condition and the value that makes it false.
    """
    for k in keys:
        if k in REFUSED_BY_ENTRY.get(entry, {}):
            raise ValueError(f"config key {k} cannot be overridden here: {REFUSED_BY_ENTRY[entry][k]}")
    skip = not_read(config)
    for k in keys:
        if k in skip:
            r = skip[k]
            raise ValueError(f"config key {k} is not read by this run: it is read only when {r.when}; "
                             f"drop --config.{k} or change the setting it depends on")
