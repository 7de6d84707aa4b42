"""Write the Dream parity fixture: a tiny random Dream checkpoint in the published layout and the
OFFICIAL implementation's raw logits on it (tests/test_pretrained_dream.py reads them).

The official code is ``modeling_dream.py`` + ``configuration_dream.py`` + ``generation_utils.py``
of the hub repository Dream-org/Dream-v0-Base-7B (its ``auto_map``); it is not part of infodiff.
It needs the transformers version Dream pins (4.46.2: later versions lack the rotary initialiser
it looks up). Run it in a PyTorch environment::

    /path/to/torch/python scripts/make_dream_fixture.py --official DIR_WITH_MODELING_DREAM \
        --out tests/fixtures/pretrained

``OUT/dream`` holds ``config.json`` (the published keys with tiny sizes), two BF16 shards with
``model.safetensors.index.json`` (names as the published checkpoint: ``model.embed_tokens``,
``model.layers.N.*``, ``model.norm``, ``lm_head``) and ``parity.npz``: ``input_ids`` int32
[B, L] (rows from all masked to none masked) and the official ``DreamModel`` logits on them,
float32 [B, L, vocab_size] (``logits_f32``: float32 on the BF16 weights upcast; ``logits_bf16``:
the model cast to bfloat16). The logits are the network's raw output: position i predicts token
i + 1 (Dream's evaluation shifts them right by one).
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from make_llada_fixture import (arguments, import_official, input_ids, random_state, write_parity,  # noqa: E402
                                write_shards)

# Published Dream-org/Dream-v0-Base-7B config.json keys; the fixture changes only the sizes below.
PUBLISHED = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "mask_token_id": 151666,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "Dream", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "pad_token_id": 151643, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.46.2", "use_cache": False, "use_sliding_window": False,
    "vocab_size": 152064,
}
SIZES = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 320, "mask_token_id": 300, "bos_token_id": 299,
         "eos_token_id": 299, "pad_token_id": 299, "max_position_embeddings": 128, "max_window_layers": 2}
EMB_STD = 0.002  # small embeddings: the RMSNorm eps (1e-6) matters at the first layer


def main():
    args = arguments(__doc__, "modeling_dream.py, configuration_dream.py and generation_utils.py")
    official = import_official(args.official.resolve(), "dream_official", "modeling_dream")
    cfg_mod = sys.modules["dream_official.configuration_dream"]
    config = dict(PUBLISHED, **SIZES)
    out = args.out / "dream"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    kwargs = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type", "torch_dtype",
                                                           "transformers_version")}
    model = official.DreamModel(cfg_mod.DreamConfig(**kwargs)).eval()
    rng = np.random.default_rng(2)
    state = random_state(model, EMB_STD, rng, embedding="embed_tokens.weight")
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    write_shards(state, out)
    write_parity(model, input_ids(config, rng), out, f"dream: {len(state)} tensors")


if __name__ == "__main__":
    main()
