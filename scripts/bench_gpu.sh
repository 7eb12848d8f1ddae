#!/usr/bin/env bash
# tptrain against PyTorch on one GPU: the same model, the same batches, the
# same precision, side by side in one run.
#
#   bash scripts/bench_gpu.sh CORPUS_DIR
#
# For each preset (base, big) and batch size (16k, 4k tokens), in that order:
#   1. train_mt --device cuda --dtype bf16 trains BENCH_STEPS steps on the
#      corpus (no evaluation, a metrics record per step) and writes the
#      batches it read (--dump-batches);
#   2. scripts/bench_torch_mt.py trains the PyTorch version of the model on
#      those batches, eager and then torch.compile (bf16 autocast, fused
#      AdamW; see its header for how it is written and timed);
#   3. each run's row: target tokens/s, step time, TFLOP/s and MFU (FLOPs
#      formula in docs/gpu-benchmark.md), peak memory (tptrain's allocator
#      peak beside torch.cuda.max_memory_allocated), and ratios to eager.
# The first BENCH_WARMUP steps of every run are not timed. Before the runs,
# the PyTorch model is checked against the float64 reference model on this
# machine's PyTorch (test/check_bench_model.py; a failure is reported under
# the table and makes the exit status 1). Output in
# BENCH_DIR (default ./bench_gpu): results.jsonl (one JSON line per run),
# bench.md (the table), logs/. A run that would not finish inside
# BENCH_BUDGET seconds is skipped with a row saying so, and a run still going
# when the budget ends is stopped; a run that fails or is stopped gets a row
# with its error (exit status 124: the budget), and the script exits 1.
# The estimate is made of measured parts, per framework and mode: the run's
# fixed cost (start-up, compilation, warm-up: its wall time less its timed
# steps) plus BENCH_STEPS steps of the configuration's FLOPs at the rate that
# run reached. tptrain's run of a configuration measures its FLOPs per step
# for the PyTorch runs after it; before it, a configuration is priced at the
# last one's FLOPs per target token (a larger preset is then under-priced,
# and its tptrain run, stopped at the budget if need be, prices the rest).
#
# Environment: TPTRAIN_BIN (folder of train_mt; default build-gpu or build),
# BENCH_PRESETS ("base big"), BENCH_TOKENS ("16384 4096"), BENCH_STEPS (40),
# BENCH_WARMUP (10), BENCH_MODES ("eager compile"), BENCH_BUDGET (seconds,
# default 1500), BENCH_DEVICE (cuda; cpu runs the harness on a CPU in fp32),
# BENCH_PYTHON (a python3 with torch; default the first of python3 and
# /usr/bin/python3 that imports it), BENCH_PEAK_TFLOPS (MFU's peak, for a
# device bench_torch_mt.py does not know).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=${1:-${TPTRAIN_CORPUS_DIR:-}}
[ -n "$corpus" ] && [ -d "$corpus" ] || { echo "bench_gpu: usage: bench_gpu.sh CORPUS_DIR (got '${corpus}')" >&2; exit 2; }
corpus=$(cd "$corpus" && pwd)
bin=${TPTRAIN_BIN:-}
if [ -z "$bin" ]; then
  for d in "$root/build-gpu" "$root/build"; do [ -x "$d/train_mt" ] && { bin=$d; break; }; done
fi
[ -x "${bin:-}/train_mt" ] || { echo "bench_gpu: no train_mt (set TPTRAIN_BIN to its folder)" >&2; exit 2; }
out=${BENCH_DIR:-$PWD/bench_gpu}
presets=${BENCH_PRESETS:-base big}
tokens=${BENCH_TOKENS:-16384 4096}
steps=${BENCH_STEPS:-40}
warmup=${BENCH_WARMUP:-10}
modes=${BENCH_MODES:-eager compile}
budget=${BENCH_BUDGET:-1500}
device=${BENCH_DEVICE:-cuda}
dtype=bf16
[ "$device" = cuda ] || dtype=fp32
py=${BENCH_PYTHON:-}
if [ -z "$py" ]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" > /dev/null && "$p" -c 'import torch' 2> /dev/null; then py=$p; break; fi
  done
fi
[ -n "$py" ] || { echo "bench_gpu: no python3 with torch (set BENCH_PYTHON)" >&2; exit 2; }
bench_py=$root/scripts/bench_torch_mt.py
mkdir -p "$out/logs" || exit 2
out=$(cd "$out" && pwd)
results=$out/results.jsonl
: > "$results"
t_end=$((SECONDS + budget))
failed=0

# left: the seconds of the budget still to run (a command's timeout).
left() { local l=$((t_end - SECONDS)); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
# row PRESET TOKENS JSON: the JSON line with the configuration added, appended to results.
row() {
  "$py" -c 'import json, sys; r = json.loads(sys.argv[3]); r.update(preset=sys.argv[1], batch_tokens=int(sys.argv[2])); print(json.dumps(r))' \
    "$1" "$2" "$3" >> "$results"
}
# fail_row PRESET TOKENS RUN MODE LOG STATUS: a row naming the failure and its log's last line.
fail_row() {
  local why
  why=$(grep -v '^[[:space:]]*$' "$5" 2> /dev/null | tail -n 1 | tr -d '"\\' | cut -c1-160)
  [ "$6" != 124 ] || why="stopped at the end of the budget (BENCH_BUDGET); $why"
  row "$1" "$2" "{\"framework\": \"$3\", \"mode\": \"$4\", \"error\": \"failed (logs/$(basename "$5")): $why\"}"
  failed=1
}

echo "bench_gpu: train_mt from $bin, $py ($("$py" -c 'import torch; print(torch.__version__)')), device $device, $dtype"
echo "bench_gpu: presets $presets; tokens per batch $tokens; $steps steps, $warmup of warmup; budget $budget s"
# The PyTorch model on this machine's PyTorch (its attention path may differ
# from the one the tests saw) against the float64 reference, on the CPU:
# a one-step tiny export and its batch (test/check_bench_model.py).
check_log=$out/logs/model_check.log
check="FAIL (logs/model_check.log)"
if timeout -k 5 "$(left)" "$bin/train_mt" --data "$corpus" --cache-dir "$out/check_cache" --device cpu --preset tiny \
     --max-steps 1 --batch-tokens 512 --eval-interval 0 --export "$out/check_model" \
     --dump-batches "$out/check_batches.st" > "$check_log" 2>&1 &&
   timeout -k 5 "$(left)" "$py" "$root/test/check_bench_model.py" "$out/check_model" "$out/check_batches.st" \
     >> "$check_log" 2>&1; then
  check="PASS ($(grep -E '^[0-9]+ gradients' "$check_log" | tail -n 1))"
else
  failed=1
fi
rm -rf "$out/check_cache" "$out/check_model" "$out/check_batches.st"
echo "bench_gpu: the PyTorch model against the float64 reference: $check"
# The measured parts and the estimates made of them (scripts/bench_estimate.sh).
# shellcheck source=scripts/bench_estimate.sh
. "$root/scripts/bench_estimate.sh"
for preset in $presets; do
  for btok in $tokens; do
    name=$preset-$btok
    flops_step=$(awk -v a="$flops_per_token" -v b="$btok" 'BEGIN { printf "%.6g", a * b }')
    if ! fits tptrain "$flops_step"; then
      row "$preset" "$btok" "{\"framework\": \"all\", \"mode\": \"\", \"skipped\": \"time budget (BENCH_BUDGET): tptrain estimated at $(estimate tptrain "$flops_step") s, $((t_end - SECONDS)) s left\"}"
      echo "bench_gpu: $name skipped: tptrain's run, estimated at $(estimate tptrain "$flops_step") s, would outlast the budget"
      continue
    fi
    t0=$SECONDS
    log=$out/logs/$name.tptrain.log
    echo "bench_gpu: $name: tptrain"
    if timeout -k 5 "$(left)" "$bin/train_mt" --data "$corpus" --preset "$preset" --device "$device" --dtype "$dtype" \
         --batch-tokens "$btok" --max-steps "$steps" --eval-interval 0 --log-interval 1 \
         --metrics "$out/$name.metrics.jsonl" --dump-batches "$out/$name.batches.st" > "$log" 2>&1 &&
       r=$("$py" "$bench_py" tptrain "$out/$name.batches.st" "$out/$name.metrics.jsonl" --warmup "$warmup" \
             --dtype "$dtype" 2>> "$log"); then
      row "$preset" "$btok" "$r"
      measure tptrain $((SECONDS - t0)) "$r"
      flops_step=${m_flops_step:-$flops_step} flops_per_token=${m_flops_per_token:-$flops_per_token}
    else
      fail_row "$preset" "$btok" tptrain "" "$log" "$?"
      continue  # no batches to replay
    fi
    for mode in $modes; do
      log=$out/logs/$name.torch-$mode.log
      if ! fits "$mode" "$flops_step"; then
        row "$preset" "$btok" "{\"framework\": \"pytorch\", \"mode\": \"$mode\", \"skipped\": \"time budget (BENCH_BUDGET): estimated at $(estimate "$mode" "$flops_step") s, $((t_end - SECONDS)) s left\"}"
        echo "bench_gpu: $name: pytorch $mode skipped: estimated at $(estimate "$mode" "$flops_step") s"
        continue
      fi
      echo "bench_gpu: $name: pytorch $mode"
      t1=$SECONDS
      if r=$(timeout -k 5 "$(left)" "$py" "$bench_py" run "$out/$name.batches.st" --mode "$mode" --device "$device" --dtype "$dtype" \
               --warmup "$warmup" 2> "$log") && [ -n "$r" ]; then
        row "$preset" "$btok" "$r"
        measure "$mode" $((SECONDS - t1)) "$r"
      else
        fail_row "$preset" "$btok" pytorch "$mode" "$log" "$?"
      fi
    done
    rm -f "$out/$name.batches.st"  # MiB each; the metrics and results stay
  done
done
"$py" "$bench_py" table "$results" > "$out/bench.md" || failed=1
printf '\nThe PyTorch model against the float64 reference (PyTorch %s, loss and every gradient): %s\n' \
  "$("$py" -c 'import torch; print(torch.__version__)')" "$check" >> "$out/bench.md"
cat "$out/bench.md"
echo "bench_gpu: results in $out (results.jsonl, bench.md, logs/)"
exit "$failed"
