"""Uniform-state diffusion (UDLM NELBO) with the exact mean denoiser of a tabular distribution.

python evaluate.py --config configs/oracle_uniform_state.py [--config.data.path=FILE.json]

Reports the NELBO of the exact (leave-one-out posterior) mean denoiser, diffusion + prior +
truncation terms, with its standard error next to the exact -log p(x): equal in expectation
(docs/uniform_state.md §4). Without data.path a random DNA-style table is generated from
data.seed. Whole sequences only (no prompt).
"""

import ml_collections

from infodiff.configs import oracle_tabular


def get_config() -> ml_collections.ConfigDict:
    c = oracle_tabular.get_config()
    c.experiment = "oracle_uniform_state"
    del c.data.prompt_len         # whole sequences only (the process has no conditionals)
    c.process = ml_collections.ConfigDict()
    c.process.name = "uniform_state"
    c.process.schedule = "loglinear"  # lam(1) = 1 - eps: the end of the NELBO integral (prior KL after it)
    c.process.eps = 1e-3
    del c.eval.estimators         # one estimator: udlm (lam = lam_max u^3)
    c.eval.num_samples = 1024     # Monte Carlo samples per sequence (>= min_samples 512)
    c.eval.output_dir = "runs/oracle_uniform_state"
    return c
