"""Blocks shared by the experiment configs: the optimiser and the training cadence.

Each experiment file builds its config from these and overrides what differs, so a default
lives in one place. Keys: see infodiff/training/state.py (optim) and infodiff/training/loop.py
(train).
"""

import ml_collections


def optim(**overrides) -> ml_collections.ConfigDict:
    """AdamW with linear warmup then cosine decay, global-norm clipping and an EMA."""
    o = ml_collections.ConfigDict()
    o.lr = 1e-3
    o.warmup_steps = 200
    o.decay = "cosine"       # cosine | constant
    o.min_lr_ratio = 0.1     # cosine: final lr = lr * min_lr_ratio
    o.decay_steps = 0        # cosine: length of the decay; 0 = train.num_steps (lr * min_lr_ratio after it)
    o.weight_decay = 0.0     # decoupled (AdamW), kernels and embeddings only
    o.b1 = 0.9
    o.b2 = 0.99
    o.eps = 1e-8
    o.grad_clip = 1.0        # <= 0 disables clipping
    o.ema_decay = 0.999      # evaluation uses the EMA parameters
    o.update(overrides)
    return o


def train(**overrides) -> ml_collections.ConfigDict:
    """Batch size, length of the run and the log / validation / checkpoint cadence."""
    t = ml_collections.ConfigDict()
    t.batch_size = 64
    t.num_steps = 3000
    t.log_every = 50
    t.eval_every = 500
    t.eval_batches = 4       # fixed validation batches, EMA parameters
    t.ckpt_every = 250
    t.keep_checkpoints = 3
    # Stop (one line, nothing saved) on a non-finite gradient norm or a training loss above
    # max_loss_ratio x the uniform model's (infodiff/training/guard.py); non-finite losses and
    # states always stop the run.
    t.divergence_guard = True
    t.max_loss_ratio = 10.0
    # Devices as data x fsdp (infodiff/parallel.py): -1 = the rest of the devices of every
    # process. fsdp > 1 splits parameters and optimizer state over that many devices.
    t.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1})
    # Where the metrics go besides W/metrics.jsonl (always written): 'jsonl' (only there),
    # 'tensorboard' (W/tensorboard/), 'wandb' (offline, W/wandb/); several comma-separated
    # (infodiff/training/sinks.py, docs/monitoring.md).
    t.log_to = "jsonl"
    t.update(overrides)
    return t
