#!/usr/bin/env bash
# Asynchronous checkpoint saves (--save-mode async, the default) against
# synchronous ones (--save-mode sync), on the tiny model's copy task with
# dropout, saving every 5 steps of 20:
#  1. Same bytes: one rank, and 2 ranks under tprun (tp 2: rank 0 waits for
#     rank 1's marker), in both modes: every file of every step_N, manifest
#     included, is byte-identical across the modes. The async run's summary
#     gives the shares of wall time spent evaluating and saving, and its
#     metrics a "time" record whose parts add up to the wall time.
#  2. Training goes on while a write is in flight: with the writer held
#     (TPTRAIN_FAULT_WRITE_DELAY_S), the metrics reach step 9 while step 5
#     is not published yet (its step_N.tmp exists); the end waits, so every
#     checkpoint is published when the run exits.
#  3. SIGKILL during a write in flight: TPTRAIN_FAULT_POINT kills the process
#     from the writer thread at the second save's "after a model shard":
#     `latest` names step 5, step 10 is not published, and --resume auto
#     ends with step 20's files byte-identical to the straight run's.
#  4. A failed write (TPTRAIN_FAULT_FAIL at the second save's optimizer
#     shard; on rank 0 of one rank, and on rank 1 of two, whose failure
#     reaches rank 0 through its marker), in both modes: exit 1 with the
#     sentence naming the file, nothing of step 10 published, `latest` at
#     step 5, and the resume gives the straight run's step 20.
#  5. Preemption with a write in flight: SIGTERM while step 5's write is
#     held: exit 75, step 5 and the checkpoint the stop names are both
#     published and verify (ckpt inspect: every file's size and CRC-32C), and the resume gives the straight
#     run's step 20.
# The fault points are found by their names (the kill message), not by
# counting them here. Usage: test_async_save.sh BUILD_DIR
set -euo pipefail
build=$1
. "$(dirname "$0")/lib.sh"
enter_workdir
train=$build/train_mt tprun=$build/tprun ckpt=$build/ckpt
flags=(--preset tiny --task copy --lr 5e-3 --warmup 5 --dropout 0.1 --log-interval 1 --eval-interval 10
       --max-steps 20 --save-interval 5)
job2() { "$tprun" --standalone --nproc_per_node 2 "$train" "${flags[@]}" --tp 2 --comm-timeout 60 "$@"; }
# WRITER_HOLD_S: how long the writer is held in parts 2 and 5; far longer
# than the steps the test waits for (milliseconds each).
WRITER_HOLD_S=3

# same_steps A B: every step_N of folder A has B's bytes, file for file.
same_steps() {
  local n=0
  for d in "$1"/step_*; do
    [[ -d $d && $d != *.tmp ]] || continue
    for f in "$d"/*; do cmp -s "$f" "$2/$(basename "$d")/$(basename "$f")" || return 1; n=$((n + 1)); done
  done
  ((n > 0))
}
latest_is() { [[ $(cat "$1/latest") == "$2" ]]; }
# same_last A B: step 20, the end of the run, has the same bytes in A and B.
same_last() {
  for f in "$2"/step_00000020/*; do cmp -s "$f" "$1/step_00000020/$(basename "$f")" || return 1; done
}

# ---- 1. the same bytes in both modes ----
run one-async.log "$train" "${flags[@]}" --save a1 --metrics a1.jsonl
run one-sync.log "$train" "${flags[@]}" --save s1 --save-mode sync
same_steps a1 s1 && same_steps s1 a1 && [[ $(ls -d a1/step_* | wc -l) == 4 ]] ||
  fail "one rank: the async checkpoints differ from the sync ones"
grep -Eq "[0-9.]+ s evaluation, [0-9.]+% of the wall time; [0-9.]+ s saving, [0-9.]+%\)" one-async.log ||
  { tail -5 one-async.log; fail "no shares of evaluation and saving in the summary"; }
/usr/bin/python3 - a1.jsonl <<'EOF' || fail "the metrics' time record"
import json, sys
t = [r["time"] for r in map(json.loads, open(sys.argv[1])) if "time" in r]
assert len(t) == 1, t
t = t[0]
assert t["eval_s"] > 0 and t["save_s"] > 0, t
assert abs(t["train_s"] + t["eval_s"] + t["save_s"] - t["wall_s"]) < 0.01, t
# the seconds are printed to the millisecond: each share times the wall time within that rounding
assert abs(t["save_frac"] * t["wall_s"] - t["save_s"]) < 1e-3 and abs(t["eval_frac"] * t["wall_s"] - t["eval_s"]) < 1e-3, t
EOF
run two-async.log job2 --save a2
run two-sync.log job2 --save s2 --save-mode sync
same_steps a2 s2 && same_steps s2 a2 && [[ -f a2/step_00000020/model-tp1-pp0.safetensors ]] ||
  fail "two ranks: the async checkpoints differ from the sync ones"
! compgen -G "a2/step_*/.written-rank-*" > /dev/null || fail "a rank's marker left in a published checkpoint"
ok "async checkpoints byte-identical to sync ones (1 rank, tp 2); the summary's shares and the time record"

# ---- 2. training goes on while the write is in flight; the end waits ----
TPTRAIN_FAULT_WRITE_DELAY_S=$WRITER_HOLD_S "$train" "${flags[@]}" --save h --metrics h.jsonl > hold.log 2>&1 &
pid=$!
for _ in $(seq 2000); do grep -q '^{"step": 9, "loss"' h.jsonl 2> /dev/null && break; sleep 0.005; done
if [[ -d h/step_00000005.tmp && ! -e h/step_00000005 ]] && grep -q '^{"step": 9, "loss"' h.jsonl; then
  inflight=1
else
  inflight=0
fi
wait "$pid" || { tail hold.log; fail "the held run: exit $?"; }
((inflight)) || fail "step 9 was not trained while step 5's write was in flight"
latest_is h step_00000020 && same_steps a1 h || fail "the held run's checkpoints"
ok "training went on while a write was in flight; the end waited for it"

# ---- straight reference and fault points ----
# point_of NAME WHAT NTH ENV...: the save point at which a run (one rank, or
# "two" ranks) passes WHAT for the NTH time (the kill message names it).
point_of() {
  local who=$1 what=$2 nth=$3 seen=0; shift 3
  for ((k = 1; k <= 80; k++)); do
    rm -rf probe
    if [[ $who == one ]]; then
      env "$@" TPTRAIN_FAULT_POINT=$k "$train" "${flags[@]}" --save probe > probe.log 2>&1 || true
    else
      env "$@" TPTRAIN_FAULT_POINT=$k "$tprun" --standalone --nproc_per_node 2 "$train" "${flags[@]}" --tp 2 \
        --comm-timeout 60 --save probe > probe.log 2>&1 || true
    fi
    grep -q "at save point $k ($what)" probe.log && seen=$((seen + 1))
    ((seen == nth)) && { echo "$k"; return 0; }
  done
  return 1
}

# ---- 3. SIGKILL in the writer thread during the second save ----
k=$(point_of one "after a model shard" 2) || fail "no second 'after a model shard' point"
rm -rf kill && TPTRAIN_FAULT_POINT=$k "$train" "${flags[@]}" --save kill > kill.log 2>&1 && fail "the fault did not kill"
grep -q "killing rank 0 at save point $k (after a model shard)" kill.log || { tail kill.log; fail "no kill"; }
latest_is kill step_00000005 && [[ ! -e kill/step_00000010 ]] ||
  { ls kill; fail "after a kill during step 10's write: latest $(cat kill/latest)"; }
run kill-resume.log "$train" "${flags[@]}" --save kill --resume auto
same_steps kill a1 || fail "the resume after the kill differs from the straight run"
ok "SIGKILL during a write in flight: latest stays step 5, the resume is the straight run (point $k)"

# ---- 4. a failed write, in both modes, on rank 0 and on rank 1 ----
k=$(point_of one "before an optimizer shard" 2) || fail "no second optimizer shard point"
for mode in async sync; do
  rm -rf f1 && rc=0
  TPTRAIN_FAULT_FAIL=$k "$train" "${flags[@]}" --save f1 --save-mode $mode > fail1.log 2>&1 || rc=$?
  ((rc == 1)) || { tail fail1.log; fail "$mode: a failed write: exit $rc, want 1"; }
  grep -q "f1/step_00000010.tmp/optim-tp0-pp0-dp0.safetensors: cannot write (No space left on device" fail1.log ||
    { tail fail1.log; fail "$mode: the failure does not name the file"; }
  latest_is f1 step_00000005 && [[ ! -e f1/step_00000010 ]] || fail "$mode: step 10 published after a failed write"
  run fail1-resume.log "$train" "${flags[@]}" --save f1 --resume auto --save-mode $mode
  same_steps f1 a1 || fail "$mode: the resume after a failed write differs from the straight run"
done
k=$(point_of two "before an optimizer shard" 2 TPTRAIN_FAULT_RANK=1) || fail "no second optimizer point of rank 1"
rm -rf f2 && rc=0
TPTRAIN_FAULT_RANK=1 TPTRAIN_FAULT_FAIL=$k job2 --save f2 > fail2.log 2>&1 || rc=$?
((rc != 0)) || fail "rank 1's failed write: exit 0"
grep -q "rank 1: f2/step_00000010.tmp/optim-tp1-pp0-dp0.safetensors: cannot write" fail2.log ||
  { tail fail2.log; fail "rank 0 does not name rank 1's file"; }
latest_is f2 step_00000005 && [[ ! -e f2/step_00000010 ]] || fail "tp 2: step 10 published after rank 1 failed"
run fail2-resume.log job2 --save f2 --resume auto
same_steps f2 a2 || fail "tp 2: the resume after a failed write differs from the straight run"
ok "a failed write is reported naming the file (rank 0, rank 1 of 2; async and sync), nothing published"

# ---- 5. a signal while a write is in flight ----
rm -rf p
TPTRAIN_FAULT_WRITE_DELAY_S=$WRITER_HOLD_S "$train" "${flags[@]}" --save p --metrics p.jsonl > pre.log 2>&1 &
pid=$!  # train_mt itself (a simple command in the background, no subshell)
for _ in $(seq 2000); do grep -q '^{"step": 6, "loss"' p.jsonl 2> /dev/null && break; sleep 0.005; done
[[ -d p/step_00000005.tmp && ! -e p/step_00000005 ]] || { kill -9 "$pid"; fail "no write in flight to signal"; }
kill -TERM "$pid"
rc=0 && wait "$pid" || rc=$?
((rc == 75)) || { tail pre.log; fail "preempted with a write in flight: exit $rc, want 75"; }
saved=$(sed -n 's/.*train_mt: saved on SIGTERM: \([^;]*\);.*/\1/p' pre.log)
[[ -n $saved && -f $saved/manifest.json && -f p/step_00000005/manifest.json ]] ||
  { tail pre.log; fail "the stop did not wait for the writes"; }
latest_is p "$(basename "$saved")" || fail "latest is not the checkpoint of the stop"
for d in p/step_00000005 "$saved"; do run verify.log "$ckpt" inspect "$d"; done
run pre-resume.log "$train" "${flags[@]}" --save p --resume auto
same_last p a1 || fail "the resume after the preemption differs from the straight run"
ok "a signal with a write in flight: both checkpoints published and verified, exit 75, the resume is exact"
