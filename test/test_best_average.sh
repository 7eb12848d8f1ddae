#!/usr/bin/env bash
# The kept best checkpoint, early stopping and checkpoint averaging (tiny
# preset, copy task, a few steps each):
#  1. --keep-best loss --patience 3 --keep-last 1 --save-interval 1 at a
#     learning rate that makes the held-out loss wander: the run must stop at
#     the first evaluation 3 evaluations after the best one (computed here
#     from its own metrics), say so in a line and a metrics record, and save
#     that step; DIR/best must name the best evaluation's step, which
#     survives --keep-last 1, and `ckpt export DIR/best` must work.
#  2. Resuming that run (--patience raised) restores the best figure: the
#     recorded best stays the best over all evaluations before and after; a
#     malformed DIR/best.json is refused naming it.
#  3. Refusals: --patience without --keep-best, --keep-best without an
#     evaluation interval or --save, --keep-best bleu on a --task run.
#  4. Averaging: step 4 saved as tp 2 (two ranks, --keep-best over both),
#     steps 5 and 6 as tp 1; `ckpt average --last 3`, `ckpt average OUT
#     CKPT...` and train_mt --average-last 3 each write a checkpoint whose
#     exported weights equal the mean of the inputs' exactly (float64 sum in
#     order, / 3, rounded to float32); it resumes with --resume.
#  5. On the corpus: --keep-best bleu keeps DIR/best, which translate_mt
#     --model DIR/best loads (the same output as its step directory), and
#     --average-last reports the averaged model's dev BLEU beside the best.
# Usage: test_best_average.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$1 corpus=$2
. "$(dirname "$0")/lib.sh"
enter_workdir
train=$build/train_mt
ckpt=$build/ckpt
# refuse PATTERN ARGS...: train_mt ARGS must exit 2 with one line matching PATTERN.
refuse() {
  local pat=$1; shift
  local rc=0
  "$train" "$@" > refuse.log 2>&1 || rc=$?
  [[ $rc == 2 ]] || { cat refuse.log; fail "expected exit 2 from train_mt $*, got $rc"; }
  [[ $(wc -l < refuse.log) == 1 ]] && grep -q -- "$pat" refuse.log || { cat refuse.log; fail "train_mt $*: want one line matching '$pat'"; }
}
synth=(--preset tiny --task copy --warmup 1 --log-interval 100)

# ---- 1. patience and the best checkpoint under --keep-last 1 --------------------------
wander=("${synth[@]}" --lr 1.0 --eval-interval 2 --save p --keep-last 1 --keep-best loss --save-interval 1)
run p1.log "$train" "${wander[@]}" --max-steps 40 --patience 3 --metrics p.jsonl
/usr/bin/python3 - <<'EOF' || exit 1
import json, os, sys
recs = [json.loads(l) for l in open("p.jsonl")]
evals = [(r["step"], r["dev_loss"]) for r in recs if "dev_loss" in r and "averaged" not in r]
best, best_step, bad, want = None, None, 0, None
for step, loss in evals:
    if best is None or loss < best: best, best_step, bad = loss, step, 0
    else: bad += 1
    if bad >= 3: want = step; break
if want is None: sys.exit("FAIL: the held-out loss never went 3 evaluations without improving; the test proves nothing")
if want >= 40: sys.exit("FAIL: the stop would be the last step anyway")
stop = [r for r in recs if r.get("early_stop")]
if len(stop) != 1 or stop[0]["step"] != want or stop[0]["best_step"] != best_step:
    sys.exit(f"FAIL: early stop record {stop}, want step {want}, best step {best_step}")
if evals[-1][0] != want: sys.exit(f"FAIL: evaluations went on past step {want}: {evals[-1]}")
rec = json.load(open("p/best.json"))
if rec["step"] != best_step or rec["metric"] != "loss": sys.exit(f"FAIL: p/best.json {rec}, want step {best_step}")
if os.readlink("p/best") != "step_%08d" % best_step: sys.exit(f"FAIL: p/best -> {os.readlink('p/best')}")
if open("p/latest").read().strip() != "step_%08d" % want: sys.exit("FAIL: the stop step is not the latest save")
if best_step == want: sys.exit("FAIL: the best is the last step; --keep-last 1 is not tested")
kept = sorted(d for d in os.listdir("p") if d.startswith("step_"))
if kept != ["step_%08d" % best_step, "step_%08d" % want]: sys.exit(f"FAIL: p holds {kept}")
print(f"early stop at step {want}, best step {best_step} kept beside it under --keep-last 1")
EOF
grep -q "train_mt: early stop at step .* dev loss has not improved for 3 evaluations (--patience 3)" p1.log ||
  fail "no early-stop line in p1.log"
run export-best.log "$ckpt" export p/best best-export
test -s best-export/model.safetensors || fail "ckpt export p/best wrote no model"
echo "part 1: --patience 3 stopped at the right evaluation; the best checkpoint survived --keep-last 1"

# ---- 2. a resumed run keeps the recorded best ----------------------------------------------
run p2.log "$train" "${wander[@]}" --max-steps 30 --patience 100 --resume auto --metrics p.jsonl
grep -q "train_mt: best so far: dev loss" p2.log || fail "the resumed run did not restore the best"
/usr/bin/python3 - <<'EOF' || exit 1
import json, sys
evals = [(r["step"], r["dev_loss"]) for r in map(json.loads, open("p.jsonl")) if "dev_loss" in r and "averaged" not in r]
step, loss = min(evals, key=lambda e: (e[1], e[0]))
rec = json.load(open("p/best.json"))
if rec["step"] != step: sys.exit(f"FAIL: after resuming, p/best.json names step {rec['step']}; the best of {evals} is step {step}")
EOF
cp -r p pbad
echo '{"step": "8", "metric": "loss", "value": 1}' > pbad/best.json
rc=0; "$train" "${wander[@]}" --save pbad --max-steps 40 --resume auto > pbad.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "pbad/best.json: not a best-checkpoint record" pbad.log || { cat pbad.log; fail "a malformed best.json"; }
echo "part 2: the resumed run kept the best over all evaluations; a malformed record is refused naming it"

# ---- 3. refusals -------------------------------------------------------------------
refuse "give --keep-best bleu|loss" "${synth[@]}" --max-steps 2 --patience 2
refuse "give --eval-interval N > 0" "${synth[@]}" --max-steps 2 --save r --keep-best loss --eval-interval 0
refuse "give --save DIR" "${synth[@]}" --max-steps 2 --keep-best loss
refuse "a --task run has no dev BLEU" "${synth[@]}" --max-steps 2 --save r --keep-best bleu
refuse "must be bleu or loss" "${synth[@]}" --max-steps 2 --save r --keep-best bleus
refuse "raise --keep-last" "${synth[@]}" --max-steps 2 --save r --average-last 3 --keep-last 2
echo "part 3: refusals"

# ---- 4. averaging across layouts ---------------------------------------------------------
avg=("${synth[@]}" --lr 5e-3 --eval-interval 2 --save a --save-interval 1)
run a1.log "$build/tprun" --standalone --nproc_per_node 2 "$train" "${avg[@]}" --tp 2 --max-steps 4 --keep-best loss
grep -q '"tp":[[:space:]]*2' a/step_00000004/manifest.json || fail "step 4 was not saved as tp 2"
run a2.log "$train" "${avg[@]}" --max-steps 6 --resume auto --average-last 3 --metrics a.jsonl
grep -q "train_mt: averaged the newest 3 checkpoints (steps 4 to 6) into a/averaged: held-out loss" a2.log ||
  fail "no averaging line in a2.log"
grep -q '"averaged": 3' a.jsonl || fail "no averaging record in a.jsonl"
run avg-last.log "$ckpt" average --last 3 a by-last
run avg-named.log "$ckpt" average by-name a/step_00000004 a/step_00000005 a/step_00000006
for d in a/step_00000004 a/step_00000005 a/step_00000006 a/averaged by-last by-name; do
  run "export-${d//\//_}.log" "$ckpt" export "$d" "x-${d//\//_}"
done
run inspect-avg.log "$ckpt" inspect by-last
run resume-avg.log "$train" "${synth[@]}" --lr 5e-3 --eval-interval 0 --max-steps 7 --resume by-last
grep -q "resumed from by-last: step 6" resume-avg.log || fail "the averaged checkpoint did not resume"
/usr/bin/python3 - <<'EOF' || exit 1
import json, struct, sys
import numpy as np
def load(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return out
ins = [load("x-a_step_0000000%d" % s) for s in (4, 5, 6)]
for name in ("x-a_averaged", "x-by-last", "x-by-name"):
    got = load(name)
    if set(got) != set(ins[0]): sys.exit(f"FAIL: {name} holds other tensors")
    for k in got:
        want = ((ins[0][k].astype(np.float64) + ins[1][k] + ins[2][k]) / 3).astype(np.float32)
        if not np.array_equal(got[k], want): sys.exit(f"FAIL: {name} {k}: not the mean of its inputs")
    if all(np.array_equal(got[k], ins[2][k]) for k in got): sys.exit(f"FAIL: {name} equals its last input")
print("the averaged weights equal the mean of their inputs exactly (%d tensors)" % len(ins[0]))
EOF
rc=0; "$ckpt" average --last 9 a too-many > many.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "holds .* complete checkpoints" many.log || { cat many.log; fail "ckpt average --last 9"; }
rc=0; "$ckpt" average by-last a/step_00000006 > exists.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "already exists" exists.log || { cat exists.log; fail "ckpt average onto an existing path"; }
# a folder OUT.partial that the average did not make is never deleted: refused, naming it; one it
# left (a crashed average: its mark inside) is replaced
mkdir -p mine.partial && echo "a user's notes" > mine.partial/notes.txt
rc=0; "$ckpt" average mine a/step_00000004 a/step_00000005 > partial.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "mine.partial exists and was not made by an average" partial.log ||
  { cat partial.log; fail "ckpt average over a user's OUT.partial: exit $rc"; }
[[ -f mine.partial/notes.txt && ! -e mine ]] || fail "ckpt average deleted a folder it did not make, or wrote OUT"
mkdir -p left.partial && touch left.partial/.tptrain-partial left.partial/latest
run left.log "$ckpt" average left a/step_00000004 a/step_00000005
[[ -f left/manifest.json && ! -e left.partial ]] || fail "the average did not replace its own crashed OUT.partial"
echo "part 4: averages of a tp 2 and two tp 1 checkpoints equal the exact mean; the average resumes;" \
     "a user's OUT.partial is refused and kept, the average's own leftover replaced"

# ---- 5. the corpus: --keep-best bleu and translate_mt --model DIR/best -----------------------
# Its 2000-piece tokenizer and token files come from the fixture corpus_cache
# when ctest gives it (their preparation is test_spm's and translate_e2e's to prove).
. "$here/corpus_cache.sh"
use_corpus_cache cache
run c.log "$train" --data "$corpus" --cache-dir cache --preset tiny --spm-vocab-size 2000 --max-steps 12 --warmup 4 \
  --batch-tokens 512 --lr 3e-3 --eval-interval 4 --log-interval 100 --save c --keep-best bleu --average-last 2 --metrics c.jsonl
grep -q "train_mt: best dev BLEU so far, .* kept as c/best" c.log || fail "no best line in c.log"
grep -q "train_mt: averaged the newest 2 checkpoints .* dev BLEU [0-9.]*; best single checkpoint: dev BLEU" c.log ||
  fail "no averaged dev BLEU beside the best in c.log"
grep -q '"best_single_dev_bleu"' c.jsonl || fail "no averaging record in c.jsonl"
best=$(readlink c/best)
head -n 20 "$corpus/test.en" > src.en
for m in best "$best" averaged; do
  "$build/translate_mt" --model "c/$m" --src src.en --beam 0 > "tr-$m.txt" 2> "tr-$m.err" ||
    { cat "tr-$m.err"; fail "translate_mt --model c/$m"; }
done
[[ $(wc -l < tr-best.txt) == 20 ]] && cmp -s tr-best.txt "tr-$best.txt" ||
  fail "translate_mt --model c/best differs from c/$best"
echo "part 5: --keep-best bleu on the corpus; translate_mt --model c/best is c/$best; the average translates"
