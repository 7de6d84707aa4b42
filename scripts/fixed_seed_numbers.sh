#!/usr/bin/env bash
# Reruns a representative set of RESULTS.md's fixed-seed commands and writes their numbers to OUT,
# one `label<TAB>repr(value)` line each, so that two revisions can be compared number by number:
#
#   bash scripts/fixed_seed_numbers.sh /tmp/new.txt                           # this checkout
#   git worktree add /tmp/old OLD_REV && bash scripts/fixed_seed_numbers.sh /tmp/old.txt /tmp/old
#   diff /tmp/old.txt /tmp/new.txt                          # empty: every number bit-identical
#   diff <(cut -f2 /tmp/old.txt) <(cut -f2 /tmp/new.txt)    # values only, if report keys were renamed
#
# Usage: bash scripts/fixed_seed_numbers.sh OUT [REPO]
#   REPO: the checkout to run (default: this script's; it need not contain this script).
#   $PYTHON: the interpreter (default: python); $INFODIFF_DATA: the corpus cache (README "Set up").
#   Exit status 1 with the failing command's log tail. The script is read whole before it runs.
#
# What it runs (3.5 minutes of CPU, 11 minutes on 2 busy cores, at nice 19, one CPU device per process:
# INFODIFF_CPU_DEVICES=1 unless set, since the device count changes float rounding):
#   * evaluate.py --config configs/oracle_tabular.py                        (RESULTS "DNA-128-style tabular")
#   * evaluate.py --config configs/oracle_markov.py --config.data.order=2   (RESULTS "2nd-order Markov chain")
#   * evaluate.py --config configs/oracle_sedd_tabular.py with eval.num_sequences=8, num_samples=256,
#       num_generate=2000                                                   (RESULTS "I-MDSE with exact scores")
#   * evaluate.py --config configs/oracle_poisson.py with eval.num_examples=200, num_generate=2000
#                                                                           (RESULTS "Standard errors with the exact denoiser")
#   * train.py, 30 steps of a tiny model (1 layer, width 32, 2 heads, length 16, batch 8), then
#     evaluate.py on 16 sequences x 2 samples, for configs/masked_text.py, sedd_absorb_text.py and
#     sedd_uniform_text.py on the built-in corpus; configs/poisson_synthetic.py (zip) 30 steps, then
#     evaluate.py on 200 examples with 1000 generated samples (50 sampler steps).
# Written: every number of each report.json and metrics.jsonl, wall times and rates left out.
set -euo pipefail

main() {
if [[ $# -lt 1 ]]; then
  echo "usage: bash scripts/fixed_seed_numbers.sh OUT [REPO]" >&2
  exit 2
fi
OUT=$(realpath -m "$1")
PY=${PYTHON:-python}
cd "${2:-$(dirname "$0")/..}"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
export INFODIFF_CPU_DEVICES=${INFODIFF_CPU_DEVICES:-1}
TMP=$(mktemp -d -t infodiff-fixed-seed-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
: >"$OUT"

run() {  # run LOG CMD...: quiet unless it fails
  local log=$1; shift
  if ! nice -n 19 "$@" >"$log" 2>&1; then
    echo "failed: $*" >&2; tail -20 "$log" >&2; exit 1
  fi
}

numbers() {  # numbers LABEL FILE: every number of a JSON file or JSON-lines file, timing keys left out
  "$PY" - "$1" "$2" >>"$OUT" <<'EOF'
import json, re, sys
label, path = sys.argv[1], sys.argv[2]
SKIP = re.compile(r"(^|_)(wall|seconds|elapsed|date|eta|argv|git|plots|version|host|pid)(_|$)|(^|_)time$|_s$|path|(^|_)dir$")

def walk(obj, where):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not SKIP.search(str(k)):
                walk(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            tag = None
            if isinstance(v, dict):  # a table row: named by its scalar name fields
                names = [str(v[k]) for k in ("estimator", "graph", "lambda_sampling", "sampler", "method", "steps")
                         if isinstance(v.get(k), (str, int)) and not isinstance(v.get(k), bool)]
                tag = ":".join(names) or None
            walk(v, f"{where}[{i}{'=' + str(tag) if tag else ''}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        print(f"{where}\t{obj!r}")

with open(path) as f:
    text = f.read()
records = [json.loads(l) for l in text.splitlines() if l.strip()] if path.endswith(".jsonl") else [json.loads(text)]
for n, rec in enumerate(records):
    walk(rec, f"{label}#{n}" if len(records) > 1 else label)
EOF
}

oracle() {  # oracle NAME CONFIG OVERRIDES...
  local name=$1 config=$2; shift 2
  run "$TMP/$name.log" "$PY" evaluate.py --config "$config" --config.eval.output_dir="$TMP/$name" "$@"
  numbers "$name" "$TMP/$name/report.json"
  echo "$name done" >&2
}

oracle oracle_tabular configs/oracle_tabular.py
oracle oracle_markov2 configs/oracle_markov.py --config.data.order=2
oracle oracle_sedd_tabular configs/oracle_sedd_tabular.py --config.eval.num_sequences=8 \
  --config.eval.num_samples=256 --config.eval.num_generate=2000
oracle oracle_poisson configs/oracle_poisson.py --config.eval.num_examples=200 --config.eval.num_generate=2000

TINY=(--config.model.num_layers=1 --config.model.width=32 --config.model.num_heads=2 --config.data.seq_len=16
      --config.train.batch_size=8 --config.train.num_steps=30 --config.train.log_every=10
      --config.train.eval_every=30 --config.train.ckpt_every=30 --config.optim.warmup_steps=5)
TEXT_EVAL=(--config.eval.max_sequences=16 --config.eval.num_samples=2 --config.eval.num_generate=0)
for name in masked_text sedd_absorb_text sedd_uniform_text; do
  run "$TMP/$name.train.log" "$PY" train.py --config "configs/$name.py" --workdir "$TMP/$name" "${TINY[@]}"
  run "$TMP/$name.eval.log" "$PY" evaluate.py --workdir "$TMP/$name" "${TEXT_EVAL[@]}"
  numbers "train_$name" "$TMP/$name/metrics.jsonl"
  numbers "eval_$name" "$TMP/$name/report.json"
  echo "$name done" >&2
done
name=poisson_zip
run "$TMP/$name.train.log" "$PY" train.py --config configs/poisson_synthetic.py --workdir "$TMP/$name" \
  --config.train.num_steps=30 --config.train.log_every=10 --config.train.eval_every=30 --config.train.ckpt_every=30 \
  --config.optim.warmup_steps=5
run "$TMP/$name.eval.log" "$PY" evaluate.py --workdir "$TMP/$name" --config.eval.max_examples=200 \
  --config.eval.num_generate=1000 --config.eval.sample_steps=50
numbers "train_$name" "$TMP/$name/metrics.jsonl"
numbers "eval_$name" "$TMP/$name/report.json"
echo "$name done" >&2
echo "$(wc -l <"$OUT") numbers written to $OUT" >&2
}

main "$@"
exit
