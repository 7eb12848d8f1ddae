#!/usr/bin/env bash
# tptrain against PyTorch at its best on one GPU: the same model, the same
# batches, the same precision, side by side in one run.
#
#   bash scripts/bench_gpu.sh CORPUS_DIR
#
# 1. tptrain: for each length bucket (BENCH_BUCKETS: 1 = the plain batcher,
#    8 = lengths padded to multiples of 8, --length-bucket), preset (base,
#    big) and batch size (16k, 4k tokens), train_mt --device cuda --dtype
#    bf16 trains BENCH_STEPS steps (no evaluation, a metrics record per
#    step, the first one with its launch-to-first-step time) and, for the
#    configurations PyTorch replays (BENCH_TORCH), writes its batches
#    (--dump-batches).
#    Then one more tptrain run with --recompute selective (BENCH_SELECTIVE's
#    configuration): the memory the recomputation saves, at what speed; and
#    one with --cuda-graphs on per BENCH_GRAPHS configuration: each batch
#    shape's forward and backward replayed as CUDA graphs (bucketed lengths
#    make shapes repeat), the row "tptrain cuda graphs"; and one with
#    --attention flash per BENCH_FLASH configuration (attention on tensor
#    cores that never stores its probabilities), the row "tptrain flash
#    attention", and the same per BENCH_FLASH_SHORT configuration with the
#    short-sequence kernels chosen (TPTRAIN_FLASH_KERNEL=short: a block per
#    sentence and head, kernels/cuda/attention_short.cu), the row "tptrain
#    flash attention short kernels".
# 2. one tptrain run with --profile (BENCH_PROFILE's configuration): where
#    the step's time goes, by class of operation and by op (the table by op
#    after the class table); both go in the report.
# 3. PyTorch at its best on those batches (scripts/bench_torch_mt.py; see
#    its header): eager, once per attention backend (BENCH_SDPA), then
#    eager again in BENCH_EAGER_TRIALS - 1 fresh processes with the backend
#    the first found fastest (eager's speed has moved by a third between
#    runs on the same machine; the table takes its fastest trial and shows
#    the others under "also tried"), then
#    torch.compile(dynamic=True) with the backend eager found fastest
#    (BENCH_COMPILE_SDPA=best, or a list); each after a warm-up over every
#    distinct batch shape of the dump.
# 4. the table: per configuration and bucket, the fastest row of each mode,
#    its backend and the others tried; target tokens/s, step time, TFLOP/s
#    and MFU (FLOPs formula in docs/gpu-benchmark.md), peak memory
#    (tptrain's allocator peak beside torch.cuda.max_memory_allocated),
#    compile and launch-to-first-step seconds, ratios to eager.
# The first BENCH_WARMUP steps of every run are not timed. Before the runs,
# the PyTorch model is checked against the float64 reference model on this
# machine's PyTorch (test/check_bench_model.py; a failure is reported under
# the table and makes the exit status 1). Output in BENCH_DIR (default
# ./bench_gpu): results.jsonl (one JSON line per run or backend tried),
# bench.md (the table and the profile), profile.txt, logs/. A run that would
# not finish inside BENCH_BUDGET seconds is skipped with a row saying so, and
# a run still going when the budget ends is stopped; a run that fails or is
# stopped gets a row with its error (exit status 124: the budget), and the
# script exits 1. The estimate is made of measured parts, per framework and
# mode (scripts/bench_estimate.sh): the run's fixed cost (start-up,
# compilation, warm-up) plus its steps at the FLOP rate that kind of run
# reached. tptrain's run of a configuration measures its FLOPs per step for
# the PyTorch runs after it; before it, a configuration is priced at the
# last one's FLOPs per target token (a larger preset is then under-priced,
# and its tptrain run, stopped at the budget if need be, prices the rest).
#
# Environment: TPTRAIN_BIN (folder of train_mt; default build-gpu or build),
# BENCH_PRESETS ("base big"), BENCH_TOKENS ("16384 4096"), BENCH_BUCKETS
# ("1 8"), BENCH_TORCH (PRESET-TOKENS configurations PyTorch replays;
# default base-16384 when it runs, else the first; "all": every one),
# BENCH_SDPA ("auto,flash,efficient,cudnn,math"), BENCH_COMPILE_SDPA (best),
# BENCH_SELECTIVE (PRESET-TOKENS-BUCKET of the --recompute selective run, default
# that of the profile run; "none" to skip it),
# BENCH_GRAPHS (PRESET-TOKENS-BUCKET configurations of the --cuda-graphs on
# runs; default the main preset (PyTorch's) at every token count of the
# sweep and the largest bucket asked for; "none" to skip them),
# BENCH_FLASH (PRESET-TOKENS-BUCKET configurations of the --attention flash
# runs; default the profile's configuration and the main preset at every
# token count with the largest bucket; "none" to skip them; always none
# with BENCH_DEVICE=cpu, whose fp32 flash refuses),
# BENCH_FLASH_SHORT (configurations of the short-kernel runs; default those
# of BENCH_FLASH; "none"),
# BENCH_FLASH_GRAPHS (configurations run with both --attention flash and
# --cuda-graphs on, the row "tptrain flash attention cuda graphs"; default
# those of BENCH_GRAPHS; "none"), BENCH_COMPILE_DYNAMIC (true: dynamic=True;
# auto: PyTorch's default; batch: the batch dimension alone symbolic, a graph
# per bucketed length pair; each with :layers to compile layer by layer,
# PyTorch's regional compilation; a list runs each), BENCH_COMPILE_BUDGET (seconds:
# each compile run's own cap, not priced against the rest; 0: the budget's),
# BENCH_PROFILE (PRESET-TOKENS-BUCKET of the --profile run, default that
# configuration with the first bucket; "none"),
# BENCH_STEPS (40), BENCH_WARMUP (10), BENCH_MODES ("eager compile"),
# BENCH_EAGER_TRIALS (2: eager's processes per configuration),
# BENCH_BUDGET (seconds, default 1500), BENCH_DEVICE (cuda; cpu runs the
# harness on a CPU in fp32), BENCH_PYTHON (a python3 with torch; default the
# first of python3 and /usr/bin/python3 that imports it), BENCH_PEAK_TFLOPS
# (MFU's peak, for a device bench_torch_mt.py does not know).
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
eager_trials=${BENCH_EAGER_TRIALS:-2}
[[ $eager_trials =~ ^[1-9][0-9]?$ ]] || { echo "bench_gpu: BENCH_EAGER_TRIALS=$eager_trials: a whole number from 1 to 99" >&2; exit 2; }
buckets=${BENCH_BUCKETS:-1 8}
# base at 16k tokens when it runs, else the first configuration: PyTorch's and the profile's
read -r first_preset _ <<< "$presets"
read -r first_tok _ <<< "$tokens"
read -r first_bucket _ <<< "$buckets"
main_cfg=$first_preset-$first_tok
[[ " $presets " == *" base "* && " $tokens " == *" 16384 "* ]] && main_cfg=base-16384
torch_cfgs=${BENCH_TORCH:-$main_cfg}
sdpa=${BENCH_SDPA:-auto,flash,efficient,cudnn,math}
compile_sdpa=${BENCH_COMPILE_SDPA:-best}
profile_cfg=${BENCH_PROFILE:-$main_cfg-$first_bucket}
selective_cfg=${BENCH_SELECTIVE:-$main_cfg-$first_bucket}
graph_bucket=$(tr ' ' '\n' <<< "$buckets" | sort -n | tail -n 1)
graphs_default=""
for t in $tokens; do graphs_default+=" ${main_cfg%%-*}-$t-$graph_bucket"; done
graphs_cfgs=${BENCH_GRAPHS:-$graphs_default}
budget=${BENCH_BUDGET:-1500}
device=${BENCH_DEVICE:-cuda}
flash_cfgs=${BENCH_FLASH:-$profile_cfg $graphs_default}
flash_graphs_cfgs=${BENCH_FLASH_GRAPHS:-$graphs_default}
flash_short_cfgs=${BENCH_FLASH_SHORT:-$flash_cfgs}
[ "$device" = cpu ] && flash_cfgs=none flash_graphs_cfgs=none flash_short_cfgs=none
compile_dynamic=${BENCH_COMPILE_DYNAMIC:-true}
compile_budget=${BENCH_COMPILE_BUDGET:-0}
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
# row PRESET TOKENS BUCKET JSON...: each JSON line with the configuration added, appended to results.
row() {
  "$py" -c 'import json, os, sys
for line in sys.argv[4:]:
    for l in line.splitlines():
        if l.strip():
            r = json.loads(l); r.update(preset=sys.argv[1], batch_tokens=int(sys.argv[2]), bucket=int(sys.argv[3]))
            if os.environ.get("ROW_TRIAL"): r["trial"] = int(os.environ["ROW_TRIAL"])
            print(json.dumps(r))' \
    "$@" >> "$results"
}
# fail_row PRESET TOKENS BUCKET RUN MODE LOG STATUS: a row naming the failure and its log's last line.
fail_row() {
  local why
  why=$(grep -v '^[[:space:]]*$' "$6" 2> /dev/null | tail -n 1 | tr -d '"\\' | cut -c1-160)
  [ "$7" != 124 ] || why="stopped at its time cap (BENCH_BUDGET, or BENCH_COMPILE_BUDGET for a compile run); $why"
  row "$1" "$2" "$3" "{\"framework\": \"$4\", \"mode\": \"$5\", \"error\": \"failed (logs/$(basename "$6")): $why\"}"
  failed=1
}
# wanted CONFIG LIST: whether CONFIG (PRESET-TOKENS) is in LIST ("all": every one).
wanted() { [ "$2" = all ] || [[ " $2 " == *" $1 "* ]]; }
# The measured parts and the estimates made of them (scripts/bench_estimate.sh).
# shellcheck source=scripts/bench_estimate.sh
. "$root/scripts/bench_estimate.sh"
declare -A cfg_flops  # PRESET-TOKENS-bBUCKET: FLOPs per step, measured by its tptrain run
# out_of_time PRESET TOKENS BUCKET RUN MODE FLOPS_STEP: true (with a skipped row) when the run,
# priced by its kind's measured parts (tptrain, eager, compile), would outlast the budget.
out_of_time() {
  local kind=$4 est
  [ "$4" = pytorch ] && kind=$5  # tptrain's runs, whatever their mode, are priced as tptrain
  est=$(estimate "$kind" "$6")
  [ $((SECONDS + est)) -ge "$t_end" ] || return 1
  row "$1" "$2" "$3" "{\"framework\": \"$4\", \"mode\": \"$5\", \"skipped\": \"time budget (BENCH_BUDGET): estimated at $est s, $((t_end - SECONDS)) s left\"}"
  echo "bench_gpu: $1-$2 bucket $3 $4 $5 skipped: estimated at $est s, $((t_end - SECONDS)) s left"
}

echo "bench_gpu: train_mt from $bin, $py ($("$py" -c 'import torch; print(torch.__version__)')), device $device, $dtype"
echo "bench_gpu: presets $presets; tokens per batch $tokens; buckets $buckets; $steps steps, $warmup of warmup; budget $budget s"
echo "bench_gpu: PyTorch replays $torch_cfgs; attention backends $sdpa (compile: $compile_sdpa); profile $profile_cfg"
# The PyTorch model on this machine's PyTorch (its attention path may differ
# from the one the tests saw) against the float64 reference, on the CPU:
# a one-step tiny export and its batch (test/check_bench_model.py). It also
# builds the corpus cache (tiny, base and big share the 8000-piece
# tokenizer) that every run below reads, so no run's launch-to-first-step
# time holds the tokenizer's training.
check_log=$out/logs/model_check.log
check="FAIL (logs/model_check.log)"
cache=$out/cache
if timeout -k 5 "$(left)" "$bin/train_mt" --data "$corpus" --cache-dir "$cache" --device cpu --preset tiny \
     --max-steps 1 --batch-tokens 512 --eval-interval 0 --export "$out/check_model" \
     --dump-batches "$out/check_batches.st" > "$check_log" 2>&1 &&
   timeout -k 5 "$(left)" "$py" "$root/test/check_bench_model.py" "$out/check_model" "$out/check_batches.st" \
     >> "$check_log" 2>&1; then
  check="PASS ($(grep -E '^[0-9]+ gradients' "$check_log" | tail -n 1))"
else
  failed=1
fi
rm -rf "$out/check_model" "$out/check_batches.st"
echo "bench_gpu: the PyTorch model against the float64 reference: $check"
# tptrain_run PRESET TOKENS BUCKET MODE [FLAGS...]: one tptrain run and its row (MODE: the row's
# mode beside "tptrain", "" for the default run; FLAGS: train_mt's extra flags).
tptrain_run() {
  local preset=$1 btok=$2 bucket=$3 mode=$4 name guess t0 log r
  shift 4
  name=$preset-$btok-b$bucket${mode:+-${mode// /-}}
  guess=$(awk -v a="$flops_per_token" -v b="$btok" 'BEGIN { printf "%.6g", a * b }')
  out_of_time "$preset" "$btok" "$bucket" tptrain "$mode" "$guess" && return
  t0=$SECONDS
  log=$out/logs/$name.tptrain.log
  echo "bench_gpu: $name: tptrain${mode:+ ($mode)}"
  # the batches are dumped for every run: the row's tokens and FLOPs are counted from them
  if timeout -k 5 "$(left)" "$bin/train_mt" --data "$corpus" --cache-dir "$cache" --preset "$preset" \
       --device "$device" --dtype "$dtype" --batch-tokens "$btok" --length-bucket "$bucket" --max-steps "$steps" --eval-interval 0 --log-interval 1 \
       --metrics "$out/$name.metrics.jsonl" --dump-batches "$out/$name.batches.st" "$@" > "$log" 2>&1 &&
     r=$("$py" "$bench_py" tptrain "$out/$name.batches.st" "$out/$name.metrics.jsonl" --warmup "$warmup" \
           --dtype "$dtype" --mode "$mode" 2>> "$log"); then
    row "$preset" "$btok" "$bucket" "$r"
    if [ -z "$mode" ]; then  # the default run prices the rest
      measure tptrain $((SECONDS - t0)) "$r"
      cfg_flops[$name]=${m_flops_step:-$guess}
      flops_per_token=${m_flops_per_token:-$flops_per_token}
    fi
  else
    fail_row "$preset" "$btok" "$bucket" tptrain "$mode" "$log" "$?"
  fi
  [ -z "$mode" ] && wanted "$preset-$btok" "$torch_cfgs" || rm -f "$out/$name.batches.st"
}

# 1. tptrain, every configuration and bucket; then the memory-lean run (BENCH_SELECTIVE)
for bucket in $buckets; do
  for preset in $presets; do
    for btok in $tokens; do
      tptrain_run "$preset" "$btok" "$bucket" ""
    done
  done
done
if [ "$selective_cfg" != none ]; then
  IFS=- read -r spreset stok sbucket <<< "$selective_cfg"
  tptrain_run "$spreset" "$stok" "${sbucket:-1}" "recompute selective" --recompute selective
fi
if [ "$graphs_cfgs" != none ]; then
  for gcfg in $graphs_cfgs; do
    IFS=- read -r gpreset gtok gbucket <<< "$gcfg"
    tptrain_run "$gpreset" "$gtok" "${gbucket:-1}" "cuda graphs" --cuda-graphs on
  done
fi
if [ "$flash_cfgs" != none ]; then
  for fcfg in $flash_cfgs; do
    IFS=- read -r fpreset ftok fbucket <<< "$fcfg"
    tptrain_run "$fpreset" "$ftok" "${fbucket:-1}" "flash attention" --attention flash
  done
fi
if [ "$flash_short_cfgs" != none ]; then
  for fcfg in $flash_short_cfgs; do
    IFS=- read -r fpreset ftok fbucket <<< "$fcfg"
    TPTRAIN_FLASH_KERNEL=short tptrain_run "$fpreset" "$ftok" "${fbucket:-1}" "flash attention short kernels" \
      --attention flash
  done
fi
if [ "$flash_graphs_cfgs" != none ]; then
  for fcfg in $flash_graphs_cfgs; do
    IFS=- read -r fpreset ftok fbucket <<< "$fcfg"
    tptrain_run "$fpreset" "$ftok" "${fbucket:-1}" "flash attention cuda graphs" --attention flash --cuda-graphs on
  done
fi

# 2. where tptrain's step goes: one --profile run
if [ "$profile_cfg" != none ] && ! [ "$SECONDS" -ge "$t_end" ]; then
  IFS=- read -r ppreset ptok pbucket <<< "$profile_cfg"
  log=$out/logs/profile-$profile_cfg.log
  echo "bench_gpu: $profile_cfg: tptrain --profile"
  if timeout -k 5 "$(left)" "$bin/train_mt" --data "$corpus" --cache-dir "$cache" --preset "$ppreset" --device "$device" --dtype "$dtype" \
       --batch-tokens "$ptok" --length-bucket "${pbucket:-1}" --max-steps "$steps" --eval-interval 0 --log-interval "$steps" \
       --profile --metrics "$out/profile-$profile_cfg.metrics.jsonl" > "$log" 2>&1; then
    { sed -n '/^profile: time per class/,/^  step (measured/p' "$log"; echo
      sed -n '/^profile: time per op/,/^  all ops/p' "$log"; } > "$out/profile.txt"
  else
    echo "the --profile run failed (logs/$(basename "$log")): $(tail -n 1 "$log")" > "$out/profile.txt"
    failed=1
  fi
fi

# 3. PyTorch at its best on the same batches
for bucket in $buckets; do
  for preset in $presets; do
    for btok in $tokens; do
      wanted "$preset-$btok" "$torch_cfgs" || continue
      name=$preset-$btok-b$bucket
      [ -s "$out/$name.batches.st" ] || continue  # tptrain failed: its row says why
      runs=()
      for mode in $modes; do
        if [ "$mode" = compile ]; then
          for dyn in $compile_dynamic; do runs+=("compile $dyn"); done
        elif [ "$mode" = eager ]; then
          for ((t = 1; t <= eager_trials; t++)); do runs+=("eager true $t"); done
        else
          runs+=("$mode true")
        fi
      done
      for run in "${runs[@]}"; do
        read -r mode dyn trial <<< "$run"
        trial=${trial:-1}
        scope=model
        [[ $dyn != *:layers ]] || scope=layers
        dyn=${dyn%%:*}
        # a compile run with a budget of its own is not priced against the rest (its cap bounds it)
        if [ "$mode" != compile ] || [ "$compile_budget" -le 0 ]; then
          out_of_time "$preset" "$btok" "$bucket" pytorch "$mode" "${cfg_flops[$name]:-0}" && continue
        fi
        backends=$sdpa
        if { [ "$mode" = compile ] && [ "$compile_sdpa" = best ]; } || [ "$trial" -gt 1 ]; then  # the fastest backend eager found
          backends=$("$py" - "$results" "$preset" "$btok" "$bucket" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ran = [r for r in rows if r.get("preset") == sys.argv[2] and str(r.get("batch_tokens")) == sys.argv[3]
       and str(r.get("bucket")) == sys.argv[4] and r.get("mode") == "eager" and "tokens_per_s" in r]
print(max(ran, key=lambda r: r["tokens_per_s"])["backend"] if ran else "auto")
PY
)
        elif [ "$mode" = compile ]; then
          backends=$compile_sdpa
        fi
        suffix="" row_trial=""
        [ "$mode" != eager ] || [ "$eager_trials" = 1 ] || row_trial=$trial  # the rows say which trial
        [ "$trial" = 1 ] || suffix="-trial$trial"
        [ "$dyn" = true ] || suffix="-dynamic-$dyn"
        [ "$scope" = model ] || suffix="$suffix-per-layer"
        log=$out/logs/$name.torch-$mode$suffix.log
        cap=$(left)
        if [ "$mode" = compile ] && [ "$compile_budget" -gt 0 ] && [ "$compile_budget" -lt "$cap" ]; then
          cap=$compile_budget
        fi
        echo "bench_gpu: $name: pytorch $mode$suffix (attention: $backends; at most $cap s)"
        t1=$SECONDS
        if r=$(timeout -k 5 "$cap" "$py" "$bench_py" run "$out/$name.batches.st" --mode "$mode" --device "$device" \
                 --dynamic "$dyn" --compile-scope "$scope" --dtype "$dtype" --warmup "$warmup" --sdpa "$backends" 2> "$log") && [ -n "$r" ]; then
          ROW_TRIAL=$row_trial row "$preset" "$btok" "$bucket" "$r"
          measure "$mode" $((SECONDS - t1)) "$r"
        else
          st=$?
          [ -z "$r" ] || ROW_TRIAL=$row_trial row "$preset" "$btok" "$bucket" "$r"  # the backends finished before the failure
          mode_name=$mode
          [ "$dyn" = true ] || mode_name="$mode dynamic=$dyn"
          [ "$scope" = model ] || mode_name="$mode_name per layer"
          fail_row "$preset" "$btok" "$bucket" pytorch "$mode_name" "$log" "$st"
        fi
      done
      rm -f "$out/$name.batches.st"  # MiB each; the metrics and results stay
    done
  done
done
"$py" "$bench_py" table "$results" > "$out/bench.md" || failed=1
printf '\nThe PyTorch model against the float64 reference (PyTorch %s, loss and every gradient): %s\n' \
  "$("$py" -c 'import torch; print(torch.__version__)')" "$check" >> "$out/bench.md"
if [ -s "$out/profile.txt" ]; then
  printf '\nWhere tptrain'"'"'s step goes (%s, train_mt --profile):\n\n```\n' "$profile_cfg" >> "$out/bench.md"
  cat "$out/profile.txt" >> "$out/bench.md"
  printf '```\n' >> "$out/bench.md"
fi
cat "$out/bench.md"
echo "bench_gpu: results in $out (results.jsonl, bench.md, profile.txt, logs/; the corpus cache in cache/)"
exit "$failed"
