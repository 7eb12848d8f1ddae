#!/usr/bin/env bash
# CPU step time of tensor-parallel layouts (benchmark, not a test): the same
# training run (corpus, tiny preset unless given) with tp = 1, 2 and 4 ranks
# through tprun, reporting mean step time, the share of it spent in
# tensor-parallel allreduces, and the ratio to tp = 1, side by side.
#   bash scripts/bench_tp_cpu.sh CORPUS_DIR [STEPS] [PRESET]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=$1 steps=${2:-60} preset=${3:-tiny}
out=${BENCH_DIR:-$root/build/bench-tp-cpu}
mkdir -p "$out"
common=(--data "$corpus" --cache-dir "$out/cache" --preset "$preset" --max-steps "$steps" --log-interval "$steps"
        --eval-interval 1000000 --seed 1)
# Prepare the cache once so that no layout pays for tokenizer training.
"$root/build/train_mt" "${common[@]}" --max-steps 1 > /dev/null
for tp in 1 2 4; do
  "$root/build/tprun" --standalone --nproc_per_node "$tp" "$root/build/train_mt" "${common[@]}" --tp "$tp" \
    > "$out/tp$tp.log" 2>&1
done
/usr/bin/python3 - "$out" "$steps" "$(nproc)" <<'PY'
import re, sys
out, steps, cores = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for tp in (1, 2, 4):
    log = open(f"{out}/tp{tp}.log").read()
    train = float(re.search(r"\(([\d.]+) s training", log).group(1))
    m = re.search(r"tensor-parallel allreduces: (\d+) \(([\d.]+) MiB\), ([\d.]+) s", log)
    comm = float(m.group(3)) if m else 0.0
    rows.append((tp, train / steps, comm / train if train else 0.0, int(m.group(1)) if m else 0))
print(f"tensor-parallel step time on CPU ({cores} cores), {steps} steps each:")
print("  tp | step time (s) | vs tp=1 | allreduce share | allreduces")
for tp, st, share, n in rows:
    print(f"  {tp:2d} | {st:13.3f} | {st / rows[0][1]:7.2f} | {100 * share:14.1f}% | {n}")
PY
