#!/usr/bin/env bash
# The test command: installs what it needs, builds Release and runs every
# CPU test (the PyTorch reference included), then repeats the suite on an
# AddressSanitizer + UBSan debug build. GPU tests (label gpu) are counted and
# left for a GPU machine.
#   bash scripts/run_tests.sh [CORPUS_DIR]
# The corpus folder (small_parallel_enja) is the argument, else
# $TPTRAIN_CORPUS_DIR, else ../shared/data/small_parallel_enja next to the
# checkout, else data/small_parallel_enja (downloaded when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=${1:-${TPTRAIN_CORPUS_DIR:-}}
if [ -z "$corpus" ]; then
  for c in ../shared/data/small_parallel_enja data/small_parallel_enja; do
    if [ -s "$c/train.en" ]; then corpus=$c; break; fi
  done
fi
if [ -z "$corpus" ]; then
  corpus=data/small_parallel_enja
  bash scripts/get_data.sh "$corpus"
fi
corpus=$(cd "$corpus" && pwd)
echo "run_tests: corpus $corpus"
bash scripts/install_deps.sh --tests
BUILD_DIR=build bash scripts/build.sh -DTPTRAIN_CORPUS_DIR="$corpus"
(cd build && ctest --output-on-failure -LE gpu)
BUILD_DIR=build-asan BUILD_TYPE=Debug bash scripts/build.sh -DTPTRAIN_ASAN=ON -DTPTRAIN_CUDA=OFF \
  -DTPTRAIN_CORPUS_DIR="$corpus"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -LE gpu)
n_gpu=$(cd build && ctest -N -L gpu | sed -n 's/^Total Tests: //p')
echo "run_tests: all CPU tests passed; ${n_gpu:-0} GPU tests left for a GPU machine"
