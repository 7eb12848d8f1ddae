#!/usr/bin/env bash
# Scores a finished training run on the test set the way a user should:
# every choice made on dev, none on test. Shared by the main job
# (run_main.sh) and the recipe sweep (sweep_recipe.sh).
#
#   score_run.sh RUN_DIR METRICS_JSONL CORPUS SRC TGT OUT_PREFIX
#
# 1. The checkpoint: RUN_DIR/averaged when its dev BLEU (the run's record
#    "averaged") beats the best single checkpoint's, else RUN_DIR/best
#    (--keep-best), else RUN_DIR itself (its newest checkpoint). Both dev
#    figures are printed.
# 2. The length penalty: the dev set translated with the beam at each of
#    SCORE_LENPENS (default "0.6 1.0 1.4"); the highest dev BLEU wins (the
#    first listed among equals). One value skips the dev passes.
# 3. The test set translated with the chosen checkpoint and length penalty:
#    OUT_PREFIX.test.TGT (plain text), OUT_PREFIX.test.log (BLEU, chrF2).
# The last line: "score_run: test BLEU B chrF2 C (CHECKPOINT, beam K,
# lenpen A)". Environment: SCORE_BIN (folder of translate_mt, default
# build), SCORE_BEAM (5), SCORE_LENPENS, SCORE_DEVICE (auto).
set -euo pipefail
[ $# -eq 6 ] || { echo "score_run: usage: score_run.sh RUN_DIR METRICS_JSONL CORPUS SRC TGT OUT_PREFIX" >&2; exit 2; }
run=$1 metrics=$2 corpus=$3 src=$4 tgt=$5 prefix=$6
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${SCORE_BIN:-$root/build}
beam=${SCORE_BEAM:-5}
read -r -a lenpens <<< "${SCORE_LENPENS:-0.6 1.0 1.4}"
[ "${#lenpens[@]}" -gt 0 ] || { echo "score_run: SCORE_LENPENS is empty" >&2; exit 2; }
[ -x "$bin/translate_mt" ] || { echo "score_run: no $bin/translate_mt (set SCORE_BIN)" >&2; exit 2; }
[ -d "$run" ] || { echo "score_run: $run: no such run folder" >&2; exit 2; }
[ -s "$metrics" ] || { echo "score_run: $metrics: no metrics" >&2; exit 2; }
for f in "dev.$src" "dev.$tgt" "test.$src" "test.$tgt"; do
  [ -s "$corpus/$f" ] || { echo "score_run: $corpus/$f: missing or empty" >&2; exit 2; }
done
py=/usr/bin/python3
[ -x "$py" ] || py=python3
above() { "$py" -c 'import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))' "$1" "$2"; }  # A > B

# 1. best or averaged, by dev BLEU ("-" where the run has no such checkpoint or figure)
read -r best_dev avg_dev < <("$py" - "$metrics" <<'PY'
import json, sys
recs = []
for n, line in enumerate(open(sys.argv[1]), 1):
    if line.strip():
        try:
            recs.append(json.loads(line))
        except ValueError as e:
            sys.exit(f"score_run: {sys.argv[1]}:{n}: not JSON ({e})")
avg = [r for r in recs if "averaged" in r]
single = [r["dev_bleu"] for r in recs if "dev_bleu" in r and "averaged" not in r]
best = avg[-1].get("best_single_dev_bleu") if avg else (max(single) if single else None)
av = avg[-1].get("dev_bleu") if avg else None
fmt = lambda v: "-" if v is None else f"{v:.2f}"
print(fmt(best), fmt(av))
PY
)
model=$run which=newest
[ -e "$run/best" ] && model=$run/best which=best
if [ -d "$run/averaged" ] && [ "$avg_dev" != - ] &&
   { [ "$best_dev" = - ] || above "$avg_dev" "$best_dev"; }; then
  model=$run/averaged which=averaged
fi
echo "score_run: dev BLEU: best single checkpoint $best_dev, averaged $avg_dev: the $which checkpoint ($model)"

# 2. the length penalty on dev
# translate_mt's lines on stderr: "BLEU = 39.49 ..." and "chrF2 = 38.53 ..."
figure_of() { sed -n "s/^$1 = \([0-9.]*\).*/\1/p" "$2" | head -n 1; }
lenpen=${lenpens[0]}
if [ "${#lenpens[@]}" -gt 1 ]; then
  best_lp_bleu=-1 line=""
  for lp in "${lenpens[@]}"; do
    "$bin/translate_mt" --model "$model" --device "${SCORE_DEVICE:-auto}" --beam "$beam" --lenpen "$lp" \
      --src "$corpus/dev.$src" --ref "$corpus/dev.$tgt" > "$prefix.dev.lp$lp.$tgt" 2> "$prefix.dev.lp$lp.log" ||
      { cat "$prefix.dev.lp$lp.log" >&2; echo "score_run: translating the dev set failed" >&2; exit 1; }
    b=$(figure_of BLEU "$prefix.dev.lp$lp.log")
    [ -n "$b" ] || { cat "$prefix.dev.lp$lp.log" >&2; echo "score_run: no BLEU in $prefix.dev.lp$lp.log" >&2; exit 1; }
    line+=" $lp: $b"
    if above "$b" "$best_lp_bleu"; then
      best_lp_bleu=$b lenpen=$lp
    fi
  done
  echo "score_run: dev BLEU by length penalty (beam $beam):$line: lenpen $lenpen"
fi

# 3. the test set
"$bin/translate_mt" --model "$model" --device "${SCORE_DEVICE:-auto}" --beam "$beam" --lenpen "$lenpen" \
  --src "$corpus/test.$src" --ref "$corpus/test.$tgt" > "$prefix.test.$tgt" 2> "$prefix.test.log" ||
  { cat "$prefix.test.log" >&2; echo "score_run: translating the test set failed" >&2; exit 1; }
bleu=$(figure_of BLEU "$prefix.test.log") chrf=$(figure_of chrF2 "$prefix.test.log")
[ -n "$bleu" ] || { cat "$prefix.test.log" >&2; echo "score_run: no BLEU in $prefix.test.log" >&2; exit 1; }
echo "score_run: test BLEU $bleu chrF2 ${chrf:--} ($which checkpoint, beam $beam, lenpen $lenpen)"
