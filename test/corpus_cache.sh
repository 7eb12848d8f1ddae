# corpus_cache.sh: sourced by the test scripts that train on the corpus. The
# tokenizer and token files (SentencePiece trained on 50,000 pairs: 2 s of
# CPU in Release, 25 s under the sanitizers; 8000 and 2000 pieces) are prepared once per
# ctest run by the fixture test corpus_cache (test_corpus_cache.sh), which
# exports its folder as TPTRAIN_TEST_CORPUS_CACHE to the tests that require
# it. Tests that prove the preparation itself (test_spm, translate_e2e,
# save_folder, hardening, test_corpus) keep preparing their own.
#   use_corpus_cache DEST: copies the prepared cache root to DEST (a
#   --cache-dir, or cache/<corpus folder name>, train_mt's default) when
#   the fixture's folder is given and exists; otherwise leaves DEST to be
#   prepared.
use_corpus_cache() {
  local dest=$1
  [ -n "${TPTRAIN_TEST_CORPUS_CACHE:-}" ] || return 0
  if [ ! -d "$TPTRAIN_TEST_CORPUS_CACHE" ]; then  # run outside ctest's fixture (a bundle): prepare as before
    echo "corpus_cache: no $TPTRAIN_TEST_CORPUS_CACHE (the corpus_cache test did not run); preparing the corpus here"
    return 0
  fi
  mkdir -p "$(dirname "$dest")"
  rm -rf "$dest"
  cp -rp "$TPTRAIN_TEST_CORPUS_CACHE" "$dest"
}
