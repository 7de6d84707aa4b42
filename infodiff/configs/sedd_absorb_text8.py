"""SEDD, absorbing graph, text8 at paper size (SEDD arXiv 2310.16834 §5.2 / App. C.3), for accelerators.

SEDD's text8 run follows D3PM's setup: 12 layers, width 768, 12 heads, length 256, batch 512,
AdamW lr 3e-4 with 2000 warmup steps, gradient clip 1, EMA 0.9999, loglinear noise (eps 1e-3),
bfloat16 compute; RADD trains 400k iterations. Published: SEDD Absorb <= 1.39 bits per character
on the text8 test split (SEDD Table 2). Needs a real text8 file:

  python train.py --config configs/sedd_absorb_text8.py --workdir runs/sedd_text8 --config.data.path=/data/text8
  python evaluate.py --workdir runs/sedd_text8
"""

from infodiff.configs import masked_text8, sedd_absorb_text


def get_config():
    c = masked_text8.get_config()
    sedd = sedd_absorb_text.get_config()
    c.experiment = "sedd_absorb_text8"
    c.process = sedd.process
    c.eval = sedd.eval
    c.eval.num_samples = 8
    c.eval.batch_size = 512
    c.eval.sample_steps = 256
    c.train.num_steps = 400_000
    c.optim.decay = "constant"  # SEDD: constant learning rate after warmup
    return c
