#!/usr/bin/env bash
# The fixture corpus_cache: train_mt prepares the corpus (tokenizer and token
# files) for the tiny preset's vocabulary (8000) into OUT, for
# the tests that require the fixture (test/corpus_cache.sh copies it), and
# checks that each vocabulary's files are there.
#   test_corpus_cache.sh BUILD_DIR CORPUS_DIR OUT
set -euo pipefail
build=$1 corpus=$2 out=$3
rm -rf "$out" "$out.tmp"
mkdir -p "$out.tmp"
cd "$out.tmp"
for v in 8000; do
  "$build/train_mt" --data "$corpus" --cache-dir "$out.tmp/root" --preset tiny --spm-vocab-size "$v" --max-steps 1 \
      --eval-interval 0 --log-interval 1 > "prepare-$v.log" 2>&1 || { cat "prepare-$v.log"; exit 1; }
  for f in spm.model train.tok dev.tok; do
    test -s "root/spm-unigram-v$v/$f" || { echo "FAIL: no root/spm-unigram-v$v/$f"; exit 1; }
  done
done
mv "$out.tmp/root" "$out"
cd /
rm -rf "$out.tmp"
echo "corpus prepared in $out (vocabulary 8000)"
