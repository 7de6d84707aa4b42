"""Likelihood report with standard errors.

  infodiff-evaluate --workdir runs/masked_text                        # installed; or python evaluate.py
  python evaluate.py --workdir runs/masked_text                       # trained model, test split
  python evaluate.py --workdir runs/masked_text --config.eval.estimator=k_dce --config.eval.num_samples=8
  python evaluate.py --config configs/oracle_tabular.py --config.data.path=FILE.json
  python evaluate.py --config configs/oracle_markov.py
  python evaluate.py --workdir runs/sedd_absorb                       # SEDD: the I-MDSE likelihood
  python evaluate.py --config configs/oracle_sedd_tabular.py          # SEDD with exact scores
  python evaluate.py --workdir runs/pois_digits                       # Poisson: nats / example, bits / dim
  python evaluate.py --config configs/oracle_poisson.py --config.data.distribution=zipf
  python evaluate.py --config configs/oracle_poisson.py --config.data.path=pmf.json   # {count: probability}
  python evaluate.py --workdir W1 --compare W2 --config.eval.input=docs.txt   # two runs, paired difference
  python evaluate.py --pretrained DIR --config.eval.input=docs.txt     # a released checkpoint (SEDD, MDLM ...)
  python evaluate.py --pretrained DIR1 --compare DIR2 --config.eval.input=docs.txt  # two checkpoints (or a run)

Prints the table, then writes report.json (schema in docs/report.md) and report.txt into the
workdir or config.eval.output_dir (with eval.input W/scores/<file name>-<hash>/ by default, with the
rows.* files), as one unit (both from this run or both from the previous one, even after a
kill -9). The newest checkpoint that passes verification is evaluated (a corrupted newer one is
named in a warning and skipped; one that a training run writing the workdir deletes while it is
read is not: the checkpoints are listed again). Errors
(including a read-only or full output directory, after the table is printed) are one line on
stderr and exit status 1. ``--config`` takes a file or the name of a shipped config
(infodiff/configs/: oracle_markov, ...).
"""

import os
import sys

from absl import flags, logging
from ml_collections import config_flags

from infodiff import cli  # imports nothing heavy


USAGE = ("give --workdir W (a training run), --pretrained DIR (a released checkpoint) or --config NAME or FILE "
         "(e.g. oracle_markov)")


def _pretrained_config_arg(argv):
    """Without --config, ``--pretrained DIR`` evaluates with infodiff/pretrained/cli_config.py:DIR."""
    if any(a == "--config" or a.startswith("--config=") for a in argv):
        return argv
    for i, a in enumerate(argv):
        if a.startswith("--pretrained="):
            found = a.split("=", 1)[1]
        elif a == "--pretrained" and i + 1 < len(argv):
            found = argv[i + 1]
        else:
            continue
        here = os.path.join(os.path.dirname(cli.CONFIG_DIR), "pretrained", "cli_config.py")
        return argv[:1] + [f"--config={here}:{found}"] + argv[1:]
    return argv


FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (default: the run's saved config).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Training run directory (network mode).")
flags.DEFINE_string("pretrained", None, "A released checkpoint's directory (config.json + model.safetensors: "
                    "SEDD, MDLM ...; docs/pretrained.md): score --config.eval.input=FILE with it.")
flags.mark_flag_as_required("config")  # --workdir alone gives the run's saved config
cli.define_distributed_flags()
cli.define_compare_flag()


def main(argv):
    del argv
    if not cli.start_distributed():  # one of several processes (docs/pods.md); else nothing
        cli.use_cpu_cores_as_devices()  # one process: the estimator calls split over the cores
    from infodiff import config_usage, evaluation, parallel, training  # one path for every process and mode

    training.quiet_library_logs()
    entry = "compare" if FLAGS.compare else ("pretrained" if FLAGS.pretrained else "evaluate")
    config_usage.check_overrides(FLAGS.config, config_usage.override_keys(sys.argv), entry=entry)

    report, out_dir = evaluation.evaluate(FLAGS.config, FLAGS.workdir, FLAGS.compare, pretrained=FLAGS.pretrained)
    if not parallel.is_primary():
        return  # process 0 prints and writes the report
    print(evaluation.format_report(report))  # printed first: a failed write loses nothing
    jpath, _ = evaluation.write_report(report, out_dir, exclusive=evaluation.report.exclusive(FLAGS.config))
    print(f"\nreport written to {jpath}")


def run() -> None:
    """The ``infodiff-evaluate`` command (and ``python evaluate.py``)."""
    logging.set_verbosity(logging.WARNING)
    sys.argv = cli.saved_config_arg(sys.argv)  # --workdir alone: the run's saved config
    sys.argv = _pretrained_config_arg(sys.argv)  # --pretrained alone: the checkpoint's config
    cli.run(main, doc=__doc__, usage=USAGE)
