"""Out-of-distribution detection with coupled masks (arXiv 2510.24088 §5.3, Fig. 2).

python run_experiment.py --config configs/exp_ood.py --workdir results/ood \
    --config.ood.model_dir=runs/masked_text      # reuse a trained masked_text run
Without ood.model_dir the masked_text model is trained in results/ood/train first.
Prompts: 32 characters of held-out text; responses: the true next 32 characters vs 32
characters of Python's documentation (a second real corpus) or the word-shuffled truth.
"""

from infodiff.configs import masked_text


def get_config():
    c = masked_text.get_config()
    c.experiment = "ood"
    c.ood = dict(model_dir="", prompt_len=32, num_prompts=500, estimator="k_dce", num_mc=32,
                 seed=0, bootstrap=1000)
    return c
