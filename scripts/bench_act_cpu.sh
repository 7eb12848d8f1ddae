#!/usr/bin/env bash
# Activation memory levers on CPU ranks (benchmark, not a test): the same
# corpus run with tp = TP through tprun, recompute none, selective and full,
# each without and with --sequence-parallel. Reports, side by side: step time
# and its ratio to (none, off), the activation peak and allocator peak per
# rank (the memory record of the metrics, max over the ranks) and the last
# loss (the runs draw the same masks, so the losses agree to rounding).
#   bash scripts/bench_act_cpu.sh CORPUS_DIR [STEPS] [PRESET] [TP] [BATCH_TOKENS]
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"
corpus=$1 steps=${2:-20} preset=${3:-small} tp=${4:-2} tokens=${5:-4096}
bench_setup bench-act-cpu --batch-tokens "$tokens"
configs=()
for rc in none selective full; do
  for sp in off on; do
    name=$rc-sp$sp
    flags=(--tp "$tp" --recompute "$rc")
    [ "$sp" = on ] && flags+=(--sequence-parallel)
    "$root/build/tprun" --standalone --nproc_per_node "$tp" "$root/build/train_mt" "${common[@]}" "${flags[@]}" \
      --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1 ||
      { echo "bench_act_cpu: $name failed:"; tail -n 20 "$out/$name.log"; exit 1; }
    configs+=("$name")
  done
done
/usr/bin/python3 - "$out" "$steps" "$(nproc)" "$preset" "$tp" "$tokens" "${configs[@]}" <<'PY'
import json, re, sys
out, steps, cores, preset, tp, tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
MiB = 1024.0 * 1024.0
print(f"activation memory on CPU ({cores} cores), preset {preset}, tp {tp}, {steps} steps of <= {tokens} tokens:")
print("  recompute / sp     | step (s) | vs none-off | activations MiB | vs none-off | allocator peak MiB | last loss")
base_t = base_a = None
for name in sys.argv[7:]:
    log = open(f"{out}/{name}.log").read()
    train = float(re.search(r"\(([\d.]+) s training", log).group(1))
    loss = float(re.findall(r"\| loss ([\d.]+)", log)[-1])
    mem = [r for r in map(json.loads, open(f"{out}/{name}.jsonl")) if "memory" in r][-1]["memory"]
    acts = max(r["activations"] for r in mem) / MiB
    peak = max(r["allocator_peak"] for r in mem) / MiB
    st = train / steps
    base_t, base_a = base_t or st, base_a or acts
    print(f"  {name:18s} | {st:8.3f} | {st / base_t:11.2f} | {acts:15.2f} | {acts / base_a:11.2f} | {peak:18.2f} |"
          f" {loss:.4f}")
PY
