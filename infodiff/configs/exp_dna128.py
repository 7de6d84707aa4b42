"""DNA-128 toy (arXiv 2510.24088 §5.1, Fig. 1a): trained time-free model vs exact NLL.

python run_experiment.py --config configs/exp_dna128.py --workdir results/dna128
CPU-sized (minutes on 2 cores). The paper's settings (8 x 256, 8 heads, 70k steps x 512, lr 3e-4,
the released optimiser: 2500 linear warmup steps then constant, b2 0.999, EMA 0.9999, dropout
0.02; arXiv 2510.24088 §5.1 and its released configs) are the override set ``paper``:

python run_experiment.py --config configs/exp_dna128.py:paper --workdir results/dna128_paper
"""

from infodiff.configs import masked_text

# The released optimiser and model of arXiv 2510.24088's toys (shared by both toy configs).
PAPER_COMMON = {
    "model.num_layers": 8, "model.width": 256, "model.num_heads": 8, "model.dropout": 0.02,
    "optim.decay": "constant", "optim.warmup_steps": 2500, "optim.b2": 0.999, "optim.ema_decay": 0.9999,
}
PAPER = dict(PAPER_COMMON, **{"train.batch_size": 512, "train.num_steps": 70_000, "optim.lr": 3e-4,
                              "train.eval_every": 5000, "train.ckpt_every": 5000, "toy.num_mc": 32768})


def apply_variant(c, variant: str, sets: dict):
    """``c`` with the override set ``variant`` ('' = none; 'paper' = ``sets``) applied, keys
    as on the command line. Raises ValueError naming an unknown variant."""
    if variant in ("", None):
        return c
    if variant != "paper":
        raise ValueError(f"unknown config variant {variant!r}: the only override set is 'paper' "
                         "(--config FILE.py:paper)")
    for key, value in sets.items():
        node = c
        *parents, leaf = key.split(".")
        for name in parents:
            node = node[name]
        if leaf not in node:  # a set may change keys, never add one
            raise KeyError(f"override set {variant!r}: the config has no key {key!r}")
        node[leaf] = value
    return c


def get_config(variant: str = ""):
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
    return apply_variant(c, variant, PAPER)
