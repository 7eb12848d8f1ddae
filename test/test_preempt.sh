#!/usr/bin/env bash
# Preemption: a signal saves and stops, and the resume is the straight run.
# A tp 2 x dp 2 x pp 2 job of the tiny model (30 steps, dropout on) runs
# through tprun; at a random step boundary plus a random delay, SIGTERM,
# SIGINT or SIGUSR1 goes to tprun or to a random rank. Each trial must exit
# 75 ("saved on signal", through tprun) naming the checkpoint it saved, that
# checkpoint must pass ckpt inspect, and `--resume auto` must finish with
# the straight run's losses (every printed digit) and exported weights (byte
# for byte). Some trials send a second signal to a rank while it saves (the
# save completes), trial 5 sends tprun a second signal (tprun's SIGKILL: at
# most the new checkpoint is lost, nothing is damaged, the resume is exact). Without --save the
# job says that nothing is saved and exits 128+signal. A job under timeout(1)
# (its doubled delivery is one request) saves and resumes exactly; so does
# scripts/slurm_job.sh when its batch shell alone gets SIGUSR1 (SLURM's B:).
# Then, PREEMPT_SCENARIOS times each (default 1): SIGUSR1 and SIGTERM at once (one request), a signal
# during a periodic save, a run evaluating with --keep-best and
# --average-last, SIGKILL while the signal's checkpoint is written; after
# each the newest complete checkpoint loads, the resume is exact, no rank
# and no shared-memory segment of the job is left.
# PREEMPT_SCENARIOS repeats the named scenarios (default 1).
# PREEMPT_TRIALS sets the number of trials (default 3, about 5 s each on two
# cores; 20 for the full check). PREEMPT_SEED fixes the random choices.
# Usage: test_preempt.sh BUILD_DIR
set -euo pipefail
build=$1
trials=${PREEMPT_TRIALS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
train=$build/train_mt tprun=$build/tprun ckpt=$build/ckpt
fail() { echo "FAIL: $*" >&2; exit 1; }
flags=(--preset tiny --task copy --lr 5e-3 --warmup 5 --activation gelu --dropout 0.1 --log-interval 1
       --eval-interval 0 --comm-timeout 60 --tp 2 --dp 2 --pp 2 --micro-batches 2 --max-steps 30)
job() { "$tprun" --standalone --nproc_per_node 8 "$train" "${flags[@]}" "$@"; }
# losses FILE.jsonl FIRST: "step loss lr grad_norm" lines from step FIRST on, as printed
losses() {
  /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line, parse_float=str)
    if "loss" in r and r["step"] >= int(sys.argv[2]):
        print(r["step"], r["loss"], r["lr"], r["grad_norm"])' "$1" "$2"
}
# wait_step METRICS N: until the metrics file (written through at every step) has step N
wait_step() {
  local t=0
  until grep -q "^{\"step\": $2, \"loss\"" "$1" 2> /dev/null; do
    sleep 0.01; t=$((t + 1))
    ((t < 3000)) || return 1
  done
}

job --metrics straight.jsonl --export straight > straight.log 2>&1 || { tail straight.log; fail "the straight run"; }
sigs=(TERM INT USR1)
seed=${PREEMPT_SEED:-$$}
RANDOM=$seed
echo "PREEMPT_SEED=$seed"
for ((i = 1; i <= trials; i++)); do
  d=t$i && mkdir "$d"
  sig=${sigs[RANDOM % 3]} at=$((1 + RANDOM % 12)) delay=0.0$((RANDOM % 10))
  target=tprun second=none
  ((RANDOM % 2)) && target=rank
  ((i % 3 == 0)) && second=rank
  ((i == 5)) && target=tprun second=tprun
  "$tprun" --standalone --nproc_per_node 8 "$train" "${flags[@]}" --save "$d/ck" --metrics "$d/a.jsonl" \
      > "$d/a.log" 2>&1 &   # tprun itself is $! (not a subshell)
  jp=$!
  wait_step "$d/a.jsonl" "$at" || true
  sleep "$delay"
  victim=$jp
  [[ $target == rank ]] && victim=$(pgrep -P "$jp" | shuf -n 1)
  kill -s "$sig" "$victim" 2> /dev/null || true
  if [[ $second != none ]]; then  # while it saves: the step's .tmp folder exists only then
    for _ in $(seq 1000); do compgen -G "$d/ck/step_*.tmp" > /dev/null && { second+=" during the save"; break; }; sleep 0.005; done
    victim2=$jp
    [[ $second == rank* ]] && victim2=$(pgrep -P "$jp" | shuf -n 1 || echo "$jp")
    kill -s "$sig" "$victim2" 2> /dev/null || true
  fi
  rc=0
  wait "$jp" || rc=$?
  if [[ $second == tprun* ]]; then
    ((rc == 75 || rc > 128)) || { tail "$d/a.log"; fail "trial $i: a second signal to tprun: exit $rc"; }
  else
    ((rc == 75)) || { tail -20 "$d/a.log"; fail "trial $i ($sig to $target at step $at + ${delay}s): exit $rc, not 75"; }
    saved=$(sed -n 's/.*train_mt: saved on SIG[A-Z0-9]*: \([^;]*\);.*/\1/p' "$d/a.log")
    [[ -n $saved && -f $saved/manifest.json ]] || { tail "$d/a.log"; fail "trial $i: no 'saved on' line naming a checkpoint"; }
    grep -q "tprun: received SIG$sig; the workers saved a checkpoint" "$d/a.log" || [[ $target == rank ]] ||
      { tail "$d/a.log"; fail "trial $i: tprun did not say that the workers saved"; }
  fi
  for c in "$d"/ck/step_*; do  # every complete checkpoint left is intact
    [[ -f $c/manifest.json ]] || continue
    "$ckpt" inspect "$c" > "$d/inspect.log" 2>&1 || { cat "$d/inspect.log"; fail "trial $i: $c is damaged"; }
  done
  job --save "$d/ck" --resume auto --metrics "$d/b.jsonl" --export "$d/out" > "$d/b.log" 2>&1 ||
    { tail "$d/b.log"; fail "trial $i: the resume failed"; }
  from=$(sed -n 's/.*resumed from [^:]*: step \([0-9]*\),.*/\1/p' "$d/b.log")
  from=${from:-0}
  cmp -s "$d/out/model.safetensors" straight/model.safetensors ||
    fail "trial $i: the resumed run's weights differ from the straight run's"
  [[ "$(losses "$d/b.jsonl" 1)" == "$(losses straight.jsonl $((from + 1)))" ]] ||
    fail "trial $i: the resumed run's losses differ from the straight run's"
  echo "trial $i: SIG$sig to $target at step $at + ${delay} s (second signal: $second): exit $rc, resumed from" \
       "step $from, steps $((from + 1))..30 and the weights equal the straight run's"
done

# resumed DIR WHAT: DIR/ck's newest complete checkpoint, if any, loads (ckpt inspect), the resume ends with
# the straight run's weights, and nothing of the job is left: no train_mt of DIR, no new /dev/shm segment
# whose maker is gone (src/tp/shm_reclaim.h's owner record; tests running beside this one make segments of
# their own, whose makers live). A segment caught between its creation and its record is looked at again.
ls /dev/shm | grep '^tpt-' > "$work/shm_before.txt" || true
shm_left() {
  local k n
  for k in 1 2 3; do
    n=$(/usr/bin/python3 - "$work/shm_before.txt" <<'PY'
import os, struct, sys
before = set(open(sys.argv[1]).read().split())
def alive(pid, ticks):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name: state is field 3
    return fields[0] != "Z" and (ticks == 0 or int(fields[19]) == ticks)
left = 0
for name in os.listdir("/dev/shm"):
    if not name.startswith("tpt-") or name in before:
        continue
    try:
        head = open(os.path.join("/dev/shm", name), "rb").read(24)
    except OSError:
        continue  # removed meanwhile
    if len(head) == 24:
        magic, pid, _, ticks = struct.unpack("<QiIQ", head)
        if magic == 0x316e776f2d747074 and alive(pid, ticks):
            continue
    left += 1
print(left)
PY
)
    [ "$n" = 0 ] && break
    sleep 1
  done
  echo "$n"
}
resumed() {
  local d=$1 what=$2
  # (a SIGKILL before the first save completed leaves none: the resume starts from step 0)
  if compgen -G "$d/ck/step_*[0-9]/manifest.json" > /dev/null; then
    "$ckpt" inspect "$d/ck" > "$d/inspect.log" 2>&1 || { cat "$d/inspect.log"; fail "$what: the newest checkpoint is damaged"; }
  fi
  ! pgrep -f -- "--save $d/ck" > /dev/null || fail "$what: a rank of the job is still running"
  job --save "$d/ck" --resume auto --metrics "$d/b.jsonl" --export "$d/out" > "$d/b.log" 2>&1 ||
    { tail "$d/b.log"; fail "$what: the resume failed"; }
  cmp -s "$d/out/model.safetensors" straight/model.safetensors || fail "$what: the resumed weights differ"
  local left
  left=$(shm_left)
  [ "$left" = 0 ] || fail "$what: $left shared-memory segment(s) of the job left in /dev/shm"
}
# launch DIR FLAGS...: the job in the background, its log and metrics in DIR; tprun's pid in $jp.
launch() {
  local d=$1
  shift
  mkdir -p "$d"
  "$tprun" --standalone --nproc_per_node 8 "$train" "${flags[@]}" "$@" --save "$d/ck" --metrics "$d/a.jsonl" \
    > "$d/a.log" 2>&1 &
  jp=$!  # tprun itself (not a subshell)
}
# stopped PID DIR WHAT SIG...: the signals to PID at once; the job saves on one of them and exits 75.
stopped() {
  local pid=$1 d=$2 what=$3 rc=0 sig
  shift 3
  for sig in "$@"; do kill -s "$sig" "$pid"; done
  wait "$pid" || rc=$?
  ((rc == 75)) || { tail -20 "$d/a.log"; fail "$what: exit $rc, not 75"; }
  local any
  any=$(IFS='|'; echo "$*")  # signals sent at once may arrive in either order
  grep -Eq "saved on SIG($any)" "$d/a.log" || { tail "$d/a.log"; fail "$what: no checkpoint saved"; }
}
# The scenarios below, PREEMPT_SCENARIOS times each (default 1; 20 for the full check), each time after
# a random step.
for ((r = 1; r <= ${PREEMPT_SCENARIOS:-1}; r++)); do
  at=$((2 + RANDOM % 10))
  echo "scenarios, round $r: signals after step $at"
  # SIGUSR1 then SIGTERM at once (two schedulers, or a user after the scheduler): one request
  launch usr1term$r
  wait_step usr1term$r/a.jsonl "$at" || true
  stopped "$jp" usr1term$r "SIGUSR1 then SIGTERM" USR1 TERM  # two signal numbers: never merged, two deliveries
  resumed usr1term$r "SIGUSR1 then SIGTERM"
  echo "SIGUSR1, then SIGTERM at once: one request, saved, exit 75, the resume equals the straight run"
  # a signal while a periodic save is being written: that save completes, then the signal's
  launch midsave$r --save-interval 3
  wait_step midsave$r/a.jsonl "$at" || true
  hit=no
  for _ in $(seq 3000); do compgen -G "midsave$r/ck/step_*.tmp" > /dev/null && { hit=yes; break; }; sleep 0.002; done
  stopped "$jp" midsave$r "a signal during a periodic save" TERM
  resumed midsave$r "a signal during a periodic save"
  echo "SIGTERM during a periodic save (caught inside it: $hit): saved, exit 75, the resume equals the straight run"
  # with evaluation every 2 steps, --keep-best and --average-last (which do not change the training): a
  # signal saves and stops; the resumed run keeps the best and averages, and trains as the straight run did
  d=keepbest$r
  extra=(--eval-interval 2 --keep-best loss --average-last 2)
  launch "$d" "${extra[@]}"
  wait_step "$d/a.jsonl" "$at" || true
  stopped "$jp" "$d" "--keep-best and --average-last" TERM
  job "${extra[@]}" --save "$d/ck" --resume auto --metrics "$d/b.jsonl" --export "$d/out" > "$d/b.log" 2>&1 ||
    { tail "$d/b.log"; fail "--keep-best and --average-last: the resume failed"; }
  cmp -s "$d/out/model.safetensors" straight/model.safetensors || fail "--keep-best and --average-last: weights differ"
  [[ -L $d/ck/best && -f $d/ck/averaged/manifest.json ]] || fail "--keep-best and --average-last: no best or averaged"
  "$ckpt" inspect "$d/ck/averaged" > /dev/null 2>&1 || fail "--keep-best and --average-last: the average is damaged"
  echo "evaluation, --keep-best and --average-last: saved on the signal, resumed to the straight run's weights," \
       "best and averaged checkpoints intact"
  # SIGKILL to the job while it writes the signal's checkpoint: the periodic one before it is the newest
  # complete checkpoint, and the resume from it is exact
  launch killsave$r --save-interval 4
  wait_step killsave$r/a.jsonl "$at" || true
  kill -TERM "$jp"
  hit=no
  for _ in $(seq 2000); do compgen -G "killsave$r/ck/step_*.tmp" > /dev/null && { hit=yes; break; }; sleep 0.001; done
  kill -KILL "$jp" 2> /dev/null || true  # the ranks follow (PR_SET_PDEATHSIG)
  wait "$jp" || true
  sleep 0.3
  resumed killsave$r "SIGKILL during the signal's save"
  echo "SIGKILL during the signal's save (caught inside it: $hit): the newest complete checkpoint (if any) loads, the resume" \
       "equals the straight run"

  # Under timeout(1), as users fit a job to an allocation: timeout delivers its signal twice, to tprun and
  # then to its own process group (tprun again), microseconds apart. That is one request: the workers
  # save, the job exits 75 (timeout passes it on), and the resume is the straight run.
  d=timeout$r && mkdir "$d"
  timeout -s TERM 600 "$tprun" --standalone --nproc_per_node 8 "$train" "${flags[@]}" --save "$d/ck" \
    --metrics "$d/a.jsonl" > "$d/a.log" 2>&1 &
  tp=$!  # timeout's pid: it forwards a signal it gets exactly as it sends its own at the limit
  wait_step "$d/a.jsonl" "$at" || true
  stopped "$tp" "$d" "under timeout" TERM
  resumed "$d" "under timeout"
  echo "under timeout -s TERM: one request, saved, exit 75, the resume equals the straight run"

  # The SLURM recipe (scripts/slurm_job.sh) as SLURM runs it: --signal=B:USR1 signals the batch shell
  # alone. The shell passes it to tprun, the ranks save, the script exits 75, the resume is exact.
  d=slurm$r && mkdir "$d"
  TPRUN=$tprun TPRUN_NPROC=8 TPRUN_GRACE=30 TPRUN_ARGS=--standalone \
    bash "$(dirname "$0")/../scripts/slurm_job.sh" "$train" "${flags[@]}" --save "$d/ck" --resume auto \
    --metrics "$d/a.jsonl" > "$d/a.log" 2>&1 &
  sh=$!
  wait_step "$d/a.jsonl" "$at" || true
  stopped "$sh" "$d" "the SLURM script signalled as B: does" USR1
  resumed "$d" "the SLURM script"
  echo "scripts/slurm_job.sh, SIGUSR1 to the batch shell: saved, exit 75, the resume equals the straight run"
done

# Without --save: said so, nothing saved, 128 + signal.
"$tprun" --standalone --nproc_per_node 8 "$train" "${flags[@]}" --metrics nosave.jsonl > nosave.log 2>&1 &
jp=$!
wait_step nosave.jsonl 2 || true
kill -TERM "$jp"
rc=0
wait "$jp" || rc=$?
grep -q "no --save DIR was given, so nothing is saved" nosave.log || { tail nosave.log; fail "no --save: no word of it"; }
((rc == 143)) || fail "no --save: exit $rc, not 143"
echo "no --save: 'nothing is saved', exit 143"
echo "test_preempt: ok ($trials trials)"
