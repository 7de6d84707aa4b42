"""The config a training run saved in its workdir: `--config configs/saved_run.py:WORKDIR`.

evaluate.py uses it when given `--workdir` without `--config`, so overrides such as
`--config.eval.num_samples=16` apply to the run's own config.
"""

import json
import os

import ml_collections


def get_config(workdir: str) -> ml_collections.ConfigDict:
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: is {workdir!r} a training workdir (python train.py --workdir ...)?"
        )
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))
