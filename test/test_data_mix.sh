#!/usr/bin/env bash
# data_mix: --data with several corpora, end to end (train_mt): two slices
# of the corpus, the second taken twice an epoch, make one tokenizer and a
# token file each (train.tok, train.c1.tok) under cache/<a>+<b>/; the epoch
# counts the first's pairs once and the second's twice; a second start
# reads neither text again; a damaged record (its checksum) makes the
# next start read that text again, saying why; a list that names a folder
# twice (under any spelling: a/, ./a, /abs/a, a link), copies of 0 or not
# a whole number (b:x, b:-1, b:1.5, b:, exit 2) or an empty item is refused
# before anything is built.
#   test_data_mix.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"
build=$1 corpus=$2
HANG_LIMIT=60
enter_workdir
mkdir -p a b
for l in en ja; do
  head -n 3000 "$corpus/train.$l" > a/train.$l
  sed -n 3001,4000p "$corpus/train.$l" > b/train.$l
  for s in dev test; do head -n 100 "$corpus/$s.$l" > a/$s.$l; cp a/$s.$l b/$s.$l; done
done
sleep 1.2  # the text's identity is recorded trusted only once it has not changed for a second
flags=(--preset tiny --spm-vocab-size 1500 --max-len 64 --max-steps 2 --eval-interval 0 --log-interval 1)
run mix.log "$build/train_mt" --data a,b:2 "${flags[@]}"
dir=cache/a+b/spm-unigram-v1500-s2000000
for f in spm.model train.tok train.c1.tok dev.tok train.source.json train.c1.source.json; do
  test -s "$dir/$f" || fail "no $dir/$f"
done
grep -qF "training SentencePiece (unigram, 1500 pieces) on 8000 of the 8000 sentences" mix.log ||
  fail "the tokenizer did not train on both corpora's 8000 sentences"
grep -qF "corpus: train.c1: 1000 pairs read from b" mix.log || fail "the second corpus was not read as train.c1"
usable=$(sed -n 's/^train_mt: train: \([0-9]*\) pairs usable an epoch.*/\1/p' mix.log)
long=$(sed -n 's/.*usable an epoch (every corpus.s copies counted), \([0-9]*\) longer.*/\1/p' mix.log)
[ -n "$usable" ] || fail "no usable count: $(grep 'train_mt: train:' mix.log)"
# every pair of a is usable once and of b twice, less the over-long (counted once, and 64 tokens is generous)
[ "$long" = 0 ] && [ "$usable" -eq 5000 ] || fail "an epoch holds $usable pairs ($long too long), want 3000 + 2 x 1000"
run again.log "$build/train_mt" --data a,b:2 "${flags[@]}"
[ "$(grep -c 'unchanged since they were read' again.log)" -eq 3 ] || fail "a second start read the text again"
[ "$(grep -c '^step' mix.log)" -eq 2 ] || fail "no step lines in mix.log"
cmp <(grep '^step' mix.log | cut -d'|' -f1-2) <(grep '^step' again.log | cut -d'|' -f1-2) ||
  fail "the same mix trained differently on a second start"
refuse twice "--data names a twice (give it copies instead: a:2)" "$build/train_mt" --data a,a "${flags[@]}"
# one folder under another spelling is the same folder: compared by device and inode
ln -s a link-a
for other in a/ ./a "$PWD/a" link-a; do
  refuse "same-$(echo "$other" | tr -c 'a-z0-9\n' _)" "--data names one folder twice: a and $other are the same folder" \
      "$build/train_mt" --data "a,$other" "${flags[@]}"
done
# malformed copies are refused naming the item, as bad input (exit 2), never taken for a folder name
for bad in x -1 1.5 ""; do
  rc=0
  "$build/train_mt" --data "a,b:$bad" "${flags[@]}" > "copies.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -qF -- "--data item 2 (b:$bad): the copies after ':' must be 1 to 100" copies.log ||
    { cat copies.log; fail "--data a,b:$bad: exit $rc, want 2 naming the item"; }
done
# one byte of the record changed (a count the text form is decided from): not trusted, the text read again
sed -i 's/"spaced_lines":\t\([0-9]\)/"spaced_lines":\t9\1/' "$dir/train.source.json"
run damaged.log "$build/train_mt" --data a,b:2 "${flags[@]}"
grep -qF "corpus: train: reading the text again: $dir/train.source.json is damaged: record_crc32c is" damaged.log ||
  fail "a damaged record was trusted: $(grep '^corpus: train:' damaged.log)"
[ "$(grep -c 'unchanged since they were read' damaged.log)" -eq 2 ] || fail "the intact records were not trusted"
cmp <(grep '^step' mix.log | cut -d'|' -f1-2) <(grep '^step' damaged.log | cut -d'|' -f1-2) ||
  fail "the start after a damaged record trained differently"
refuse zero "--data item 2 (b:0): the copies after ':' must be 1 to 100" "$build/train_mt" --data a,b:0 "${flags[@]}"
refuse empty "--data item 2 is an empty folder name" "$build/train_mt" --data a,,b "${flags[@]}"
[ ! -e cache/a+a ] || fail "a refused list left a cache folder"
echo "data_mix: two corpora, the second twice, one tokenizer and a token file each; a warm second start; a damaged record read again; bad lists refused (one folder by identity, malformed copies exit 2)"
