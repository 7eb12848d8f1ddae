#!/usr/bin/env bash
# The test command: installs what it needs, builds Release and runs every
# CPU test (the PyTorch reference included), then repeats the suite on an
# AddressSanitizer + UBSan debug build. GPU tests (label gpu) are counted and
# left for a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --tests
BUILD_DIR=build bash scripts/build.sh
(cd build && ctest --output-on-failure -LE gpu)
BUILD_DIR=build-asan BUILD_TYPE=Debug bash scripts/build.sh -DTPTRAIN_ASAN=ON -DTPTRAIN_CUDA=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -LE gpu)
n_gpu=$(cd build && ctest -N -L gpu | sed -n 's/^Total Tests: //p')
echo "run_tests: all CPU tests passed; ${n_gpu:-0} GPU tests left for a GPU machine"
