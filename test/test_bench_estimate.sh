#!/usr/bin/env bash
# bench_gpu.sh's budget estimate (scripts/bench_estimate.sh) on recorded
# rows, as on the GPU where it went wrong: base at 16k tokens took 40 s
# (tptrain), 50 s (eager) and 140 s (compile, 124 s of it compilation); with
# 150 s left, the configuration's whole time (230 s) skipped the big preset
# entirely. Made of the measured parts, each run is priced alone: big's
# tptrain run (priced at base's FLOPs per token) and, once it has measured
# big's FLOPs, eager fit; compile (its compilation again, plus 3x the FLOPs)
# does not. Usage: test_bench_estimate.sh BENCH_ESTIMATE_SH
set -uo pipefail
py=/usr/bin/python3 steps=40
# shellcheck source=../scripts/bench_estimate.sh
. "$1"
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
want() { if [ "$2" = "$3" ]; then ok "$1: $2"; else bad "$1: got '$2', want '$3'"; fi; }
# rows as bench_torch_mt.py writes them: 30 timed steps of 16384 target tokens
row() { echo "{\"tflops\": $1, \"step_s\": $2, \"steps\": 30, \"tokens\": $((30 * 16384))}"; }
want "nothing measured: no estimate" "$(estimate tptrain 1e12)" 0
base_flops=$(awk 'BEGIN { printf "%.6g", 100e12 * 0.3 }')  # tptrain at 100 TFLOP/s, 0.3 s a step
measure tptrain 40 "$(row 100 0.3)"
want "tptrain's fixed seconds" "${fixed_s[tptrain]}" 28
want "FLOPs per step" "$m_flops_step" "$base_flops"
flops_per_token=$m_flops_per_token
measure eager 50 "$(row 50 0.6)"
measure compile 140 "$(row 75 0.4)"
want "compile's fixed seconds (its compilation)" "${fixed_s[compile]}" 124
want "base again: tptrain" "$(estimate tptrain "$base_flops")" 40
want "base again: compile" "$(estimate compile "$base_flops")" 140
t_end=$((SECONDS + 150))
big_guess=$(awk -v a="$flops_per_token" 'BEGIN { printf "%.6g", a * 16384 }')
want "big priced at base's FLOPs per token before its own run" "$(estimate tptrain "$big_guess")" 40
if fits tptrain "$big_guess"; then ok "big's tptrain run fits in 150 s (the old rule skipped it)"; else bad "big's tptrain run skipped"; fi
# big's tptrain run measured 3x the FLOPs per step: the PyTorch runs are priced with them
measure tptrain 72 "$(row 100 0.9)"
big_flops=$m_flops_step
t_end=$((SECONDS + 110))
want "big: eager" "$(estimate eager "$big_flops")" 98
want "big: compile" "$(estimate compile "$big_flops")" 172
if fits eager "$big_flops"; then ok "big's eager run fits in 110 s"; else bad "big's eager run skipped"; fi
if fits compile "$big_flops"; then bad "big's compile run (172 s) was let into 110 s"; else ok "big's compile run skipped"; fi
[ "$fails" -eq 0 ] || { echo "test_bench_estimate: $fails failed"; exit 1; }
echo "test_bench_estimate: all passed"
