#!/usr/bin/env bash
# The launcher end to end, with tprun_worker as the launched program:
# environment, prefixed output, log files, failure by exit code and by
# signal, a rank that exits 0 early, one fatal error line with one rank
# prefix, SIGTERM to tprun, a worker that ignores SIGTERM, a signal delivered twice
# (one request) and a second request 2 s later (SIGKILL at once), standalone jobs
# side by side, two nodes on this machine, restarts, program lookup, and the
# shared memory of a tprun killed with SIGKILL while its ranks form groups
# (removed by the next tprun; a live job's untouched).
# Every failure path must leave no process behind: workers carry a marker
# argument unique to this run and pgrep looks for it after tprun returns.
# Usage: test_tprun.sh BUILD_DIR [TPRUN_WORKER]
set -uo pipefail
build=$1
worker=${2:-$build/test/tprun_worker}
tprun=$build/tprun
work=$(mktemp -d)
marker="tprun-test-mark-$$-$RANDOM"
kill_marked() {  # SIGKILL every process this test started that is still alive (pid files + marker check)
    local f p
    for f in "$work"/*/pid_* "$work"/*/cpid_*; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        grep -qa -- "$marker" "/proc/$p/cmdline" 2>/dev/null && kill -KILL "$p" 2>/dev/null
    done
}
cleanup() {
    kill_marked
    rm -rf "$work"
}
trap cleanup EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
# tprun20 ARGS...: tprun ARGS under a 20 s timeout, output in $d/out and $d/err; $rc, and $dt seconds.
tprun20() {
    t0=$(now)
    timeout 20 "$tprun" "$@" > "$d/out" 2> "$d/err"
    rc=$?
    dt=$(elapsed "$t0")
}
# failed_first WHAT PATTERN: the job failed (not by the timeout) within 5 s, its stderr names the rank
# that failed first as PATTERN says, and no process is left behind.
failed_first() {
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && lt "$dt" 5 && grep -q "$2" "$d/err"; then
        ok "$1 reported in ${dt} s (tprun exit $rc): $(grep 'failed first' "$d/err")"
    else
        bad "$1: rc $rc after $dt s, stderr: $(cat "$d/err")"
    fi
    no_leftovers "$1"
}
no_leftovers() {  # $1: what; waits a moment for the kernel to finish exits
    for _ in 1 2 3 4 5; do
        pgrep -f -- "$marker" > /dev/null || { ok "$1: no process left behind"; return; }
        sleep 0.1
    done
    bad "$1: processes left behind: $(pgrep -af -- "$marker" | head -5)"
    kill_marked
}
wait_files() {  # $1 glob prefix, $2 count, $3 timeout s
    local t=0
    while [ "$(ls $1* 2>/dev/null | wc -l)" -lt "$2" ]; do
        sleep 0.05
        t=$((t + 1))
        [ $t -gt $(($3 * 20)) ] && return 1
    done
    return 0
}
field() { grep "^$2=" "$1" | cut -d= -f2-; }

# ---- environment for every rank, prefixed output, partial last lines ----
d=$work/env && mkdir "$d"
"$tprun" --nproc_per_node 3 "$worker" env "$d" > "$d/out" 2> "$d/err"
rc=$?
[ $rc -eq 0 ] && ok "env job exits 0" || bad "env job exit code $rc: $(cat "$d/err")"
token=$(field "$d/env_0" TPRUN_TOKEN)
job=$(field "$d/env_0" TPRUN_JOB_ID)
port=$(field "$d/env_0" MASTER_PORT)
[[ $token =~ ^[0-9a-f]{32}$ ]] && ok "token is 32 hex chars" || bad "token '$token'"
[[ $job =~ ^[0-9a-f]{16}$ ]] && ok "job id is 16 hex chars" || bad "job id '$job'"
[[ $port =~ ^[0-9]+$ ]] && [ "$port" -gt 0 ] && ok "master port $port" || bad "master port '$port'"
for r in 0 1 2; do
    f=$d/env_$r
    want="RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 GROUP_RANK=0 ROLE_RANK=$r NODE_RANK=0"
    want="$want MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TPRUN_TOKEN=$token TPRUN_JOB_ID=$job"
    want="$want TORCHELASTIC_RESTART_COUNT=0"
    for kv in $want; do
        grep -qx "$kv" "$f" || bad "rank $r: want $kv, file has: $(grep "^${kv%%=*}=" "$f")"
    done
    grep -qx "\[rank $r\] out line from $r" "$d/out" || bad "stdout lacks prefixed line of rank $r"
    grep -qx "\[rank $r\] tail-$r" "$d/out" || bad "stdout lacks the partial last line of rank $r"
    grep -qx "\[rank $r\] err line from $r" "$d/err" || bad "stderr lacks prefixed line of rank $r"
    grep -q "err line" "$d/out" && bad "stderr lines went to stdout"
done
ok "environment and prefixed output checked for ranks 0..2"

# ---- dash spellings and --flag=value; the store through the workers ----
d=$work/store && mkdir "$d"
"$tprun" --nproc-per-node=4 --grace=2 -- "$worker" store > "$d/out" 2> "$d/err"
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'store ok (world 4)' "$d/out")" -eq 4 ] &&
    ok "4 ranks rendezvous through the store; a wrong token is refused (--nproc-per-node=4)" ||
    bad "store job rc $rc: $(cat "$d/out" "$d/err")"

# ---- --log_dir, with and without --tee ----
d=$work/logs && mkdir "$d"
"$tprun" --nproc_per_node=2 --log_dir "$d/logs" "$worker" env "$d" > "$d/out" 2> "$d/err"
rc=$?
if [ $rc -eq 0 ] && grep -qx "out line from 1" "$d/logs/rank_1.log" && grep -qx "err line from 1" "$d/logs/rank_1.log" &&
    grep -qx "tail-0" "$d/logs/rank_0.log" && ! grep -q "line from" "$d/out" "$d/err"; then
    ok "--log_dir writes rank_N.log (stdout and stderr), nothing on the terminal"
else
    bad "--log_dir: rc $rc, logs: $(cat "$d"/logs/* 2>&1), terminal: $(cat "$d/out" "$d/err")"
fi
"$tprun" --nproc_per_node=2 --log-dir="$d/logs2" --tee 1 "$worker" env "$d" > "$d/out" 2> "$d/err"
if grep -qx "\[rank 1\] out line from 1" "$d/out" && ! grep -q "err line" "$d/err" &&
    grep -qx "err line from 1" "$d/logs2/rank_1.log"; then
    ok "--tee 1: stdout to log and terminal, stderr to log only"
else
    bad "--tee 1: terminal: $(cat "$d/out" "$d/err")"
fi

# ---- a worker exits 3 (its group includes a child process) ----
d=$work/exit3 && mkdir "$d"
tprun20 --nproc_per_node 3 "$worker" run "$d" "$marker" --fail-rank 1 --code 3 --child
failed_first "exit 3" "tprun: rank 1 (local rank 1, pid [0-9]*) on host .* failed first: exit code 3"

# ---- a worker killed by SIGKILL ----
d=$work/kill9 && mkdir "$d"
tprun20 --nproc_per_node 2 "$worker" run "$d" "$marker" --kill-rank 0
failed_first "SIGKILL" "rank 0 (local rank 0, pid [0-9]*) on host .* failed first: killed by signal SIGKILL (9)"

# ---- a rank exits 0 early, another fails after it: the early one is named ----
d=$work/exit0 && mkdir "$d"
timeout 20 "$tprun" --nproc_per_node 3 "$worker" run "$d" "$marker" --exit0-rank 1 --fail-rank 0 --code 3 \
    --fail-after 1 > "$d/out" 2> "$d/err"
rc=$?
last=$(tail -n 1 "$d/err")
if [ $rc -eq 3 ] && [[ $last =~ ^"tprun: rank 1 (local rank 1, pid "[0-9]+") on host ".*" exited 0 early, while other ranks were still running, and the job failed after it: rank 0 (local rank 0, pid "[0-9]+") exit code 3"$ ]]
then
    ok "a rank exiting 0 early is named in the final line: $last"
else
    bad "early exit 0: rc $rc, final line: $last"
fi
no_leftovers "early exit 0"

# ---- the same refusal on every rank: shown once, the rank whose error came first named, its exit status kept ----
d=$work/refuse && mkdir "$d"
timeout 20 "$tprun" --nproc_per_node 3 "$worker" refuse > "$d/out" 2> "$d/err"
rc=$?
n_shown=$(grep -c "worker: refused, the same reason on every rank" "$d/err")
if [ $rc -eq 2 ] && [ "$n_shown" -eq 1 ] && grep -qx "\[rank 0\] worker: refused, the same reason on every rank" "$d/err" &&
    grep -q "^tprun: rank 0 (local rank 0, pid [0-9]*) on host .* failed first: exit code 2$" "$d/err"; then
    ok "one refusal of 3 ranks: shown once, rank 0 named, exit 2 passed through"
else
    bad "same refusal on 3 ranks: rc $rc, shown $n_shown times: $(cat "$d/err")"
fi

# ---- a fatal error under tprun: the rank once, from tprun ----
d=$work/die && mkdir "$d"
timeout 20 "$tprun" --nproc_per_node 2 "$worker" die > "$d/out" 2> "$d/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "^\[rank 1\] error: rank 1 stops on purpose (" "$d/err" && ! grep -q "\[rank 1\] \[rank" "$d/err"
then
    ok "a fatal error line carries one rank prefix: $(grep 'stops on purpose' "$d/err")"
else
    bad "fatal error prefix: rc $rc: $(cat "$d/err")"
fi

# ---- SIGTERM to tprun ----
d=$work/term && mkdir "$d"
"$tprun" --nproc_per_node 3 "$worker" run "$d" "$marker" --child > "$d/out" 2> "$d/err" &
tp=$!
if wait_files "$d/pid_" 3 10; then
    t0=$(now)
    kill -TERM $tp
    wait $tp
    rc=$?
    dt=$(elapsed "$t0")
    [ $rc -eq 143 ] && lt "$dt" 3 && ok "SIGTERM to tprun: exit 143 after ${dt} s" ||
        bad "SIGTERM to tprun: rc $rc after $dt s, stderr: $(cat "$d/err")"
else
    bad "SIGTERM: workers did not start"
    kill -KILL $tp
    wait $tp
fi
no_leftovers "SIGTERM to tprun"

# ---- a worker ignores SIGTERM: SIGKILL after --grace ----
d=$work/grace && mkdir "$d"
tprun20 --nproc_per_node 2 --grace 1 "$worker" run "$d" "$marker" --fail-rank 0 --ignore-term --child
if [ $rc -eq 1 ] && lt 1.2 "$dt" && lt "$dt" 4 && grep -q "sending SIGKILL" "$d/err"; then
    ok "a worker ignoring SIGTERM is killed after --grace 1 (tprun took ${dt} s)"
else
    bad "grace: rc $rc after $dt s, stderr: $(cat "$d/err")"
fi
no_leftovers "ignored SIGTERM"

# ---- a repeated signal: timeout(1)'s double delivery (to tprun, then to its process group) is one
#      request, the workers keep their --grace; one 2 s or more after the first is a second request:
#      SIGKILL at once, not after --grace ----
d=$work/timeout && mkdir "$d"
t0=$(now)
timeout -s TERM 1 "$tprun" --nproc_per_node 2 --grace 3 "$worker" run "$d" "$marker" --ignore-term --child \
    > "$d/out" 2> "$d/err"
rc=$?
dt=$(elapsed "$t0")
if [ $rc -eq 124 ] && lt 3.8 "$dt" && ! grep -q "SIGKILL to every worker now" "$d/err" &&
   grep -q "still running 3.0 s after SIGTERM: sending SIGKILL" "$d/err"; then
    ok "timeout -s TERM's double delivery is one request: the workers had their 3 s of --grace (${dt} s in all)"
else
    bad "timeout's delivery: rc $rc after $dt s, stderr: $(cat "$d/err")"
fi
no_leftovers "timeout's delivery"
# twice GAP seconds apart to a job of workers ignoring SIGTERM (--grace GRACE): "rc seconds" on stdout,
# stderr in DIR/err ("start" when the workers did not start)
signal_twice() {
    local d=$1 grace=$2 gap=$3 tp t0 rc
    mkdir "$d"
    "$tprun" --nproc_per_node 2 --grace "$grace" "$worker" run "$d" "$marker" --ignore-term --child \
        > "$d/out" 2> "$d/err" &
    tp=$!
    if ! wait_files "$d/pid_" 2 10; then
        kill -KILL $tp; wait $tp; echo start; return
    fi
    t0=$(now)
    kill -TERM $tp; sleep "$gap"; kill -TERM $tp
    wait $tp
    rc=$?
    echo "$rc $(elapsed "$t0")"
}
# the same twice, 0.1 s apart: two deliveries for certain (the kernel merges a duplicate still pending,
# so timeout's own pair above is one delivery or two, by chance)
read -r rc dt <<< "$(signal_twice "$work/twice" 3 0.1)"
if [ "$rc" = 143 ] && lt 2.8 "$dt" && ! grep -q "SIGKILL to every worker now" "$work/twice/err" &&
   grep -q "SIGTERM 0.[0-9]* s after SIGTERM: taken as the same request" "$work/twice/err"; then
    ok "SIGTERM twice 0.1 s apart: one request, said so; the workers had their --grace (${dt} s)"
else
    bad "doubled SIGTERM: rc $rc after ${dt:-?} s, stderr: $(cat "$work/twice/err")"
fi
no_leftovers "a doubled signal"
read -r rc dt <<< "$(signal_twice "$work/again" 30 2.2)"
if [ "$rc" = 143 ] && lt "$dt" 8 &&
   grep -q "SIGTERM again, 2.[0-9] s after SIGTERM: SIGKILL to every worker now" "$work/again/err"; then
    ok "a second SIGTERM 2.2 s after the first: SIGKILL at once (${dt} s of a 30 s --grace), said so"
else
    bad "second request: rc $rc after ${dt:-?} s, stderr: $(cat "$work/again/err")"
fi
no_leftovers "a repeated signal"

# ---- two standalone jobs side by side ----
d=$work/standalone && mkdir -p "$d/a" "$d/b"
"$tprun" --standalone --nproc_per_node 2 --master_port 1 "$worker" store > "$d/a.out" 2>&1 &
ja=$!
"$tprun" --standalone --nproc_per_node 2 "$worker" store > "$d/b.out" 2>&1 &
jb=$!
wait $ja
ra=$?
wait $jb
rb=$?
"$tprun" --standalone --nproc_per_node 1 "$worker" env "$d/a" > /dev/null 2>&1 &
ja=$!
"$tprun" --standalone --nproc_per_node 1 "$worker" env "$d/b" > /dev/null 2>&1 &
jb=$!
wait $ja $jb
pa=$(field "$d/a/env_0" MASTER_PORT)
pb=$(field "$d/b/env_0" MASTER_PORT)
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -n "$pa" ] && [ "$pa" != "$pb" ] && [ "$pa" != 1 ]; then
    ok "two standalone jobs at once both succeed (ports $pa and $pb)"
else
    bad "standalone: rc $ra/$rb ports '$pa'/'$pb': $(cat "$d/a.out" "$d/b.out")"
fi

# ---- two nodes on this machine ----
d=$work/nodes && mkdir "$d"
mport=$("$worker" free-port)
TPRUN_TOKEN= "$tprun" --nnodes 2 --node_rank 1 --master_port "$mport" "$worker" env "$d" > /dev/null 2> "$d/notoken"
rc=$?
[ $rc -ne 0 ] && grep -q "TPRUN_TOKEN" "$d/notoken" && ok "--nnodes 2 without TPRUN_TOKEN: clear error" ||
    bad "no token: rc $rc: $(cat "$d/notoken")"
export TPRUN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
common=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$mport")
"$tprun" "${common[@]}" --node_rank 1 "$worker" env "$d" > "$d/n1.out" 2>&1 &
n1=$!
"$tprun" "${common[@]}" --node_rank 0 "$worker" env "$d" > "$d/n0.out" 2>&1 &
n0=$!
wait $n0
r0=$?
wait $n1
r1=$?
good=1
for r in 0 1 2 3; do
    f=$d/env_$r
    grep -qx "RANK=$r" "$f" && grep -qx "WORLD_SIZE=4" "$f" && grep -qx "LOCAL_RANK=$((r % 2))" "$f" &&
        grep -qx "GROUP_RANK=$((r / 2))" "$f" && grep -qx "TPRUN_TOKEN=$TPRUN_TOKEN" "$f" &&
        grep -qx "MASTER_PORT=$mport" "$f" || good=0
done
[ "$(field "$d/env_0" TPRUN_JOB_ID)" = "$(field "$d/env_3" TPRUN_JOB_ID)" ] || good=0
[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && [ $good -eq 1 ] && ok "two nodes: WORLD_SIZE 4, ranks 0..3, one job id" ||
    bad "two nodes: rc $r0/$r1, $(cat "$d/n0.out" "$d/n1.out" "$d"/env_* 2>&1)"

mport=$("$worker" free-port)
common=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$mport")
"$tprun" "${common[@]}" --node_rank 0 "$worker" store > "$d/s0.out" 2>&1 &
n0=$!
"$tprun" "${common[@]}" --node_rank 1 "$worker" store > "$d/s1.out" 2>&1 &
n1=$!
wait $n0
r0=$?
wait $n1
r1=$?
[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && [ "$(cat "$d/s0.out" "$d/s1.out" | grep -c 'store ok (world 4)')" -eq 4 ] &&
    ok "two nodes: 4 ranks rendezvous through node 0's store" ||
    bad "two-node store: rc $r0/$r1: $(cat "$d/s0.out" "$d/s1.out")"

mport=$("$worker" free-port)
common=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$mport")
t0=$(now)
"$tprun" "${common[@]}" --node_rank 0 "$worker" run "$d" "$marker" --child > "$d/f0.out" 2> "$d/f0.err" &
n0=$!
"$tprun" "${common[@]}" --node_rank 1 "$worker" run "$d" "$marker" --fail-rank 3 --code 3 > "$d/f1.out" 2> "$d/f1.err" &
n1=$!
wait $n0
r0=$?
d0=$(elapsed "$t0")
wait $n1
r1=$?
if [ $r0 -eq 1 ] && [ $r1 -eq 3 ] && lt "$d0" 6 &&
    grep -q "node 0 stopped its workers: rank 3 (local rank 1, pid [0-9]*) on host .* failed first: exit code 3" \
        "$d/f0.err" && grep -q "tprun: rank 3 (local rank 1, pid [0-9]*) on host .* failed first: exit code 3" "$d/f1.err"
then
    ok "a failure on node 1 stops node 0 (node 0 exited after ${d0} s): $(grep 'stopped its workers' "$d/f0.err")"
else
    bad "two-node failure: rc $r0/$r1 after $d0 s: $(cat "$d/f0.err" "$d/f1.err")"
fi
no_leftovers "two-node failure"
unset TPRUN_TOKEN

# ---- restarts ----
d=$work/restart && mkdir "$d"
timeout 30 "$tprun" --nproc_per_node 2 --max_restarts 1 "$worker" run "$d" "$marker" --fail-once-rank 1 --seconds 1 \
    > "$d/out" 2> "$d/err"
rc=$?
if [ $rc -eq 0 ] && [ -f "$d/pid_0_1" ] && [ -f "$d/pid_1_1" ] && grep -q "restarting all workers (restart 1 of 1)" "$d/err"
then
    ok "--max_restarts 1: a worker failing once is restarted (TORCHELASTIC_RESTART_COUNT 1) and the job succeeds"
else
    bad "restart: rc $rc, files $(ls "$d"), stderr: $(cat "$d/err")"
fi
d=$work/norestart && mkdir "$d"
timeout 30 "$tprun" --nproc_per_node 2 "$worker" run "$d" "$marker" --fail-once-rank 1 --seconds 1 > /dev/null 2>&1
rc=$?
[ $rc -eq 1 ] && [ ! -f "$d/pid_0_1" ] && ok "without --max_restarts the same job fails" || bad "no restart: rc $rc"
no_leftovers "restarts"

# ---- shared memory of a job killed (SIGKILL to tprun) while its ranks form groups ----
d=$work/shm && mkdir -p "$d/dead" "$d/live"
"$tprun" --nproc_per_node 2 "$worker" shm-form "$d/dead" > /dev/null 2>&1 &
tdead=$!
"$tprun" --nproc_per_node 2 "$worker" shm-form "$d/live" > /dev/null 2>&1 &
tlive=$!
seg_ready() {  # $1: folder the worker names its segment in; waits until it exists with its owner record
    local t=0
    while :; do
        [ -f "$1/shm_name" ] && [ "$(stat -c %s "/dev/shm/$(cat "$1/shm_name")" 2>/dev/null || echo 0)" -gt 64 ] &&
            return 0
        sleep 0.05
        t=$((t + 1))
        [ $t -gt 200 ] && return 1
    done
}
if seg_ready "$d/dead" && seg_ready "$d/live"; then
    dead_seg=/dev/shm/$(cat "$d/dead/shm_name")
    live_seg=/dev/shm/$(cat "$d/live/shm_name")
    kill -KILL $tdead
    wait $tdead 2> /dev/null
    sleep 0.3  # the kernel delivers PR_SET_PDEATHSIG's SIGKILL to the ranks
    if [ -e "$dead_seg" ]; then
        ok "tprun killed while rank 0 formed its group: $(basename "$dead_seg") is left in /dev/shm ($(stat -c %s "$dead_seg") bytes)"
        "$tprun" --nproc_per_node 1 "$worker" env "$d" > /dev/null 2> "$d/err"
        rc=$?
        if [ $rc -eq 0 ] && [ ! -e "$dead_seg" ] && [ -e "$live_seg" ] &&
            grep -Eq "^tprun: removed [0-9]+ shared-memory segments? \([0-9.]+ MiB\) left in /dev/shm by jobs that died$" "$d/err"
        then
            ok "the next tprun removed the dead job's segment, not the live job's: $(grep removed "$d/err")"
        else
            bad "reclaim: rc $rc, dead segment $(ls "$dead_seg" 2>&1), live segment $(ls "$live_seg" 2>&1): $(cat "$d/err")"
        fi
    else
        bad "the killed job's segment vanished by itself: nothing to reclaim"
    fi
    # The live job ends by SIGTERM to tprun while rank 0 still forms its group:
    # tprun removes its own job's segment as it ends (not the next tprun), and
    # only its own (a decoy of another job id stays).
    decoy=/dev/shm/tpt-0000000000000000-$marker-dp.0
    printf 'decoy' > "$decoy"
    kill -TERM $tlive
    wait $tlive 2> /dev/null
    if [ ! -e "$live_seg" ] && [ -e "$decoy" ]; then
        ok "tprun ended by SIGTERM while rank 0 formed its group removed its own segment $(basename "$live_seg"), not another job's"
    else
        bad "after SIGTERM to tprun: its segment $(ls "$live_seg" 2>&1), the decoy $(ls "$decoy" 2>&1)"
    fi
    rm -f "$live_seg" "$dead_seg" "$decoy"
else
    bad "shm-form workers did not create their segments"
    kill -KILL $tdead $tlive 2> /dev/null
    wait $tdead $tlive 2> /dev/null
fi

# ---- --nproc_per_node gpu|auto: a stand-in nvidia-smi on PATH lists 3 GPUs ----
d=$work/gpus && mkdir -p "$d/bin"
printf '#!/bin/sh\n[ "$1" = -L ] || exit 1\nfor i in 0 1 2; do echo "GPU $i: Stand-in GPU (UUID: GPU-0000000$i)"; done\n' > "$d/bin/nvidia-smi"
chmod +x "$d/bin/nvidia-smi"
n_env() { ls "$1"/env_* 2> /dev/null | wc -l; }
mkdir "$d/a" "$d/b" "$d/c" "$d/e"
(unset CUDA_VISIBLE_DEVICES; PATH=$d/bin:$PATH "$tprun" --nproc_per_node=gpu "$worker" env "$d/a" > /dev/null 2> "$d/a.err")
[ "$(n_env "$d/a")" = 3 ] && grep -q "3 workers, one per visible GPU" "$d/a.err" && ok "--nproc_per_node=gpu: 3 GPUs, 3 workers" ||
    bad "--nproc_per_node=gpu: $(n_env "$d/a") workers: $(cat "$d/a.err")"
CUDA_VISIBLE_DEVICES=2,0 PATH=$d/bin:$PATH "$tprun" --nproc_per_node gpu "$worker" env "$d/b" > /dev/null 2> "$d/b.err"
[ "$(n_env "$d/b")" = 2 ] && ok "--nproc_per_node gpu honours CUDA_VISIBLE_DEVICES=2,0: 2 workers" ||
    bad "CUDA_VISIBLE_DEVICES=2,0: $(n_env "$d/b") workers: $(cat "$d/b.err")"
rc=0
CUDA_VISIBLE_DEVICES= PATH=$d/bin:$PATH "$tprun" --nproc_per_node=gpu "$worker" env "$d/c" > /dev/null 2> "$d/c.err" || rc=$?
[ $rc -eq 2 ] && [ "$(n_env "$d/c")" = 0 ] && grep -q "no GPU is visible" "$d/c.err" &&
    ok "--nproc_per_node=gpu with no visible GPU: clear error, exit 2" || bad "no GPU: rc $rc: $(cat "$d/c.err")"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed" >&2\nexit 9\n' > "$d/bin/nvidia-smi"
(unset CUDA_VISIBLE_DEVICES; PATH=$d/bin:$PATH "$tprun" --nproc_per_node=auto "$worker" env "$d/e" > /dev/null 2> "$d/e.err")
[ "$(n_env "$d/e")" = "$(nproc --all 2> /dev/null || nproc)" ] && grep -q "one per CPU core" "$d/e.err" &&
    ok "--nproc_per_node=auto without a GPU: one worker per core ($(n_env "$d/e"))" ||
    bad "auto: $(n_env "$d/e") workers for $(nproc) cores: $(cat "$d/e.err")"

# ---- SLURM: two "nodes" with srun's variables, against the same run through --nnodes 2 ----
d=$work/slurm && mkdir -p "$d/flags" "$d/slurm"
train=(--task copy --preset tiny --max-steps 3 --log-interval 1 --eval-interval 100 --tp 2 --seed 5)
# node ENV_WORDS DIR TPRUN_FLAGS...: one node's tprun of the training run (metrics from rank 0's node)
node() {
    local envw=$1 dir=$2
    shift 2
    # shellcheck disable=SC2086  # the variables split on purpose
    env TPRUN_TOKEN=slurm-test-token $envw "$tprun" --nproc_per_node 1 --master_port "$sport" "$@" "$build/train_mt" "${train[@]}" \
        --metrics "$dir/m$(date +%s%N).jsonl"
}
sport=$("$worker" free-port)
node "SLURM_JOB_ID=" "$d/flags" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 > "$d/flags/n1.out" 2>&1 &
p1=$!
node "SLURM_JOB_ID=" "$d/flags" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 > "$d/flags/n0.out" 2>&1
f0=$?
wait $p1
f1=$?
slurm_env() { echo "SLURM_JOB_ID=77 SLURM_NNODES=2 SLURM_NODEID=$1 SLURM_LOCALID=0 SLURM_JOB_NODELIST=127.0.0.[1-2]"; }
sport=$("$worker" free-port)
node "$(slurm_env 1)" "$d/slurm" > "$d/slurm/n1.out" 2>&1 &
p1=$!
node "$(slurm_env 0)" "$d/slurm" > "$d/slurm/n0.out" 2>&1
r0=$?
wait $p1
r1=$?
losses() { cat "$1"/m*.jsonl 2> /dev/null | grep -o '"loss": *[-0-9.e]*' | tr -d ' '; }
if [ $f0 -eq 0 ] && [ $f1 -eq 0 ] && [ $r0 -eq 0 ] && [ $r1 -eq 0 ] &&
   grep -q "SLURM job 77: node 0 of 2, master 127.0.0.1" "$d/slurm/n0.out" &&
   grep -q "SLURM job 77: node 1 of 2, master 127.0.0.1" "$d/slurm/n1.out" &&
   [ "$(losses "$d/slurm" | wc -l)" -ge 3 ] && [ "$(losses "$d/slurm")" = "$(losses "$d/flags")" ]; then
    ok "SLURM: two nodes from SLURM_NNODES/SLURM_NODEID/SLURM_JOB_NODELIST train as --nnodes 2 does ($(losses "$d/slurm" | tail -n 1))"
else
    bad "SLURM: flags rc $f0/$f1, slurm rc $r0/$r1: $(cat "$d/slurm/n0.out" "$d/slurm/n1.out" "$d/flags/n0.out"; losses "$d/slurm"; echo vs; losses "$d/flags")"
fi
rc=0
env SLURM_JOB_ID=77 SLURM_NNODES=2 SLURM_NODEID=0 SLURM_JOB_NODELIST='gpu[01-' "$tprun" --nproc_per_node 1 \
    --master_port "$sport" "$worker" env "$d" > /dev/null 2> "$d/bad.err" || rc=$?
[ $rc -eq 2 ] && grep -q "SLURM_JOB_NODELIST: node list 'gpu\[01-': '\[' without '\]'" "$d/bad.err" &&
    ok "a malformed SLURM_JOB_NODELIST: clear error" || bad "bad nodelist: rc $rc: $(cat "$d/bad.err")"
rc=0
env SLURM_JOB_ID=77 SLURM_NNODES=2 SLURM_NODEID=0 SLURM_LOCALID=1 SLURM_JOB_NODELIST=a1 "$tprun" --nproc_per_node 1 \
    "$worker" env "$d" > /dev/null 2> "$d/task.err" || rc=$?
[ $rc -eq 2 ] && grep -q "one tprun per node" "$d/task.err" && ok "a second SLURM task on a node: clear error" ||
    bad "SLURM_LOCALID=1: rc $rc: $(cat "$d/task.err")"

# ---- program lookup next to tprun; bad invocations ----
d=$work/lookup && mkdir -p "$d/bin" "$d/cwd"
cp "$tprun" "$d/bin/tprun" && cp "$worker" "$d/bin/tprun_worker"
(cd "$d/cwd" && PATH=/usr/bin:/bin "$d/bin/tprun" --nproc_per_node=2 tprun_worker env "$d" > out 2>&1)
rc=$?
[ $rc -eq 0 ] && [ -f "$d/env_1" ] && ok "PROGRAM found next to tprun" || bad "lookup: rc $rc: $(cat "$d/cwd/out")"
"$tprun" --nproc_per_node=2 no-such-program-$$ > /dev/null 2> "$d/err"
rc=$?
[ $rc -ne 0 ] && grep -q "cannot find program" "$d/err" && ok "missing program: clear error" || bad "missing: $rc"
"$tprun" --nproc_per_nod=2 "$worker" env "$d" > /dev/null 2> "$d/err"
rc=$?
[ $rc -eq 2 ] && [ "$(cat "$d/err")" = "tprun: unknown flag --nproc_per_nod; did you mean --nproc_per_node?" ] &&
    ok "unknown flag: one sentence with the nearest flag" || bad "unknown flag: $rc: $(cat "$d/err")"

if [ $fails -ne 0 ]; then
    echo "test_tprun: $fails failed"
    exit 1
fi
echo "test_tprun: all passed"
