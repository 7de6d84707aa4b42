"""Shared schema of the Poisson-diffusion (ItDPDM) configs (configs/poisson_*.py, oracle_poisson.py).

Groups: data / process / model / optim / train / eval (see infodiff/tasks/poisson.py, PoissonTask).
"""

import ml_collections

from infodiff.configs import common


def estimator_settings(ev: ml_collections.ConfigDict) -> None:
    """The Poisson NLL estimator's eval keys shared by network and oracle mode: the manual
    proposal (loc, scale, clip), the defensive channel draw and the high-SNR guard."""
    ev.loc = -1.0
    ev.scale = 5.0
    ev.clip = 4.0
    ev.channel_defensive = 0.3  # defensive channel mixture eps (0 = plain Poisson draw, as before; docs/poisson.md §3.5)
    ev.channel_shift = 2.0    # its shifted components, in channel standard deviations
    ev.high_snr_guard = ""    # '' or 'round' (lattice rounding above eval.alpha_guard; exact tail)
    ev.alpha_guard = 30.0


def base(experiment: str) -> ml_collections.ConfigDict:
    """Every key a Poisson config has, with CPU-sized defaults (an MLP on 1-D counts)."""
    c = ml_collections.ConfigDict()
    c.experiment = experiment
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.name = "synthetic"     # synthetic | digits | fashion_mnist | randhie | chorales
    c.data.distribution = "zip"   # synthetic: a name of infodiff.data.count_synthetic.NAMES
    c.data.dim = 1                # synthetic: iid coordinates per example
    c.data.num_train = 50000      # synthetic split sizes (paper: 50k train / 50k generated)
    c.data.num_valid = 2000
    c.data.num_test = 2000
    c.data.seed = 0               # synthetic sampling seed
    c.data.max_count = 50         # synthetic: truncation per coordinate (paper: "truncated at 50")
    c.data.cache_dir = ""         # default $INFODIFF_DATA or ~/.cache/infodiff
    c.data.path = ""              # chorales: npz (default infodiff/data/chorales.npz)
    c.data.window = 32            # chorales: eighth-note steps per example
    c.data.low = 1.0              # counts 0..K mapped to [low, high] (paper's best Dn = [1, 2])
    c.data.high = 2.0

    c.process = ml_collections.ConfigDict()
    c.process.name = "poisson"
    c.process.proposal = "auto_v1"  # training log-SNR proposal: auto_v1 (data-driven, as trained so far) | auto (v2) | paper (-1, 5, 4) | manual
    c.process.loc = -1.0          # manual proposal (truncated logistic)
    c.process.scale = 5.0
    c.process.clip = 4.0
    c.process.weighting = "likelihood"  # likelihood (e^alpha / q) | paper (1 / q, Alg. 1 as printed)

    c.model = ml_collections.ConfigDict()
    c.model.arch = "mlp"          # mlp | conv | seqconv
    c.model.head = "categorical"  # categorical (lattice posterior + exact Poisson likelihood) | sigmoid | softplus
    c.model.init_prior = True     # categorical: start prior_logits at the training marginals
    c.model.hidden = 64           # mlp (paper: 3 x 64, LayerNorm, LeakyReLU(0.2))
    c.model.num_layers = 3
    c.model.channels = 32         # conv / seqconv
    c.model.num_blocks = 2
    c.model.emb_dim = 64          # sinusoidal log-SNR embedding

    c.optim = common.optim(warmup_steps=100, b2=0.999)   # paper (synthetic): Adam 1e-3
    c.train = common.train(batch_size=128, num_steps=2000, log_every=100, eval_every=500,
                           eval_batches=8, ckpt_every=500, keep_checkpoints=2)  # paper: batch 128

    c.eval = ml_collections.ConfigDict()
    c.eval.mode = "network"       # network | oracle
    c.eval.split = "test"
    c.eval.max_examples = 0       # 0: the whole split
    c.eval.sampler = "stratified"  # stratified (SE from strata pairs) | logistic (iid; old default) | qmc | grid
    c.eval.num_samples = 100      # log-SNR draws per example (paper: 100; per-example SEs need ~1000 in 1-D: docs/poisson.md §3.5)
    c.eval.proposal = "auto"      # auto (recipe v2, docs/poisson.md §3.5) | train (same as process) | auto_v1 | paper | manual
    estimator_settings(c.eval)
    c.eval.batch_size = 4096      # rows per forward pass
    c.eval.use_ema = True
    c.eval.seed = 1234
    c.eval.num_generate = 10000   # increment-sampler draws (synthetic: W1; images: first 32 in the PNG)
    c.eval.sample_steps = 500     # log-spaced SNRs of the sampler
    c.eval.gamma_min = 1e-3
    c.eval.gamma_max = 0.0        # 0: 64 high / spacing^2 (lattice resolved)
    c.eval.decision = "round"     # final lattice decision: round | ml | denoiser
    c.eval.sampler_steps = (20, 100, 1000)  # oracle mode: step counts compared
    c.eval.output_dir = ""        # '': the workdir (split), W/scores/<file name>-<folder hash>/ (eval.input), '.' (oracle)
    c.eval.overwrite = False      # network mode: False refuses an output folder that already holds a report
    c.eval.input = ""             # network mode: a .npy of counts [N, *event_shape] to score instead of the split
    c.eval.limit = 0              # eval.input: score the first N rows only (0: every row)
    return c
