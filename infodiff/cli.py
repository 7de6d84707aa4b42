"""Command-line error handling shared by train.py, evaluate.py and run_experiment.py.

A user-facing failure (bad input, a config that does not fit, a corrupt checkpoint, a locked,
full or read-only workdir, a non-finite loss) is printed as one line on stderr::

    error: StorageError: cannot write /w/report.json: [Errno 30] Read-only file system (EROFS); ...

and the program exits with status 1, without a traceback. ``--debug`` (or
``INFODIFF_TRACEBACK=1``) re-raises instead and keeps absl's log prefixes. Anything else (a bug)
keeps its traceback. ``--help`` lists the flags and the config's keys and exits 0.

This module imports nothing heavy: it is used before flags are parsed.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
import traceback
from typing import Callable

__all__ = ["define_distributed_flags", "start_distributed", "supervise_if_several", "compilation_cache_dir", "remove_damaged_cache_entries", "heal_unreadable_cache_entries",
           "condense_cache_warnings", "use_compilation_cache", "EXIT_ERROR", "EXIT_INTERRUPTED", "INTERRUPTED", "user_error_types", "one_line", "exit_on_user_error", "run", "config_flag_error",
           "help_text", "HELP_FLAGS", "CONFIG_DIR", "saved_config_arg", "config_names", "resolve_config", "resolve_config_arg"]

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
# What a Ctrl-C outside training loses (train.py saves a checkpoint itself and exits 130 too).
INTERRUPTED = ("interrupted (SIGINT): the work in progress is lost and nothing of it was written; reports "
               "and checkpoints written before are intact (every write is atomic). Rerun the same command.")


def define_distributed_flags() -> None:
    """``--coordinator_address``, ``--num_processes``, ``--process_id``: how this process joins
    a multi-process run (docs/pods.md); SLURM, Open MPI and multi-host TPU jobs
    are detected without them."""
    from absl import flags

    flags.DEFINE_string("coordinator_address", None, "Multi-process run: HOST:PORT of process 0, the same for "
                        "every process (or JAX_COORDINATOR_ADDRESS). Not needed on SLURM, Open MPI or a TPU pod.")
    flags.DEFINE_integer("num_processes", None, "Multi-process run: number of processes (or JAX_NUM_PROCESSES).")
    flags.DEFINE_integer("process_id", None, "Multi-process run: this process's index, 0 .. num_processes - 1 "
                         "(or JAX_PROCESS_ID).")


def define_compare_flag() -> None:
    """evaluate.py's ``--compare W2``: score ``eval.input`` with the ``--workdir`` run and W2 and
    write their per-row difference with a paired SE (docs/scoring.md, "Comparing two runs")."""
    from absl import flags

    flags.DEFINE_string("compare", None, "Another training run's directory: score --config.eval.input with both "
                        "runs and report the per-row difference -log p_a - (-log p_b) with a paired SE.")


def start_distributed() -> bool:
    """Join the multi-process run the flags / environment describe (:func:`infodiff.parallel.
    initialize`; nothing for a single process). Call first in ``main``, before any JAX work."""
    from absl import flags

    from infodiff import parallel

    f = flags.FLAGS
    return parallel.initialize(f.coordinator_address, f.num_processes, f.process_id)


def supervise_if_several(argv: list[str]) -> int | None:
    """A multi-process run (:func:`define_distributed_flags` or the environment), in the process
    the user started: run ``python argv`` (the command line as given) as this process's worker
    under :func:`infodiff.supervise.supervise` (a dead or missing process is one line on every
    other one, exit status :data:`infodiff.supervise.EXIT_PEER`) and return this process's exit
    status. None in a single-process run, in the worker itself, or for a bad setting (the
    worker path reports it: :func:`start_distributed`)."""
    from absl import flags

    from infodiff import supervise

    f = flags.FLAGS
    if "coordinator_address" not in f or supervise.is_worker():
        return None
    try:
        found = supervise.settings(f.coordinator_address, f.num_processes, f.process_id)
        timeout = supervise.timeout_s()
        if found == "cluster":
            found = supervise.cluster_settings(timeout)
    except Exception:  # a bad setting, or a cluster JAX cannot read: the worker path says why
        return None
    if found is None:
        return None
    return supervise.supervise(argv, *found, timeout, raw=bool(os.environ.get("INFODIFF_TRACEBACK")))


def _leave(status: int):
    """``sys.exit(status)``; in a supervised worker a failure exits at once instead: JAX's exit
    handler would wait (up to 300 s) for the processes still running, which its supervisor
    stops (infodiff/supervise.py)."""
    if status:
        from infodiff import supervise

        if supervise.is_worker():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    sys.exit(status)


COMPILATION_CACHE_ENV = "INFODIFF_COMPILATION_CACHE"
_CACHE_OFF = ("0", "off", "no", "false", "none")
_CACHE_ON = ("", "1", "on", "yes", "true")  # the default directory
MIN_COMPILE_TIME_S = 0.1  # programs that compiled faster are not kept


def compilation_cache_dir() -> str | None:
    """The directory in which the entry points keep compiled XLA programs between runs (JAX's
    persistent compilation cache): ``$INFODIFF_COMPILATION_CACHE``, by default
    ``$XDG_CACHE_HOME/infodiff/xla`` (``~/.cache/infodiff/xla``; also for ``1``, ``on``, ``yes``,
    ``true``); None when that variable is ``off`` (or 0, no, false, none) or when
    ``JAX_COMPILATION_CACHE_DIR`` is set (JAX then uses that directory itself). JAX keys a
    program on its HLO, the compile options (which include this directory's path), the XLA
    flags, the devices and the jaxlib version, so a cached program is the one XLA would
    compile and the numbers do not change; only programs that took at least
    :data:`MIN_COMPILE_TIME_S` to compile are kept (unless
    ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says otherwise)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    value = os.environ.get(COMPILATION_CACHE_ENV, "").strip()
    if value.lower() in _CACHE_OFF:
        return None
    if value.lower() in _CACHE_ON:
        value = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "infodiff", "xla")
    return os.path.abspath(os.path.expanduser(value))


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # RFC 8878 §3.1.1


VERIFIED_INDEX = "infodiff-verified.json"  # in the cache directory: the entries found whole
_TMP_MAX_AGE_S = 3600  # a temporary index file older than this was left by a killed process


def _entry_is_whole(path: str) -> bool:
    """Whether the cache entry ``path`` is a complete zlib stream (or a non-empty zstd frame)."""
    import zlib

    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if head == _ZSTD_MAGIC:
                return True
            f.seek(0)
            d = zlib.decompressobj()
            for block in iter(lambda: f.read(1 << 20), b""):
                d.decompress(block, 1 << 20)
                while d.unconsumed_tail:
                    d.decompress(d.unconsumed_tail, 1 << 20)
            return d.eof
    except (OSError, zlib.error):
        return False


def remove_damaged_cache_entries(path: str) -> list[str]:
    """Delete the entries of the compilation cache ``path`` that JAX could not read (empty, or
    not a complete zlib stream: a write cut short, e.g. by a full disk). JAX never replaces an
    entry whose file exists, so a damaged one would cost a warning and a compilation on every
    run. Returns the names removed. Entries in zstd frames (written when the optional
    ``zstandard`` package is installed) are only checked for being empty.

    An entry found whole is recorded in ``path/infodiff-verified.json`` with its size, mtime and
    inode, and is read again only when one of them changes (a rewrite, a truncation, a copy):
    reading all 343 entries took 0.5 s at every start. The record is written atomically; two
    scans at once cost at most a second reading."""
    import json

    index = os.path.join(path, VERIFIED_INDEX)
    try:
        with open(index) as f:
            known = json.load(f)
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    verified, removed = {}, []
    for entry in os.scandir(path):
        try:
            if entry.name.startswith(f".{VERIFIED_INDEX}.") and entry.name.endswith(".tmp"):
                if time.time() - entry.stat().st_mtime > _TMP_MAX_AGE_S:
                    os.remove(entry.path)  # left by a killed scan
                continue
            if not (entry.is_file() and entry.name.endswith("-cache")):
                continue
            st = entry.stat()
        except OSError:
            continue
        ident = [st.st_size, st.st_mtime_ns, st.st_ino]
        if known.get(entry.name) == ident or _entry_is_whole(entry.path):
            verified[entry.name] = ident
            continue
        try:
            os.remove(entry.path)
            removed.append(entry.name)
        except OSError:
            pass
    if verified != known:
        try:
            from infodiff.training import workdir as workdir_lib

            workdir_lib.atomic_write_bytes(index, json.dumps(verified, sort_keys=True).encode())
        except OSError:
            pass  # no record: the next start reads every entry again
    return removed


def _cache_note(msg: str) -> None:
    """``warning: msg`` on stderr, one line, without breaking a live tqdm progress bar."""
    try:
        import tqdm

        with tqdm.tqdm.external_write_mode(file=sys.stderr):
            print(f"warning: {msg}", file=sys.stderr, flush=True)
    except ImportError:
        print(f"warning: {msg}", file=sys.stderr, flush=True)


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _is_local_cache_dir(path: str) -> bool:
    return path.startswith("file://") or "://" not in path


def heal_unreadable_cache_entries() -> bool:
    """Make JAX's persistent compilation cache remove an entry it fails to read.

    Damage that leaves a well-formed file (a zlib stream of garbage, zstd magic followed by
    garbage, a byte changed in place with the size, mtime and inode kept) passes
    :func:`remove_damaged_cache_entries`; JAX then fails to decompress or deserialize the entry,
    warns (three lines per entry) and compiles again, and since it never replaces an entry whose
    file exists this repeats on every run. Here the reader JAX calls
    (``jax._src.compilation_cache.get_executable_and_time``, jax 0.10.2) is wrapped: an entry that
    fails is deleted (process 0 of a multi-process run only: it alone writes the cache) and
    reported in one line naming the file; JAX then compiles the program and writes the entry
    anew, so the next run reads it. ``jax_raise_persistent_cache_errors`` still raises (after the
    removal), and JAX's verification errors are left to JAX. Returns whether the wrapper is in
    place (False when this JAX has no such function: its own warnings are then shown, one line
    each, by :func:`condense_cache_warnings`)."""
    try:
        import jax
        from jax._src import compilation_cache as jcc
        from jax._src import distributed as jax_distributed
    except ImportError:
        return False
    original = getattr(jcc, "get_executable_and_time", None)
    if original is None:
        return False
    if getattr(original, "_infodiff_heals", False):
        return True

    @functools.wraps(original)
    def get_executable_and_time(cache_key, *args, **kwargs):
        try:
            return original(cache_key, *args, **kwargs)
        except Exception as e:
            if isinstance(e, getattr(jcc, "CacheVerificationError", ())):
                raise
            directory = jax.config.jax_compilation_cache_dir or "?"
            entry = os.path.join(directory, f"{cache_key}-cache")
            if getattr(jax_distributed.global_state, "process_id", 0) not in (0, None):
                what = "left to process 0 to replace"
            elif not _is_local_cache_dir(directory):
                what = "not removed (not a local directory); delete it by hand"
            else:
                try:
                    os.remove(entry[len("file://"):] if entry.startswith("file://") else entry)
                    what = "removed: compiled again in this run and written anew"
                except FileNotFoundError:
                    what = "already removed"
                except OSError as oe:
                    what = f"could not be removed ({_first_line(oe, 80)}); delete it by hand"
            _cache_note(f"compilation cache entry {entry} could not be read ({_first_line(e)}); {what}")
            if jax.config.jax_raise_persistent_cache_errors:
                raise
            return None, None

    get_executable_and_time._infodiff_heals = True
    jcc.get_executable_and_time = get_executable_and_time
    return True


_JAX_CACHE_WARNING = re.compile(r"^Error (reading|writing) persistent compilation cache entry")


def condense_cache_warnings() -> None:
    """Show JAX's warnings about its persistent compilation cache (``Error reading / writing
    persistent compilation cache entry ...``: a write that failed, e.g. on a full disk, or a read
    :func:`heal_unreadable_cache_entries` does not see) as one line each, ``warning: ...``,
    instead of Python's three (file:line, message, source line). Other warnings are shown as
    before. Idempotent."""
    import warnings

    shown = warnings.showwarning
    if getattr(shown, "_infodiff_condenses", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if _JAX_CACHE_WARNING.match(text) and "jax" in filename.replace(os.sep, "/"):
            after = ("the program is compiled instead" if text.startswith("Error reading")
                     else "the compiled program is not kept for later runs")
            _cache_note(f"{' '.join(text.split())[:400]} ({after})")
            return
        shown(message, category, filename, lineno, file, line)

    showwarning._infodiff_condenses = True
    warnings.showwarning = showwarning


def use_compilation_cache() -> str | None:
    """Point JAX's persistent compilation cache at :func:`compilation_cache_dir`, after removing
    its damaged entries (:func:`remove_damaged_cache_entries`); call before the first
    compilation. An entry JAX still fails to read is removed when read, in one line
    (:func:`heal_unreadable_cache_entries`; also in a directory ``JAX_COMPILATION_CACHE_DIR``
    names), and JAX's own cache warnings are one line each (:func:`condense_cache_warnings`).
    Returns the directory, or None (off, JAX's own directory, or not a writable directory: the
    run goes on without a cache, with a one-line warning)."""
    path = compilation_cache_dir()
    if path is None:
        if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            heal_unreadable_cache_entries()
            condense_cache_warnings()
        return None
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path!r} is not writable")
        removed = remove_damaged_cache_entries(path)
    except OSError as e:
        print(f"warning: no compilation cache ({e}); set {COMPILATION_CACHE_ENV}=DIR or "
              f"{COMPILATION_CACHE_ENV}=off", file=sys.stderr, flush=True)
        return None
    if removed:
        print(f"warning: removed {len(removed)} damaged compilation cache entr{'y' if len(removed) == 1 else 'ies'} "
              f"from {path} (compiled again in this run)", file=sys.stderr, flush=True)
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    heal_unreadable_cache_entries()
    condense_cache_warnings()
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # JAX's default, 1 s, keeps
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)  # none on 2 cores
    return path


CPU_DEVICES_ENV = "INFODIFF_CPU_DEVICES"
MAX_DEFAULT_CPU_DEVICES = 8  # measured on 2 cores only; INFODIFF_CPU_DEVICES may go up to the cores
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``os.sched_getaffinity``), lowered
    to a cgroup v2 CPU quota (``/sys/fs/cgroup/cpu.max``, e.g. ``docker --cpus=2``) if one is
    set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open(CGROUP_CPU_MAX) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def cpu_devices() -> int:
    """JAX CPU devices for an evaluation: ``$INFODIFF_CPU_DEVICES``, by default one per core
    (:func:`usable_cores`), at most :data:`MAX_DEFAULT_CPU_DEVICES`. Raises ValueError for a
    value that is not a whole number from 1 to the usable cores (more devices than cores only
    slow the run down; hundreds stall XLA:CPU's collectives)."""
    value = os.environ.get(CPU_DEVICES_ENV, "").strip()
    cores = usable_cores()
    if value:
        if not re.fullmatch(r"[0-9]+", value) or not 1 <= int(value) <= cores:
            raise ValueError(f"{CPU_DEVICES_ENV}={value!r}: give a whole number from 1 (one device) to {cores} "
                             "(the cores this process may use), or unset it (one device per core)")
        return int(value)
    return min(cores, MAX_DEFAULT_CPU_DEVICES)


def use_cpu_cores_as_devices() -> int | None:
    """For a single-process evaluation: give JAX :func:`cpu_devices` CPU devices, over which
    :func:`infodiff.evaluation.evaluate` splits the Monte Carlo rows of every estimator call
    (:func:`infodiff.parallel.rows_mesh`; the same draws, so the numbers of one device to float
    rounding). XLA:CPU keeps the cores of one device's small matmuls poorly busy; over two
    devices the Monte Carlo part of a k_dce evaluation ran 1.29-1.37x faster on 2 cores
    (RESULTS.md, "Evaluation over one CPU device per core"). Call before the
    first JAX computation. Returns the count set, or None where it is left to JAX: the CPU
    device count already set (``JAX_NUM_CPU_DEVICES``, or XLA_FLAGS'
    ``--xla_force_host_platform_device_count``) or a count of 1. Other backends (GPU, TPU) are
    not affected. Raises ValueError for a bad ``$INFODIFF_CPU_DEVICES``."""
    n = cpu_devices()
    if ("JAX_NUM_CPU_DEVICES" in os.environ or n == 1
            or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")):
        return None
    import jax

    jax.config.update("jax_num_cpu_devices", n)
    return n


def user_error_types() -> tuple[type, ...]:
    """Exception types reported as one line: ValueError (bad values, ConfigMismatchError),
    OSError (missing files, StorageError), FloatingPointError, CheckpointError,
    WorkdirLockedError."""
    from infodiff.training.checkpoint import CheckpointError
    from infodiff.training.workdir import WorkdirLockedError

    return (ValueError, OSError, FloatingPointError, CheckpointError, WorkdirLockedError)


def one_line(e: BaseException) -> str:
    """``error: Type: message`` on one line (newlines of the message joined by ' | ')."""
    msg = " | ".join(part.strip() for part in str(e).strip().splitlines() if part.strip())
    # ml_collections wraps a config file's own error in this sentence: keep the error
    msg = re.sub(r"^Configuration is not available because of an earlier failure to load: ?", "", msg)
    return f"error: {type(e).__name__}: {msg}"


def _quiet_unraisable(unraisable) -> None:
    del unraisable


def exit_on_user_error(main: Callable) -> Callable:
    """Wrap an absl ``main(argv)``: user errors -> one line on stderr and ``sys.exit(1)``; Ctrl-C
    (KeyboardInterrupt) -> :data:`INTERRUPTED` and exit status 130."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        from infodiff import interrupts

        supervised = supervise_if_several(sys.orig_argv[1:])  # several processes: this one supervises
        if supervised is not None:
            sys.exit(supervised)
        try:
            use_compilation_cache()  # flags parsed: a rerun skips XLA compilation (same numbers)
            with interrupts.installed():  # a Ctrl-C swallowed by a gc callback still stops the driver
                return main(*args, **kwargs)
        except KeyboardInterrupt:
            if os.environ.get("INFODIFF_TRACEBACK"):
                raise
            sys.stdout.flush()
            print(INTERRUPTED, file=sys.stderr, flush=True)
            sys.unraisablehook = _quiet_unraisable
            _leave(EXIT_INTERRUPTED)
        except Exception as e:
            if os.environ.get("INFODIFF_TRACEBACK") or not isinstance(e, user_error_types()):
                from absl import app

                from infodiff import supervise

                if supervise.is_worker() and not isinstance(e, app.UsageError):
                    traceback.print_exc()
                    _leave(EXIT_ERROR)
                raise
            sys.stdout.flush()
            print(one_line(e), file=sys.stderr, flush=True)
            # A failed restore / save leaves orbax / TensorStore coroutines that complain ("Event
            # loop is closed") when collected at exit: the one line above is the whole report.
            sys.unraisablehook = _quiet_unraisable
            _leave(EXIT_ERROR)

    return wrapped


ONLY_MASKED_KEYS = ("interval", "interval_orders", "interval_level", "interval_proposal", "sampler_likelihood")


def config_flag_error(e: BaseException, argv: list[str]) -> str:
    """One line for an error raised while absl / ml_collections parse the flags: an unknown
    (e.g. misspelt) ``--config.*`` key names the flag and ml_collections' suggestion; a config
    file that raises gives its last error line; anything else is :func:`one_line` of it."""
    if "Unknown command line flag 'config." in str(e) and not any(
            a == "--config" or a.startswith("--config=") for a in argv):
        return ("error: --config.* overrides need a config: give --workdir W (a training run) or "
                "--config configs/<experiment>.py")
    text = str(e).replace("\\'", "'")
    for name in ONLY_MASKED_KEYS:
        if re.search(rf"['.]{name}'", text):
            flag = next((a.split("=")[0] for a in argv if a.split("=")[0].endswith(f".{name}")), name)
            return (f"error: {flag}: NLL intervals and sampler likelihoods are for masked-diffusion runs (they use "
                    "the any-order conditionals of a masked denoiser); this config has no such key")
    key = re.search(r"'(\w+)'", text)
    if isinstance(e, (AttributeError, KeyError)) and key:
        name = key.group(1)
        flag = next((a.split("=")[0] for a in argv if a.startswith("--config.")
                     and a.split("=")[0].split(".")[-1] == name), f"--config.*.{name}")
        hint = re.search(r'Did you mean "([^"]+)"', text)
        return (f"error: unknown config key {flag} ({name!r} is not in the config)"
                + (f"; did you mean {hint.group(1)!r}?" if hint else "; see the config file for its keys"))
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errs = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b:", ln)]
    if errs:
        return f"error: {errs[-1]}"
    return one_line(e)


HELP_FLAGS = ("-h", "--help", "-?", "--helpshort", "--helpfull")


CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")  # shipped with the package


def config_names() -> list[str]:
    """The names of the configs shipped in :data:`CONFIG_DIR` (``masked_text``, ...)."""
    return sorted(f[:-3] for f in os.listdir(CONFIG_DIR) if f.endswith(".py") and not f.startswith("_"))


def resolve_config(spec: str) -> str:
    """A ``--config`` value as a file ml_collections can load: ``PATH[:ARG]`` unchanged when PATH
    is a file; else a shipped config by name, ``NAME[:ARG]``, ``NAME.py`` or ``configs/NAME.py``
    (the checkout's spelling, from any directory), as its path in :data:`CONFIG_DIR`. Raises
    FileNotFoundError naming the value and where the shipped configs are."""
    path, sep, arg = spec.partition(":")
    if os.path.isfile(path):
        return spec
    name = os.path.basename(path)
    name = name[:-3] if name.endswith(".py") else name
    parent = os.path.basename(os.path.dirname(os.path.normpath(path))) if os.sep in path or "/" in path else ""
    if parent in ("", "configs") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) \
            and os.path.isfile(os.path.join(CONFIG_DIR, f"{name}.py")):
        return os.path.join(CONFIG_DIR, f"{name}.py") + sep + arg
    raise FileNotFoundError(f"--config {spec}: no such file and no shipped config of that name; give a config file "
                            f"or a name of {CONFIG_DIR}/*.py (e.g. masked_text)")


def resolve_config_arg(argv: list[str]) -> list[str]:
    """``argv`` with its ``--config`` value resolved (:func:`resolve_config`)."""
    out = list(argv)
    for i, a in enumerate(out):
        if a.startswith("--config="):
            out[i] = "--config=" + resolve_config(a.split("=", 1)[1])
        elif a == "--config" and i + 1 < len(out):
            out[i + 1] = resolve_config(out[i + 1])
    return out


def _config_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _load_config(spec: str):
    """A config file's ``get_config()`` (``path`` or ``path:argument``, as ml_collections)."""
    import importlib.util

    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file not found: {path!r}")
    mod_spec = importlib.util.spec_from_file_location("_help_config", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


def help_text(argv: list[str], doc: str, default_config: str | None = None) -> str:
    """``--help``: the program's docstring, its flags, and the keys of the config it would run
    (``--config`` or the default; evaluate.py with ``--workdir``: the run's saved config) with
    their values, marking the keys this config's settings do not read (infodiff/config_usage.py)."""
    from absl import flags

    out = [doc.strip(), "", "flags:", flags.FLAGS.main_module_help() or "  (none)"]
    spec = _config_arg(argv) or default_config
    if spec is None and "--workdir" in " ".join(argv):
        wd = next((a.split("=", 1)[1] for a in argv if a.startswith("--workdir=")), None)
        if wd is None and "--workdir" in argv and argv.index("--workdir") + 1 < len(argv):
            wd = argv[argv.index("--workdir") + 1]
        if wd:
            spec = f"{os.path.join(CONFIG_DIR, 'saved_run.py')}:{wd}"
    if spec is None:
        out += ["", "config keys: give --config configs/<experiment>.py (or --workdir W) with --help to list "
                "them; every config file's get_config() documents its keys"]
        return "\n".join(out)
    try:
        config = _load_config(spec)
    except Exception as e:  # help must not fail on a bad config: say why
        out += ["", f"config keys: cannot load {spec!r}: {type(e).__name__}: {e}"]
        return "\n".join(out)
    from infodiff import config_usage

    skip = config_usage.not_read(config)
    out += ["", f"config keys of {spec} (override with --config.KEY=VALUE):"]
    for key in sorted(config_usage.leaf_keys(config)):
        node = config
        for part in key.split("."):
            node = node[part]
        note = f"   # not read: only when {skip[key].when}" if key in skip else ""
        out.append(f"  {key} = {node!r}{note}")
    return "\n".join(out)


def _positional(argv: list[str]) -> list[str]:
    """The arguments of ``argv[1:]`` that are neither a flag nor a flag's separate value."""
    from absl import flags

    out, skip = [], False
    for a in argv[1:]:
        if skip:
            skip = False
        elif a.startswith("-"):
            name = a.lstrip("-").split("=", 1)[0]
            skip = "=" not in a and name in flags.FLAGS and not flags.FLAGS[name].boolean
        else:
            out.append(a)
    return out


def _usage_exit(usage: str, what: str = "") -> None:
    """One line, ``error: [what: ]usage; see --help``, and exit status 1."""
    print(f"error: {what + ': ' if what else ''}{usage}; see --help", file=sys.stderr, flush=True)
    sys.exit(EXIT_ERROR)


def _parse_flags(argv: list[str], usage: str | None = None) -> list[str]:
    """absl's flag parsing with every parse error as one line on stderr and exit status 1; a
    positional argument or a missing required flag: ``usage`` (what to give), one line."""
    from absl import flags

    try:
        rest = flags.FLAGS(argv)
    except Exception as e:
        if os.environ.get("INFODIFF_TRACEBACK"):
            raise
        missing = re.findall(r"flag --(\w+)=None: Flag --\w+ must have a value other than None", str(e))
        if usage and missing:
            extra = _positional(argv)
            _usage_exit(usage, f"unexpected argument {extra[0]!r}" if extra
                        else "missing " + ", ".join(f"--{m}" for m in missing))
        print(config_flag_error(e, argv), file=sys.stderr, flush=True)
        sys.exit(EXIT_ERROR)
    if usage and len(rest) > 1:
        _usage_exit(usage, f"unexpected argument {rest[1]!r}")
    return rest


class _PlainFormatter:
    """Log lines without absl's prefix (level letter, time, thread, file:line); warnings and
    errors keep a 'warning: ' / 'error: ' lead. ``--debug`` restores absl's format."""

    def __init__(self):
        import logging

        self._fmt = logging.Formatter("%(message)s")

    def format(self, record):
        import logging

        msg = self._fmt.format(record)
        return f"{record.levelname.lower()}: {msg}" if record.levelno >= logging.WARNING else msg

    def __getattr__(self, name):
        return getattr(self._fmt, name)


# What a failed write says (TensorStore's status, or the errno's name and text): a storage fault
# infodiff reports itself, as one line naming the path and the errno (training.StorageError).
_STORAGE_FAULT = re.compile(r"RESOURCE_EXHAUSTED|No space left on device|ENOSPC|Disk quota exceeded|EDQUOT|"
                            r"Read-only file system|EROFS|Permission denied|EACCES|PERMISSION_DENIED|"
                            r"File too large|EFBIG|OUT_OF_RANGE: Error writing")


class _OrbaxStorageErrors:
    """A logging filter that holds back orbax's error lines about a storage fault (a full disk,
    a read-only or unwritable directory): a failed save logs four of them (up to 870
    characters each, from its background threads) before infodiff's own one line
    (``error: StorageError: cannot save a checkpoint in ...: [Errno 28] ... (ENOSPC); ...``).
    Other records pass. The held lines are kept in ``held``; :func:`_report_held_storage_errors`
    shows them in one line when the run nevertheless ends without an error. Not installed with
    ``--debug``."""

    def __init__(self):
        self.held: list[str] = []

    def filter(self, record) -> bool:
        import logging

        if record.levelno < logging.ERROR or f"{os.sep}orbax{os.sep}" not in (record.pathname or ""):
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string: let the handler report it
            return True
        if not _STORAGE_FAULT.search(msg):
            return True
        self.held.append(" ".join(msg.split()))
        return False


_ORBAX_FILTER = _OrbaxStorageErrors()


def _report_held_storage_errors(main: Callable) -> Callable:
    """``main``, then, if it returned (no error) while orbax storage errors were held back
    (:class:`_OrbaxStorageErrors`), one line saying so (the first, shortened)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        out = main(*args, **kwargs)
        held = _ORBAX_FILTER.held
        if held:
            first = held[0] if len(held[0]) <= 300 else held[0][:300] + " ..."
            print(f"warning: orbax logged {len(held)} storage error{'s' * (len(held) != 1)} that did not stop the "
                  f"run (--debug shows them): {first}", file=sys.stderr, flush=True)
        return out

    return wrapped


def _debug_flag() -> bool:
    """Remove ``--debug`` from sys.argv; with it, user errors keep their traceback
    (``INFODIFF_TRACEBACK=1``) and log lines their absl prefix."""
    if "--debug" not in sys.argv[1:]:
        return bool(os.environ.get("INFODIFF_TRACEBACK"))
    sys.argv = [a for a in sys.argv if a != "--debug"]
    os.environ["INFODIFF_TRACEBACK"] = "1"
    return True


def saved_config_arg(argv: list[str], only_if_saved: bool = False) -> list[str]:
    """``argv`` with ``--config=<CONFIG_DIR>/saved_run.py:W`` inserted when it names
    ``--workdir W`` and no ``--config``: the run's own saved config (``W/config.json``) with the
    command line's overrides. ``only_if_saved``: only when ``W/config.json`` exists (train.py:
    a new workdir takes the default config)."""
    if any(a == "--config" or a.startswith("--config=") for a in argv):
        return argv
    workdir = None
    for i, a in enumerate(argv):
        if a.startswith("--workdir="):
            workdir = a.split("=", 1)[1]
        elif a == "--workdir" and i + 1 < len(argv):
            workdir = argv[i + 1]
    if workdir is None or (only_if_saved and not os.path.isfile(os.path.join(workdir, "config.json"))):
        return argv
    return argv[:1] + [f"--config={os.path.join(CONFIG_DIR, 'saved_run.py')}:{workdir}"] + argv[1:]


def run(main: Callable, default_config: str | None = None, *, doc: str | None = None,
        usage: str | None = None) -> None:
    """``absl.app.run`` of ``main`` with one-line user errors (:func:`exit_on_user_error`), also
    for errors raised while the flags are parsed (a misspelt ``--config.*`` key, a bad flag
    value, a config file that raises): one line, exit status 1. ``--help`` (any of
    :data:`HELP_FLAGS`) prints :func:`help_text` and exits 0. Once the flags are parsed,
    compiled programs are kept between runs (:func:`use_compilation_cache`). ``--debug``: tracebacks and
    absl's log prefixes (both off by default). ``default_config``: the config file used when
    the command line names none (passed as ``--config=...`` so that its overrides are parsed
    here, not when the flag is defined; define the config flag without a default). A
    ``--config`` value may name a shipped config (:func:`resolve_config`). ``doc``: the text of
    ``--help`` (default: ``__main__``'s docstring). ``usage``: what to give, printed as one line
    (exit status 1) for no arguments, a positional argument or a missing required flag."""
    from absl import app
    from absl import logging as absl_logging

    debug = _debug_flag()
    if usage and len(sys.argv) == 1:
        _usage_exit(usage)
    try:
        sys.argv = resolve_config_arg(sys.argv)
    except FileNotFoundError as e:
        if debug:
            raise
        print(one_line(e), file=sys.stderr, flush=True)
        sys.exit(EXIT_ERROR)
    if default_config and _config_arg(sys.argv) is None:
        sys.argv.insert(1, f"--config={default_config}")

    if not debug:
        absl_logging.get_absl_handler().setFormatter(_PlainFormatter())
        absl_logging.get_absl_handler().addFilter(_ORBAX_FILTER)  # a failed save: our one line only
        main = _report_held_storage_errors(main)
    if any(a in HELP_FLAGS for a in sys.argv[1:]):
        print(help_text(sys.argv, doc if doc is not None else sys.modules["__main__"].__doc__ or "", default_config))
        sys.exit(0)
    app.run(exit_on_user_error(main), flags_parser=functools.partial(_parse_flags, usage=usage))
