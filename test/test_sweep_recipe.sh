#!/usr/bin/env bash
# scripts/sweep_recipe.sh end to end on the CPU at the tiny size: two
# candidates side by side on the corpus, the table ranks them by their best
# dev loss at the steps both reached (SWEEP_METRIC=loss: 12 tiny steps give
# no BLEU to rank by; checked against their metrics files),
# the winner trains alone under --max-minutes, keeps the best and the
# averaged checkpoint, and the test set is scored with whichever had the
# higher dev BLEU. The figures prove the harness, not a recipe.
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
SWEEP_BIN=$build SWEEP_DEVICE=cpu SWEEP_PRESET=tiny SWEEP_CANDIDATES=cands.txt SWEEP_STEPS=12 SWEEP_EVAL=6 \
  SWEEP_FLAGS="--spm-vocab-size 2000 --batch-tokens 512 --warmup 4" SWEEP_WINNER_MINUTES=0.05 SWEEP_AVERAGE=2 \
  SWEEP_BEAM=0 SWEEP_METRIC=loss bash "$here/../scripts/sweep_recipe.sh" "$corpus" sw > sweep.log 2>&1 ||
  { tail -n 30 sweep.log; fail "sweep_recipe.sh failed"; }
/usr/bin/python3 - sw <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/sweep.jsonl")]
assert [r["name"] for r in rows] == ["calm", "eager"], rows
for r in rows:
    recs = [json.loads(l) for l in open(f"{out}/{r['name']}.jsonl")]
    bleu = {x["step"]: x["dev_loss"] for x in recs if "dev_loss" in x and "averaged" not in x}
    assert sorted(bleu) == [6, 12] and r["metric"] == "dev_loss", (r["name"], bleu)
    assert r["best"] == min(bleu.values()) and bleu[r["best_step"]] == r["best"], (r, bleu)
    assert r["last"] == bleu[12], (r, bleu)
table = open(f"{out}/sweep.md").read().splitlines()
ranked = sorted(rows, key=lambda r: r["best"])  # dev loss: the lowest first
assert ranked[0]["best"] < ranked[1]["best"], "the two recipes tie: the ranking is not exercised"
assert table[2].startswith(f"| 1 | {ranked[0]['name']} |") and table[3].startswith(f"| 2 | {ranked[1]['name']} |"), table
print(f"table: {ranked[0]['name']} (dev loss {ranked[0]['best']:.4f}) ahead of {ranked[1]['name']} ({ranked[1]['best']:.4f})")
PY
winner=$(sed -n 's/^sweep_recipe: winner \([^:]*\):.*/\1/p' sweep.log)
[ -n "$winner" ] || fail "no winner line"
line=$(grep "^sweep_recipe: en-ja: $winner for 0.05 min: the \(best\|averaged\) checkpoint" sweep.log) ||
  { tail sweep.log; fail "no test-set line for the winner"; }
echo "$line" | grep -q "test BLEU = [0-9.]* .* chrF2 = [0-9.]*" || fail "no BLEU and chrF in: $line"
[[ -d sw/winner-en-ja/averaged && -e sw/winner-en-ja/best ]] || fail "the winner kept no best or averaged checkpoint"
# the checkpoint scored is the one with the higher dev BLEU
/usr/bin/python3 - sw/winner-en-ja.jsonl "$line" <<'PY'
import json, re, sys
avg = [json.loads(l) for l in open(sys.argv[1]) if "averaged" in json.loads(l)][-1]
which = re.search(r"the (best|averaged) checkpoint", sys.argv[2]).group(1)
want = "averaged" if avg["dev_bleu"] > avg["best_single_dev_bleu"] else "best"
assert which == want, (which, avg)
print(f"scored the {which} checkpoint: averaged dev BLEU {avg['dev_bleu']:.2f}, best single {avg['best_single_dev_bleu']:.2f}")
PY
echo "test_sweep_recipe: ok"
