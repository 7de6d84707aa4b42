"""The masked process's estimators, one law each (:class:`infodiff.processes.masking.MaskLaw`).

``dce.py``: the one-draw laws of arXiv 2510.24088 (t_dce, lambda_dce, k_dce, time_free) and
the stratified estimator; ``neyman.py``: the two-stage neyman estimator. Importing this package
registers them in :data:`infodiff.processes.masking.LAWS` in that order, then every other module
of the package: a new estimator is a new module here that calls ``masking.register_law``.
"""

import importlib
import pkgutil

from infodiff.processes.mask_laws import dce, neyman  # noqa: F401  (the built-in laws, in order)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
