#!/usr/bin/env bash
# The data pipeline at scale: makes a corpus of N training pairs from any
# corpus folder (scripts/make_corpus.py: the training pairs repeated, two
# words swapped in every copy so no line repeats), then times, side by side
# in one run:
#   cold  one rank from an empty cache: validation, the tokenizer (trained
#         on --spm-sample sentences), encoding on every core; wall time,
#         start-up phases and peak RSS (/usr/bin/time);
#   warm  RANKS ranks (tprun) on the cache just made, twice: the start-up
#         to the first step as rank 0 reports it, and the whole job's wall
#         time. The first start after a build checks the new token files
#         whole (and reads text that changed within a second of being read);
#         the second is every later start.
#   bash scripts/bench_data.sh CORPUS_DIR N [N...]
# Env: RANKS (4), BENCH_DIR (bench-data/), PRESET (cpu), SPM_SAMPLE (the
# default), KEEP=1 keeps the made corpora and caches.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: bench_data.sh CORPUS_DIR N [N...]}
shift
[ $# -gt 0 ] || { echo "bench_data: give at least one corpus size"; exit 2; }
ranks=${RANKS:-4}
out=${BENCH_DIR:-bench-data}
build=${BUILD_DIR:-build}
[ -x "$build/train_mt" ] && [ -x "$build/tprun" ] || { echo "bench_data: build first (scripts/build.sh)"; exit 2; }
mkdir -p "$out"
extra=()
[ -n "${SPM_SAMPLE:-}" ] && extra+=(--spm-sample "$SPM_SAMPLE")
printf '%-10s | %8s %8s %8s %9s %9s | %8s %8s %8s\n' pairs cold_s spm_s encode_s pieces/s rss_MiB warm1_s warm2_s job2_s
for n in "$@"; do
  corpus="$out/corpus-$n"
  cache="$out/cache-$n"
  if [ ! -s "$corpus/train.ja" ] || [ "$(wc -l < "$corpus/train.ja")" -ne "$n" ]; then
    /usr/bin/python3 scripts/make_corpus.py "$src" "$corpus" "$n"
  fi
  rm -rf "$cache"
  log="$out/cold-$n.log"
  /usr/bin/time -f 'bench_data: wall %e s, peak RSS %M KiB' "$build/train_mt" --preset "${PRESET:-cpu}" \
    --data "$corpus" --cache-dir "$cache" --max-steps 1 --eval-interval 0 "${extra[@]}" > "$log" 2>&1 ||
    { tail -5 "$log"; exit 1; }
  cold=$(sed -n 's/^bench_data: wall \([0-9.]*\) s.*/\1/p' "$log")
  rss=$(sed -n 's/.*peak RSS \([0-9]*\) KiB/\1/p' "$log")
  spm=$(sed -n 's/^corpus: wrote .*spm.model in \([0-9.]*\) s/\1/p' "$log")
  enc=$(sed -n 's/^corpus: train: encoded .* in \([0-9.]*\) s on.*/\1/p' "$log")
  pieces=$(sed -n 's/^corpus: train: encoded [0-9]* pairs (\([0-9]*\) en + \([0-9]*\) ja pieces).*/\1 \2/p' "$log")
  pps=$(awk -v p="$pieces" -v t="$enc" 'BEGIN { split(p, a, " "); printf "%.0f", (a[1] + a[2]) / t }')
  warm=()
  for k in 1 2; do
    wlog="$out/warm$k-$n.log"
    start=$(date +%s.%N)
    "$build/tprun" --nproc_per_node="$ranks" "$build/train_mt" --preset "${PRESET:-cpu}" --data "$corpus" \
      --cache-dir "$cache" --dp "$ranks" --max-steps 1 --eval-interval 0 "${extra[@]}" > "$wlog" 2>&1 ||
      { tail -5 "$wlog"; exit 1; }
    job=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    warm+=("$(sed -n 's/^\(\[rank 0\] \)\{0,1\}train_mt: start-up \([0-9.]*\) s.*/\2/p' "$wlog" | head -1)")
  done
  printf '%-10s | %8s %8s %8s %9s %9.0f | %8s %8s %8s\n' "$n" "$cold" "$spm" "$enc" "$pps" "$((rss / 1024))" \
    "${warm[0]}" "${warm[1]}" "$job"
  grep -h 'train_mt: start-up' "$log" "$out/warm1-$n.log" "$out/warm2-$n.log" | sed 's/^/    /'
  [ "${KEEP:-0}" = 1 ] || rm -rf "$cache"
done
