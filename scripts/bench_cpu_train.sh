#!/usr/bin/env bash
# CPU training benchmark (not a test): trains a preset on the corpus for a
# fixed number of steps and reports the dev-loss curve, dev BLEU, tokens/s
# and the time one epoch takes on this machine.
#   bash scripts/bench_cpu_train.sh CORPUS_DIR [STEPS] [PRESET] [extra train_mt flags...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=$1 steps=${2:-1200} preset=${3:-tiny}
shift $(( $# < 3 ? $# : 3 ))
out=${BENCH_DIR:-$root/build/bench-cpu-$preset}
mkdir -p "$out"
"$root/build/train_mt" --data "$corpus" --cache-dir "$out/cache" --preset "$preset" --max-steps "$steps" \
  --lr 2e-3 --warmup 200 --log-interval 100 --eval-interval 200 --metrics "$out/metrics.jsonl" \
  --save "$out/model" "$@" | tee "$out/train.log"
/usr/bin/python3 - "$out/metrics.jsonl" "$out/train.log" "$(nproc)" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
log = open(sys.argv[2]).read()
train = [r for r in rows if "loss" in r]
dev = [r for r in rows if "dev_loss" in r]
per_epoch = int(re.search(r"(\d+) batches per epoch", log).group(1))
m = re.search(r"(\d+) steps in \S+ \(([\d.]+) s training.*?([\d.]+) s evaluation\)", log)
steps, t_train = int(m.group(1)), float(m.group(2))
tps = [r["tokens_per_s"] for r in train[1:]] or [train[0]["tokens_per_s"]]
print(f"\nCPU benchmark ({sys.argv[3]} cores): {steps} steps, {t_train:.0f} s training")
print(f"  target tokens/s (median of log windows): {sorted(tps)[len(tps)//2]:.0f}")
print(f"  one epoch = {per_epoch} steps = {per_epoch * t_train / steps / 60:.1f} min")
print("  step   dev_loss  dev_bleu")
for r in dev:
    print(f"  {r['step']:5d}  {r['dev_loss']:8.4f}  {r.get('dev_bleu', float('nan')):8.2f}")
PY
