#!/usr/bin/env bash
# The planner against runs on CPU ranks (benchmark, not a test: it times).
# `train_mt --plan --layout auto` through tprun weighs every layout of
# NPROC ranks; then each of these candidates trains STEPS steps on the
# corpus: auto's choice, per mesh (tp x dp x pp) the fastest predicted, and the fastest
# predicted with full recomputation, with ZeRO-2 and with sequence
# parallelism. Prints predicted against measured step time (measured: the
# mean step after the first two, which allocate and warm the caches, from
# the metrics' elapsed seconds) and peak memory, and checks:
#   - every predicted step time within 20% of the measured one,
#   - auto's pick within 10% of the best measured candidate.
# Exit status 1 when a check fails.
#   bash scripts/bench_plan_cpu.sh CORPUS_DIR [STEPS] [PRESET] [BATCH_TOKENS]
# NPROC (default 4) ranks; BUILD_DIR (default build); BENCH_DIR for the
# logs. The global batch is BATCH_TOKENS x NPROC tokens per step for every
# layout (auto splits it into dp x micro-batches).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=$(cd "$1" && pwd)
steps=${2:-20} preset=${3:-cpu} btok=${4:-2048} nproc=${NPROC:-4}
[ "$steps" -ge 4 ] || { echo "bench_plan_cpu: STEPS must be at least 4"; exit 2; }
build=$(cd "${BUILD_DIR:-$root/build}" && pwd)
out=${BENCH_DIR:-$build/bench-plan-cpu}
mkdir -p "$out"
cd "$out"  # the corpus cache and the planner's calibration live in ./cache
common=(--data "$corpus" --preset "$preset" --max-steps "$steps" --log-interval 1 --eval-interval 1000000 --seed 1)
"$build/train_mt" "${common[@]}" --max-steps 1 --batch-tokens "$btok" > prepare.log 2>&1 ||
  { tail -n 20 prepare.log; exit 1; }
"$build/tprun" --nproc_per_node="$nproc" "$build/train_mt" --plan --layout auto "${common[@]}" --batch-tokens "$btok" \
  --metrics auto.json > auto.log 2>&1 || { tail -n 30 auto.log; echo "bench_plan_cpu: --plan --layout auto failed"; exit 1; }
grep -v "corpus:" auto.log | sed -n '/--layout auto:/,/and [0-9]* more that fit/p'
# name|flags of the candidates to run
mapfile -t runs < <(/usr/bin/python3 - <<'PY'
import json
c = [x for x in json.load(open("auto.json"))["candidates"] if x["fits"]]
picks = {}
def take(name, pred):
    best = next((x for x in c if pred(x)), None)  # candidates come fastest first
    if best and best["flags"] not in [p["flags"] for p in picks.values()]:
        picks[name] = best
take("auto", lambda x: x["chosen"])
for x in c:
    take(f"tp{x['tp']}dp{x['dp']}pp{x['pp']}", lambda y, x=x: (y["tp"], y["dp"], y["pp"]) == (x["tp"], x["dp"], x["pp"]))
take("full-recompute", lambda x: x["recompute"] == "full")
take("zero2", lambda x: x["zero"] == 2)
take("seq-parallel", lambda x: x["sp"])
for name, x in picks.items():
    print(f"{name}|{x['flags']}")
PY
)
for r in "${runs[@]}"; do
  IFS='|' read -r name flags <<< "$r"
  echo "bench_plan_cpu: running $name ($flags)"
  # shellcheck disable=SC2086
  "$build/tprun" --nproc_per_node="$nproc" "$build/train_mt" "${common[@]}" $flags --metrics "$name.jsonl" \
    > "$name.log" 2>&1 || { tail -n 20 "$name.log"; echo "bench_plan_cpu: $name failed"; exit 1; }
done
/usr/bin/python3 - "$steps" "$(nproc)" "$nproc" "$preset" "$btok" "${runs[@]}" <<'PY'
import json, sys
steps, cores, nproc, preset, btok = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
cand = {x["flags"]: x for x in json.load(open("auto.json"))["candidates"]}
MiB = 2.0 ** 20
rows = []
for r in sys.argv[6:]:
    name, flags = r.split("|", 1)
    recs = [json.loads(x) for x in open(f"{name}.jsonl")]
    elapsed = {x["step"]: x["elapsed_s"] for x in recs if "elapsed_s" in x}
    measured = (elapsed[steps] - elapsed[2]) / (steps - 2)
    mem = [x for x in recs if "memory" in x][-1]["memory"]
    peak = max(m["allocator_peak"] for m in mem)
    c = cand[flags]
    rows.append((name, c, measured, peak))
print(f"\nplanner against runs: {nproc} CPU ranks on {cores} cores, preset {preset}, {steps} steps, "
      f"global batch {btok * nproc} tokens")
print("  candidate      | predicted s | measured s | error  | predicted MiB | measured MiB | layout")
bad = []
for name, c, m, peak in rows:
    err = (c["step_s"] - m) / m
    # the peak predicted is the plan's largest rank, library overhead included (0 on CPU)
    print(f"  {name:14} | {c['step_s']:11.3f} | {m:10.3f} | {err:+6.1%} | {c['peak'] / MiB:13.1f} | {peak / MiB:12.1f} | {c['layout']}")
    if abs(err) > 0.20:
        bad.append(f"{name}: predicted step {c['step_s']:.3f} s, measured {m:.3f} s ({err:+.1%})")
best = min(rows, key=lambda x: x[2])
auto = rows[0]
ratio = auto[2] / best[2]
print(f"  auto's pick measured {auto[2]:.3f} s; the best measured: {best[0]} {best[2]:.3f} s; ratio {ratio:.3f}")
if ratio > 1.10:
    bad.append(f"auto's pick is {ratio:.2f}x the best measured candidate")
print("\n".join("bench_plan_cpu: FAIL: " + b for b in bad) if bad else
      "bench_plan_cpu: every step time within 20%; auto's pick within 10% of the best measured")
raise SystemExit(1 if bad else 0)
PY
