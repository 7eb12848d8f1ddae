#!/usr/bin/env bash
# --max-minutes: a run ends after the first step past its wall-time limit,
# with what a run does at its last step (held-out evaluation, save), and
# every rank ends at the same step (rank 0's clock decides for all: a rank
# that stopped alone would leave the others waiting in a collective).
#   1. one rank: a 0.6 s limit on a 100000-step run ends at a step N;
#      the checkpoint is step N, the last training row and a held-out row
#      are step N;
#   2. two ranks through tprun (tp 2): the same, the job exits 0 and the
#      checkpoint has both shards of step N;
#   3. 0, negative and non-numeric limits are refused naming the flag.
# Usage: test_max_minutes.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "test_max_minutes: FAIL: $*" >&2; exit 1; }
args=(--preset tiny --task copy --max-steps 100000 --max-minutes 0.01 --log-interval 3 --eval-interval 100000
      --lr 5e-3 --warmup 10)

# check NAME LOG METRICS CKPT: the run ended at a step N, logged, saved and evaluated it.
check() {
  local name=$1 log=$2 metrics=$3 ckpt=$4 n
  n=$(sed -n 's/.*--max-minutes 0.01 reached at step \([0-9]*\) of 100000.*/\1/p' "$log" | head -n 1)
  [ -n "$n" ] || fail "$name: no 'reached at step' line in: $(tail -n 3 "$log")"
  [ "$(cat "$ckpt/latest")" = "$(printf 'step_%08d' "$n")" ] || fail "$name: latest is $(cat "$ckpt/latest"), not step $n"
  /usr/bin/python3 - "$metrics" "$n" <<'PY' || fail "$name: metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2])
train = [r["step"] for r in rows if "loss" in r]
held = [r["step"] for r in rows if "dev_loss" in r]
assert train[-1] == n, f"last training row {train[-1]}, not {n}"
assert held == [n], f"held-out rows at {held}, expected only the last step {n}"
PY
  echo "$name: ended at step $n, logged, saved, evaluated"
}

"$build/train_mt" "${args[@]}" --save ck1 --metrics m1.jsonl > r1.log 2>&1 || { cat r1.log; fail "one rank: exit $?"; }
check "one rank" r1.log m1.jsonl ck1

"$build/tprun" --standalone --nproc_per_node 2 "$build/train_mt" "${args[@]}" --tp 2 --comm-timeout 60 \
  --save ck2 --metrics m2.jsonl > r2.log 2>&1 || { cat r2.log; fail "two ranks: exit $?"; }
check "two ranks" r2.log m2.jsonl ck2
shards=$(find "ck2/$(cat ck2/latest)" -name '*.safetensors' | wc -l)
[ "$shards" -ge 2 ] || fail "two ranks: $shards shard files in the checkpoint"

for bad in 0 -1 soon; do
  if "$build/train_mt" --preset tiny --task copy --max-minutes "$bad" > bad.log 2>&1; then
    fail "--max-minutes $bad was accepted"
  fi
  grep -q -- "--max-minutes" bad.log || fail "--max-minutes $bad: the refusal does not name the flag: $(cat bad.log)"
done
echo "test_max_minutes: PASS"
