"""MD4's text8 setting (arXiv 2406.04329 App. J.1), for accelerators.

12 layers, width 768, 12 heads, length 256, batch 512, 1M steps, linear schedule eps 1e-4,
t-DCE (continuous-time ELBO) with antithetic t, lr 3e-4 cosine with 2k warmup, EMA 0.9999.
Needs a real text8 file (standard 90M/5M/5M split):

  python train.py --config configs/masked_text8.py --workdir runs/text8 --config.data.path=/data/text8
  python evaluate.py --workdir runs/text8

Published reference: MD4 <= 1.37 bits per character on the text8 test split (MD4 Table 2).
The batch is split over every device of every process (it must divide by the device count);
config.train.mesh.fsdp > 1 also splits the parameters (docs/pods.md).
"""

from infodiff.configs import masked_text


def get_config():
    c = masked_text.get_config()
    c.experiment = "masked_text8"
    c.data.name = "text8"
    c.data.path = ""  # REQUIRED: path to the text8 file
    c.data.seq_len = 256

    c.process.schedule = "linear"
    c.process.eps = 1e-4
    c.process.objective = "t_dce"
    c.process.antithetic = True

    c.model.num_layers = 12
    c.model.num_heads = 12
    c.model.width = 768
    c.model.dropout = 0.0
    c.model.time_conditioning = True
    c.model.dtype = "bfloat16"

    c.optim.lr = 3e-4
    c.optim.warmup_steps = 2000
    c.optim.decay = "cosine"
    c.optim.min_lr_ratio = 0.0
    c.optim.b2 = 0.999
    c.optim.weight_decay = 0.0
    c.optim.ema_decay = 0.9999

    c.train.batch_size = 512
    c.train.num_steps = 1_000_000
    c.train.log_every = 1000
    c.train.eval_every = 20_000
    c.train.eval_batches = 16
    c.train.ckpt_every = 10_000
    c.train.keep_checkpoints = 3

    c.eval.estimator = "k_dce"
    c.eval.num_samples = 8
    c.eval.batch_size = 512
    return c
