"""The config a training run saved in its workdir: `--config configs/saved_run.py:WORKDIR`.

evaluate.py uses it when given `--workdir` without `--config`, so overrides such as
`--config.eval.num_samples=16` apply to the run's own config. Keys that the run's experiment
config (configs/<experiment>.py) has gained since the run was saved are filled in from it, so
an older run can still be evaluated with newer evaluation options.
"""

import importlib
import json
import os

import ml_collections

from infodiff import config_rules


def _fill_missing(saved: dict, defaults: dict) -> dict:
    out = dict(saved)
    for k, v in defaults.items():
        if k not in out:
            out[k] = v
        elif isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = _fill_missing(out[k], v)
    return out


def get_config(workdir: str) -> ml_collections.ConfigDict:
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: is {workdir!r} a training workdir (python train.py --workdir ...)?"
        )
    with open(path) as f:
        text = f.read()
    try:
        saved = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                         "restore it from a copy, or evaluate with --config configs/<experiment>.py "
                         "and the run's settings") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path} must hold a JSON object (the run's config); got {type(saved).__name__}")
    config_rules.check_run_config(saved, workdir)
    experiment = saved.get("experiment", "")
    try:
        module = importlib.import_module(f"infodiff.configs.{experiment}") if experiment else None
    except ImportError:
        module = None
    if module is not None and hasattr(module, "get_config"):
        saved = _fill_missing(saved, module.get_config().to_dict())
    return ml_collections.ConfigDict(saved)
