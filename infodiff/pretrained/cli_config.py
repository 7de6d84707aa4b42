"""evaluate.py's config for a released checkpoint: ``--pretrained DIR`` (docs/pretrained.md).

``python evaluate.py --pretrained DIR --config.eval.input=FILE`` loads this file as
``--config=infodiff/pretrained/cli_config.py:DIR``. ``pretrained.*``: the checkpoint (kind ''
detects it from config.json; tokenizer '' uses DIR/tokenizer.json; dtype float32 | bfloat16);
``eval.*``: as for a trained run scoring a file (docs/scoring.md); input_samples 0 takes the
model's default (masked 32, SEDD the I-MDSE estimator's min_samples); estimator '' the model's
(k_dce masked, imdse SEDD).
"""
import ml_collections


def get_config(directory: str = "") -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({
        "experiment": "pretrained",
        "pretrained": {"path": directory, "kind": "", "tokenizer": "", "dtype": "float32"},
        "eval": {"input": "", "input_unit": "line", "output_dir": "", "overwrite": False, "seed": 0,
                 "estimator": "", "input_samples": 0, "batch_size": 256, "target_se": 0.0,
                 "input_max_samples": 1024, "limit": 0, "use_ema": False},
    })
