"""Poisson diffusion (ItDPDM) on a synthetic count distribution, CPU-sized (about 1-2 min).

python train.py --config configs/poisson_synthetic.py --config.data.distribution=zip --workdir runs/pois_zip
python evaluate.py --workdir runs/pois_zip

Distributions: infodiff.data.count_synthetic.NAMES (ItDPDM Table 5, docs/poisson.md §5.1). The paper's
synthetic denoiser ("ConditionalMLP", docs/poisson.md §4.2) is a 3 x 64 MLP with LayerNorm and LeakyReLU(0.2);
the paper trains 200 epochs of 50k samples (batch 128, Adam 1e-3) — here 2,000 steps of 128.
report.json gives the exact entropy, the model's test NLL +- SE (nats / example) and the
Wasserstein-1 distance of 10,000 generated samples (increment sampler) to the true pmf.
"""

from infodiff.configs import poisson_common


def get_config():
    c = poisson_common.base("poisson_synthetic")
    c.data.name = "synthetic"
    c.data.distribution = "zip"
    c.eval.num_samples = 100
    return c
