"""4th-order Markov conditional toy (arXiv 2510.24088 §5.1, Fig. 1b).

python run_experiment.py --config configs/exp_markov_cond.py --workdir results/markov_cond
Sequences of 32 = 16-symbol prompt + 16-symbol response over ACGT; conditional NLL of the
response by the stratified estimator vs the exact chain-rule value. Paper size:
--config.model.width=256 --config.model.num_layers=8 --config.model.num_heads=8
--config.train.batch_size=1024 --config.train.num_steps=80000 --config.optim.lr=6e-4
"""

from configs import masked_text


def get_config():
    c = masked_text.get_config()
    c.experiment = "markov_cond"
    c.data.name = "toy"
    c.data.seq_len = 32
    c.data.vocab_size = 4
    c.data.aligned = True
    c.process.objective = "k_dce"
    c.model.num_layers = 3
    c.model.num_heads = 4
    c.model.width = 64
    c.optim.lr = 3e-3
    c.optim.warmup_steps = 200
    c.optim.min_lr_ratio = 0.05
    c.train.batch_size = 64
    c.train.num_steps = 12000
    c.train.log_every = 200
    c.train.eval_every = 1000
    c.train.ckpt_every = 2000
    # Temperature 0.15, not the paper's stated 0.5: with 0.5 every row is nearly uniform
    # (probability ratios <= e^2, 0.1 nats of structure per symbol) and a CPU-sized model stays
    # on the uniform plateau for thousands of steps; the paper's released table is itself far
    # more peaked than its stated recipe (spec §10.2). Override with --config.toy.temperature.
    c.toy = dict(seed=0, temperature=0.15, prompt_len=16, response_len=16, num_train=200_000,
                 num_valid=2_000, num_pairs=64, estimator="stratified", num_mc=64)
    return c
