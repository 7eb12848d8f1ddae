#!/usr/bin/env bash
# bench_spm_sample.sh BUILD_DIR CORPUS_DIR [ALPHA...]: the rate at which
# --spm-alpha draws an epoch's segmentations (docs/data.md), as train_mt's
# own line reports it: one step of the cpu preset per alpha (default 0.1
# 0.2 0.5), in a scratch folder whose cache is prepared by the first run.
# PREP_WORKERS (default 0: every core) sets the drawing threads.
set -euo pipefail
build=$(cd "$1" && pwd) corpus=$(cd "$2" && pwd)
shift 2
alphas=("$@")
((${#alphas[@]})) || alphas=(0.1 0.2 0.5)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$build/train_mt" --preset cpu --data "$corpus" --max-steps 1 > prepare.log 2>&1 || { tail prepare.log; exit 1; }
for a in "${alphas[@]}"; do
  "$build/train_mt" --preset cpu --data "$corpus" --max-steps 1 --spm-alpha "$a" \
    --prep-workers "${PREP_WORKERS:-0}" > "run-$a.log" 2>&1 || { tail "run-$a.log"; exit 1; }
  grep -o "subword sampling.*of the best" "run-$a.log"
done
