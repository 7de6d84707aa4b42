"""SEDD (absorbing and uniform graphs) with the exact score of a k-th order Markov chain.

python evaluate.py --config configs/oracle_sedd_markov.py [--config.data.path=TABLE.json]

Uniform graph: the noised sequence is a hidden Markov model, so exact score ratios come from
forward-backward (infodiff.oracles.MarkovOracle.log_score); absorbing graph: a times the exact
masked conditionals. Reports I-MDSE of -log p(x) for both graphs and, for the absorbing graph,
the conditional -log p(y | x) of the response given the prompt.
"""

import ml_collections

from infodiff.configs import oracle_common, oracle_markov


def get_config() -> ml_collections.ConfigDict:
    c = oracle_markov.get_config()
    c.experiment = "oracle_sedd_markov"
    c.data.order = 2
    oracle_common.add_sedd_process_and_eval(c)
    c.eval.sampler_steps = ()     # no enumeration of 4^32 sequences
    c.eval.output_dir = "runs/oracle_sedd_markov"
    return c
