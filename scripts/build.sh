#!/usr/bin/env bash
# Configures and builds into BUILD_DIR (default build/) with extra CMake args.
# CUDA targets build when nvcc is found (also under /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
cmake --build "$dir" -j "$(nproc)"
