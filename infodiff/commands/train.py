"""Train a diffusion model: masked, score-entropy (SEDD) or Poisson, chosen by config.process.name.

    infodiff-train --config masked_text --workdir runs/masked_text      # installed; or python train.py
    python train.py --config configs/masked_text.py --workdir runs/masked_text
    python train.py --config configs/masked_text.py --workdir runs/x --config.optim.lr=1e-3
    python train.py --config configs/sedd_absorb_text.py --workdir runs/sedd_absorb   # or sedd_uniform_text.py
    python train.py --config configs/poisson_digits.py --workdir runs/pois_digits     # count data

One path for every process: :func:`infodiff.tasks.make_task` (what is trained: model, loss,
data) and :func:`infodiff.training.train` (the loop).

The config is locked: overriding a key that does not exist (a typo) is an error, and so is
overriding one that this run does not read (infodiff/config_usage.py). Rerunning with
the same --workdir resumes from its latest checkpoint (the log / eval / checkpoint cadence may
change; train.num_steps only where the learning rates already used stay the same, else
optim.decay_steps says how the schedule continues: docs/guide.md "Training longer"; optim.lr and
optim.grad_clip to recover a diverged run). A diverged run (NaN, exploding gradient norm or
loss) stops with one line before it saves anything of the bad state. SIGINT / SIGTERM save a checkpoint and exit with status
128 + signal number, so a scheduler sees the job as interrupted and can requeue it.

One writer per workdir (``W/train.lock``; a second train.py is refused, naming the holder).
Checkpoints are verified on resume: a corrupted one is named, moved to ``W/checkpoints.corrupt/``
and the newest good one resumed. User errors (a bad value, a config that does not fit, no
verified checkpoint, a locked, full or read-only workdir) print one line on stderr and exit
with status 1 (``--debug`` for the traceback). ``--help`` lists the config's keys. ``--config``
takes a file or the name of a shipped config (infodiff/configs/: masked_text, poisson_digits, ...);
without it, an existing run (``W/config.json``) continues with its own saved config (overrides
apply to it), a new workdir gets configs/masked_text.py.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # quiet XLA/TSL C++ info logs

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from infodiff import cli  # noqa: E402  (imports nothing heavy)

_DEFAULT_CONFIG = os.path.join(cli.CONFIG_DIR, "masked_text.py")
USAGE = ("give --workdir W (the run's directory; --config NAME or FILE, default: W's saved config.json "
         "if W is a run, else masked_text)")

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training config file (a get_config() module; default: an existing run's saved config.json, else "
    "configs/masked_text.py).",
    lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output directory for checkpoints, config.json and metrics.jsonl (required)."
)
_LIBRARY_LOGS = flags.DEFINE_bool(
    "library_logs", False, "Show INFO logs of orbax / jax / flax (hidden by default)."
)
flags.mark_flag_as_required("workdir")
cli.define_distributed_flags()


def main(argv):
    del argv  # positional arguments are refused while the flags are parsed (USAGE)
    cli.start_distributed()  # one of several processes (docs/pods.md); else nothing
    from infodiff import config_usage, parallel, tasks, training  # imports jax; after flag parsing so --help is fast

    if not _LIBRARY_LOGS.value:
        training.quiet_library_logs()
    logging.set_verbosity(logging.INFO)

    config = _CONFIG.value
    # An override of a key this run does not read (e.g. process.loc without proposal 'manual').
    config_usage.check_overrides(config, config_usage.override_keys(sys.argv), entry="train")
    # The resolved config is written to WORKDIR/config.json (not dumped to the terminal).
    result = training.train(tasks.make_task(config), _WORKDIR.value)
    if parallel.is_primary():
        print(json.dumps({k: v for k, v in result.items()}, indent=2, sort_keys=True, default=str))
    if result.get("interrupted"):
        sys.exit(training.exit_status(result["interrupted"]))


def run() -> None:
    """The ``infodiff-train`` command (and ``python train.py``)."""
    sys.argv = cli.saved_config_arg(sys.argv, only_if_saved=True)  # an existing run: its saved config
    cli.run(main, default_config=_DEFAULT_CONFIG, doc=__doc__, usage=USAGE)
