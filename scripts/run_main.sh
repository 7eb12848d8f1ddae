#!/usr/bin/env bash
# The main job: installs what it needs, builds, fetches the corpus when it is
# not there, and trains an en->ja model on small_parallel_enja with 4 ranks
# (on a CPU: the `cpu` preset, data parallel, 4 x 1024 tokens a step, the
# layout with the best BLEU for its time in docs/cpu-default.md; on a GPU:
# the base preset, tensor parallel inside the node), saving it
# with its tokenizer to checkpoints/enja for translate_mt, which then
# translates the test set and prints its BLEU and chrF. The run's curves
# (scripts/plot_metrics.py on checkpoints/enja.jsonl) go to
# checkpoints/enja.png, beside the checkpoint; the last line names it.
#   bash scripts/run_main.sh [CORPUS_DIR] [extra train_mt flags...]
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
bash scripts/install_deps.sh --plot
BUILD_DIR=build bash scripts/build.sh
[ -s "$corpus/train.en" ] || bash scripts/get_data.sh "$corpus"
layout=()
nvidia-smi -L > /dev/null 2>&1 || layout=(--tp 1 --dp 4 --batch-tokens 1024)
./build/tprun --nproc_per_node=4 train_mt --data "$corpus" --log-interval 100 "${layout[@]}" \
  --metrics checkpoints/enja.jsonl --save checkpoints/enja "$@"
./build/translate_mt --model checkpoints/enja --src "$corpus/test.en" --ref "$corpus/test.ja" \
  > checkpoints/enja.test.ja
/usr/bin/python3 scripts/plot_metrics.py checkpoints/enja.jsonl -o checkpoints/enja.png > /dev/null
echo "run_main: translations of the test set: $(pwd)/checkpoints/enja.test.ja"
echo "run_main: training curves: $(pwd)/checkpoints/enja.png"
