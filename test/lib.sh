# lib.sh: the scaffolding the shell tests share, sourced first thing:
#     . "$(dirname "$0")/lib.sh"
# Each test still states what it checks; only the set-up (a scratch folder
# removed at exit), the tallies and the run/refuse checks live here, so a
# fix to them (a folder left read-only, a sanitizer report missed) is made
# once. Nothing here runs anything by itself.

here=$(cd "$(dirname "$0")" && pwd)  # the test's own folder (helper scripts beside it)

fail() { echo "FAIL: $*" >&2; exit 1; }

# enter_workdir: a fresh temporary folder as the current one, in $work,
# removed at exit (made writable first: a test may leave a read-only part).
enter_workdir() {
  work=$(mktemp -d)
  trap 'chmod -R u+w "$work" 2> /dev/null; rm -rf "$work"' EXIT
  cd "$work" || exit 1
}

# corpus_workdir: enter_workdir, then the corpus prepared once per ctest run
# (corpus_cache.sh) copied to train_mt's default cache folder for $corpus.
corpus_workdir() {
  . "$here/corpus_cache.sh"
  enter_workdir
  use_corpus_cache "cache/$(basename "$corpus")"
}

# metric_test TOOL [CORPUS_DIR]: a metric's test: TOOL's own C checks first,
# then the Python oracle (this function's stdin, a heredoc) with the
# arguments TOOL, a scratch folder (enter_workdir) and CORPUS_DIR.
metric_test() {
  enter_workdir
  "$1"
  /usr/bin/python3 - "$1" "$work" "${2:-}"
}

# Tallies for tests that go on after a failed case: ok / bad, then
# `exit $((fails > 0))` (or their own summary) at the end.
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# sanitizer_clean LOG: the ASan build of a test: no sanitizer report in LOG.
sanitizer_clean() {
  ! grep -qE "runtime error|LeakSanitizer|AddressSanitizer" "$1" || { cat "$1"; fail "$1: sanitizer report"; }
}
# run LOG CMD...: CMD must succeed (output to LOG, shown on failure).
run() {
  local log=$1; shift
  "$@" > "$log" 2>&1 || { local rc=$?; echo "FAIL: exit status $rc from: $*"; tail -n 30 "$log"; exit 1; }
  sanitizer_clean "$log"
}
# refuse NAME EXPECTED CMD...: CMD must end within HANG_LIMIT seconds (the
# test sets it) with a plain non-zero exit status and print EXPECTED (a
# fixed string); its output is kept in refuse-NAME.log.
refuse() {
  local name=$1 want=$2; shift 2
  local rc=0
  timeout "$HANG_LIMIT" "$@" > "refuse-$name.log" 2>&1 || rc=$?
  ((rc != 0)) || { cat "refuse-$name.log"; fail "$name: accepted"; }
  ((rc != 124)) || fail "$name: still running after $HANG_LIMIT s (waiting on a named pipe?)"
  ((rc < 128)) || { tail -n 20 "refuse-$name.log"; fail "$name: died with exit status $rc"; }
  grep -qF -- "$want" "refuse-$name.log" || { cat "refuse-$name.log"; fail "$name: no '$want'"; }
  sanitizer_clean "refuse-$name.log"
}
# dev_pairs N: the corpus's first N dev pairs as src.en and ref.ja (needs $corpus).
dev_pairs() {
  head -n "$1" "$corpus/dev.en" > src.en
  head -n "$1" "$corpus/dev.ja" > ref.ja
}
# seal ARGS...: test/manifest_seal.py (reseals a checkpoint's manifest over edited files).
seal() { /usr/bin/python3 "$here/manifest_seal.py" "$@"; }
# copy_of DST SRC: DST becomes a fresh copy of the folder SRC.
copy_of() { rm -rf "$1"; cp -r "$2" "$1"; }
# one_line_refusal WHAT PREFIX CMD...: CMD must exit 2 with one line on
# stderr that starts with PREFIX (the programs' usage-error contract).
one_line_refusal() {
  local what=$1 want=$2 msg rc=0
  shift 2
  msg=$("$@" 2>&1 > /dev/null) || rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: $what exited $rc: $msg"; exit 1; }
  [ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] && [[ "$msg" == "$want"* ]] || { echo "FAIL: $what said: $msg"; exit 1; }
  echo "refused as expected: $msg"
}
