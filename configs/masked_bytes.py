"""Masked diffusion on the embedded KJV + Shakespeare corpus as raw UTF-8 bytes, CPU-sized.

The corpus of configs/masked_text.py uncleaned (case, punctuation, digits, newlines kept;
infodiff/data/text_bytes.py): 256 byte values, the mask id 256. Any UTF-8 text is scored exactly
as given, in bits per byte (lm-eval's bits_per_byte; docs/scoring.md).

python train.py --config configs/masked_bytes.py --workdir runs/masked_bytes
python evaluate.py --workdir runs/masked_bytes
python evaluate.py --workdir runs/masked_bytes --config.eval.input=my.txt

The acceptance run in RESULTS.md trained this config unchanged except train.num_steps (the CPU
budget stated there); the model sizes are masked_text.py's.
"""

from configs import masked_text


def get_config():
    c = masked_text.get_config()
    c.experiment = "masked_bytes"
    c.data.name = "bytes"         # the embedded corpus as UTF-8 bytes (no text8 file: data.path unused)
    del c.data.path
    c.data.vocab_size = 256       # byte values; the mask id is 256
    return c
