#!/usr/bin/env bash
# A --save folder never mixes models: a run whose --save folder holds a
# checkpoint of another model is refused before it trains (nothing trained,
# nothing saved, `latest` untouched), naming the difference and whose value
# is which; the same model may continue there. A resumed checkpoint of
# another model is refused the same way ("the checkpoint has d_model 16,
# this run 32"). And the tokenizer cache: presets of other vocabulary
# sizes switch back and forth on one corpus and one cache, each finding its
# own tokenizer. Tiny models, a 300-pair slice of the corpus: seconds.
# Usage: test_save_folder.sh BUILD_DIR CORPUS_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
corpus=$(cd "$2" && pwd)
. "$(dirname "$0")/lib.sh"
enter_workdir
train=$build/train_mt
small=(--preset tiny --task copy --layers 1 --d-model 16 --heads 2 --ffn-hidden-size 32 --max-len 16 --seq-len 8
       --batch-size 8 --log-interval 1 --eval-interval 0)

"$train" "${small[@]}" --max-steps 2 --save ck > first.log 2>&1 || bad "first run: $(tail -3 first.log)"
latest=$(cat ck/latest 2>/dev/null)
[ "$latest" = step_00000002 ] && ok "first run saved step 2" || bad "first run: latest '$latest'"

# another model (d_model 32), same folder, no --resume: refused before step 1
"$train" "${small[@]}" --d-model 32 --max-steps 3 --save ck > other.log 2> other.err
rc=$?
want="train_mt: --save ck holds step_00000002 of another model (the checkpoint has d_model 16, this run 32): save into another folder, or remove those checkpoints first; nothing was trained"
if [ $rc -eq 2 ] && [ "$(cat other.err)" = "$want" ] && ! grep -q "^step " other.log && [ ! -e ck/step_00000003 ] &&
    [ "$(cat ck/latest)" = step_00000002 ]; then
    ok "another model's --save folder refused before training: $(cat other.err)"
else
    bad "another model's folder: rc $rc: $(cat other.err) / $(tail -2 other.log); $(ls ck)"
fi

# a synthetic-task checkpoint of another task length is still the same model: the same model continues there
"$train" "${small[@]}" --max-steps 3 --resume auto --save ck > same.log 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(cat ck/latest)" = step_00000003 ] && ok "the same model continues in its folder" ||
    bad "same model: rc $rc: $(tail -3 same.log)"

# resuming another model's checkpoint into a fresh folder: which value is the checkpoint's
"$train" "${small[@]}" --d-model 32 --max-steps 4 --resume ck --save ck2 > resume.log 2> resume.err
rc=$?
if [ $rc -ne 0 ] && grep -qF "the checkpoint's model differs from this run's: the checkpoint has d_model 16, this run 32" resume.err &&
    [ ! -e ck2/latest ]; then
    ok "resume of another model: $(cat resume.err)"
else
    bad "resume of another model: rc $rc: $(cat resume.err)"
fi

# ---- one tokenizer per configuration in one cache ----
mkdir slice
head -n 300 "$corpus/train.en" > slice/train.en
head -n 300 "$corpus/train.ja" > slice/train.ja
head -n 20 "$corpus/dev.en" > slice/dev.en
head -n 20 "$corpus/dev.ja" > slice/dev.ja
cflags=(--preset tiny --data slice --cache-dir cache --batch-tokens 256 --max-steps 1 --eval-interval 1000)
for v in 700 900 700; do
    "$train" "${cflags[@]}" --spm-vocab-size $v > "cache-$v.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && [ -s "cache/spm-unigram-v$v-s2000000/spm.model" ] || bad "vocab $v: rc $rc: $(tail -3 "cache-$v.log")"
done
grep -q "corpus: reusing cache/spm-unigram-v700-s2000000/spm.model" cache-700.log &&
    [ "$(grep -c . cache/spm-unigram-v700-s2000000/spm.vocab)" -eq 700 ] && [ "$(grep -c . cache/spm-unigram-v900-s2000000/spm.vocab)" -eq 900 ] &&
    ok "vocabulary sizes 700, 900, 700 on one cache: each its own tokenizer, reused when it comes back" ||
    bad "switching vocabulary sizes: $(cat cache-700.log | head -5)"

if [ $fails -ne 0 ]; then
    echo "test_save_folder: $fails failed"
    exit 1
fi
echo "test_save_folder: all passed"
