#!/usr/bin/env bash
# The main job: installs what it needs, builds, fetches the corpus when it is
# not there, and trains an en->ja model on small_parallel_enja: on a machine
# with GPUs one rank per visible GPU (nvidia-smi -L, CUDA_VISIBLE_DEVICES
# honoured; tprun --nproc_per_node=gpu), the base preset in the layout the
# planner picks (train_mt --layout auto: the fastest that fits); on a CPU 4
# ranks (the `cpu` preset, data parallel, 4 x 1024 tokens a step, the layout
# with the best BLEU for its time in docs/cpu-default.md). It prints what it
# chose and why before it starts. The model is saved
# with its tokenizer to checkpoints/enja for translate_mt, which then
# translates the test set and prints its BLEU and chrF. The run's curves
# (scripts/plot_metrics.py on checkpoints/enja.jsonl) go to
# checkpoints/enja.png, beside the checkpoint; the last line names it.
# With --direction ja-en among the extra flags the model translates
# Japanese to English: saved to checkpoints/jaen, scored on test.ja -> test.en.
#   bash scripts/run_main.sh [CORPUS_DIR] [extra train_mt flags...]
# RUN_MAIN_DRY_RUN=1 prints the choice and the training command, and stops.
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
if [ "$n_gpu" -gt 0 ]; then
  nproc=(--nproc_per_node=gpu) layout=(--layout auto --length-bucket 8)
  echo "run_main: $n_gpu GPU(s) visible (nvidia-smi -L${CUDA_VISIBLE_DEVICES+, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}):" \
       "one rank per GPU, the base preset, and the layout the planner picks (--layout auto: the fastest" \
       "that fits each GPU's memory); ranks sharing one GPU would be staged through host memory, 16x slower;" \
       "lengths padded to multiples of 8, so that one rank replays each batch shape as a CUDA graph" \
       "(docs/gpu-benchmark.md)"
else
  nproc=(--nproc_per_node=4) layout=(--tp 1 --dp 4 --batch-tokens 1024)
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
out=checkpoints/$src$tgt
echo "run_main: direction $src->$tgt: the model and its curves in $out"
cmd=(./build/tprun "${nproc[@]}" train_mt --data "$corpus" --log-interval 100 "${layout[@]}"
     --metrics "$out.jsonl" --save "$out" "$@")
echo "run_main: ${cmd[*]}"
[ "${RUN_MAIN_DRY_RUN:-0}" != 1 ] || exit 0
bash scripts/install_deps.sh --plot
BUILD_DIR=build bash scripts/build.sh
[ -s "$corpus/train.en" ] || bash scripts/get_data.sh "$corpus"
"${cmd[@]}"
./build/translate_mt --model "$out" --src "$corpus/test.$src" --ref "$corpus/test.$tgt" > "$out.test.$tgt"
/usr/bin/python3 scripts/plot_metrics.py "$out.jsonl" -o "$out.png" > /dev/null
echo "run_main: translations of the test set: $(pwd)/$out.test.$tgt"
echo "run_main: training curves: $(pwd)/$out.png"
