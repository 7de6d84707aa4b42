"""Poisson diffusion (ItDPDM) on scikit-learn's 8x8 digits (counts 0..16), CPU-sized (~5 min).

python train.py --config configs/poisson_digits.py --workdir runs/pois_digits
python evaluate.py --workdir runs/pois_digits

1,439 / 179 / 179 images (infodiff.data.counts.load_digits; the scikit-learn wheel is fetched
once with pip download, sha256-verified, never installed). Denoiser: U-Net-lite (CountConvNet)
with a categorical lattice head; data mapped to [1, 2] (paper's Dn). report.json gives the test
NLL in bits per dimension (64 dims) +- SE and samples.png (increment sampler).
"""

from infodiff.configs import poisson_common


def get_config():
    c = poisson_common.base("poisson_digits")
    c.data.name = "digits"
    c.model.arch = "conv"
    c.model.channels = 32
    c.model.num_blocks = 1
    c.optim.lr = 2e-3
    c.optim.warmup_steps = 100
    c.train.batch_size = 64
    c.train.num_steps = 3000
    c.train.eval_batches = 2
    c.train.eval_every = 1000
    c.train.ckpt_every = 1000
    c.eval.num_samples = 100
    c.eval.batch_size = 2048
    c.eval.num_generate = 32
    c.eval.sample_steps = 500
    return c
