"""Poisson diffusion (ItDPDM) on Fashion-MNIST (28x28, grey levels 0..255).

python train.py --config configs/poisson_fashion_mnist.py --workdir runs/pois_fmnist
python evaluate.py --workdir runs/pois_fmnist --config.eval.max_examples=1000

Data: Debian's dataset-fashion-mnist .deb (fetched over HTTP, sha256-verified, never installed;
infodiff.data.counts.load_fashion_mnist): 55,000 / 5,000 / 10,000. Denoiser: CountConvNet with a
256-way categorical lattice head per pixel.

The defaults below are CPU-sized (a visible start, not a good model: 1,000 steps of batch 32 with
24 channels; measured about 1 step/s on a busy 2-core CPU, where a 20-step run reached
4.2 bits/dim on validation — the independent-pixel-marginal start — so expect ~15 min). Accelerator sizes (paper CIFAR-10 setup, docs/poisson.md §4.2: U-Net with 4 downsampling
blocks and attention, Adam lr 2e-5, 600 epochs): e.g.
  --config.model.channels=128 --config.model.num_blocks=2 --config.train.batch_size=256
  --config.train.num_steps=200000 --config.optim.lr=2e-4 --config.eval.num_samples=100
(this U-Net-lite has two resolutions only; a paper-size backbone is not implemented).
"""

from infodiff.configs import poisson_common


def get_config():
    c = poisson_common.base("poisson_fashion_mnist")
    c.data.name = "fashion_mnist"
    c.model.arch = "conv"
    c.model.channels = 24
    c.model.num_blocks = 1
    c.optim.lr = 1e-3
    c.train.batch_size = 32
    c.train.num_steps = 1000
    c.train.eval_batches = 4
    c.train.eval_every = 500
    c.train.ckpt_every = 500
    c.eval.max_examples = 500
    c.eval.num_samples = 20
    c.eval.batch_size = 256
    c.eval.num_generate = 16
    c.eval.sample_steps = 400
    return c
