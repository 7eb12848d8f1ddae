#!/usr/bin/env bash
# Checkpoint benchmarks (not tests); figures are this machine's disk and CPU.
#
#   bash scripts/bench_ckpt.sh [PRESET] [NPROC]
# Save/load time and size: one step of a preset (base by default) on the
# synthetic task, saved, then resumed in the same layout and in another.
#
#   bash scripts/bench_ckpt.sh blocking [PRESET] [SAVES] [INTERVAL]
# What a save holds training up, --save-mode sync against async: one rank
# of PRESET (cpu by default) on the synthetic task saves every INTERVAL
# steps (20) SAVES times (5), once per mode, --keep-last 2 as a long run
# would. Per save: a sync save's seconds ("saved to DIR in X s"); an async
# save's snapshot plus the wait for its write at the next save point ("the
# run waited A s for its snapshot and B s for the write"). The last save
# (the run's end, which waits for its write in both modes) is shown apart;
# the ratio is of the mean over the others. Also each run's share of wall
# time spent saving (its metrics' "time" record).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ ${1:-} == blocking ]]; then
  preset=${2:-cpu} saves=${3:-5} interval=${4:-20}
  out=${BENCH_DIR:-$root/build/bench-ckpt-blocking-$preset}
  rm -rf "$out"; mkdir -p "$out"
  for mode in sync async; do
    "$root/build/train_mt" --task copy --preset "$preset" --log-interval 1000000 --eval-interval 0 \
      --max-steps $((saves * interval)) --save-interval "$interval" --keep-last 2 --save "$out/ck-$mode" \
      --save-mode "$mode" --metrics "$out/$mode.jsonl" > "$out/$mode.log" 2>&1 ||
      { tail "$out/$mode.log"; echo "bench_ckpt: the $mode run failed" >&2; exit 1; }
  done
  grep -h "parameters per rank" "$out/sync.log"
  /usr/bin/python3 - "$out" "$preset" "$interval" <<'PY'
import json, re, sys
out, preset, interval = sys.argv[1], sys.argv[2], sys.argv[3]
sync = [float(x) for x in re.findall(r"checkpoint step \d+ saved to \S+ in ([0-9.]+) s\n", open(f"{out}/sync.log").read())]
asyn = [float(a) + float(b) for a, b in re.findall(r"the run waited ([0-9.]+) s for its snapshot and ([0-9.]+) s for the write",
                                                   open(f"{out}/async.log").read())]
assert len(sync) == len(asyn) >= 2, (sync, asyn)
def frac(mode):
    t = [json.loads(l)["time"] for l in open(f"{out}/{mode}.jsonl") if '"time"' in l][-1]
    return t["save_frac"], t["wall_s"]
ms, ma = sum(sync[:-1]) / len(sync[:-1]), sum(asyn[:-1]) / len(asyn[:-1])
print(f"preset {preset}, one rank, a save every {interval} steps, {len(sync)} saves")
print(f"| mode | blocking per save (mean of {len(sync) - 1}) | last save (the end) | saving, share of wall time |")
print("| --- | --- | --- | --- |")
for mode, xs, m in (("sync", sync, ms), ("async", asyn, ma)):
    f, wall = frac(mode)
    print(f"| {mode} | {m * 1000:.1f} ms | {xs[-1] * 1000:.1f} ms | {100 * f:.1f}% of {wall:.1f} s |")
print(f"async / sync blocking per save: {ma / ms:.3f} ({ms / ma:.0f}x less)" if ma > 0 else "async blocking: 0")
PY
  du -sh "$out/ck-sync/step_$(printf %08d $((saves * interval)))"
  exit 0
fi

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
