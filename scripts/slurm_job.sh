#!/usr/bin/env bash
#SBATCH --job-name=tptrain
#SBATCH --nodes=1
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
# A SLURM batch script for a preemptible tptrain job that saves before its
# time limit and requeues itself:
#
#   sbatch [--gres=gpu:8] scripts/slurm_job.sh train_mt --data DIR --save ckpt --resume auto [FLAGS...]
#
# --signal=B:USR1@120 signals this batch shell alone, 120 s before the
# limit; a shell running tprun in the foreground would die of it (SIGUSR1's
# default action) and tprun, never told, would be killed at the limit with
# nothing saved. So tprun runs in the background and the shell passes the
# signal on (the traps below); tprun forwards it to every rank, the ranks
# finish their step, save, and exit 75 ("saved on signal"), and the job is
# requeued to continue with --resume auto. 120 s must cover a step and a
# save: tprun --grace (TPRUN_GRACE, 90) is how long the ranks get before
# SIGKILL. Environment: TPRUN (./build/tprun), TPRUN_NPROC (gpu: one rank
# per visible GPU), TPRUN_GRACE (90), TPRUN_ARGS (more tprun flags).
# test/test_preempt.sh runs this very file, signalled as B: does.
set -u
tprun=${TPRUN:-./build/tprun}
read -r -a extra <<< "${TPRUN_ARGS:-}"
"$tprun" --grace "${TPRUN_GRACE:-90}" --nproc_per_node="${TPRUN_NPROC:-gpu}" "${extra[@]}" "$@" &
pid=$!
for s in USR1 TERM INT; do
  # shellcheck disable=SC2064  # $pid and $s expand now, on purpose
  trap "kill -s $s $pid 2> /dev/null" "$s"
done
# A trapped signal ends `wait` early: wait until tprun itself has ended, then take its status.
while kill -0 "$pid" 2> /dev/null; do wait "$pid"; done
wait "$pid"
rc=$?
echo "slurm_job: tprun exited $rc"
if [ "$rc" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
