"""Block diffusion (BD3-LM) on the embedded text8-format corpus, CPU-sized: masked diffusion
within blocks of L' = 4 characters, block after block (docs/block_diffusion.md).

python train.py --config configs/block_text.py --workdir runs/block_text
python train.py --config configs/block_text.py:16 --workdir runs/block_text16   # blocks of 16
python evaluate.py --workdir runs/block_text

evaluate.py reports the block NELBO ± SE and, for this time-free network, the exact block
likelihood (every block by the subset recursion, 2^L' - 1 passes per block) with the gap.
"""

import ml_collections

from infodiff.configs import masked_text


def get_config(block_size: str = "") -> ml_collections.ConfigDict:
    """``block_size``: the config argument (``configs/block_text.py:16``), default 4."""
    c = masked_text.get_config()
    c.experiment = "block_text"
    c.process.name = "block"
    c.process.block_size = int(block_size) if block_size else 4   # L': tokens per block; must divide data.seq_len
    c.eval.sample_steps = 4         # ancestral steps per block of the report's samples
    # The model's own likelihood: the exact block likelihood (time-free network, L' <= the budget);
    # a time-conditioned network gets the per-block interval (eval.interval_*) instead.
    c.eval.exact = True
    c.eval.exact_max_block_size = 16   # the budget: the largest L' computed exactly (2^L' - 1 passes per block)
    # '' | greedy_confidence | margin | left_to_right | ancestral (T = sample_steps per block): -log p of
    # that unmasking sampler, block after block (exact for the deterministic policies)
    c.eval.sampler_likelihood = ""
    return c
