# bench_lib.sh: what the CPU benchmarks of one corpus share, sourced after
# `set -euo pipefail` (bench_act_cpu.sh, bench_pp_cpu.sh):
#   $root                the checkout
#   bench_setup NAME [FLAGS...]
#                        $out = $BENCH_DIR or build/NAME (created); common=()
#                        the flags every run shares (from $corpus, $preset,
#                        $steps, then FLAGS); the corpus cache prepared once
#                        (one step of train_mt), so no run pays for
#                        tokenizer training.
root=$(cd "$(dirname "$0")/.." && pwd)

bench_setup() {
  out=${BENCH_DIR:-$root/build/$1}
  shift
  mkdir -p "$out"
  common=(--data "$corpus" --cache-dir "$out/cache" --preset "$preset" --max-steps "$steps" --log-interval "$steps"
          --eval-interval 1000000 --seed 1 "$@")
  "$root/build/train_mt" "${common[@]}" --max-steps 1 > /dev/null
}
