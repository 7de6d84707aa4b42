"""Uniform-state diffusion (UDLM / duo) on the embedded text corpus; CPU-sized.

    python train.py --config configs/uniform_text.py --workdir runs/uniform_text
    python evaluate.py --workdir runs/uniform_text

Same model size, data, batch, steps and optimiser as configs/masked_text.py (so the bits per
character are comparable at the same budget); the process is uniform-state diffusion: each
token stays with probability alpha_t = 1 - (1 - eps) t (loglinear, eps = 1e-3 as UDLM / duo)
and is otherwise redrawn uniformly over the 27 characters; a time-conditioned transformer
(conditioned on the noise level lam = 1 - alpha_t) predicts x_theta (the mean
parametrisation) and is trained on UDLM's continuous-time NELBO (t ~ U[0, 1), antithetic).
evaluate.py reports the NELBO (diffusion + prior + truncation terms) with a standard error, in
nats and bits per character (docs/uniform_state.md). Only whole-sequence likelihoods: the
masked runs' any-order likelihoods, user files and samplers are not part of this process.

Paper-size: the overrides listed in configs/sedd_absorb_text.py (text8, 12 layers, width 768).
"""

import ml_collections

from infodiff.configs import masked_text

# masked-run eval keys this process does not read (it refuses them by name: tasks/uniform_state.py)
NOT_HERE = masked_text.ORDER_KEYS + ("input", "input_unit", "input_samples", "target_se", "input_max_samples",
                                     "choice_confidence", "choice_samples", "choice_max_samples", "limit",
                                     "num_generate", "sample_steps")


def get_config() -> ml_collections.ConfigDict:
    c = masked_text.get_config()
    c.experiment = "uniform_text"
    c.process = ml_collections.ConfigDict()
    c.process.name = "uniform_state"
    c.process.schedule = "loglinear"    # alpha_t = 1 - (1 - eps) t (UDLM / duo); any infodiff schedule
    c.process.eps = 1e-3                # loglinear: lam(1) = 1 - eps, the prior term KL(q(z_1 | x) || uniform)
    c.process.antithetic = True         # low-discrepancy t across the batch (training)
    c.model.time_conditioning = True    # conditioned on lam = 1 - alpha_t (UDLM / duo condition on time)
    c.eval.estimator = "udlm"           # the NELBO, lam = lam_max u^3 (the only estimator here)
    c.eval.num_samples = 4              # per test sequence: the split SE pools them (a row needs 512 for its own SE)
    for k in NOT_HERE:
        del c.eval[k]
    return c
