#!/usr/bin/env bash
# Pipeline stages on CPU ranks (benchmark, not a test): the same corpus run
# at one fixed global batch of GLOBAL_TOKENS (M micro-batches of
# --batch-tokens GLOBAL_TOKENS / M each) with pp = 1 (M = 1 and M), pp = 2
# and pp = 4 through tprun. Reports,
# side by side: step time and its ratio to pp = 1, the per-rank allocator
# peak and activation peak (the memory record of the metrics: max and min
# over the ranks), and per stage the measured time waiting in exchanges
# against the ideal 1F1B bubble (p - 1) / (M + p - 1).
#   bash scripts/bench_pp_cpu.sh CORPUS_DIR [STEPS] [PRESET] [MICRO_BATCHES] [GLOBAL_TOKENS]
# On a machine with fewer cores than ranks the stages share cores, so the
# waits include time-slicing: compare the memory columns there, the times on
# a machine with a core (or a GPU) per rank.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"
corpus=$1 steps=${2:-30} preset=${3:-small} micro=${4:-4} global=${5:-8192}
bench_setup bench-pp-cpu
configs=("pp1-m1:1:1" "pp1-m$micro:1:$micro" "pp2-m$micro:2:$micro" "pp4-m$micro:4:$micro")
for c in "${configs[@]}"; do
  IFS=: read -r name pp m <<< "$c"
  "$root/build/tprun" --standalone --nproc_per_node "$pp" "$root/build/train_mt" "${common[@]}" --pp "$pp" \
    --micro-batches "$m" --batch-tokens $((global / m)) --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1 ||
    { echo "bench_pp_cpu: $name failed:"; tail -n 20 "$out/$name.log"; exit 1; }
done
/usr/bin/python3 - "$out" "$steps" "$(nproc)" "$preset" "$global" "${configs[@]}" <<'PY'
import json, re, sys
out, steps, cores, preset, glob = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
MiB = 1024.0 * 1024.0
print(f"pipeline stages on CPU ({cores} cores), preset {preset}, {steps} steps, global batches of <= {glob} tokens:")
print("  config   | step (s) | vs pp1-m1 | last loss | peak MiB (max/min rank) | activations MiB (max/min) | waiting per stage (ideal bubble)")
base = None
for c in sys.argv[6:]:
    name, pp, m = c.split(":")
    pp, m = int(pp), int(m)
    log = open(f"{out}/{name}.log").read()
    train = float(re.search(r"\(([\d.]+) s training", log).group(1))
    loss = float(re.findall(r"\| loss ([\d.]+)", log)[-1])
    mem = [r for r in map(json.loads, open(f"{out}/{name}.jsonl")) if "memory" in r][-1]["memory"]
    peaks = [r["allocator_peak"] / MiB for r in mem]
    acts = [r["activations"] / MiB for r in mem]
    waits = re.findall(r"pipeline stage (\d+) \([^)]*\): ([\d.]+)% of .*ideal 1F1B bubble ([\d.]+)%", log)
    wait = ", ".join(f"{w}%" for _, w, _ in sorted(waits, key=lambda x: int(x[0])))
    ideal = f" ({waits[0][2]}%)" if waits else ""
    st = train / steps
    base = base or st
    print(f"  {name:8s} | {st:8.3f} | {st / base:9.2f} | {loss:9.4f} | {max(peaks):10.2f} / {min(peaks):<10.2f} |"
          f" {max(acts):12.2f} / {min(acts):<10.2f} | {wait or '-'}{ideal}")
PY
