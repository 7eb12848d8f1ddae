#!/usr/bin/env bash
# The data-parallel reduction on CPU ranks (benchmark, not a test): the same
# corpus run with dp = 2 and dp = 4 through tprun, ZeRO 0 and 1, buckets
# reduced after backward or on the communication thread while backward runs,
# gradients reduced in fp32 or bf16. Reports, side by side: step time, the
# data-parallel communication time per step and the part of it the step
# waited for (exposed), and the gradient and optimizer memory and the
# allocator peak per rank
# (the memory record of the metrics).
#   bash scripts/bench_dp_cpu.sh CORPUS_DIR [STEPS] [PRESET] [BUCKET_MB]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=$1 steps=${2:-30} preset=${3:-small} bucket=${4:-2}
out=${BENCH_DIR:-$root/build/bench-dp-cpu}
mkdir -p "$out"
common=(--data "$corpus" --cache-dir "$out/cache" --preset "$preset" --max-steps "$steps" --log-interval "$steps"
        --eval-interval 1000000 --seed 1 --tp 1 --batch-tokens 2048 --grad-bucket-mb "$bucket")
# Prepare the cache once so that no run pays for tokenizer training.
"$root/build/train_mt" "${common[@]}" --max-steps 1 > /dev/null
configs=(
  "z0-after:--zero 0 --grad-overlap off"
  "z0-overlap:--zero 0 --grad-overlap on"
  "z0-overlap-bf16:--zero 0 --grad-overlap on --grad-comm-dtype bf16"
  "z1-after:--zero 1 --grad-overlap off"
  "z1-overlap:--zero 1 --grad-overlap on"
  "z2-after:--zero 2 --grad-overlap off"
  "z2-overlap:--zero 2 --grad-overlap on"
)
for dp in 2 4; do
  for c in "${configs[@]}"; do
    name=${c%%:*} flags=${c#*:}
    # shellcheck disable=SC2086
    "$root/build/tprun" --standalone --nproc_per_node "$dp" "$root/build/train_mt" "${common[@]}" --dp "$dp" $flags \
      --metrics "$out/dp$dp-$name.jsonl" > "$out/dp$dp-$name.log" 2>&1
  done
done
/usr/bin/python3 - "$out" "$steps" "$(nproc)" "$preset" "$bucket" "${configs[@]}" <<'PY'
import json, re, sys
out, steps, cores, preset, bucket = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
names = [c.split(":")[0] for c in sys.argv[6:]]
MiB = 1024.0 * 1024.0
print(f"data-parallel reduction on CPU ({cores} cores), preset {preset}, {steps} steps, buckets of {bucket} MiB:")
print("  dp | config          | step (s) | vs z0-after | comm/step (s) | exposed/step (s) | grads MiB | optimizer MiB | peak MiB")
for dp in (2, 4):
    base = None
    for n in names:
        log = open(f"{out}/dp{dp}-{n}.log").read()
        m = re.search(r"\(([\d.]+) s training, with ([\d.]+) s data-parallel communication of which ([\d.]+) s exposed", log)
        train, comm, exposed = (float(x) for x in m.groups())
        mem = [r for r in map(json.loads, open(f"{out}/dp{dp}-{n}.jsonl")) if "memory" in r][-1]["memory"]
        opt = max(r["optimizer"] for r in mem) / MiB
        grads = max(r["grads"] for r in mem) / MiB
        peak = max(r["allocator_peak"] for r in mem) / MiB
        st = train / steps
        base = base or st
        print(f"  {dp:2d} | {n:15s} | {st:8.3f} | {st / base:11.2f} | {comm / steps:13.3f} | {exposed / steps:16.3f} |"
              f" {grads:9.2f} | {opt:13.2f} | {peak:8.2f}")
PY
