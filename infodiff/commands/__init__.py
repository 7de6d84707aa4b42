"""The command-line programs, installed as ``infodiff-train``, ``infodiff-evaluate`` and
``infodiff-experiment`` (``[project.scripts]`` in pyproject.toml); the checkout's ``train.py``,
``evaluate.py`` and ``run_experiment.py`` call the same ``run`` functions. Each module defines its
absl flags when imported, so import one per process."""
