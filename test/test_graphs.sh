#!/usr/bin/env bash
# --cuda-graphs on: each batch shape's forward and backward captured once
# and replayed (train/graphs.h) give the very bits of the run without
# graphs, on the device given (cpu: the backend's recording; cuda: CUDA
# graphs). Copy-task runs with dropout on (the replays must draw each step's
# own masks: the StepVars), gradient accumulation (the micro-batch index is
# in the masks too, and the loss scale changes per step), evaluation
# between steps, bf16 and fp32, every recomputation mode and flash
# attention (its lse and delta buffers in the graph too). For each:
# the exported weights byte for byte and every logged loss, and the graphs
# record shows replays (a run that never replayed would prove nothing).
# With the corpus: a run whose batches come in several padded shapes
# (--length-bucket), so graphs of several shapes are captured, replayed
# and, as the activations grow for a longer batch, captured again.
# A run saved at step 10 with graphs and resumed to 20 with graphs ends
# with the weights of 20 straight steps without them.
# The default, --cuda-graphs auto: on for one CUDA rank with bucketed
# lengths (the same bits), off on the CPU and without buckets.
# Then the refusals: with --profile, with --tp, --pp or --layout auto, and
# on two ranks through tprun. (The graph
# cache's own rules, stale graphs among them, are test_step_graphs's.)
#   test_graphs.sh BUILD_DIR [cpu|cuda] [CORPUS_DIR]
set -euo pipefail
build=$(cd "$1" && pwd)
dev=${2:-cpu}
corpus=${3:+$(cd "$3" && pwd)}
. "$(dirname "$0")/corpus_cache.sh"
# runs are compared bit for bit across processes: on a GPU the heuristic's first cuBLASLt algorithm for every
# GEMM, not the per-process timed choice (kernels/cuda/gemm_tune.cu)
export TPTRAIN_GEMM_TUNE=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
base=(--task copy --preset tiny --max-steps 30 --lr 5e-3 --warmup 5 --log-interval 1 --eval-interval 12 --seed 7
      --dropout 0.1 --min-len 3 --seq-len 9 --device "$dev")
run() {  # name graphs args...
  local name=$1 g=$2
  shift 2
  "$build/train_mt" "${base[@]}" "$@" --cuda-graphs "$g" --metrics "$name.$g.jsonl" --export "$name.$g" \
    > "$name.$g.log" 2>&1 || { echo "FAIL: $name with --cuda-graphs $g"; cat "$name.$g.log"; exit 1; }
}
check() {  # name min_shapes args...
  local name=$1 shapes=$2
  shift 2
  run "$name" off "$@"
  run "$name" on "$@"
  cmp "$name.off/model.safetensors" "$name.on/model.safetensors" ||
    { echo "FAIL: $name: the weights trained with graphs differ from those without"; exit 1; }
  /usr/bin/python3 - "$name" "$shapes" <<'PY'
import json, sys
name, shapes = sys.argv[1], int(sys.argv[2])
def rows(g):
    return [json.loads(l) for l in open(f"{name}.{g}.jsonl")]
def losses(g):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows(g) if "loss" in r] + \
           [(r["step"], r["dev_loss"]) for r in rows(g) if "dev_loss" in r]
off, on = losses("off"), losses("on")
assert len(off) >= 20 and off == on, f"{name}: the losses differ: {[(a, b) for a, b in zip(off, on) if a != b][:3]}"
assert not any("graphs" in r for r in rows("off")), f"{name}: a graphs record without --cuda-graphs"
g = [r["graphs"] for r in rows("on") if "graphs" in r]
assert len(g) == 1, f"{name}: {len(g)} graphs records"
g = g[0]
assert not g["failed"], f"{name}: a capture was refused: {g}"
assert g["captured"] >= 2 * shapes and g["replayed"] >= 20, f"{name}: too few captures or replays to prove anything: {g}"
print(f"{name}: {len(on)} losses equal, weights equal; graphs {g}")
PY
}
check bf16_accum 1 --dtype bf16 --micro-batches 2
check fp32_selective 1 --dtype fp32 --recompute selective
check bf16_full_gelu 1 --dtype bf16 --recompute full --activation gelu
check bf16_flash 1 --dtype bf16 --heads 2 --attention flash --micro-batches 2
# resumed with graphs = straight without (the bf16_accum run above: 30 steps; here 20)
"$build/train_mt" "${base[@]}" --dtype bf16 --max-steps 20 --eval-interval 0 --cuda-graphs off --export straight \
  > straight.log 2>&1 || { cat straight.log; exit 1; }
for to in 10 20; do
  "$build/train_mt" "${base[@]}" --dtype bf16 --max-steps "$to" --eval-interval 0 --cuda-graphs on --save ckpt \
    --resume auto --export "resumed$to" > "resume$to.log" 2>&1 || { cat "resume$to.log"; exit 1; }
done
grep -q "graphs: [1-9][0-9]* captured, [1-9]" resume20.log || { echo "FAIL: the resumed run replayed no graph"; cat resume20.log; exit 1; }
cmp straight/model.safetensors resumed20/model.safetensors ||
  { echo "FAIL: saved at 10 and resumed to 20 with graphs differs from 20 steps without"; exit 1; }
echo "resume: saved at 10, resumed to 20 with graphs = 20 straight steps without, byte for byte"
if [ -n "$corpus" ]; then
  use_corpus_cache cache
  base=(--data "$corpus" --cache-dir cache --preset tiny --batch-tokens 600 --length-bucket 16 --max-steps 40
        --log-interval 1 --eval-interval 20 --seed 3 --dropout 0.1 --device "$dev")
  check corpus_buckets 3 --dtype bf16 --recompute selective
  # the default (--cuda-graphs auto): graphs on a CUDA rank with bucketed lengths, none on the CPU or
  # without buckets (whether on or off, the bits are those proven equal above)
  for b in 16 1; do
    "$build/train_mt" "${base[@]}" --length-bucket "$b" --dtype bf16 --max-steps 12 --eval-interval 0 \
      --metrics "auto$b.jsonl" > "auto$b.log" 2>&1 || { echo "FAIL: the default run, bucket $b"; cat "auto$b.log"; exit 1; }
  done
  /usr/bin/python3 - "$dev" <<'PY'
import json, sys
dev = sys.argv[1]
g16 = [json.loads(l)["graphs"] for l in open("auto16.jsonl") if "graphs" in json.loads(l)]
g1 = [json.loads(l)["graphs"] for l in open("auto1.jsonl") if "graphs" in json.loads(l)]
if dev == "cuda":
    assert len(g16) == 1 and g16[0]["replayed"] > 0, f"cuda, bucket 16: the default made no graphs: {g16}"
else:
    assert not g16, f"cpu: the default made graphs: {g16}"
assert not g1, f"{dev}, bucket 1: the default made graphs: {g1}"
print(f"default --cuda-graphs auto on {dev}: graphs {g16[0] if g16 else 'none'} at bucket 16, none at bucket 1")
PY
fi

# refusals: one sentence, a failing exit
if "$build/train_mt" "${base[@]}" --max-steps 2 --eval-interval 0 --cuda-graphs on --profile > profile.log 2>&1; then
  echo "FAIL: --cuda-graphs on with --profile ran"; exit 1
fi
grep -q "cuda-graphs on and --profile do not mix" profile.log || { echo "FAIL: no reason given:"; cat profile.log; exit 1; }
# a layout of more than one rank given on the command line: refused with the flags, before any set-up
for flag in "--tp 2" "--pp 2" "--layout auto"; do
  if "$build/train_mt" "${base[@]}" --max-steps 2 --eval-interval 0 --cuda-graphs on $flag > flag.log 2>&1; then
    echo "FAIL: --cuda-graphs on ran with $flag"; exit 1
  fi
  grep -q "cuda-graphs on needs one rank" flag.log || { echo "FAIL: $flag: no reason given:"; cat flag.log; exit 1; }
done
if [ "$dev" = cpu ]; then
  if "$build/tprun" --nproc_per_node=2 "$build/train_mt" "${base[@]}" --max-steps 2 --eval-interval 0 --cuda-graphs on \
       > ranks.log 2>&1; then
    echo "FAIL: --cuda-graphs on ran on two ranks"; exit 1
  fi
  grep -q "cuda-graphs on needs one rank (this run has tp 2" ranks.log || { echo "FAIL: no reason given:"; cat ranks.log; exit 1; }
fi
echo "graphs ($dev): OK"
