#!/usr/bin/env bash
# scripts/compare_curves.py, the judge of gpu_check.sh's CPU-vs-GPU and
# parallel-vs-single curves, on recorded metrics (test/curves/):
#   cpu.jsonl       a real 12-step CPU run (train_mt --task copy --preset tiny
#                   --lr 5e-3 --warmup 4 --log-interval 1 --eval-interval 6)
#   gpu_fp32.jsonl  its losses moved by ~1e-6 relative (another summation order)
#   gpu_bf16.jsonl  its losses moved by 1.5e-3 at step 1, up to 1.6e-2 later
# The band exact and --from (a resumed run) on cuts of cpu.jsonl.
# Within a band it must say PASS (exit 0), outside it FAIL (exit 1), and
# unusable input must exit 2 rather than pass.
# Usage: test_compare_curves.sh SCRIPTS_DIR CURVES_DIR
set -euo pipefail
scripts=$1 curves=$2
py=/usr/bin/python3
[ -x "$py" ] || py=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

expect() {  # expect RC WHAT compare_curves-args...
  local want=$1 what=$2 rc=0
  shift 2
  "$py" "$scripts/compare_curves.py" "$@" > "$work/out.txt" 2>&1 || rc=$?
  if [ "$rc" -eq "$want" ]; then
    echo "ok   $what (exit $rc): $(tail -n 1 "$work/out.txt")"
  else
    echo "FAIL $what: exit $rc, expected $want"
    cat "$work/out.txt"
    fails=$((fails + 1))
  fi
}

expect 0 "identical curves, fp32 band" --band fp32 "$curves/cpu.jsonl" "$curves/cpu.jsonl"
expect 0 "fp32-like run within the fp32 band" --band fp32 "$curves/cpu.jsonl" "$curves/gpu_fp32.jsonl"
expect 0 "bf16-like run within the bf16 band" --band bf16 "$curves/cpu.jsonl" "$curves/gpu_bf16.jsonl"
expect 1 "bf16-like run outside the fp32 band" --band fp32 "$curves/cpu.jsonl" "$curves/gpu_bf16.jsonl"

# Outside the bf16 band: every loss 8% high (a wrong scale, a dropped term).
"$py" - "$curves/cpu.jsonl" "$work/high.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if "loss" in r:
            r["loss"] *= 1.08
        out.write(json.dumps(r) + "\n")
PY
expect 1 "curve 8% off, bf16 band" --band bf16 "$curves/cpu.jsonl" "$work/high.jsonl"
# Only the last step off by 2%: the first step agrees, the curve does not.
sed 's/"step": 12, "loss": 4.03923464/"step": 12, "loss": 4.12/' "$curves/cpu.jsonl" > "$work/late.jsonl"
grep -q '"loss": 4.12' "$work/late.jsonl"
expect 1 "one late step 2% off, fp32 band" --band fp32 "$curves/cpu.jsonl" "$work/late.jsonl"
# A run that stopped early: the steps differ, which is a FAIL, not a pass on fewer steps.
head -n 5 "$curves/cpu.jsonl" > "$work/short.jsonl"
expect 1 "run with fewer steps" --band fp32 "$curves/cpu.jsonl" "$work/short.jsonl"

# Unusable input.
sed 's/"loss": 4.36866856/"loss": NaN/' "$curves/cpu.jsonl" > "$work/nan.jsonl"
expect 2 "non-finite loss" --band bf16 "$curves/cpu.jsonl" "$work/nan.jsonl"
grep dev_loss "$curves/cpu.jsonl" > "$work/devonly.jsonl"
expect 2 "no training rows" --band bf16 "$curves/cpu.jsonl" "$work/devonly.jsonl"
expect 2 "missing file" --band fp32 "$curves/cpu.jsonl" "$work/absent.jsonl"
echo '{"step": 1, "loss": 4.8' > "$work/cut.jsonl"
expect 2 "truncated line" --band fp32 "$curves/cpu.jsonl" "$work/cut.jsonl"
expect 2 "unknown band" --band fp16 "$curves/cpu.jsonl" "$curves/cpu.jsonl"

# exact: a resumed run against the straight one, from the step it resumed at.
expect 0 "identical curves, exact band" --band exact "$curves/cpu.jsonl" "$curves/cpu.jsonl"
expect 1 "fp32-like run (1e-6 off) outside the exact band" --band exact "$curves/cpu.jsonl" "$curves/gpu_fp32.jsonl"
grep -E '"step": (7|8|9|10|11|12),' "$curves/cpu.jsonl" > "$work/resumed.jsonl"
expect 0 "resumed at 7, exact from 7" --band exact --from 7 "$curves/cpu.jsonl" "$work/resumed.jsonl"
expect 1 "resumed at 7, compared from 1 (steps missing)" --band exact "$curves/cpu.jsonl" "$work/resumed.jsonl"
sed 's/"step": 12, "loss": 4.03923464/"step": 12, "loss": 4.03923465/' "$work/resumed.jsonl" > "$work/resumed_off.jsonl"
grep -q '"loss": 4.03923465' "$work/resumed_off.jsonl"
expect 1 "resumed, last digit off at step 12, exact" --band exact --from 7 "$curves/cpu.jsonl" "$work/resumed_off.jsonl"
expect 2 "--from past the last step" --band exact --from 99 "$curves/cpu.jsonl" "$work/resumed.jsonl"

# The side-by-side table: one row per common step, with both losses.
"$py" "$scripts/compare_curves.py" --band bf16 --names cpu,bf16 "$curves/cpu.jsonl" "$curves/gpu_bf16.jsonl" \
  > "$work/table.txt" || true
rows=$(grep -cE '^ +[0-9]+ +[0-9.]+ +[0-9.]+ ' "$work/table.txt" || true)
if [ "$rows" -eq 12 ] && grep -q 'cpu' "$work/table.txt" && grep -q 'max rel diff' "$work/table.txt"; then
  echo "ok   side-by-side table: $rows rows"
else
  echo "FAIL side-by-side table: $rows rows"; cat "$work/table.txt"; fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "compare_curves: all checks passed"
