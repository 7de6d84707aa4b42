#!/usr/bin/env bash
# One short check on a GPU machine (about 10 minutes): the accelerator-relevant tests, then the
# text8-size model (12 x 768, L 256, bf16) for a few hundred steps on the built-in corpus,
# printing tokens/s and model FLOP utilisation against the chip's bf16 peak.
#
#   bash benchmarks/device_check.sh            # writes under ${OUT:-/tmp/device_check}
#   STEPS=300 BATCH=64 PEAK_TFLOPS=989 bash benchmarks/device_check.sh
#
# Needs jax[cuda12]==0.10.2 (installed into .venv if missing). Put the printed table in RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/device_check}"
STEPS="${STEPS:-300}"
BATCH="${BATCH:-64}"
mkdir -p "$OUT"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q -r requirements.txt "jax[cuda12]==0.10.2"
fi
PY=.venv/bin/python
$PY -c "import jax; print('devices:', jax.devices())" | tee "$OUT/devices.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/devices.txt" || true

echo "== tests on the accelerator"
JAX_PLATFORMS= timeout 300 $PY -m pytest -q -x tests/test_transformer.py tests/test_processes.py \
  tests/test_likelihood.py 2>&1 | tail -5 | tee "$OUT/tests.txt" || echo "tests: failed or timed out" | tee -a "$OUT/tests.txt"

echo "== text8-size model, $STEPS steps x $BATCH x 256, bf16, dot_product attention"
rm -rf "$OUT/run"
timeout 420 $PY train.py --config configs/masked_text8.py --workdir "$OUT/run" --config.data.name=text \
  --config.train.num_steps="$STEPS" --config.train.batch_size="$BATCH" --config.train.log_every=50 \
  --config.train.eval_every=100000 --config.train.eval_batches=2 --config.train.ckpt_every=100000 --config.optim.warmup_steps=100 \
  --config.model.attention=dot_product > "$OUT/train.log" 2>&1 || echo "train: failed or timed out (see $OUT/train.log)"

$PY - "$OUT" "$BATCH" <<'PYEOF'
import json, os, subprocess, sys
out, batch = sys.argv[1], int(sys.argv[2])
L, D, layers = 256, 768, 12
peaks = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}
peak = float(os.environ.get("PEAK_TFLOPS", 0)) * 1e12
if not peak:
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout
        peak = next((v for k, v in peaks.items() if k in name), 0.0)
    except OSError:
        peak = 0.0
recs = [json.loads(l) for l in open(os.path.join(out, "run", "metrics.jsonl"))] if os.path.exists(
    os.path.join(out, "run", "metrics.jsonl")) else []
train = [r for r in recs if r["split"] == "train"][1:]  # the first window includes compilation
if not train:
    sys.exit("no timed train records")
tps = sorted(r["metrics"]["tokens_per_s"] for r in train)[len(train) // 2]
# FLOPs per token of a train step (forward + backward = 3 x forward): dense layers 2 x 12 D^2 per
# layer, attention scores and values 2 x 2 L D per layer, the output head 2 D V (V = 28).
per_token = 3 * (layers * (2 * 12 * D * D + 4 * L * D) + 2 * D * 28)
print(f"| steps | batch x L | tokens/s (median window) | model TFLOP/s | bf16 peak TFLOP/s | MFU |")
print(f"|---|---|---|---|---|---|")
mfu = f"{tps * per_token / peak:.1%}" if peak else "n/a (set PEAK_TFLOPS)"
print(f"| {train[-1]['step']} | {batch} x {L} | {tps:,.0f} | {tps * per_token / 1e12:.1f} | "
      f"{peak / 1e12:.0f} | {mfu} |")
PYEOF
