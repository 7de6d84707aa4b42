"""The LLaDA tables of arXiv 2510.24088 (Table 1): variance of conditional NLL estimates at fixed
forward passes (time-integral vs time-free vs k-DCE vs stratified) and of coupled vs decoupled
log-ratios, on a released LLaDA checkpoint (infodiff/experiments/llada_tables.py).

python run_experiment.py --config configs/exp_llada_tables.py --workdir results/llada_tables \
    --config.llada.checkpoint=~/models/LLaDA-8B-Base \
    --config.llada.pairs=hellaswag_pairs.jsonl --config.llada.triplets=beavertails_triplets.jsonl
pairs: JSONL {"prompt", "response"} texts (the paper: a question, and "Correct: ... | Incorrect:
..."); triplets: JSONL {"prompt", "response", "alt_response"} (the paper: BeaverTails prompt, safe
and unsafe replies); tokenised by the checkpoint's tokenizer.json. Empty: random token ids of
prompt_len + response_len (the CPU check on a tiny random checkpoint, e.g.
tests/fixtures/pretrained/llada, with the variant 'cpu').
"""

import ml_collections


def get_config(variant: str = ""):
    c = ml_collections.ConfigDict()
    c.experiment = "llada_tables"
    # The paper's protocol (§5.2): 30 pairs x 15 repeats at 128/256/512 passes; ~500 triplets x 8
    # estimates at 5/10/15/20 samples. BF16 weights and compute (docs/pretrained_llada.md).
    c.llada = dict(checkpoint="", dtype="bfloat16", tokenizer="", pairs="", triplets="", seed=0,
                   num_pairs=30, reps=15, budgets=(128, 256, 512),
                   estimators=("lambda_dce", "time_free", "k_dce", "stratified"),
                   num_triplets=500, ratio_samples=(5, 10, 15, 20), ratio_reps=8,
                   prompt_len=64, response_len=64, batch_size=64)
    if variant == "cpu":  # a tiny random checkpoint on a CPU, in seconds
        c.llada.update(dict(dtype="float32", num_pairs=3, reps=3, budgets=(16,), num_triplets=3,
                            ratio_samples=(4,), ratio_reps=3, prompt_len=4, response_len=4, batch_size=64))
    elif variant:
        raise ValueError(f"unknown variant {variant!r} of exp_llada_tables: '' (the paper's protocol) or 'cpu'")
    return c
