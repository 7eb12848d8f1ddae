#!/usr/bin/env bash
# scripts/sweep_recipe.sh end to end on the CPU at the tiny size: two
# candidates side by side on the corpus, each bounded by --max-minutes
# (SWEEP_MINUTES) and here by 12 steps (SWEEP_STEPS), the table ranks them by the best dev loss each reached,
# wherever it reached it (SWEEP_METRIC=loss: a few tiny steps give no BLEU
# to rank by; checked against their metrics files), the winner trains alone
# under --max-minutes, keeps the best and the averaged checkpoint, and
# scripts/score_run.sh scores the test set with whichever had the higher
# dev BLEU and the length penalty best on dev; then the same in two
# commands (SWEEP_WINNER). The figures prove the harness, not a recipe.
#   test_sweep_recipe.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
corpus=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
. "$here/corpus_cache.sh"
mkdir -p sw
use_corpus_cache sw/cache
printf '%s\n' "# two recipes" "calm --dropout 0 --lr 2e-3" "eager --dropout 0.1 --lr 5e-3" > cands.txt
SWEEP_BIN=$build SWEEP_DEVICE=cpu SWEEP_PRESET=tiny SWEEP_CANDIDATES=cands.txt SWEEP_MINUTES=5 SWEEP_STEPS=12 \
  SWEEP_FLAGS="--spm-vocab-size 2000 --batch-tokens 512 --warmup 4" SWEEP_WINNER_MINUTES=0.05 SWEEP_AVERAGE=2 \
  SWEEP_EVAL=6 SWEEP_BEAM=2 SWEEP_LENPENS="0.6 1.0" SWEEP_METRIC=loss bash "$here/../scripts/sweep_recipe.sh" "$corpus" sw \
  > sweep.log 2>&1 ||
  { tail -n 30 sweep.log; fail "sweep_recipe.sh failed"; }
/usr/bin/python3 - sw <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/sweep.jsonl")]
assert [r["name"] for r in rows] == ["calm", "eager"], rows
for r in rows:
    recs = [json.loads(l) for l in open(f"{out}/{r['name']}.jsonl")]
    loss = {x["step"]: x["dev_loss"] for x in recs if "dev_loss" in x and "averaged" not in x}
    assert sorted(loss) == [6, 12] and r["metric"] == "dev_loss", (r["name"], loss)
    assert r["best"] == min(loss.values()) and loss[r["best_step"]] == r["best"], (r, loss)
    assert r["last"] == loss[max(loss)], (r, loss)
    assert r["steps"] == max(x["step"] for x in recs if "step" in x and "averaged" not in x), r
table = open(f"{out}/sweep.md").read().splitlines()
ranked = sorted(rows, key=lambda r: r["best"])  # dev loss: the lowest first
assert ranked[0]["best"] < ranked[1]["best"], "the two recipes tie: the ranking is not exercised"
assert table[2].startswith(f"| 1 | {ranked[0]['name']} |") and table[3].startswith(f"| 2 | {ranked[1]['name']} |"), table
print(f"table: {ranked[0]['name']} (dev loss {ranked[0]['best']:.4f}) ahead of {ranked[1]['name']} ({ranked[1]['best']:.4f})")
PY
winner=$(sed -n 's/^sweep_recipe: winner \([^:]*\):.*/\1/p' sweep.log)
[ -n "$winner" ] || fail "no winner line"
grep -q "^sweep_recipe: 2 candidates side by side, 5 minutes (at most 12 steps) each" sweep.log ||
  fail "the comparison was not bounded by time"
line=$(grep "^sweep_recipe: en-ja: $winner for 0.05 min: test BLEU [0-9.]* chrF2 [0-9.]* (\(best\|averaged\) checkpoint, beam 2, lenpen \(0.6\|1.0\))" sweep.log) ||
  { tail sweep.log; fail "no test-set line for the winner"; }
grep -q "^sweep_recipe: en-ja: dev BLEU by length penalty (beam 2): 0.6: [0-9.]* 1.0: [0-9.]*: lenpen" sweep.log ||
  fail "no length penalty chosen on dev"
[[ -d sw/winner-en-ja/averaged && -e sw/winner-en-ja/best ]] || fail "the winner kept no best or averaged checkpoint"
# the checkpoint scored is the one with the higher dev BLEU
/usr/bin/python3 - sw/winner-en-ja.jsonl "$line" <<'PY'
import json, re, sys
avg = [json.loads(l) for l in open(sys.argv[1]) if "averaged" in json.loads(l)][-1]
which = re.search(r"\((best|averaged) checkpoint", sys.argv[2]).group(1)
want = "averaged" if avg["dev_bleu"] > avg["best_single_dev_bleu"] else "best"
assert which == want, (which, avg)
print(f"scored the {which} checkpoint: averaged dev BLEU {avg['dev_bleu']:.2f}, best single {avg['best_single_dev_bleu']:.2f}")
PY
# The comparison and the winner in two commands (SWEEP_WINNER): the named
# candidate, here the runner-up, trains alone with no comparison run; a
# name that is not a candidate is refused before anything runs.
other=$(sed -n '4s/^| 2 | \([^ ]*\) |.*/\1/p' sw/sweep.md)
[ -n "$other" ] && [ "$other" != "$winner" ] || fail "no runner-up in sw/sweep.md"
sweep2() {
  SWEEP_BIN=$build SWEEP_DEVICE=cpu SWEEP_PRESET=tiny SWEEP_CANDIDATES=cands.txt SWEEP_EVAL=6 \
    SWEEP_FLAGS="--spm-vocab-size 2000 --batch-tokens 512 --warmup 4" SWEEP_WINNER_MINUTES=0.05 SWEEP_AVERAGE=2 \
    SWEEP_BEAM=0 SWEEP_WINNER=$1 bash "$here/../scripts/sweep_recipe.sh" "$corpus" sw2
}
rc=0
sweep2 nosuch > bad.log 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "SWEEP_WINNER=nosuch is not a candidate" bad.log || { cat bad.log; fail "an unknown SWEEP_WINNER: exit $rc"; }
[ ! -e sw2/winner-en-ja ] || fail "an unknown SWEEP_WINNER trained"
mkdir -p sw2 && mv sw/cache sw2/cache  # the tokenizer the first command made
sweep2 "$other" > sweep2.log 2>&1 || { tail -n 30 sweep2.log; fail "sweep_recipe.sh with SWEEP_WINNER failed"; }
grep -q "^sweep_recipe: no comparison (SWEEP_WINNER): $other alone" sweep2.log || fail "no 'no comparison' line"
[ ! -e sw2/sweep.md ] && [ ! -e "sw2/$winner.jsonl" ] || fail "SWEEP_WINNER still ran the comparison"
grep -q "^sweep_recipe: en-ja: $other for 0.05 min: test BLEU [0-9.]* chrF2 [0-9.]* (\(best\|averaged\) checkpoint" sweep2.log ||
  { tail sweep2.log; fail "no test-set line for SWEEP_WINNER=$other"; }
echo "SWEEP_WINNER: $other trained alone and scored; an unknown name refused"
echo "test_sweep_recipe: ok"
