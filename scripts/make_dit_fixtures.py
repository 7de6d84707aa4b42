"""Write the DiT parity fixtures (tests/fixtures/pretrained/<name>/) by running the OFFICIAL code.

The fixtures are data: random tiny weights in the published layout, inputs, and the reference
implementation's raw outputs at several noise levels. The reference code is not part of this
project; this script imports it from checkouts given on the command line and runs it on a CPU
with PyTorch (a separate environment: torch is not an infodiff dependency).

How the committed fixtures were made:
    git clone https://github.com/louaaron/Score-Entropy-Discrete-Diffusion  SEDD   # commit 0605786da5ccb5747545e26d66fdf477187598b6
    git clone https://github.com/kuleshov-group/mdlm                         MDLM   # commit c112c526d193436838c98d81455ee51f90309470
    git clone https://github.com/s-sahoo/duo                                 DUO    # commit 7c9b498f5b717de064d6fad7e2509c866e6cb620
    git clone https://github.com/kuleshov-group/bd3lms                       BD3LM  # commit 1c3e8f43d88dfbcee5ff2aa6932a9e74b31ae1d7
    python -m venv tv && tv/bin/pip install torch==2.13.0 numpy einops safetensors omegaconf huggingface_hub==0.36.0
    tv/bin/python scripts/make_dit_fixtures.py --sedd SEDD --mdlm MDLM --duo DUO --bd3lm BD3LM --out tests/fixtures/pretrained
(add transformers to tv for BD3LM's hub model; each of --sedd, --mdlm, --duo, --bd3lm is optional: only the fixtures of the checkouts given are written)

flash-attn (CUDA only) is replaced by plain PyTorch in a stub package this script puts on the path:
  - ``flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0, causal=False)``
    for equal-length rows: softmax(q k^T / sqrt(d)) v per row (``scaled_dot_product_attention``);
  - ``flash_attn.layers.rotary.apply_rotary_emb_qkv_(qkv, cos, sin)`` (MDLM) and
    ``apply_rotary_emb_torch(x, cos, sin)`` (duo; one of q, k) (SEDD falls back
    to its own TorchScript rotary when flash-attn's is absent): flash-attn's non-interleaved
    rotary, cos/sin [L, d/2] applied to q and k, (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
    over the two halves of the head width (flash-attn's ``apply_rotary_emb_torch`` reference).
MDLM's ``Diffusion`` class needs Lightning and Hydra; its ``_process_sigma`` and
``_subs_parameterization`` methods are taken from the checkout's diffusion.py source (``ast``)
and run unchanged on a stand-in ``self`` holding ``mask_index``, ``neg_infinity`` (the class's
-1e6) and ``time_conditioning``; the backbone is the checkout's ``models/dit.py`` ``DIT``.

SEDD's checkpoint is written by its own ``save_pretrained`` (huggingface_hub's
PyTorchModelHubMixin: config.json + model.safetensors, the hub layout); MDLM's as the hub's
``MDLM`` model stores it (``backbone.`` + the DIT's names) with its ``MDLMConfig`` fields.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import types

import numpy as np

SIGMAS = (0.01, 0.3, 0.7, 2.0, 6.0)  # noise levels of the stored outputs (SEDD: total noise sigma)
B, L = 2, 12  # rows and length of the inputs
TINY = dict(hidden_size=32, cond_dim=16, n_blocks=2, n_heads=4, length=16)

STUB = {
    "flash_attn/__init__.py": "from . import flash_attn_interface, layers\n",
    "flash_attn/flash_attn_interface.py": textwrap.dedent('''
        import torch, torch.nn.functional as F
        def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, causal=False, **kw):
            assert dropout_p == 0.0 and not causal
            n, three, h, d = qkv.shape
            b = n // max_seqlen
            q, k, v = qkv.reshape(b, max_seqlen, 3, h, d).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(d)) v
            return o.permute(0, 2, 1, 3).reshape(n, h, d)
        '''),
    "flash_attn/layers/__init__.py": "from . import rotary\n",
    "flash_attn/layers/rotary.py": textwrap.dedent('''
        import torch
        def _rot(x, cos, sin):
            x1, x2 = x.chunk(2, dim=-1)
            c, s = cos[None, :, None, :], sin[None, :, None, :]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        def apply_rotary_emb_torch(x, cos, sin, interleaved=False):
            assert not interleaved and cos.shape[-1] * 2 == x.shape[-1]
            return _rot(x, cos, sin)
        def apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False, seqlen_offsets=0):
            assert not interleaved and cos.shape[-1] * 2 == qkv.shape[-1]
            qkv[:, :, 0] = _rot(qkv[:, :, 0], cos, sin)
            qkv[:, :, 1] = _rot(qkv[:, :, 1], cos, sin)
            return qkv
        '''),
}


def _stub_flash_attn(root: pathlib.Path, with_rotary: bool) -> None:
    for rel, text in STUB.items():
        if not with_rotary and "layers" in rel:
            continue
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text if with_rotary or rel != "flash_attn/__init__.py"
                     else "from . import flash_attn_interface\n")


def _randomise(model, torch, seed: int) -> None:
    """Every parameter random (the official init zeroes adaLN and the output layer)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "norm_final" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "vocab_embed" in name:  # variance near LayerNorm's eps: a port with another eps fails
                p.copy_(0.005 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.ndim > 1 else 4.0
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def _inputs(V: int, mask_id: int | None, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    real = V - (mask_id is not None)
    x = rng.integers(0, real, size=(B, L)).astype(np.int64)
    if mask_id is not None:
        x[0, rng.random(L) < 0.5] = mask_id
        x[1, :3] = mask_id
    return x


def _write(out: pathlib.Path, x, sigmas, outputs, meta: dict) -> None:
    np.savez_compressed(out / "io.npz", x_BxL=x.astype(np.int32), sigma_S=np.asarray(sigmas, np.float32),
                        out_SxBxLxV=np.stack(outputs).astype(np.float32))
    (out / "fixture.json").write_text(json.dumps(meta, indent=1) + "\n")


def make_sedd(sedd_dir: pathlib.Path, out_root: pathlib.Path, graph: str, seed: int) -> None:
    import torch

    sys.path.insert(0, str(sedd_dir))
    from model.transformer import SEDD  # the checkout's network

    config = {"tokens": 40, "graph": {"type": graph, "file": "data", "report_all": False},
              "noise": {"type": "loglinear", "sigma_min": 1e-4, "sigma_max": 20},
              "model": {"name": "tiny", "type": "ddit", **TINY, "scale_by_sigma": graph == "absorb", "dropout": 0.1}}
    torch.manual_seed(seed)
    model = SEDD(config)
    _randomise(model, torch, seed)
    model.eval()
    out = out_root / f"sedd_{graph}"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))  # huggingface_hub: config.json + model.safetensors
    (out / "README.md").unlink(missing_ok=True)  # the mixin's model card, not needed
    V = config["tokens"] + (graph == "absorb")
    x = _inputs(V, config["tokens"] if graph == "absorb" else None, seed)
    outputs = []
    with torch.no_grad():
        for s in SIGMAS:
            outputs.append(model(torch.from_numpy(x), torch.full((B,), s, dtype=torch.float32)).numpy())
    _write(out, x, SIGMAS, outputs, {"source": "louaaron/Score-Entropy-Discrete-Diffusion", "commit": _commit(sedd_dir),
                                     "network": "model.transformer.SEDD", "output": "log_score", "seed": seed})
    sys.path.remove(str(sedd_dir))
    for m in [m for m in sys.modules if m == "model" or m.startswith("model.")]:
        del sys.modules[m]


def _methods_from(source: pathlib.Path, names, class_name: str | None = None) -> dict:
    """Functions ``names`` of the classes in ``source`` (of class ``class_name`` only, if given),
    compiled from its text (unchanged)."""
    tree = ast.parse(source.read_text())
    if class_name is not None:
        tree = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    ns = {"torch": __import__("torch"), "np": np, "F": __import__("torch").nn.functional}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(ast.Module([node], []), str(source), "exec"), ns)
    return {n: ns[n] for n in names}


def make_mdlm(mdlm_dir: pathlib.Path, out_root: pathlib.Path, time_conditioning: bool, seed: int) -> None:
    import omegaconf
    import torch
    from safetensors.torch import save_file

    import importlib.util

    # models/dit.py alone (models/__init__.py also imports the Mamba backbone's CUDA packages)
    spec = importlib.util.spec_from_file_location("mdlm_dit", mdlm_dir / "models" / "dit.py")
    dit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dit)

    V = 41  # 40 real tokens + the mask (mask_index = vocab_size - 1, as GPT-2's 50257 of 50258)
    model = dit.DIT(omegaconf.OmegaConf.create({"model": {**TINY, "scale_by_sigma": False, "dropout": 0.1}}), V)
    _randomise(model, torch, seed)
    model.eval()
    m = _methods_from(mdlm_dir / "diffusion.py", ("_process_sigma", "_subs_parameterization"))
    me = types.SimpleNamespace(mask_index=V - 1, neg_infinity=-1000000.0, time_conditioning=time_conditioning,
                               parameterization="subs")
    out = out_root / ("mdlm" if not time_conditioning else "mdlm_timecond")
    out.mkdir(parents=True, exist_ok=True)
    save_file({f"backbone.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = {"architectures": ["MDLM"], "model_type": "mdlm", "vocab_size": V, "model_length": TINY["length"],
              "hidden_dim": TINY["hidden_size"], "cond_dim": TINY["cond_dim"], "n_blocks": TINY["n_blocks"],
              "n_heads": TINY["n_heads"], "dropout": 0.1, "time_conditioning": time_conditioning, "var_min": True}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    x = _inputs(V, V - 1, seed)
    outputs = []
    with torch.no_grad():
        for s in SIGMAS:
            xt = torch.from_numpy(x)
            sigma = m["_process_sigma"](me, torch.full((B,), s, dtype=torch.float32))
            logits = model(xt, sigma)
            outputs.append(m["_subs_parameterization"](me, logits=logits, xt=xt).numpy())
    _write(out, x, SIGMAS, outputs, {"source": "kuleshov-group/mdlm", "commit": _commit(mdlm_dir),
                                     "network": "models.dit.DIT + Diffusion._process_sigma/_subs_parameterization",
                                     "output": "logits (SUBS log-probabilities)", "seed": seed})


def _module_from(path: pathlib.Path, name: str):
    """The module in file ``path`` alone (a package's __init__ may import CUDA-only backbones)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_duo(duo_dir: pathlib.Path, out_root: pathlib.Path, seed: int) -> None:
    """duo (s-sahoo/duo): its models/dit.py ``DIT`` (bidirectional, time-conditioned), sigma through
    ``Diffusion._process_sigma`` (trainer_base.py) and the output through
    ``DUO_BASE._process_model_output`` (algo.py), both run unchanged on a stand-in ``self``. Also
    stored: ``DUO_BASE.nll_per_token`` (its NELBO integrand per unit t) at the fixture's inputs,
    clean tokens ``x0_BxL`` and alpha_t = 1 - lam at each noise level, for the NELBO's parity."""
    import omegaconf
    import torch
    from safetensors.torch import save_file

    dit = _module_from(duo_dir / "models" / "dit.py", "duo_dit")
    V = 40  # uniform-state: no mask token
    cfg = {"algo": {"causal_attention": False},
           "model": {**TINY, "scale_by_sigma": True, "dropout": 0.1}}
    model = dit.DIT(omegaconf.OmegaConf.create(cfg), V)
    _randomise(model, torch, seed)
    model.eval()
    sig = _methods_from(duo_dir / "trainer_base.py", ("_process_sigma", "_sigma_from_alphat"))
    out_m = _methods_from(duo_dir / "algo.py", ("_process_model_output", "nll_per_token"), "DUO_BASE")
    me = types.SimpleNamespace(time_conditioning=True, vocab_size=V)
    out = out_root / "duo"
    out.mkdir(parents=True, exist_ok=True)
    save_file({f"backbone.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = {"architectures": ["DUO"], "model_type": "duo", "vocab_size": V, "model_length": TINY["length"],
              "causal": False, "hidden_dim": TINY["hidden_size"], "cond_dim": TINY["cond_dim"],
              "n_blocks": TINY["n_blocks"], "n_heads": TINY["n_heads"], "dropout": 0.1, "var_min": True}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    rng = np.random.default_rng(seed)
    x0 = rng.integers(0, V, size=(B, L)).astype(np.int64)
    x = np.where(rng.random((B, L)) < 0.5, rng.integers(0, V, size=(B, L)), x0)  # half the tokens redrawn
    outputs, nll = [], []
    with torch.no_grad():
        for s in SIGMAS:
            xt = torch.from_numpy(x)
            alpha_t = torch.full((B, 1), math.exp(-s), dtype=torch.float64)
            sigma = sig["_process_sigma"](me, sig["_sigma_from_alphat"](me, alpha_t.float()))
            log_x_theta = out_m["_process_model_output"](me, model_output=model(xt, sigma), xt=xt, sigma=sigma)
            outputs.append(log_x_theta.numpy())
            nll.append(out_m["nll_per_token"](me, log_x_theta=log_x_theta.double(), xt=xt, x0=torch.from_numpy(x0),
                                              alpha_t=alpha_t.expand(B, L), dalpha_t=-torch.ones(B, L,
                                              dtype=torch.float64)).numpy())
    _write(out, x, SIGMAS, outputs, {"source": "s-sahoo/duo", "commit": _commit(duo_dir),
                                     "network": "models.dit.DIT + Diffusion._process_sigma + "
                                                "DUO_BASE._process_model_output; NELBO: DUO_BASE.nll_per_token",
                                     "output": "log x_theta (mean parametrisation)", "seed": seed})
    np.savez_compressed(out / "nelbo.npz", x0_BxL=x0.astype(np.int32), alpha_S=np.exp(-np.asarray(SIGMAS, np.float64)),
                        nll_per_token_SxBxL=np.stack(nll))


def make_bd3lm(bd3lm_dir: pathlib.Path, out_root: pathlib.Path, block_size: int, time_conditioning: bool,
               seed: int) -> None:
    """BD3-LM (kuleshov-group/bd3lms): the hub model of its models/hf/ (``BD3LM``: ``DITBackbone``,
    the published layout), ``attn_backend='sdpa'`` (the documented CPU path of the same mask), saved
    by its own ``save_pretrained``; sigma through ``Diffusion._process_sigma`` and the output through
    ``Diffusion._subs_parameterization`` (diffusion.py), both run unchanged on a stand-in ``self``.
    Inputs: the two-copy layout [x_t, x_0] of 2L tokens; row 0 a clean x_0 with x_t masked at
    random, row 1 the denoiser form [z, z] (a clean prefix, a partly masked block, later blocks
    masked)."""
    import torch

    sys.path.insert(0, str(bd3lm_dir / "models"))
    from hf import BD3LM, BD3LMConfig  # the checkout's hub model

    V = 41  # 40 real tokens + the mask (mask_index = vocab_size - 1)
    cfg = BD3LMConfig(block_size=block_size, vocab_size=V, model_length=TINY["length"], cross_attn=True, adaln=True,
                      attn_backend="sdpa", causal=False, hidden_dim=TINY["hidden_size"], cond_dim=TINY["cond_dim"],
                      n_blocks=TINY["n_blocks"], n_heads=TINY["n_heads"], dropout=0.1,
                      time_conditioning=time_conditioning, var_min=True)
    model = BD3LM(cfg)
    _randomise(model, torch, seed)
    model.eval()
    m = _methods_from(bd3lm_dir / "diffusion.py", ("_process_sigma", "_subs_parameterization"), "Diffusion")
    me = types.SimpleNamespace(mask_index=V - 1, neg_infinity=-1000000.0, time_conditioning=time_conditioning,
                               parameterization="subs")
    out = out_root / f"bd3lm_bs{block_size}"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    n = TINY["length"]
    rng = np.random.default_rng(seed)
    x0 = rng.integers(0, V - 1, size=(2, n)).astype(np.int64)
    xt = np.where(rng.random((2, n)) < 0.5, V - 1, x0)
    b = n // block_size // 2  # row 1: block b half masked, the blocks after it masked
    z = x0[1].copy()
    z[b * block_size:(b + 1) * block_size][rng.random(block_size) < 0.5] = V - 1
    z[(b + 1) * block_size:] = V - 1
    x = np.stack([np.concatenate([xt[0], x0[0]]), np.concatenate([z, z])])
    outputs = []
    with torch.no_grad():
        for s in SIGMAS:
            xin = torch.from_numpy(x)
            sigma = m["_process_sigma"](me, torch.full((2, 1), s, dtype=torch.float32))
            logits = model(input_ids=xin, timesteps=sigma, return_dict=False)
            outputs.append(m["_subs_parameterization"](me, logits=logits, xt=xin[:, :n]).numpy())
    _write(out, x, SIGMAS, outputs, {"source": "kuleshov-group/bd3lms", "commit": _commit(bd3lm_dir),
                                     "network": "models/hf BD3LM (sdpa) + Diffusion._process_sigma/_subs_parameterization",
                                     "input": "[x_t, x_0], 2L tokens", "output": "logits (SUBS log-probabilities)",
                                     "seed": seed})
    sys.path.remove(str(bd3lm_dir / "models"))
    for mod in [k for k in sys.modules if k == "hf" or k.startswith("hf.")]:
        del sys.modules[mod]


def _commit(repo: pathlib.Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sedd", type=pathlib.Path, help="checkout of louaaron/Score-Entropy-Discrete-Diffusion")
    ap.add_argument("--mdlm", type=pathlib.Path, help="checkout of kuleshov-group/mdlm")
    ap.add_argument("--duo", type=pathlib.Path, help="checkout of s-sahoo/duo")
    ap.add_argument("--bd3lm", type=pathlib.Path, help="checkout of kuleshov-group/bd3lms")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/fixtures/pretrained"))
    args = ap.parse_args()
    stub = pathlib.Path(tempfile.mkdtemp())
    _stub_flash_attn(stub / "sedd", with_rotary=False)
    _stub_flash_attn(stub / "mdlm", with_rotary=True)
    if args.sedd:
        sys.path.insert(0, str(stub / "sedd"))
        make_sedd(args.sedd.resolve(), args.out, "absorb", seed=1)
        make_sedd(args.sedd.resolve(), args.out, "uniform", seed=2)
        sys.path.remove(str(stub / "sedd"))
        for mod in [k for k in sys.modules if k == "flash_attn" or k.startswith("flash_attn.")]:
            del sys.modules[mod]
    sys.path.insert(0, str(stub / "mdlm"))
    if args.mdlm:
        make_mdlm(args.mdlm.resolve(), args.out, time_conditioning=False, seed=3)
        make_mdlm(args.mdlm.resolve(), args.out, time_conditioning=True, seed=4)
    if args.duo:
        make_duo(args.duo.resolve(), args.out, seed=5)
    if args.bd3lm:  # block sizes of the released checkpoints; the 8 one time-conditioned (the other branch)
        for seed, (bs, tc) in enumerate([(4, False), (8, True), (16, False)], start=6):
            make_bd3lm(args.bd3lm.resolve(), args.out, bs, tc, seed)
    print(f"fixtures written under {args.out}")


if __name__ == "__main__":
    main()
