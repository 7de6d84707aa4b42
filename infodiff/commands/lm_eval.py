"""``infodiff-lm-eval``: lm-evaluation-harness's command line with the ``infodiff`` model
(:func:`infodiff.harness.main`); without the harness extra, one line saying how to install it."""

import sys


def run() -> int:
    try:
        from infodiff import harness
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return harness.main()


if __name__ == "__main__":
    sys.exit(run())
