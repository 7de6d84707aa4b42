"""``python -m infodiff <command> ...``: ``export`` (also installed as ``infodiff-export``) (a training run
as a checkpoint directory, infodiff/commands/export.py); the other commands are ``train.py``,
``evaluate.py``, ``run_experiment.py`` and ``infodiff-lm-eval``."""

import sys

COMMANDS = ("export",)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        got = repr(sys.argv[1]) if len(sys.argv) > 1 else "nothing"
        print(f"error: infodiff takes a command, one of {', '.join(COMMANDS)}; got {got}", file=sys.stderr)
        sys.exit(1)
    command = sys.argv.pop(1)
    if command == "export":
        from infodiff.commands import export

        export.run()


if __name__ == "__main__":
    main()
