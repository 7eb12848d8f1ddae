#!/usr/bin/env bash
# scripts/run_main.sh's choice of ranks and layout (RUN_MAIN_DRY_RUN=1: the
# choice and the command, nothing run), with a stand-in nvidia-smi first on
# PATH: no GPU keeps the CPU's 4 data-parallel ranks; 1 and 4 GPUs give one
# rank per GPU (tprun --nproc_per_node=gpu) and the planner's layout
# (--layout auto); CUDA_VISIBLE_DEVICES narrows the count; --direction ja-en
# among the extra flags saves to checkpoints/jaen. On a GPU the run is the
# measured recipe, bounded by time with its best checkpoint kept
# (RUN_MAIN_MINUTES, RUN_MAIN_EVAL change the bound and the interval), and
# the extra flags come after it, so a user's own win; on the CPU none of it.
# Usage: test_run_main.sh RUN_MAIN_SH
set -uo pipefail
script=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# a folder holding the corpus's first file (run_main refuses a given path without it)
corpus=$work/corpus
mkdir -p "$corpus" && echo "a sentence ." > "$corpus/train.en"
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
smi() {  # smi N: a stand-in nvidia-smi listing N GPUs (0: failing, as without a driver)
  mkdir -p "$work/bin$1"
  if [ "$1" = 0 ]; then
    printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"\nexit 9\n'
  else
    printf '#!/bin/sh\ni=0\nwhile [ $i -lt %s ]; do echo "GPU $i: Stand-in H100 (UUID: GPU-$i)"; i=$((i+1)); done\n' "$1"
  fi > "$work/bin$1/nvidia-smi"
  chmod +x "$work/bin$1/nvidia-smi"
  echo "$work/bin$1"
}
# choice NAME N_GPUS [ENV...]: run_main's output in $work/NAME.out
choice() {
  local name=$1 bin
  bin=$(smi "$2")
  shift 2
  env -u CUDA_VISIBLE_DEVICES PATH="$bin:$PATH" RUN_MAIN_DRY_RUN=1 "$@" bash "$script" "$corpus" --max-steps 5 \
    > "$work/$name.out" 2>&1 || bad "$name: exit $?: $(cat "$work/$name.out")"
}
has() { if grep -qF -- "$3" "$work/$2.out"; then ok "$1"; else bad "$1: no '$3' in: $(cat "$work/$2.out")"; fi; }
choice cpu 0
has "no GPU: the CPU's 4 ranks" cpu "run_main: no GPU visible (nvidia-smi -L): 4 ranks on the CPU"
has "no GPU: today's command" cpu "./build/tprun --nproc_per_node=4 ./build/train_mt --data $corpus --log-interval 100 --tp 1 --dp 4 --batch-tokens 1024"
has "no GPU: extra flags passed on" cpu "--save checkpoints/enja --max-steps 5"
choice one 1
has "1 GPU: counted" one "run_main: 1 GPU(s) visible (nvidia-smi -L): one rank per GPU"
has "1 GPU: one rank per GPU, the planner's layout" one "./build/tprun --nproc_per_node=gpu ./build/train_mt --data $corpus --log-interval 100 --layout auto --length-bucket 8"
if grep -q -- "--nproc_per_node=4" "$work/one.out"; then bad "1 GPU: still 4 ranks"; else ok "1 GPU: not 4 ranks"; fi
has "1 GPU: bounded by 10 minutes, the best and the averaged checkpoints kept" one \
  "--batch-tokens 4096 --max-steps 1000000 --max-minutes 10 --eval-interval 500 --save-interval 500 --keep-last 3 --keep-best bleu --average-last 3 --metrics"
has "1 GPU: the extra flags after the recipe" one "--save checkpoints/enja --max-steps 5"
has "1 GPU: says why" one "run_main: the recipe measured best on a GPU (docs/quality.md)"
has "1 GPU: the choice on dev announced" one "chosen on the dev set, and the test set scored with them"
choice short 1 RUN_MAIN_MINUTES=3 RUN_MAIN_EVAL=250
has "RUN_MAIN_MINUTES=3 RUN_MAIN_EVAL=250" short "--max-minutes 3 --eval-interval 250 --save-interval 250"
if grep -qE -- "--max-minutes|--keep-best" "$work/cpu.out"; then bad "no GPU: the GPU's bound and keep-best"; else ok "no GPU: the cpu preset's own length"; fi
choice four 4
has "4 GPUs: counted" four "run_main: 4 GPU(s) visible"
has "4 GPUs: one rank per GPU" four "tprun --nproc_per_node=gpu ./build/train_mt"
choice bundle 1 RUN_MAIN_BIN=/opt/b RUN_MAIN_OUT=/tmp/o
has "RUN_MAIN_BIN, RUN_MAIN_OUT: the programs and the folder given" bundle \
  "/opt/b/tprun --nproc_per_node=gpu /opt/b/train_mt --data"
has "RUN_MAIN_OUT: the model's folder" bundle "--metrics /tmp/o/enja.jsonl --save /tmp/o/enja"
choice cvd 4 CUDA_VISIBLE_DEVICES=1,3
has "CUDA_VISIBLE_DEVICES=1,3 of 4: two GPUs" cvd "run_main: 2 GPU(s) visible (nvidia-smi -L, CUDA_VISIBLE_DEVICES=1,3)"
choice hidden 4 CUDA_VISIBLE_DEVICES=
has "CUDA_VISIBLE_DEVICES empty: the CPU choice" hidden "run_main: no GPU visible (nvidia-smi -L, CUDA_VISIBLE_DEVICES=): 4 ranks"
# --direction among the extra flags: the model's folder and the test set's sides follow it.
has "en-ja by default: checkpoints/enja" cpu "--metrics checkpoints/enja.jsonl --save checkpoints/enja"
for form in "--direction ja-en" "--direction=ja-en"; do
  env -u CUDA_VISIBLE_DEVICES PATH="$(smi 0):$PATH" RUN_MAIN_DRY_RUN=1 bash "$script" "$corpus" $form --max-steps 5 \
    > "$work/jaen.out" 2>&1 || bad "$form: exit $?: $(cat "$work/jaen.out")"
  has "$form: direction ja->en" jaen "run_main: direction ja->en: the model and its curves in checkpoints/jaen"
  has "$form: saved to checkpoints/jaen" jaen "--metrics checkpoints/jaen.jsonl --save checkpoints/jaen $form --max-steps 5"
done
[ "$fails" -eq 0 ] || { echo "test_run_main: $fails failed"; exit 1; }
echo "test_run_main: all passed"
