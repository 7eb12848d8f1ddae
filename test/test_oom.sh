#!/usr/bin/env bash
# Out of memory ends a run with one sentence: the rank, the allocator tag
# that asked, the bytes asked for, in use and allowed, and what to change.
# TPTRAIN_DEVICE_MEMORY_LIMIT caps the tagged allocator on every backend,
# so the CPU runs the path a full GPU takes (cudaMalloc failing reaches the
# same sentence through the same allocator). Also: the limit's parse errors,
# and a limit the run fits in changes nothing.
# Usage: test_oom.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
train=$build/train_mt tprun=$build/tprun
fail() { echo "FAIL: $*" >&2; exit 1; }
synth=(--preset tiny --task copy --max-steps 2 --log-interval 1 --eval-interval 0)
# expect NAME STATUS TEXT CMD...: exit STATUS, TEXT (an extended regex) on one line of the output
expect() {
  local name=$1 want_rc=$2 text=$3; shift 3
  local rc=0
  timeout 60 "$@" > "$name.log" 2>&1 || rc=$?
  ((rc == want_rc)) || { cat "$name.log"; fail "$name: exit $rc, not $want_rc"; }
  grep -qE -- "$text" "$name.log" || { cat "$name.log"; fail "$name: no line matching '$text'"; }
  ! grep -qE "Segmentation|Aborted|AddressSanitizer|runtime error" "$name.log" || { cat "$name.log"; fail "$name: crashed"; }
}
num='[0-9]+\.[0-9] MiB \([0-9]+ bytes\)'
# 300000 bytes: the weights (179 KB) fit, their gradients do not
TPTRAIN_DEVICE_MEMORY_LIMIT=300000 expect grads 1 \
  "^rank 0 is out of host memory on CPU: grads asked for $num with $num in use of the 0.3 MiB \(300000 bytes\) TPTRAIN_DEVICE_MEMORY_LIMIT allows; to fit, shard the state with --zero 1 .*--tp, --pp.*train_mt --plan" \
  "$train" "${synth[@]}"
[[ $(grep -c "out of host memory" grads.log) == 1 ]] || fail "grads: not one sentence"
# 2 MB per rank, two ranks through tprun (each needs 0.7 MiB of state and
# 2.0 MiB of activations): every rank names itself and the activations
TPTRAIN_DEVICE_MEMORY_LIMIT=2000000 expect ranks 1 \
  "^\[rank 1\] rank 1 is out of host memory on CPU: activations asked for $num with $num in use of the 1.9 MiB \(2000000 bytes\) TPTRAIN_DEVICE_MEMORY_LIMIT allows; to fit, lower --batch-tokens, add --recompute" \
  "$tprun" --nproc_per_node 2 "$train" "${synth[@]}" --dp 2
grep -q "tprun: rank [01] (local rank [01], pid [0-9]*) on host .* failed first: exit code 1" ranks.log ||
  { cat ranks.log; fail "ranks: tprun did not name the failed rank"; }
for bad in 1e9 -5 abc 12MiB 0; do
  TPTRAIN_DEVICE_MEMORY_LIMIT=$bad expect "parse-$bad" 2 \
    "^train_mt: TPTRAIN_DEVICE_MEMORY_LIMIT expects an integer in \[1, [0-9]+\], got '$bad' \(bytes of device memory" \
    "$train" "${synth[@]}"
done
TPTRAIN_DEVICE_MEMORY_LIMIT=100000000 expect fits 0 "^step +2/2 " "$train" "${synth[@]}"
TPTRAIN_DEVICE_MEMORY_LIMIT= expect empty 0 "^step +2/2 " "$train" "${synth[@]}"
echo "test_oom: ok"
