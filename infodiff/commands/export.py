"""``infodiff-export --workdir W --out DIR`` (or ``python -m infodiff export ...``): write a training run as a checkpoint directory
(config.json + model.safetensors) that ``infodiff.load_pretrained(DIR)`` and ``evaluate.py
--pretrained DIR`` read back bit-identically (docs/pretrained.md).

  infodiff-export --workdir runs/masked_text --out exported/masked_text     # EMA parameters
  python -m infodiff export --workdir W --out DIR --noema                   # the raw parameters

Errors (a workdir that is not a run, an existing non-empty --out) are one line, exit status 1,
and nothing is written.
"""


from absl import flags

from infodiff import cli

USAGE = "give --workdir W (a training run) and --out DIR (a new directory)"

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "The training run to export.")
flags.DEFINE_string("out", None, "The new checkpoint directory (config.json + model.safetensors).")
flags.DEFINE_boolean("ema", None, "EMA parameters (default: the run's eval.use_ema).")
flags.mark_flags_as_required(["workdir", "out"])


def main(argv):
    del argv
    from infodiff.pretrained import export

    out = export.export(FLAGS.workdir, FLAGS.out, ema=FLAGS.ema)
    print(f"exported {FLAGS.workdir} to {out} (config.json + model.safetensors)")


def run() -> None:
    """The ``infodiff export`` command (``python -m infodiff export``)."""
    cli.run(main, doc=__doc__, usage=USAGE)


if __name__ == "__main__":
    run()
