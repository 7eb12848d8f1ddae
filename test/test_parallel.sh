#!/usr/bin/env bash
# Parallel runs reproduce the single-rank run: through tprun, tp=2, tp=4,
# dp=2, tp=2 x dp=2, gradient accumulation, ZeRO, pipeline stages (pp 2
# and 4, with tp and dp, an explicit layout) and sequence parallelism train
# 20 steps of the synthetic copy task (global
# batch of 32 sequences, dropout off) and must match the single process
# step by step (loss relative difference < LOSS_RTOL) and in the final
# weights (max abs difference < WEIGHT_ATOL). GELU keeps every step smooth:
# with ReLU a pre-activation within rounding of 0 may flip between layouts.
# Observed: losses within 1.2e-7, weights within 5.4e-7 (fp32 sums in
# another order), so the tolerances leave room without hiding a wrong term.
# With stages, each stage's message count must equal the 1F1B count, and a
# stage killed or stopped mid-step must end the job with the rank named.
# Usage: test_parallel.sh BUILD_DIR
set -euo pipefail
build=$1
. "$(dirname "$0")/lib.sh"
enter_workdir
args=(--task copy --max-steps 20 --lr 5e-3 --warmup 5 --log-interval 1 --eval-interval 20 --dropout 0
      --activation gelu --batch-size 32 --comm-timeout 60)
"$build/train_mt" "${args[@]}" --metrics single.jsonl --export single > single.log
# The dropout runs below drop at every site: the sub-blocks' outputs, the
# attention probabilities and the FFN activations (the last two split over
# tp by heads and columns, each rank drawing its window of the whole mask).
drop=(--dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1)
run() {  # name nproc train_mt-flags...
  local name=$1 n=$2; shift 2
  "$build/tprun" --standalone --nproc_per_node "$n" "$build/train_mt" "${args[@]}" "$@" \
      --metrics "$name.jsonl" --export "$name" > "$name.log" 2>&1 || { cat "$name.log"; exit 1; }
}
run tp2 2 --tp 2
run tp4 4 --tp 4
run dp2 2 --tp 1 --dp 2
run tp2dp2 4 --tp 2 --dp 2
grep -q "tp 2 x dp 2 x pp 1" tp2dp2.log
# Gradient accumulation: M micro-batches of the same global batch (rank r's
# micro-batch i is share r + i dp), reduced once (ZeRO-2: every micro-batch).
run m4 1 --micro-batches 4
run dp2m2 2 --tp 1 --dp 2 --micro-batches 2
run tp2dp2m2z1 4 --tp 2 --dp 2 --micro-batches 2 --zero 1 --grad-bucket-mb 0.01
run dp2m2z2 2 --tp 1 --dp 2 --micro-batches 2 --zero 2 --grad-bucket-mb 0.01
# with dropout: micro-batch i of dp rank r draws the masks of global
# micro-batch r + i dp, so dp 2 x M 2 is dp 4 (same shares, same masks)
run drop_dp4 4 --tp 1 --dp 4 "${drop[@]}"
run drop_dp2m2 2 --tp 1 --dp 2 --micro-batches 2 "${drop[@]}"
# Pipeline stages (1F1B through the shm pp group): p 2 and 4, with tp, dp
# (ZeRO-1) and an explicit layout whose first stage ends inside the decoder.
run pp2 2 --pp 2
run pp2m4 2 --pp 2 --micro-batches 4
run pp4m4 4 --pp 4 --micro-batches 4
run tp2pp2m2 4 --tp 2 --pp 2 --micro-batches 2
run dp2pp2m2z1 4 --tp 1 --dp 2 --pp 2 --micro-batches 2 --zero 1 --grad-bucket-mb 0.01
# ZeRO-2 with stages: every micro-batch reduced into the shards, the
# embedding a bucket of its own whose shard pieces the embedding group sums
run dp2pp2m2z2 4 --tp 1 --dp 2 --pp 2 --micro-batches 2 --zero 2 --grad-bucket-mb 0.01
run pp2lay 2 --pp 2 --pp-layout "enc:0-1,dec:0|dec:1" --micro-batches 3
run tp2dp2pp2m2 8 --tp 2 --dp 2 --pp 2 --micro-batches 2    # the full 3D mesh
grep -Eq "^\[rank 0\] +7 \(1,1,1\)" tp2dp2pp2m2.log
grep -q "pipeline: 4 stages enc:0-0|enc:1-1|dec:0-0|dec:1-1, 1F1B over 4 micro-batches" pp4m4.log
for s in 0 1 2 3; do grep -q "pipeline stage $s (.*% of .* s training waiting in exchanges" pp4m4.log; done
# Stage messages counted in the run equal the 1F1B count: every micro-batch's
# activations go to the next stage and its gradients to the previous one, so
# stage s of p sends and receives M ([s < p-1] + [s > 0]) per step.
messages() {  # log p M steps
  local log=$1 p=$2 m=$3 steps=$4 s want
  for ((s = 0; s < p; s++)); do
    want=$((steps * m * ((s < p - 1) + (s > 0))))
    grep -q "pipeline stage $s (.*; $want messages sent and $want received in $steps steps" "$log" ||
      { grep "pipeline stage" "$log"; echo "FAIL: $log: stage $s did not send and receive $want messages"; exit 1; }
  done
}
messages pp4m4.log 4 4 20
messages pp2lay.log 2 3 20
messages tp2dp2pp2m2.log 2 2 20
grep -Eq "^\[rank 0\] +3 \(0,0,3\)" pp4m4.log   # the memory table shows the pp coordinate
# A stage killed mid-step (SIGKILL as it begins its last micro-batch of step 3)
# ends the job at once with the rank named; a stage that stops answering
# (SIGSTOP) ends it after --comm-timeout, its neighbours naming it.
fault() {  # name rank mode expected-text
  local name=$1 rank=$2 mode=$3 want=$4 t0=$SECONDS rc=0
  TPTRAIN_FAULT_STEP=3 TPTRAIN_FAULT_RANK=$rank TPTRAIN_FAULT_MODE=$mode timeout 120 "$build/tprun" --standalone \
      --nproc_per_node 4 "$build/train_mt" "${args[@]}" --pp 4 --micro-batches 4 --comm-timeout 3 > "$name.log" 2>&1 ||
    rc=$?
  ((rc != 0 && rc != 124)) || { cat "$name.log"; echo "FAIL: $name: exit status $rc (124: hung)"; exit 1; }
  grep -qF -- "$want" "$name.log" || { cat "$name.log"; echo "FAIL: $name: no '$want'"; exit 1; }
  grep -q "step      3/" "$name.log" && { echo "FAIL: $name: step 3 completed"; exit 1; }
  echo "$name: ended in $((SECONDS - t0)) s"
}
fault kill-stage1 1 kill "tprun: rank 1 (local rank 1, pid"
grep -q "failed first: killed by signal SIGKILL" kill-stage1.log || { cat kill-stage1.log; exit 1; }
# The first rank to time out names the peer it waited on: a neighbour of
# stage 2 names it, unless (on a loaded machine) stage 0 started waiting on
# stage 1, itself blocked on stage 2, a moment earlier: then stage 1 is named.
fault stop-stage2 2 stop "did not send within 3 s"
grep -Eq "pipeline stage [13]: receiving micro-batch [0-9]+'s [a-z]+ from stage 2 failed: comm pp.t0.d0: rank 2 did not send|pipeline stage 0: receiving micro-batch [0-9]+'s [a-z]+ from stage 1 failed: comm pp.t0.d0: rank 1 did not send" stop-stage2.log ||
  { cat stop-stage2.log; echo "FAIL: stop-stage2: the stopped stage (or the stage waiting on it) not named"; exit 1; }
# with dropout: every stage draws the masks of the same global micro-batch and layer
run drop_m2 1 --micro-batches 2 "${drop[@]}"
run drop_pp2m2 2 --pp 2 --micro-batches 2 "${drop[@]}"
# Recomputation in backward: bit for bit the run that keeps everything
# (tp 2 repeats its allreduces in the recomputed forward; stages with slots).
run drop_tp2 2 --tp 2 "${drop[@]}"
run drop_1 1 "${drop[@]}"   # tp 2 draws the one-rank run's masks: the same run, sums in another order
run drop_tp2_sel 2 --tp 2 "${drop[@]}" --recompute selective
run drop_tp2_full 2 --tp 2 "${drop[@]}" --recompute full
run drop_pp2m2_full 2 --pp 2 --micro-batches 2 "${drop[@]}" --recompute full
grep -q "recompute full" drop_tp2_full.log
# Sequence parallelism: the token rows between sub-blocks split over tp.
# The same results as the single-rank run (sums in another order): tp 2 and
# 4, with dp, micro-batches and ZeRO 1 and 2 (the LayerNorm and bias
# gradients summed over tp every micro-batch); with dropout equal to tp
# without it (the masks are windows of the whole); tp 3 on rows that do not
# split evenly (padding rows), against tp 3 without it.
run tp2sp 2 --tp 2 --sequence-parallel
run tp4sp 4 --tp 4 --sequence-parallel
run tp2dp2m2z1sp 4 --tp 2 --dp 2 --micro-batches 2 --zero 1 --grad-bucket-mb 0.01 --sequence-parallel
run tp2dp2m2z2sp 4 --tp 2 --dp 2 --micro-batches 2 --zero 2 --grad-bucket-mb 0.01 --sequence-parallel
run drop_tp2_sp 2 --tp 2 "${drop[@]}" --sequence-parallel
run drop_tp2_sp_full 2 --tp 2 "${drop[@]}" --sequence-parallel --recompute full
tp3=(--heads 3 --d-model 36 --ffn-hidden-size 72)
run tp3 3 --tp 3 "${tp3[@]}" "${drop[@]}"
run tp3sp 3 --tp 3 "${tp3[@]}" "${drop[@]}" --sequence-parallel --recompute selective
grep -q "recompute selective; sequence parallel" tp3sp.log
# sequences up to 13 long: the encoder's rows (32 x 13) leave a padding row
# inside the decoder's (32 x 14), where the decoder's input gradients lie
# stale; backward writes its LayerNorm-output gradients and must zero that row
run tp3len13 3 --tp 3 "${tp3[@]}" "${drop[@]}" --seq-len 13
run tp3len13sp 3 --tp 3 "${tp3[@]}" "${drop[@]}" --seq-len 13 --sequence-parallel
# with stages: the messages carry a rank's rows of the residual streams
run tp2pp2m2sp 4 --tp 2 --pp 2 --micro-batches 2 --sequence-parallel
run tp2dp2pp2m2sp 8 --tp 2 --dp 2 --pp 2 --micro-batches 2 --sequence-parallel --pp-layout "enc:0-1,dec:0|dec:1" \
  --zero 2 --grad-bucket-mb 0.01
run drop_tp2pp2m2 4 --tp 2 --pp 2 --micro-batches 2 "${drop[@]}" --pp-layout "enc:0|enc:1,dec:0-1"
run drop_tp2pp2m2_sp 4 --tp 2 --pp 2 --micro-batches 2 "${drop[@]}" --pp-layout "enc:0|enc:1,dec:0-1" \
  --sequence-parallel --recompute selective
# The tp collectives per training step (2 + 2 layers, one micro-batch).
# Without it: forward 2 embeddings + 2 per encoder layer + 3 per decoder
# layer + 2 for the loss, backward 1 (output layer) + 3 per decoder layer +
# 1 (encoder output) + 2 per encoder layer, + 1 for the gradient norm: 27
# allreduces. With it the allreduces left are the loss's 2, the norm's 1 and
# one per layer and final LayerNorm for the replicated gradients (2+2+2): 9;
# each g becomes a reduce-scatter (forward 2 + 4 + 6, backward 1 + 6 + 1 + 4:
# 24) and each f an allgather (forward 4 + 6 + the encoder output and the
# final decoder LayerNorm 2, backward the output gradient and the LayerNorm
# output again per sub-block 8 + 12, the 2 embeddings' 2: 34).
grep -q "per training step 27.00 allreduces, 0.00 reduce-scatters, 0.00 allgathers" tp2.log ||
  { grep "per training step" tp2.log; echo "FAIL: tp 2 collectives"; exit 1; }
grep -q "per training step 9.00 allreduces, 24.00 reduce-scatters, 34.00 allgathers" tp2sp.log ||
  { grep "per training step" tp2sp.log; echo "FAIL: tp 2 sequence-parallel collectives"; exit 1; }
# Invalid layouts are refused with one sentence, and tprun reports the failure.
refuse() {  # nproc expected-text train_mt-flags...
  local n=$1 want=$2; shift 2
  if "$build/tprun" --standalone --nproc_per_node "$n" "$build/train_mt" "${args[@]}" "$@" > bad.log 2>&1; then
    echo "FAIL: layout $* accepted"; exit 1
  fi
  grep -qF -- "$want" bad.log || { echo "FAIL: no '$want' in:"; cat bad.log; exit 1; }
}
refuse 2 "tp (2) x dp (2) x pp (1) = 4 does not match the world size 2" --tp 2 --dp 2
refuse 4 "tp (3) does not divide the world size 4" --tp 3
refuse 2 "n_heads (3) is not divisible by tp (2)" --tp 2 --heads 3 --d-model 36
grep -q "failed first" bad.log || { echo "FAIL: tprun did not report the failed rank"; cat bad.log; exit 1; }
refuse 1 "pp (5) must be between 1 and the 4 layers" --pp 5
refuse 2 "--pp-layout 'enc:0|dec:0-1': 'dec:0-1' does not continue the stack where stage 1 is (encoder layer 1)" --pp 2 --pp-layout "enc:0|dec:0-1"
refuse 3 "does not fit the world size 3" --pp 2
grep -Eq "^\[rank 0\] +3 \(1,1,0\)" tp2dp2.log   # the memory table lists every rank with its (tp,dp,pp)
/usr/bin/python3 - "$here/reference" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import safetensors_io as st
import torch
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5
def losses(name):
    return [r["loss"] for r in map(json.loads, open(name + ".jsonl")) if "loss" in r]
base = losses("single")
assert len(base) == 20, base
w1, _ = st.load("single/model.safetensors")
bad = []
for name in ("tp2", "tp4", "dp2", "tp2dp2", "m4", "dp2m2", "tp2dp2m2z1", "dp2m2z2",
             "pp2", "pp2m4", "pp4m4", "tp2pp2m2", "dp2pp2m2z1", "dp2pp2m2z2", "pp2lay", "tp2dp2pp2m2",
             "tp2sp", "tp4sp", "tp2dp2m2z1sp", "tp2dp2m2z2sp", "tp2pp2m2sp", "tp2dp2pp2m2sp"):
    got = losses(name)
    assert len(got) == 20, (name, got)
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, base))
    w, _ = st.load(name + "/model.safetensors")
    assert set(w) == set(w1), name
    wd, wk = max((float((w[k] - w1[k]).abs().max()), k) for k in w1)
    print(f"{name}: max relative loss difference {rel:.2e}, max weight difference {wd:.2e} ({wk})")
    if rel > LOSS_RTOL or wd > WEIGHT_ATOL:
        bad.append(name)
def same_run(ref, name, what):
    """name against ref (dropout runs, which must also differ from the dropout-free run)."""
    a, b = losses(ref), losses(name)
    rel = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    wa, _ = st.load(ref + "/model.safetensors")
    wb, _ = st.load(name + "/model.safetensors")
    wd = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    print(f"dropout 0.1 (and attention, activation 0.1), {what}: max relative loss difference {rel:.2e}, max weight difference {wd:.2e}")
    if len(b) != 20 or rel > LOSS_RTOL or wd > WEIGHT_ATOL or a == losses("single"):
        bad.append(name)
same_run("drop_dp4", "drop_dp2m2", "dp 2 x 2 micro-batches vs dp 4")
same_run("drop_m2", "drop_pp2m2", "pp 2 x 2 micro-batches vs one rank x 2")
same_run("drop_1", "drop_tp2", "tp 2 vs one rank")
same_run("drop_tp2", "drop_tp2_sp", "tp 2 sequence-parallel vs tp 2")
same_run("drop_tp2", "drop_tp2_sp_full", "tp 2 sequence-parallel, recompute full vs tp 2")
same_run("tp3", "tp3sp", "tp 3 (uneven rows) sequence-parallel, recompute selective vs tp 3")
same_run("tp3len13", "tp3len13sp", "tp 3 (uneven rows, stale padding rows) sequence-parallel vs tp 3")
same_run("drop_tp2pp2m2", "drop_tp2pp2m2_sp", "tp 2 x pp 2 (a stage inside the encoder) sequence-parallel vs without")
def bitwise(ref, name, what):
    a, b = losses(ref), losses(name)
    wa, _ = st.load(ref + "/model.safetensors")
    wb, _ = st.load(name + "/model.safetensors")
    same = [k for k in wa if torch.equal(wa[k], wb[k])]
    print(f"dropout 0.1 (and attention, activation 0.1), {what}: losses {'equal' if a == b else 'DIFFER'}, {len(same)} of {len(wa)} tensors equal")
    if len(b) != 20 or a != b or len(same) != len(wa):
        bad.append(name)
bitwise("drop_tp2", "drop_tp2_sel", "tp 2, recompute selective vs none")
bitwise("drop_tp2", "drop_tp2_full", "tp 2, recompute full vs none")
bitwise("drop_pp2m2", "drop_pp2m2_full", "pp 2 x 2 micro-batches, recompute full vs none")
if bad:
    sys.exit("layouts differ from the single-rank run: " + ", ".join(bad))
PY
echo "test_parallel: ok"
