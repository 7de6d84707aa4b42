"""DNA-128 toy (arXiv 2510.24088 §5.1, Fig. 1a): trained time-free model vs exact NLL.

python run_experiment.py --config configs/exp_dna128.py --workdir results/dna128
CPU-sized (minutes on 2 cores). Paper size: --config.model.width=256 --config.model.num_layers=8
--config.model.num_heads=8 --config.train.batch_size=512 --config.train.num_steps=70000
--config.optim.lr=3e-4 --config.toy.num_train=1000000 --config.toy.num_mc=32768
"""

from configs import masked_text


def get_config():
    c = masked_text.get_config()
    c.experiment = "dna128"
    c.data.name = "toy"
    c.data.seq_len = 8
    c.data.vocab_size = 4
    c.data.aligned = True
    c.process.objective = "k_dce"
    c.model.num_layers = 3
    c.model.num_heads = 4
    c.model.width = 64
    c.optim.lr = 3e-3
    c.optim.warmup_steps = 200
    c.optim.min_lr_ratio = 0.05
    c.optim.ema_decay = 0.999
    c.train.batch_size = 256
    c.train.num_steps = 12000
    c.train.log_every = 200
    c.train.eval_every = 1000
    c.train.ckpt_every = 2000
    c.toy = dict(seed=0, temperature=0.5, num_train=1_000_000, num_valid=10_000, num_mc=4096)
    return c
