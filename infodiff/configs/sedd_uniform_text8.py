"""SEDD, uniform graph, text8 at paper size, for accelerators (SEDD Uniform <= 1.47 bpc, SEDD Table 2).

As configs/sedd_absorb_text8.py with process.graph = 'uniform' and SEDD's geometric noise
(sigma_min 1e-4, sigma_max 20) that its uniform runs use:

  python train.py --config configs/sedd_uniform_text8.py --workdir runs/sedd_u_text8 --config.data.path=/data/text8
"""

from infodiff.configs import sedd_absorb_text8


def get_config():
    c = sedd_absorb_text8.get_config()
    c.experiment = "sedd_uniform_text8"
    c.process.graph = "uniform"
    c.process.schedule = "geometric"
    c.eval.lambda_sampling = "importance"
    c.eval.input_samples = 512            # the uniform graph's min_samples (calibrated SE)
    c.process.clean_prefix_prob = 0.0     # > 0: clean prompts in training, for conditionals
    return c
