"""Process and evaluation settings shared by the oracle configs."""

import ml_collections


def add_process_and_eval(c: ml_collections.ConfigDict) -> None:
    """Masked process (linear schedule, eps 1e-4) and every estimator, 16 x 1024 samples."""
    c.process = ml_collections.ConfigDict()
    c.process.name = "masked"
    c.process.schedule = "linear"
    c.process.eps = 1e-4

    c.eval = ml_collections.ConfigDict()
    c.eval.mode = "oracle"
    c.eval.estimators = ("t_dce", "lambda_dce", "k_dce", "time_free", "stratified", "neyman")
    c.eval.num_sequences = 16     # sequences drawn from the distribution
    c.eval.num_samples = 1024     # Monte Carlo samples per sequence (= forward passes)
    c.eval.batch_size = 4096
    c.eval.seed = 1234


def add_sedd_process_and_eval(c: ml_collections.ConfigDict) -> None:
    """SEDD (score-entropy) settings: both graphs, I-MDSE with the exact score, sampler TV."""
    c.process = ml_collections.ConfigDict()
    c.process.name = "sedd"
    c.process.schedule = "loglinear"  # lam(1) = 1 - eps: the end of the I-MDSE integral
    c.process.eps = 1e-3

    c.eval = ml_collections.ConfigDict()
    c.eval.mode = "oracle"
    c.eval.graphs = ("absorb", "uniform")
    c.eval.lambda_samplings = ("defensive", "importance", "uniform")  # I-MDSE noise-level sampling (likelihood.imdse_nll)
    c.eval.num_sequences = 16     # sequences drawn from the distribution
    c.eval.num_samples = 1024     # Monte Carlo samples per sequence (= forward passes)
    c.eval.batch_size = 4096
    c.eval.seed = 1234
    c.eval.sampler_steps = (1, 8, 64)   # tabular only: TV of generated sequences vs the truth
    c.eval.sampler_methods = ("tweedie", "euler")
    c.eval.num_generate = 20000
