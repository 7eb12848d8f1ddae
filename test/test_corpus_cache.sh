#!/usr/bin/env bash
# The fixture corpus_cache: train_mt prepares the corpus (tokenizer and token
# files) for the tiny preset's vocabulary (8000) and best_average's (2000)
# into OUT, for the tests that require the fixture (test/corpus_cache.sh
# copies it), and
# checks that each vocabulary's files are there. Given SEED (another build's
# OUT for the same corpus), it copies SEED instead and checks that train_mt
# reuses the tokenizer and every token file rather than preparing them again.
#   test_corpus_cache.sh BUILD_DIR CORPUS_DIR OUT [SEED]
set -euo pipefail
build=$1 corpus=$2 out=$3 seed=${4:-}
rm -rf "$out" "$out.tmp"
mkdir -p "$out.tmp"
cd "$out.tmp"
if [ -n "$seed" ]; then
  test -d "$seed" || { echo "FAIL: the seed folder $seed does not exist (run the other build's corpus_cache first)"; exit 1; }
  cp -rp "$seed" root
fi
for v in 8000 2000; do
  "$build/train_mt" --data "$corpus" --cache-dir "$out.tmp/root" --preset tiny --spm-vocab-size "$v" --max-steps 1 \
      --eval-interval 0 --log-interval 1 > "prepare-$v.log" 2>&1 || { cat "prepare-$v.log"; exit 1; }
  for f in spm.model train.tok dev.tok; do
    test -s "root/spm-unigram-v$v-s2000000/$f" || { echo "FAIL: no root/spm-unigram-v$v-s2000000/$f"; exit 1; }
  done
  if [ -n "$seed" ]; then
    for what in "reusing $out.tmp/root/spm-unigram-v$v-s2000000/spm.model" "train: reusing" "dev: reusing"; do
      grep -qF "$what" "prepare-$v.log" || { echo "FAIL: train_mt did not reuse $seed ('$what'):"; cat "prepare-$v.log"; exit 1; }
    done
  fi
done
mv "$out.tmp/root" "$out"
cd /
rm -rf "$out.tmp"
echo "corpus prepared in $out (vocabularies 8000 and 2000${seed:+, from $seed})"
