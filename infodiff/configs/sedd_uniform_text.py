"""Score-entropy discrete diffusion (SEDD), uniform graph, on the embedded text corpus; CPU-sized.

    python train.py --config configs/sedd_uniform_text.py --workdir runs/sedd_uniform_text
    python evaluate.py --workdir runs/sedd_uniform_text

As configs/sedd_absorb_text.py (same model, data, budget) with the uniform graph: with
probability lam each token is resampled uniformly (SEDD code convention Q = (1 1^T - V I) / V),
stationary law uniform, and the network outputs a log-score for every single-token change
(score_param='direct'). SEDD uses the geometric schedule for the uniform graph; we keep
loglinear (eps = 1e-3) by default so that the two graphs share the time grid, and the
I-MDSE prior term KL(p_{T|0} || uniform) is reported (1.3e-5 nats per token at lam = 0.999).

Paper-size: the overrides listed in configs/sedd_absorb_text.py (SEDD Uniform <= 1.47 bpc on
text8), optionally --config.process.schedule=geometric. For conditionals -log p(y | x):
--config.process.clean_prefix_prob=0.5.
"""

from infodiff.configs import sedd_absorb_text


def get_config():
    c = sedd_absorb_text.get_config()
    c.experiment = "sedd_uniform_text"
    c.process.graph = "uniform"
    c.eval.lambda_sampling = "importance"  # lowest per-sample SD for this graph (RESULTS.md)
    c.eval.input_samples = 512             # per window of a user's file: the uniform graph's min_samples
    # Probability that a training sequence keeps a clean prefix (seen at lam = 0, not scored), so
    # that the network learns the scores of -log p(y | x) with a clean prompt x. 0 = SEDD's
    # objective; e.g. 0.5 for a network meant for conditionals (imdse_conditional_nll).
    c.process.clean_prefix_prob = 0.0
    return c
