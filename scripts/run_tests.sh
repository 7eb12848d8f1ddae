#!/usr/bin/env bash
# The test command: installs what it needs, builds Release and runs every
# CPU test (the PyTorch reference included), then the tests that exercise
# memory (unit tests, parsers, checkpoint loading, communication) again on an
# AddressSanitizer + UBSan debug build: the end-to-end runs (label e2e: the
# same code, judged on results) run in Release only. Two tests at a time
# (ctest -j 2). GPU tests (label gpu) are counted and left for a GPU machine;
# the long tier (label long: longer fuzzing, runs too long for the command)
# is counted and left for `ctest -L long` (scripts/run_tests.sh --long runs
# it after the rest).
#   bash scripts/run_tests.sh [--long] [CORPUS_DIR]
# The corpus folder (small_parallel_enja) is the argument, else
# $TPTRAIN_CORPUS_DIR, else ../shared/data/small_parallel_enja next to the
# checkout, else data/small_parallel_enja (downloaded when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
long=0
if [ "${1:-}" = --long ]; then long=1; shift; fi
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
(cd build && ctest --output-on-failure -j 2 -LE 'gpu|long')
# Debug (assertions on) at -O1, the optimization AddressSanitizer's authors
# advise: every load and store that runs is still checked, in less time
# (test_model_grad: 0.8 s of CPU against 1.2 s at -O0). Its corpus_cache
# fixture reuses the Release pass's prepared corpus (the same bytes: test_spm
# and translate_e2e prepare their own under the sanitizers).
BUILD_DIR=build-asan BUILD_TYPE=Debug bash scripts/build.sh -DTPTRAIN_ASAN=ON -DTPTRAIN_CUDA=OFF \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DTPTRAIN_CORPUS_DIR="$corpus" \
  -DTPTRAIN_TEST_CORPUS_CACHE_SEED="$PWD/build/test-corpus-cache"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 -LE 'gpu|long|e2e')
n_gpu=$(cd build && ctest -N -L gpu | sed -n 's/^Total Tests: //p')
n_long=$(cd build && ctest -N -L long | sed -n 's/^Total Tests: //p')
if [ "$long" = 1 ]; then
  (cd build && ctest --output-on-failure -j 2 -L long -LE gpu)
  echo "run_tests: all CPU tests passed, the long tier's ${n_long:-0} included;" \
       "${n_gpu:-0} GPU tests left for a GPU machine"
else
  echo "run_tests: all CPU tests passed; ${n_gpu:-0} GPU tests left for a GPU machine," \
       "${n_long:-0} long-tier tests for \`ctest -L long\` (or run_tests.sh --long)"
fi
