#!/usr/bin/env bash
# Candidate CPU main jobs side by side at equal training time (not a test):
# how docs/cpu-default.md chose `--preset auto` on a CPU.
#   bash scripts/bench_cpu_presets.sh CORPUS_DIR OUT_DIR [NAME ...]
# For each candidate (the table below; NAME picks some), two phases:
#   1. pace: 60 steps, seconds per step over steps 30..60 (after the start-up);
#   2. train: the steps that fit BUDGET_S seconds at that pace (STEPS_<NAME>
#      overrides), the main job's layout (4 ranks, tp 4), metrics every 50
#      steps, dev BLEU at EVALS points; then translate_mt on the test set.
# Steps, not seconds, end each run, so its losses and BLEU do not depend on
# what else the machine ran; its wall time does (quiet machine wanted).
# Writes OUT_DIR/NAME.{jsonl,log,test.ja,score}, OUT_DIR/table.tsv and the
# overlay OUT_DIR/candidates.png (time on the x axis).
set -euo pipefail
corpus=$1 out=$2
shift 2
budget=${BUDGET_S:-275} evals=${EVALS:-6}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD_DIR:-$here/build}
mkdir -p "$out"
V4="--spm-vocab-size 4000 --cache-dir $out/cache-v4000"
V8="--spm-vocab-size 8000 --cache-dir $out/cache-v8000"
CPU="--preset cpu $V4 --tp 1 --dp 4 --batch-tokens 1024"   # the cpu preset's layout, the base of the R runs
declare -A CAND=(
  [A_tiny_v8k_invsqrt]="--preset tiny $V8 --lr 2e-3 --warmup 200 --lr-schedule inv-sqrt"
  [B_tiny_v8k_cos]="--preset tiny $V8 --lr 2e-3 --warmup 200 --lr-schedule cosine"
  [C_tiny_v4k_cos]="--preset tiny $V4 --lr 2e-3 --warmup 200 --lr-schedule cosine"
  [D_d64_v4k_cos]="--preset tiny $V4 --d-model 64 --ffn-hidden-size 256 --lr 2e-3 --warmup 200 --lr-schedule cosine"
  [E_d128_v4k_cos]="--preset tiny $V4 --d-model 128 --ffn-hidden-size 512 --lr 1e-3 --warmup 100 --lr-schedule cosine"
  [F_d64_v4k_cos_dp4]="--preset tiny $V4 --d-model 64 --ffn-hidden-size 256 --lr 2e-3 --warmup 200 --lr-schedule cosine --tp 1 --dp 4 --batch-tokens 1024"
  [G_d128_v4k_cos_dp4]="--preset tiny $V4 --d-model 128 --ffn-hidden-size 512 --lr 2e-3 --warmup 100 --lr-schedule cosine --tp 1 --dp 4 --batch-tokens 1024"
  [P_cpu_preset]="$CPU"
  [R1_cpu_dropout01]="$CPU --dropout 0.1"
  [R2_cpu_ls0]="$CPU --label-smoothing 0"
  [R3_cpu_wd01]="$CPU --weight-decay 0.1"
  [R4_cpu_lr3e3]="$CPU --lr 3e-3"
  [H_d96_v4k_cos]="--preset tiny $V4 --d-model 96 --ffn-hidden-size 384 --lr 2e-3 --warmup 150 --lr-schedule cosine"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=($(printf '%s\n' "${!CAND[@]}" | sort))
for n in "${names[@]}"; do
  [ -n "${CAND[$n]:-}" ] || { echo "bench_cpu_presets: unknown candidate '$n' (known: ${!CAND[*]})" >&2; exit 2; }
done
train() {  # $1 name, $2 steps, $3 eval interval, $4 metrics file, rest: flags
  local n=$1 steps=$2 ev=$3 m=$4
  shift 4
  "$bin/tprun" --nproc_per_node=4 train_mt --data "$corpus" --seed 1 --max-steps "$steps" --eval-interval "$ev" \
    --log-interval 50 --metrics "$m" "$@" > "$out/$n.log" 2>&1 ||
    { echo "bench_cpu_presets: $n failed:" >&2; tail -n 20 "$out/$n.log" >&2; exit 1; }
}
printf 'name\tsteps\ts_per_step\ttraining_s\tdev_bleu\ttest_bleu\ttest_chrf\tflags\n' > "$out/table.tsv"
# Every candidate's pace first, back to back, so a busy moment later cannot
# skew one candidate's step count.
declare -A PACE
for n in "${names[@]}"; do
  # shellcheck disable=SC2086
  train "$n" 60 1000000 "$out/$n.pace.jsonl" ${CAND[$n]} --log-interval 30
  PACE[$n]=$(/usr/bin/python3 -c "
import json, sys
e = {r['step']: r['elapsed_s'] for r in map(json.loads, open(sys.argv[1])) if 'loss' in r}
print(f'{(e[60] - e[30]) / 30:.4f}')" "$out/$n.pace.jsonl")
  echo "bench_cpu_presets: $n: ${PACE[$n]} s per step"
done
for n in "${names[@]}"; do
  pace=${PACE[$n]}
  var="STEPS_$n"
  steps=${!var:-$(/usr/bin/python3 -c "print(max(1, int($budget / $pace)))")}
  ev=$(( steps / evals > 0 ? steps / evals : 1 ))
  rm -rf "$out/$n"
  # shellcheck disable=SC2086
  train "$n" "$steps" "$ev" "$out/$n.jsonl" ${CAND[$n]} --save "$out/$n"
  "$bin/translate_mt" --model "$out/$n" --src "$corpus/test.en" --ref "$corpus/test.ja" \
    > "$out/$n.test.ja" 2> "$out/$n.score"
  /usr/bin/python3 - "$out" "$n" "$steps" "$pace" "${CAND[$n]}" >> "$out/table.tsv" <<'PY'
import json, re, sys
out, n, steps, pace, flags = sys.argv[1:]
recs = [json.loads(l) for l in open(f"{out}/{n}.jsonl")]
dev = [r["dev_bleu"] for r in recs if "dev_bleu" in r]
train_s = re.search(r"\(([0-9.]+) s training", open(f"{out}/{n}.log").read()).group(1)
score = open(f"{out}/{n}.score").read()
bleu = re.search(r"BLEU = ([0-9.]+)", score).group(1)
chrf = re.search(r"chrF2 = ([0-9.]+)", score).group(1)
flags = re.sub(r"--cache-dir \S+ ?", "", flags).strip()
print(f"{n}\t{steps}\t{pace}\t{train_s}\t{dev[-1]:.2f}\t{bleu}\t{chrf}\t{flags}")
PY
  tail -n 1 "$out/table.tsv"
done
runs=() labels=()
for n in "${names[@]}"; do runs+=("$out/$n.jsonl"); labels+=(--label "$n"); done
/usr/bin/python3 "$here/scripts/plot_metrics.py" "${runs[@]}" "${labels[@]}" --x time \
  --title "CPU main-job candidates at equal training time" -o "$out/candidates.png" > /dev/null
echo "bench_cpu_presets: $out/table.tsv, $out/candidates.png"
