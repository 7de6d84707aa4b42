"""Every masked-diffusion estimator with the exact oracle of a tabular distribution.

python evaluate.py --config configs/oracle_tabular.py --config.data.path=FILE.json
FILE.json holds {sequence: probability}. Without data.path a random DNA-128-style table
(128 sequences of length 8 over ACGT, probabilities softmax(u / 0.5), arXiv 2510.24088 §5.1)
is generated from data.seed and written next to the report.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "oracle_tabular"
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.name = "tabular"
    c.data.path = ""              # JSON {sequence: probability}; empty: generate (see above)
    c.data.alphabet = ""          # default: sorted symbols of the table
    c.data.seed = 0               # for the generated table
    c.data.num_support = 128
    c.data.seq_len = 8
    c.data.temperature = 0.5
    c.data.prompt_len = 0         # > 0: also conditional NLL and log-ratios given a prefix

    c.process = ml_collections.ConfigDict()
    c.process.name = "masked"
    c.process.schedule = "linear"
    c.process.eps = 1e-4

    c.eval = ml_collections.ConfigDict()
    c.eval.estimators = "t_dce,lambda_dce,k_dce,time_free,stratified"
    c.eval.num_sequences = 16     # sequences drawn from the distribution
    c.eval.num_samples = 1024     # Monte Carlo samples per sequence (= forward passes)
    c.eval.batch_size = 4096
    c.eval.seed = 1234
    c.eval.output_dir = "runs/oracle_tabular"
    return c
