"""Score-entropy discrete diffusion (SEDD), absorbing graph, on the embedded text corpus; CPU-sized.

    python train.py --config configs/sedd_absorb_text.py --workdir runs/sedd_absorb_text
    python evaluate.py --workdir runs/sedd_absorb_text

Same model size, data, batch, steps and optimiser as configs/masked_text.py (so the bits per
character are comparable at the same budget); the process is SEDD's: loglinear noise
(eps = 1e-3), t ~ U[0, 1) antithetic, DSE loss sigma(t) * score entropy (SEDD Eq. 3), a
time-conditioned transformer (conditioned on the noise level lam) whose head gives SEDD's
"scale by sigma" log-scores (score_param='direct'; 'mean' is RADD's normalised head).
evaluate.py reports the I-MDSE likelihood (integral of the DSE in lam + the prior KL) with a
standard error, and samples with the Tweedie ("analytic") sampler.

Paper-size (SEDD text8 follows D3PM: 12 layers, width 768, length 256, batch 512, lr 3e-4,
EMA 0.9999; SEDD Absorb <= 1.39 bpc), for accelerators with a real text8 file:
    --config.data.name=text8 --config.data.path=/data/text8 --config.data.seq_len=256
    --config.model.num_layers=12 --config.model.num_heads=12 --config.model.width=768
    --config.train.batch_size=512 --config.train.num_steps=400000 --config.optim.lr=3e-4
    --config.optim.warmup_steps=2000 --config.optim.ema_decay=0.9999
"""

import ml_collections

from infodiff.configs import masked_text


def get_config() -> ml_collections.ConfigDict:
    c = masked_text.get_config()
    c.experiment = "sedd_absorb_text"
    c.process = ml_collections.ConfigDict()
    c.process.name = "sedd"
    c.process.graph = "absorb"          # absorb | uniform
    c.process.schedule = "loglinear"    # loglinear (SEDD absorb) | geometric (SEDD uniform) | ...
    c.process.eps = 1e-3                # loglinear: lam(1) = 1 - eps
    c.process.sigma_min = 1e-4          # geometric only
    c.process.sigma_max = 20.0          # geometric only
    c.process.score_param = "direct"    # direct (SEDD log-scores) | mean (x0-prediction)
    c.process.antithetic = True
    c.model.time_conditioning = True    # conditioned on lam

    c.eval.estimator = "imdse"          # the I-MDSE likelihood (the only SEDD estimator)
    c.eval.lambda_sampling = "defensive"  # defensive | importance (finite variance) | uniform (infinite)
    c.eval.num_samples = 4
    c.eval.input_samples = 128          # per window of a user's file: the absorbing graph's min_samples
    c.eval.sampler = "tweedie"          # tweedie (SEDD 'analytic') | euler
    c.eval.sample_steps = 64
    for k in masked_text.ORDER_KEYS:  # any-order likelihoods: masked runs only (infodiff/orders.py)
        del c.eval[k]
    return c
