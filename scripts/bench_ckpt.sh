#!/usr/bin/env bash
# Checkpoint save/load time and size (benchmark, not a test): one step of a
# preset (base by default) on the synthetic task, saved, then resumed in the
# same layout and in another. Figures are this machine's disk and CPU.
#   bash scripts/bench_ckpt.sh [PRESET] [NPROC]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-base} n=${2:-2}
out=${BENCH_DIR:-$root/build/bench-ckpt-$preset}
rm -rf "$out"; mkdir -p "$out"
common=(--task copy --preset "$preset" --batch-size 8 --log-interval 1 --eval-interval 1000000 --comm-timeout 600)
"$root/build/tprun" --standalone --nproc_per_node "$n" "$root/build/train_mt" "${common[@]}" --tp "$n" \
  --max-steps 1 --save "$out/ckpt" > "$out/save.log" 2>&1
"$root/build/tprun" --standalone --nproc_per_node "$n" "$root/build/train_mt" "${common[@]}" --tp "$n" \
  --max-steps 2 --resume "$out/ckpt" > "$out/load_same.log" 2>&1
"$root/build/train_mt" "${common[@]}" --max-steps 2 --resume "$out/ckpt" > "$out/load_tp1.log" 2>&1
grep -h "parameters per rank\|checkpoint step 1 saved\|resumed from" "$out"/save.log "$out"/load_same.log "$out"/load_tp1.log
du -sh "$out/ckpt/step_00000001"
ls -l "$out/ckpt/step_00000001"
