"""``infodiff-lm-eval``: lm-evaluation-harness's command line with the ``infodiff`` model
(:func:`infodiff.harness.main`); without the harness extra, one line saying how to install it."""

import os
import sys


def install_hint() -> str:
    """How to install the harness extra: from a checkout (a ``pyproject.toml`` beside the
    ``infodiff`` package), ``pip install -e '<checkout>[harness]'``; from an installed package,
    ``pip install 'infodiff[harness]'``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.isfile(os.path.join(root, "pyproject.toml")):
        return f"pip install -e '{root}[harness]'"
    return "pip install 'infodiff[harness]'"


def run() -> int:
    try:
        from infodiff import harness
    except ImportError:
        print(f"error: infodiff-lm-eval needs lm-evaluation-harness: {install_hint()} "
              "(or pip install 'lm-eval>=0.4.13')", file=sys.stderr)
        return 1
    return harness.main()


if __name__ == "__main__":
    sys.exit(run())
