#!/usr/bin/env bash
# with_save_mode.sh MODE BUILD_DIR TEST [ARGS...]: runs the shell test TEST
# (which takes BUILD_DIR first) with every train_mt it starts saving in
# --save-mode MODE. TEST gets a folder standing in for BUILD_DIR: links to
# each of its entries, but train_mt is a script that execs the real one (the
# same process, so a test's signals and kills reach it) with --save-mode
# MODE added last. ctest runs today's crash-safety tests this way in the
# mode that is not the default (their *_sync twins), so both stay proven.
set -euo pipefail
mode=$1 build=$(cd "$2" && pwd) test=$3
shift 3
case $mode in sync | async) ;; *) echo "with_save_mode: MODE must be sync or async, got '$mode'" >&2; exit 2 ;; esac
shadow=$(mktemp -d)
trap 'rm -rf "$shadow"' EXIT
for e in "$build"/*; do ln -s "$e" "$shadow/"; done
rm "$shadow/train_mt"
printf '#!/bin/sh\nexec "%s" "$@" --save-mode %s\n' "$build/train_mt" "$mode" > "$shadow/train_mt"
chmod +x "$shadow/train_mt"
"$test" "$shadow" "$@"
