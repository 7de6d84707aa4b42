"""Byte-level masked diffusion at MD4's text8 model size (configs/masked_text8.py), for accelerators.

The embedded KJV + Shakespeare corpus as raw UTF-8 bytes (configs/masked_bytes.py); 12 layers,
width 768, 12 heads, length 256, batch 512, t-DCE with antithetic t, lr 3e-4 cosine with 2k
warmup, EMA 0.9999, bfloat16 matmuls; the training length, cadence and evaluation budget of
masked_text8.py.

  python train.py --config configs/masked_bytes_large.py --workdir runs/bytes_large
  python evaluate.py --workdir runs/bytes_large
"""

from infodiff.configs import masked_bytes, masked_text8


def get_config():
    c = masked_text8.get_config()
    c.experiment = "masked_bytes_large"
    c.data = masked_bytes.get_config().data
    c.data.seq_len = 256
    return c
