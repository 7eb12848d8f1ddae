#!/usr/bin/env bash
# The main job: installs what it needs, builds, and trains. Until the corpus
# pipeline lands, this trains the tiny model on the synthetic copy task and
# exports it to checkpoints/copy-tiny. Extra arguments go to train_mt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=build bash scripts/build.sh
./build/train_mt --preset tiny --task copy --max-steps 600 --lr 5e-3 --warmup 50 \
  --log-interval 50 --eval-interval 200 --save checkpoints/copy-tiny "$@"
