"""Poisson diffusion (ItDPDM) on Bach chorale voice-count rolls, CPU-sized (~4 min of training on 2 cores).

python train.py --config configs/poisson_chorales.py --workdir runs/pois_chorales
python evaluate.py --workdir runs/pois_chorales

Data: infodiff/data/chorales.npz (scripts/prepare_chorales.py; 400 chorales of music21's corpus,
46 pitches MIDI 36..81, eighth-note steps, windows of 32 steps; a cell counts the voices (0..4)
sounding that pitch; split by chorale). Denoiser: CountSeqConv (pitch channels, dilated 1-D convs
over time) with a categorical lattice head. report.json gives the test NLL in bits per
dimension (46 x 32 = 1472 dims) +- SE and samples.png (piano rolls, increment sampler).
"""

from infodiff.configs import poisson_common


def get_config():
    c = poisson_common.base("poisson_chorales")
    c.data.name = "chorales"
    c.data.window = 32
    c.model.arch = "seqconv"
    c.model.channels = 64
    c.model.num_blocks = 3
    c.optim.lr = 2e-3
    c.train.batch_size = 32
    c.train.num_steps = 6000
    c.train.eval_batches = 3
    c.train.eval_every = 1000
    c.train.ckpt_every = 1000
    c.eval.num_samples = 50
    c.eval.batch_size = 512
    c.eval.num_generate = 16
    c.eval.sample_steps = 400
    return c
