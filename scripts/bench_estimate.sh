# bench_estimate.sh: bench_gpu.sh's time estimate, made of measured parts
# (sourced; test/test_bench_estimate.sh drives it with recorded rows).
# A run of one kind (tptrain, eager, compile) costs its fixed seconds
# (start-up, compilation, warm-up: its wall time less its timed steps at
# their mean step time) plus $steps steps of the configuration's FLOPs at the
# FLOP/s that kind reached. Needs: py (a python3), steps, t_end (the budget's
# end on bash's SECONDS clock).
# The measured parts, per run kind (tptrain, eager, compile): fixed seconds
# and FLOP/s; and the last configuration's FLOPs per target token.
declare -A fixed_s rate
flops_per_token=0
# measure KIND WALL_S JSON: the run's fixed cost and rate (JSON: a row per attention backend tried, each
# timed; the rate is the configuration's FLOPs over the sum of their step times); its FLOPs per step and per target token
# into m_flops_step and m_flops_per_token.
measure() {
  local m
  m=$("$py" -c 'import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
rows = [r for r in rows if r.get("step_s")]  # one per attention backend tried; skipped ones have none
wall, steps, r = float(sys.argv[2]), int(sys.argv[3]), rows[0]
f = r["tflops"] * 1e12 * r["step_s"]
step_s = sum(x["step_s"] for x in rows)  # a run of several backends times each one
print(" ".join("%.6g" % x for x in (max(0.0, wall - steps * step_s), f / step_s, f,
                                    f * r["steps"] / max(1, r["tokens"]))))' \
      "$3" "$2" "$steps" 2> /dev/null) || return 0
  read -r "fixed_s[$1]" "rate[$1]" m_flops_step m_flops_per_token <<< "$m"
}
# estimate KIND FLOPS_PER_STEP: seconds a run of that kind would take (0 when none was measured yet).
estimate() {
  [ -n "${rate[$1]:-}" ] || { echo 0; return; }
  awk -v f="${fixed_s[$1]}" -v r="${rate[$1]}" -v n="$steps" -v x="$2" 'BEGIN { printf "%d", f + n * x / r + 0.5 }'
}
# fits KIND FLOPS_PER_STEP: whether that run would end inside the budget (else its skipped row is the caller's).
fits() { [ $((SECONDS + $(estimate "$1" "$2"))) -lt "$t_end" ]; }
