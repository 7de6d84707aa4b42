"""Run one experiment of infodiff/experiments/ and write results.json / results.md / results.png.

  infodiff-experiment --config exp_dna128 --workdir results/dna128    # installed; or python run_experiment.py
  python run_experiment.py --config configs/exp_dna128.py --workdir results/dna128
  python run_experiment.py --config configs/exp_markov_cond.py --workdir results/markov_cond
  python run_experiment.py --config configs/exp_ood.py --workdir results/ood --config.ood.model_dir=runs/masked_text
  python run_experiment.py --config configs/exp_variance.py --workdir results/variance
  python run_experiment.py --config configs/exp_llada_tables.py --workdir results/llada_tables \
      --config.llada.checkpoint=DIR    # a LLaDA checkpoint (docs/pretrained_llada.md)

Rerunning resumes the experiment's training from its last checkpoint.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from infodiff import cli  # noqa: E402  (imports nothing heavy)

USAGE = "give --config NAME or FILE (exp_dna128, exp_markov_cond, exp_ood, exp_variance, exp_llada_tables) and --workdir W"
config_flags.DEFINE_config_file("config", None, "Experiment config (configs/exp_*.py).", lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory (results and the training run).")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from infodiff import config_usage, experiments, training

    config_usage.check_overrides(FLAGS.config, config_usage.override_keys(sys.argv), entry="experiment")

    training.quiet_library_logs()
    results = experiments.run(FLAGS.config, FLAGS.workdir)
    with open(results["files"]["md"]) as f:
        print(f.read())
    print("written:", ", ".join(results["files"].values()))


def run() -> None:
    """The ``infodiff-experiment`` command (and ``python run_experiment.py``)."""
    logging.set_verbosity(logging.INFO)
    cli.run(main, doc=__doc__, usage=USAGE)
