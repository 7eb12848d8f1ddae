#!/usr/bin/env bash
# scripts/score_run.sh's choices, every one made on dev, with a stand-in
# translate_mt whose BLEU is a table of (checkpoint, lenpen, split), so each
# choice has one right answer:
#  - the averaged checkpoint when its dev BLEU (the metrics' "averaged"
#    record) beats the best single one's, the best otherwise, the newest
#    (the run folder) when the run kept neither;
#  - the length penalty with the highest dev BLEU (the first among equals),
#    no dev pass for a single value;
#  - the test set translated once, with those two, and its BLEU and chrF2
#    on the last line; never a test figure used to choose;
#  - a failed translation, a metrics line that is not JSON, a missing split:
#    a non-zero exit naming it.
# Usage: test_score_run.sh SCORE_RUN_SH
set -uo pipefail
script=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

corpus=$work/corpus
mkdir -p "$corpus" "$work/bin"
for f in dev.en dev.ja test.en test.ja; do echo "line of $f" > "$corpus/$f"; done
# The stand-in: BLEU from $TABLE's line "CHECKPOINT LENPEN SPLIT BLEU" (CHECKPOINT the model folder's
# name), each call logged as "CHECKPOINT LENPEN SPLIT BEAM"; FAIL_ON=SPLIT makes that split's call fail.
cat > "$work/bin/translate_mt" <<'EOF'
#!/usr/bin/env bash
model= lp= src= beam=
while [ $# -gt 0 ]; do
  case $1 in --model) model=$2 ;; --lenpen) lp=$2 ;; --src) src=$2 ;; --beam) beam=$2 ;; esac
  shift 2
done
split=$(basename "$src"); split=${split%%.*}
name=$(basename "$model")
echo "$name $lp $split $beam" >> "$CALLS"
[ "${FAIL_ON:-}" != "$split" ] || { echo "translate_mt: out of memory" >&2; exit 1; }
b=$(awk -v m="$name" -v l="$lp" -v s="$split" '$1 == m && $2 == l && $3 == s { print $4 }' "$TABLE")
echo "a translation"
echo "BLEU = ${b:-1.00} 50.0/30.0/20.0/10.0 (BP = 1.000, hyp_len = 10, ref_len = 10)" >&2
echo "chrF2 = 33.33 (character 1..6-grams: P = 40.0, R = 30.0)" >&2
EOF
chmod +x "$work/bin/translate_mt"
export SCORE_BIN=$work/bin TABLE=$work/table CALLS=$work/calls
cat > "$TABLE" <<'EOF'
averaged 0.6 dev 30.00
averaged 1.0 dev 32.50
averaged 1.4 dev 31.00
averaged 1.0 test 35.25
averaged 0.6 test 99.00
best 0.6 dev 33.00
best 1.0 dev 33.00
best 1.4 dev 20.00
best 0.6 test 34.75
best 1.0 test 98.00
run 1.2 test 27.50
EOF
# run NAME KEPT METRICS [ENV...]: a run folder "run" with the checkpoints KEPT (best, averaged), the metrics
# given, and score_run's output in $work/NAME.out, its exit code in $work/NAME.rc
run() {
  local name=$1 kept=$2 metrics=$3
  shift 3
  rm -rf "$work/run" "$CALLS" && mkdir -p "$work/run"
  for k in $kept; do mkdir -p "$work/run/$k"; done
  printf '%s\n' "$metrics" > "$work/m.jsonl"
  env "$@" bash "$script" "$work/run" "$work/m.jsonl" "$corpus" en ja "$work/out-$name" > "$work/$name.out" 2>&1
  echo $? > "$work/$name.rc"
}
has() { if grep -qF -- "$3" "$work/$2.out"; then ok "$1"; else bad "$1: no '$3' in: $(cat "$work/$2.out")"; fi; }
called() { if grep -qxF -- "$3" "$CALLS"; then ok "$1"; else bad "$1: no call '$3' in: $(cat "$CALLS")"; fi; }
rc() { if [ "$(cat "$work/$2.rc")" = "$3" ]; then ok "$1"; else bad "$1: exit $(cat "$work/$2.rc"), want $3: $(cat "$work/$2.out")"; fi; }

m_avg='{"step": 500, "dev_bleu": 40.0}
{"step": 1000, "dev_bleu": 39.0}
{"step": 1000, "averaged": 3, "dev_bleu": 41.5, "best_single_dev_bleu": 40.0}'
run avg "best averaged" "$m_avg"
rc "averaged better on dev: succeeds" avg 0
has "averaged better on dev: both dev figures printed" avg "dev BLEU: best single checkpoint 40.00, averaged 41.50: the averaged checkpoint"
has "averaged: lenpen 1.0 the best on dev" avg "dev BLEU by length penalty (beam 5): 0.6: 30.00 1.0: 32.50 1.4: 31.00: lenpen 1.0"
called "averaged: the test set with the averaged checkpoint, lenpen 1.0" avg "averaged 1.0 test 5"
has "averaged: its test figures on the last line" avg "score_run: test BLEU 35.25 chrF2 33.33 (averaged checkpoint, beam 5, lenpen 1.0)"
[ "$(grep -c ' test ' "$CALLS")" = 1 ] && ok "averaged: the test set translated once" || bad "test set translated $(grep -c ' test ' "$CALLS") times"
[ -s "$work/out-avg.test.ja" ] && ok "the translations kept" || bad "no $work/out-avg.test.ja"

m_best='{"step": 500, "dev_bleu": 40.0}
{"step": 1000, "averaged": 3, "dev_bleu": 39.9, "best_single_dev_bleu": 40.0}'
run best "best averaged" "$m_best"
has "best better on dev: the best checkpoint" best "averaged 39.90: the best checkpoint"
has "best: equal dev figures keep the first length penalty" best ": lenpen 0.6"
has "best: the test figure of best at 0.6, not the higher one at 1.0" best "score_run: test BLEU 34.75"

run noavg "best" '{"step": 500, "dev_bleu": 40.0}'
has "no averaged record: the best checkpoint, averaged shown as -" noavg "best single checkpoint 40.00, averaged -: the best checkpoint"

run newest "" '{"step": 500, "dev_loss": 3.0}' SCORE_LENPENS=1.2 SCORE_BEAM=4
rc "neither kept: succeeds" newest 0
has "neither kept: the newest checkpoint" newest "the newest checkpoint ($work/run)"
if grep -q ' dev ' "$CALLS"; then bad "one length penalty: dev still translated"; else ok "one length penalty: no dev pass"; fi
called "the beam and lenpen passed on" newest "run 1.2 test 4"
has "neither kept: its test figure" newest "score_run: test BLEU 27.50"

run fail "best averaged" "$m_avg" FAIL_ON=test
rc "a failed translation: exit 1" fail 1
has "a failed translation: named, with its error" fail "translating the test set failed"
has "a failed translation: translate_mt's own line shown" fail "out of memory"

run badjson "best" '{"step": 500, "dev_bleu": 40.0}
{"step": 1000, "dev_bleu"'
if [ "$(cat "$work/badjson.rc")" != 0 ]; then ok "a broken metrics line: refused"; else bad "a broken metrics line: exit 0"; fi
has "a broken metrics line: named with its line" badjson "m.jsonl:2: not JSON"

rm "$corpus/dev.ja"
run nodev "best" '{"step": 500, "dev_bleu": 40.0}'
rc "a missing split: exit 2" nodev 2
has "a missing split: named" nodev "$corpus/dev.ja: missing or empty"

[ "$fails" -eq 0 ] || { echo "test_score_run: $fails failed"; exit 1; }
echo "test_score_run: all passed"
