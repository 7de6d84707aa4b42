"""Poisson-diffusion estimators and samplers with the EXACT denoiser of a count law.

python evaluate.py --config configs/oracle_poisson.py --config.data.distribution=zip
python evaluate.py --config configs/oracle_poisson.py --config.data.path=pmf.json

No network: the denoiser is the exact posterior mean E[X | Z_gamma] of the law
(infodiff.count_oracles on the [low, high]-scaled support). The law is a built-in
``data.distribution`` (infodiff.data.count_synthetic.NAMES; '' = zip) or a 1-D pmf file
``data.path`` = JSON {count: probability} (validated by count_synthetic.load_pmf; giving both is
an error). Reports the Monte Carlo NLL of ``eval.num_examples`` samples against their exact
-log p(x) and the exact entropy (bias in MC standard errors; the SE method is in
``process.se_method``), and the total-variation / W1 distance to the true pmf of
``eval.num_generate`` samples of the increment sampler (docs/poisson.md §4.4) and the
paper-literal Algorithm 2 at each of ``eval.sampler_steps``.

The config holds only the keys this mode reads (the config is locked: any other key, e.g. a
training setting or a misspelt name, is an error, not silently ignored).

2-D laws (bivariate_poisson, gamma_poisson) have 51 x 51 = 2,601 atoms and the exact posterior sums
over all of them per call: on a CPU use e.g. --config.eval.num_generate=2000
--config.eval.sampler_steps=20,100 --config.eval.num_examples=500.
Measured: see RESULTS.md (Poisson oracle lines) and docs/poisson.md §3.5.
"""

import ml_collections

from infodiff.configs import poisson_common


def get_config():
    c = ml_collections.ConfigDict()
    c.experiment = "oracle_poisson"

    c.data = ml_collections.ConfigDict()
    c.data.distribution = ""      # a name of count_synthetic.NAMES ('' = zip unless data.path)
    c.data.path = ""              # JSON pmf {count: probability} (1-D), instead of data.distribution
    c.data.dim = 1                # iid coordinates per example (1-D laws)
    c.data.max_count = 0          # lattice {0..K}; 0 = the law's own (50 built-in; largest count of a file)
    c.data.low = 1.0              # counts 0..K mapped to [low, high] (paper's best Dn = [1, 2])
    c.data.high = 2.0

    c.process = ml_collections.ConfigDict()
    c.process.name = "poisson"

    c.eval = ml_collections.ConfigDict()
    c.eval.mode = "oracle"
    c.eval.sampler = "stratified"  # stratified (default; SE from strata pairs) | logistic | qmc | grid
    c.eval.num_samples = 1000     # log-SNR draws per example (per-example SEs calibrated at 1000, not 200: docs/poisson.md §3.5)
    c.eval.proposal = "auto"      # auto | paper (-1, 5, 4) | manual (eval.loc / scale / clip)
    poisson_common.estimator_settings(c.eval)
    c.eval.num_examples = 2000
    c.eval.batch_size = 4096
    c.eval.seed = 1234
    c.eval.num_generate = 20000
    c.eval.gamma_min = 1e-3
    c.eval.gamma_max = 0.0        # 0: 64 high / spacing^2 (lattice resolved)
    c.eval.decision = "round"     # final lattice decision: round | ml | denoiser
    c.eval.sampler_steps = (20, 100, 1000)
    c.eval.output_dir = "runs/oracle_poisson"
    return c
