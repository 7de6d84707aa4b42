"""Masked diffusion on the embedded KJV + Shakespeare corpus as raw UTF-8 bytes, CPU-sized.

The corpus of configs/masked_text.py uncleaned (case, punctuation, digits, newlines kept;
infodiff/data/text_bytes.py): 256 byte values, the mask id 256. Any UTF-8 text is scored exactly
as given, in bits per byte (lm-eval's bits_per_byte; docs/scoring.md).

python train.py --config configs/masked_bytes.py --workdir runs/masked_bytes
python evaluate.py --workdir runs/masked_bytes
python evaluate.py --workdir runs/masked_bytes --config.eval.input=my.txt

CPU budget: masked_text.py's, unchanged: 3000 steps of 64 x 64 bytes (12.3 M byte tokens), 4
layers, width 128 (857,216 parameters); 55 min on a shared 2-core CPU for the RESULTS.md run
(test 2.90 bits per byte).
"""

from infodiff.configs import masked_text


def get_config():
    c = masked_text.get_config()
    c.experiment = "masked_bytes"
    c.data.name = "bytes"         # the embedded corpus as UTF-8 bytes (no text8 file: data.path unused)
    del c.data.path
    c.data.vocab_size = 256       # byte values; the mask id is 256
    return c
