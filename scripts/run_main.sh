#!/usr/bin/env bash
# The main job: installs what it needs, builds, fetches the corpus when it is
# not there, and trains an en->ja model on small_parallel_enja: on a machine
# with GPUs one rank per visible GPU (nvidia-smi -L, CUDA_VISIBLE_DEVICES
# honoured; tprun --nproc_per_node=gpu), the base preset in the layout the
# planner picks (train_mt --layout auto: the fastest that fits) with the
# recipe measured best on a GPU (docs/quality.md), bounded by time
# (RUN_MAIN_MINUTES, default 10, the schedule's horizon) and keeping its best
# checkpoint and the average of its newest; on a CPU 4 ranks (the `cpu`
# preset, data parallel, 4 x 1024 tokens a step, the layout with the best
# BLEU for its time in docs/cpu-default.md). It prints what it chose and why
# before it starts. The model is saved with its tokenizer to checkpoints/enja;
# scripts/score_run.sh then picks the checkpoint (best or averaged) and the
# beam's length penalty on the dev set and prints the test set's BLEU and
# chrF. The run's curves (scripts/plot_metrics.py on checkpoints/enja.jsonl)
# go to checkpoints/enja.png, beside the checkpoint; the last line names it.
# With --direction ja-en among the extra flags the model translates
# Japanese to English: saved to checkpoints/jaen, scored on test.ja -> test.en.
#   bash scripts/run_main.sh [CORPUS_DIR] [extra train_mt flags...]
# RUN_MAIN_DRY_RUN=1 prints the choice and the training command, and stops.
# RUN_MAIN_BIN=DIR runs the programs built in DIR and installs and builds
# nothing (a machine that cannot install: scripts/gpu_check.sh's section g
# runs the main job so); RUN_MAIN_OUT=DIR puts the model and its files in
# DIR instead of checkpoints/.
set -euo pipefail
cd "$(dirname "$0")/.."
default_corpus=data/small_parallel_enja
corpus=${1:-$default_corpus}
shift || true
# Only the default folder is downloaded into: a path given that does not hold
# the corpus is a typo or a missing mount, refused before anything is built.
if [ "$corpus" != "$default_corpus" ] && [ ! -s "$corpus/train.en" ]; then
  echo "run_main: $corpus does not hold the corpus (no $corpus/train.en); give the folder that does, or no" \
       "folder to download it into $default_corpus" >&2
  exit 2
fi
# The GPUs a rank would see: nvidia-smi -L's, narrowed by CUDA_VISIBLE_DEVICES
# (tprun --nproc_per_node=gpu counts them again, as CUDA does, and says so).
n_gpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
if [ "$n_gpu" -gt 0 ] && [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  n_cvd=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c . || true)
  [ "$n_cvd" -lt "$n_gpu" ] && n_gpu=$n_cvd
fi
minutes=${RUN_MAIN_MINUTES:-10} every=${RUN_MAIN_EVAL:-500}
if [ "$n_gpu" -gt 0 ]; then
  nproc=(--nproc_per_node=gpu) layout=(--layout auto --length-bucket 8)
  # the recipe: docs/quality.md's GPU table (dropout 0.3 and 1000 warm-up steps: the base preset's own
  # defaults); ended by time, not steps, and the best checkpoint kept, since a model of this size overfits
  # 50k pairs long before 10 minutes are up
  recipe=(--batch-tokens 4096 --max-steps 1000000 --max-minutes "$minutes" --eval-interval "$every"
          --save-interval "$every" --keep-last 3 --keep-best bleu --average-last 3)
  echo "run_main: $n_gpu GPU(s) visible (nvidia-smi -L${CUDA_VISIBLE_DEVICES+, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}):" \
       "one rank per GPU, the base preset, and the layout the planner picks (--layout auto: the fastest" \
       "that fits each GPU's memory); ranks sharing one GPU would be staged through host memory, 16x slower;" \
       "lengths padded to multiples of 8, so that one rank replays each batch shape as a CUDA graph" \
       "(docs/gpu-benchmark.md)"
  echo "run_main: the recipe measured best on a GPU (docs/quality.md): the base preset (dropout 0.3, 1000" \
       "warm-up steps), 4096 tokens a step, $minutes minutes of training (RUN_MAIN_MINUTES; the schedule's" \
       "horizon), dev BLEU and a checkpoint every $every steps (RUN_MAIN_EVAL), the best one kept and the" \
       "newest 3 averaged: the base model overfits 50k pairs within minutes, so the test set is scored with" \
       "whichever of the two is better on dev"
else
  nproc=(--nproc_per_node=4) layout=(--tp 1 --dp 4 --batch-tokens 1024) recipe=()
  echo "run_main: no GPU visible (nvidia-smi -L${CUDA_VISIBLE_DEVICES+, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}): 4 ranks on the CPU, the cpu preset, data parallel" \
       "(tp 1 x dp 4, 1024 tokens per rank and step: the best BLEU for its time, docs/cpu-default.md)"
fi
# The direction (train_mt's --direction, en-ja unless the extra flags say otherwise; the last one wins).
src=en tgt=ja prev=
for f in "$@"; do
  v=$f
  [ "$prev" = --direction ] && v=--direction=$f  # "--direction ja-en" as two words
  case "$v" in
    --direction=ja-en) src=ja tgt=en ;;
    --direction=en-ja) src=en tgt=ja ;;
  esac
  prev=$f
done
bin=${RUN_MAIN_BIN:-./build}
out=${RUN_MAIN_OUT:-checkpoints}/$src$tgt
echo "run_main: direction $src->$tgt: the model and its curves in $out"
cmd=("$bin/tprun" "${nproc[@]}" "$bin/train_mt" --data "$corpus" --log-interval 100 "${layout[@]}" "${recipe[@]}"
     --metrics "$out.jsonl" --save "$out" "$@")
echo "run_main: then the checkpoint (best or averaged, where the run kept them) and the beam's length penalty" \
     "(${RUN_MAIN_LENPENS:-0.6 1.0 1.4}; RUN_MAIN_LENPENS) chosen on the dev set, and the test set scored with them"
echo "run_main: ${cmd[*]}"
[ "${RUN_MAIN_DRY_RUN:-0}" != 1 ] || exit 0
if [ -z "${RUN_MAIN_BIN:-}" ]; then
  bash scripts/install_deps.sh --plot
  BUILD_DIR=build bash scripts/build.sh
fi
[ -s "$corpus/train.en" ] || bash scripts/get_data.sh "$corpus"
mkdir -p "$(dirname "$out")"
# A new run: an earlier run's model and metrics are moved aside, never removed (--keep-best and
# --average-last then judge this run's checkpoints only).
if [ -e "$out" ] || [ -e "$out.jsonl" ]; then
  aside=$out.$(date +%Y%m%d-%H%M%S)
  echo "run_main: the earlier run moved to $aside (and $aside.jsonl)"
  [ ! -e "$out" ] || mv "$out" "$aside"
  for f in "$out.jsonl"*; do [ ! -e "$f" ] || mv "$f" "$aside${f#"$out"}"; done
fi
"${cmd[@]}"
SCORE_BIN=$bin SCORE_LENPENS=${RUN_MAIN_LENPENS:-0.6 1.0 1.4} \
  bash scripts/score_run.sh "$out" "$out.jsonl" "$corpus" "$src" "$tgt" "$out"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
echo "run_main: translations of the test set: $out.test.$tgt"
if /usr/bin/python3 -c 'import matplotlib' 2> /dev/null; then
  /usr/bin/python3 scripts/plot_metrics.py "$out.jsonl" -o "$out.png" > /dev/null
  echo "run_main: training curves: $out.png"
else
  echo "run_main: no curves drawn: /usr/bin/python3 has no matplotlib (scripts/install_deps.sh --plot installs it)"
fi
