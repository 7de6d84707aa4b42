"""Likelihood report with standard errors.

  python evaluate.py --workdir runs/masked_text                       # trained model, test split
  python evaluate.py --workdir runs/masked_text --config.eval.estimator=k_dce --config.eval.num_samples=8
  python evaluate.py --config configs/oracle_tabular.py --config.data.path=FILE.json
  python evaluate.py --config configs/oracle_markov.py
  python evaluate.py --workdir runs/sedd_absorb                       # SEDD: the I-MDSE likelihood
  python evaluate.py --config configs/oracle_sedd_tabular.py          # SEDD with exact scores
  python evaluate.py --workdir runs/pois_digits                       # Poisson: nats / example, bits / dim
  python evaluate.py --config configs/oracle_poisson.py --config.data.distribution=zipf
  python evaluate.py --config configs/oracle_poisson.py --config.data.path=pmf.json   # {count: probability}

Prints the table, then writes report.json (schema in docs/report.md) and report.txt into the
workdir or config.eval.output_dir (with eval.input W/scores/<file name>-<hash>/ by default, with the
rows.* files), as one unit (both from this run or both from the previous one, even after a
kill -9). The newest checkpoint that passes verification is evaluated (a corrupted newer one is
named in a warning and skipped; one that a training run writing the workdir deletes while it is
read is not: the checkpoints are listed again). Errors
(including a read-only or full output directory, after the table is printed) are one line on
stderr and exit status 1.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from infodiff import cli  # imports nothing heavy


def _default_config_from_workdir(argv):
    """Without --config, evaluate the run's own saved config (configs/saved_run.py:WORKDIR)."""
    if any(a == "--config" or a.startswith("--config=") for a in argv):
        return argv
    workdir = None
    for i, a in enumerate(argv):
        if a.startswith("--workdir="):
            workdir = a.split("=", 1)[1]
        elif a == "--workdir" and i + 1 < len(argv):
            workdir = argv[i + 1]
    if workdir is None:
        return argv
    here = os.path.dirname(os.path.abspath(__file__))
    return argv[:1] + [f"--config={os.path.join(here, 'configs', 'saved_run.py')}:{workdir}"] + argv[1:]


FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (default: the run's saved config).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Training run directory (network mode).")
cli.define_distributed_flags()


def main(argv):
    del argv
    if FLAGS.config is None:
        raise app.UsageError("give --workdir (a training run) or --config (e.g. configs/oracle_markov.py)")
    if not cli.start_distributed():  # one of several processes (README "Running on a pod"); else nothing
        cli.use_cpu_cores_as_devices()  # one process: the estimator calls split over the cores
    from infodiff import config_usage, evaluation, parallel, training  # one path for every process and mode

    training.quiet_library_logs()
    config_usage.check_overrides(FLAGS.config, config_usage.override_keys(sys.argv), entry="evaluate")

    report, out_dir = evaluation.evaluate(FLAGS.config, FLAGS.workdir)
    if not parallel.is_primary():
        return  # process 0 prints and writes the report
    print(evaluation.format_report(report))  # printed first: a failed write loses nothing
    jpath, _ = evaluation.write_report(report, out_dir)
    print(f"\nreport written to {jpath}")


if __name__ == "__main__":
    logging.set_verbosity(logging.WARNING)
    sys.argv = _default_config_from_workdir(sys.argv)
    cli.run(main)
