"""Every masked-diffusion estimator with the exact oracle of a tabular distribution.

python evaluate.py --config configs/oracle_tabular.py --config.data.path=FILE.json
FILE.json holds {sequence: probability}. Without data.path a random DNA-128-style table
(128 sequences of length 8 over ACGT, probabilities softmax(u / 0.5), arXiv 2510.24088 §5.1)
is generated from data.seed and written next to the report.
"""

import ml_collections

from infodiff.configs import oracle_common


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "oracle_tabular"

    c.data = ml_collections.ConfigDict()
    c.data.name = "tabular"
    c.data.path = ""              # JSON {sequence: probability}; empty: generate (see above)
    c.data.alphabet = ""          # default: sorted symbols of the table
    c.data.seed = 0               # for the generated table
    c.data.num_support = 128
    c.data.seq_len = 8
    c.data.temperature = 0.5
    c.data.prompt_len = 0         # > 0: also conditional NLL and log-ratios given a prefix

    oracle_common.add_process_and_eval(c)
    c.eval.output_dir = "runs/oracle_tabular"
    return c
