"""Write the LLaDA parity fixtures: tiny random checkpoints in the published layout and the
OFFICIAL implementation's raw logits on them (tests/test_pretrained_llada.py reads them).

The official code is ``modeling_llada.py`` + ``configuration_llada.py`` of the hub repository
GSAI-ML/LLaDA-8B-Base (the files its ``config.json`` names in ``auto_map``); it is not part of
infodiff. Run it in a PyTorch environment with ``transformers`` (torch stays out of infodiff)::

    /path/to/torch/python scripts/make_llada_fixture.py --official DIR_WITH_MODELING_LLADA \
        --out tests/fixtures/pretrained

Each fixture directory (``OUT/llada``, ``OUT/llada_variant``) holds ``config.json`` (the published
config with tiny sizes),
``model-0000{1,2}-of-00002.safetensors`` + ``model.safetensors.index.json`` (BF16 tensors named
as in the published checkpoint, ``model.transformer.*``, split over two shards to exercise the
index) and ``parity.npz``: ``input_ids`` int32 [B, L] (rows from all masked to none masked) and
the official ``LLaDAModelLM`` logits on them, float32 [B, L, embedding_size]: ``logits_f32`` (the
model in float32 on the BF16 weights upcast, exact) and ``logits_bf16`` (the model cast to
bfloat16, as the 8B checkpoint is run). The official module is loaded with ``strict=True``, so the
tensor names are the ones its ``state_dict`` has.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys
import types

import numpy as np
import torch
from safetensors.torch import save_file

# Published GSAI-ML/LLaDA-8B-Base config.json; the fixtures change only the sizes listed below.
PUBLISHED = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                 "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_dropout": 0.0, "embedding_size": 126464, "eos_token_id": 126081, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 126336, "max_sequence_length": 4096, "mlp_hidden_size": 12288,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32,
    "n_layers": 32, "pad_token_id": 126081, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 126464, "weight_tying": False,
}

# "llada": the published architecture at tiny size (the mask id inside the vocabulary, with ids
# above it, as 126336 < 126464). Embeddings of std EMB_STD so that the RMSNorm eps (1e-5) is not
# negligible against the first layer's mean square: a port with another eps fails.
# "llada_variant": the options the published config leaves off but the loader accepts: grouped
# keys/values (n_kv_heads < n_heads), tied output weights, logits scaled by 1/sqrt(d_model),
# input embeddings scaled by sqrt(d_model), embedding_size above vocab_size.
FIXTURES = {
    "llada": dict(sizes={"d_model": 64, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 192,
                         "vocab_size": 320, "embedding_size": 320, "mask_token_id": 300, "eos_token_id": 299,
                         "pad_token_id": 299, "max_sequence_length": 64},
                  emb_std=0.004, seed=0),
    "llada_variant": dict(sizes={"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "mlp_hidden_size": 64,
                                 "vocab_size": 200, "embedding_size": 256, "mask_token_id": 190,
                                 "eos_token_id": 189, "pad_token_id": 189, "max_sequence_length": 32,
                                 "weight_tying": True, "scale_logits": True, "input_emb_norm": True,
                                 "rope_theta": 10000.0, "rms_norm_eps": 1e-6},
                          emb_std=0.5, seed=1),
}
MASK_RATES = (1.0, 0.0, 0.5, 0.85)  # one row per rate: all masked ... none masked
SEQ_LEN = 16


def import_official(directory: pathlib.Path, package: str = "llada_official", module: str = "modeling_llada"):
    """``module`` imported from ``directory`` as ``package`` (it imports its config relatively)."""
    pkg = types.ModuleType(package)
    pkg.__path__ = [str(directory)]
    sys.modules[package] = pkg
    return importlib.import_module(f"{package}.{module}")


def random_state(model, emb_std: float, rng: np.random.Generator, embedding: str = "wte.weight"
                 ) -> dict[str, torch.Tensor]:
    """Random BF16 weights for every tensor of ``model``'s state dict: norm weights around 1,
    embeddings N(0, emb_std^2), biases N(0, 0.2^2), linear weights N(0, 1/fan_in)."""
    out = {}
    for name, t in model.state_dict().items():
        if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
            a = 1.0 + 0.3 * rng.standard_normal(t.shape)
        elif name.endswith(embedding):
            a = emb_std * rng.standard_normal(t.shape)
        elif name.endswith(".bias"):
            a = 0.2 * rng.standard_normal(t.shape)
        else:
            a = rng.standard_normal(t.shape) / np.sqrt(t.shape[1])
        out[name] = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return out


def input_ids(config: dict, rng: np.random.Generator) -> np.ndarray:
    """[len(MASK_RATES), SEQ_LEN] ids: tokens anywhere in the vocabulary but the mask id, each
    row masked at its rate."""
    V, mask = config["vocab_size"], config["mask_token_id"]
    x = rng.integers(0, V - 1, size=(len(MASK_RATES), SEQ_LEN))
    x = np.where(x >= mask, x + 1, x)
    for i, rate in enumerate(MASK_RATES):
        x[i, rng.permutation(SEQ_LEN)[:round(rate * SEQ_LEN)]] = mask
    return x.astype(np.int32)


def write_shards(state: dict[str, torch.Tensor], out: pathlib.Path) -> None:
    """Two BF16 shards + model.safetensors.index.json, as ``save_pretrained`` writes them."""
    names = sorted(state)
    files = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    weight_map = {n: files[i % 2] for i, n in enumerate(names)}
    for f in files:
        save_file({n: state[n].contiguous() for n in names if weight_map[n] == f}, str(out / f),
                  metadata={"format": "pt"})
        (out / f).chmod(0o644)
    total = sum(t.numel() * t.element_size() for t in state.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")


def make(official, name: str, spec: dict, root: pathlib.Path) -> None:
    config = dict(PUBLISHED, **spec["sizes"])
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    cfg_mod = sys.modules["llada_official.configuration_llada"]
    model = official.LLaDAModelLM(cfg_mod.LLaDAConfig(**config), init_params=False).eval()
    rng = np.random.default_rng(spec["seed"])
    state = random_state(model, spec["emb_std"], rng)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    write_shards(state, out)
    x = input_ids(config, rng)
    write_parity(model, x, out, f"{name}: {len(state)} tensors")


def write_parity(model, x: np.ndarray, out: pathlib.Path, what: str) -> None:
    """``out/parity.npz``: the ids and the official model's logits on them in float32 and, after
    casting the model, in bfloat16."""
    ids = torch.from_numpy(x).long()
    kw = dict(use_cache=False, return_dict=True)  # passed: newer transformers configs lack these attributes
    with torch.no_grad():
        f32 = model(input_ids=ids, **kw).logits.float().numpy()
        bf16 = model.to(torch.bfloat16)(input_ids=ids, **kw).logits.float().numpy()
    np.savez_compressed(out / "parity.npz", input_ids=x, logits_f32=f32, logits_bf16=bf16)
    print(f"{what}, logits {f32.shape}, max|logit| {np.abs(f32).max():.3f}, "
          f"max|bf16 - f32| {np.abs(bf16 - f32).max():.4f}")


def arguments(doc: str, files: str) -> argparse.Namespace:
    """--official DIR (the hub's ``files``) and --out (default tests/fixtures/pretrained)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--official", required=True, type=pathlib.Path, help=f"directory holding the hub's {files}")
    ap.add_argument("--out", default="tests/fixtures/pretrained", type=pathlib.Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    return args


def main():
    args = arguments(__doc__, "modeling_llada.py and configuration_llada.py")
    official = import_official(args.official.resolve())
    for name, spec in FIXTURES.items():
        make(official, name, spec, args.out)


if __name__ == "__main__":
    main()
