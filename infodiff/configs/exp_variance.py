"""Variance tables in the style of arXiv 2510.24088 Table 1, and the stratified estimator.

python run_experiment.py --config configs/exp_variance.py --workdir results/variance \
    --config.variance.model_workdir=results/markov_cond
Uses the Markov-4 model of configs/exp_markov_cond.py from variance.model_workdir (trained
there if missing, or resumed); empty: trained in this workdir. Paper protocol: 30 sequences x 15 repeats at 128/256/512 samples (Table 1a);
coupled vs decoupled log-ratio at 5/10/15/20 samples, 8 repeats (Table 1b).
"""

from infodiff.configs import exp_markov_cond


def get_config(variant: str = ""):
    # 'paper': the Markov-4 model at the paper's settings (configs/exp_markov_cond.py)
    c = exp_markov_cond.get_config(variant)
    c.experiment = "variance"
    c.variance = dict(model_workdir="", seed=7, num_pairs=30, reps=15, budgets=(128, 256, 512),
                      estimators=("lambda_dce", "time_free", "k_dce", "stratified"),
                      ratio_samples=(5, 10, 15, 20), ratio_reps=8, vpf_passes=4096, batch_size=8192)
    return c
