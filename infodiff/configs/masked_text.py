"""Masked diffusion on the embedded KJV + Shakespeare text8-format corpus, CPU-sized.

python train.py --config configs/masked_text.py --workdir runs/masked_text
python evaluate.py --workdir runs/masked_text
Makes visible progress in minutes on a 2-core CPU; see README for measured numbers.
"""

import ml_collections

from infodiff.configs import common


# eval keys of the any-order likelihood (infodiff/orders.py): masked runs only.
ORDER_KEYS = ("interval", "interval_orders", "interval_level", "interval_proposal", "sampler_likelihood")


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "masked_text"
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.name = "text"          # 'text': embedded corpus; set data.path for a real text8 file
    c.data.path = ""              # text8 file (standard 90M/5M/5M split) instead of the embedded corpus
    c.data.cache_dir = ""         # default $INFODIFF_DATA or ~/.cache/infodiff
    c.data.seq_len = 64
    c.data.vocab_size = 27        # a-z and space; the mask id is vocab_size

    c.process = ml_collections.ConfigDict()
    c.process.name = "masked"
    c.process.schedule = "linear"  # linear | cosine | polyK | loglinear | geometric
    c.process.eps = 1e-4           # MD4 shift (linear/cosine/poly); loglinear uses 1e-3
    c.process.objective = "k_dce"  # training objective: t_dce | lambda_dce | k_dce | time_free
    c.process.finite_T = 0         # 0: continuous time; T > 0: MD4 discrete-time ELBO (t_dce)
    c.process.antithetic = True    # low-discrepancy t across the batch (training only)

    c.model = ml_collections.ConfigDict()
    c.model.num_layers = 4
    c.model.num_heads = 4
    c.model.width = 128
    c.model.mlp_ratio = 4
    c.model.dropout = 0.0
    c.model.time_conditioning = False  # RADD-style time-free network
    c.model.dtype = "float32"          # matmul dtype: float32 | bfloat16 (params, outputs, losses: float32)
    c.model.allow_float16 = False      # True: accept dtype 'float16' (no loss scaling; read only for float16)
    c.model.attention = "einsum"       # einsum (reference) | dot_product (jax.nn.dot_product_attention)

    c.optim = common.optim()
    c.train = common.train()

    c.eval = ml_collections.ConfigDict()
    c.eval.mode = "network"         # network (a trained run) | oracle (exact denoiser; the oracle configs)
    c.eval.estimator = "k_dce"      # t_dce | lambda_dce | k_dce | time_free (k_dce: lowest variance measured, see RESULTS.md)
    c.eval.num_samples = 4          # Monte Carlo masks per test sequence
    c.eval.batch_size = 256         # rows per forward pass
    c.eval.split = "test"
    c.eval.max_sequences = 0        # 0: every non-overlapping chunk of the split
    c.eval.use_ema = True
    c.eval.seed = 1234
    c.eval.num_generate = 4         # samples shown in the report (MD4 ancestral sampler)
    c.eval.sample_steps = 64
    c.eval.input = ""               # a file to score instead of the split: .txt (one document per line) or .jsonl
    c.eval.input_unit = "line"      # .txt: 'line' (one document per line) | 'file' (the whole file)
    c.eval.input_samples = 32       # Monte Carlo samples per window of an input row (docs/scoring.md)
    c.eval.target_se = 0.0          # > 0: add samples until every input row's SE (nats) is at most this
    c.eval.input_max_samples = 1024  # the bound of a target_se run (samples per window)
    # a multiple-choice .jsonl ({"prompt", "choices", "answer"}): coupled options, adaptive stopping
    c.eval.choice_confidence = 0.95  # a choice is decided when it beats every rival at this confidence
    c.eval.choice_samples = 0        # the first round's samples per option (0: 2 x the estimator's min_samples)
    c.eval.choice_max_samples = 0    # the cap per option (0: max(128, 4 x the first round); k_dce 128)
    c.eval.limit = 0                # eval.input: score the first N rows only (0: every row)
    c.eval.output_dir = ""          # '': the workdir (split), W/scores/<file name>-<folder hash>/ (eval.input)
    c.eval.overwrite = False        # False: refuse an output folder that already holds a report
    # The model's own -log p (a mixture over generation orders), not only its NELBO: an interval
    # from importance-weighted orders (upper side) and TUBE (lower side), infodiff/orders.py.
    c.eval.interval = False         # True: add the interval block to the report (and to input rows)
    c.eval.interval_orders = 16     # K orders per item (>= 2), and as many pilot orders
    c.eval.interval_level = 0.95    # the interval's level, in (0, 1)
    c.eval.interval_proposal = "uniform"   # uniform | informed: the law the orders are drawn from
    c.eval.sampler_likelihood = ""  # '' | greedy_confidence | margin | left_to_right | ancestral (T = sample_steps)
    return c
