"""Every masked-diffusion estimator with the exact oracle of a k-th order Markov chain.

python evaluate.py --config configs/oracle_markov.py --config.data.path=TABLE.json
TABLE.json holds {context: {symbol: probability}}. Sequences are [prompt; response]; the
report has unconditional NLL of the whole sequence, conditional NLL of the response given the
prompt, and coupled vs decoupled log-ratios log p(y | x) - log p(y' | x) with y' ~ p(. | x).
Without data.path a random chain (rows softmax(u / 0.5), as the I-MDCE paper states for its
4th-order toy) is generated from data.seed and written next to the report.
"""

import ml_collections

from infodiff.configs import oracle_common


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "oracle_markov"

    c.data = ml_collections.ConfigDict()
    c.data.name = "markov"
    c.data.path = ""              # JSON {context: {symbol: probability}}; empty: generate
    c.data.alphabet = ""          # default: sorted symbols of the table
    c.data.seed = 0
    c.data.order = 4              # for the generated chain
    c.data.generated_alphabet = "ACGT"
    c.data.temperature = 0.5
    c.data.prompt_len = 16
    c.data.response_len = 16

    oracle_common.add_process_and_eval(c)
    c.eval.output_dir = "runs/oracle_markov"
    return c
