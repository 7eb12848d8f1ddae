#!/usr/bin/env bash
# The main job: installs what it needs, builds, fetches the corpus when it is
# not there, and trains an en->ja model on small_parallel_enja on the CPU,
# saving it (with its tokenizer) to checkpoints/enja-tiny for translate_mt.
#   bash scripts/run_main.sh [CORPUS_DIR] [extra train_mt flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=${1:-data/small_parallel_enja}
shift || true
bash scripts/install_deps.sh
BUILD_DIR=build bash scripts/build.sh
[ -s "$corpus/train.en" ] || bash scripts/get_data.sh "$corpus"
./build/train_mt --data "$corpus" --preset tiny --max-steps 1500 --lr 2e-3 --warmup 200 \
  --log-interval 100 --eval-interval 500 --metrics checkpoints/enja-tiny.jsonl --save checkpoints/enja-tiny "$@"
./build/translate_mt --model checkpoints/enja-tiny --src "$corpus/test.en" --ref "$corpus/test.ja" \
  > checkpoints/enja-tiny.test.ja
