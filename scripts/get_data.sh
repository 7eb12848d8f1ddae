#!/usr/bin/env bash
# Downloads the small_parallel_enja corpus (50k English-Japanese training
# pairs, 500 dev, 500 test; tokenized, English lowercased) from its public
# GitHub repository into DIR:
#
#   scripts/get_data.sh [DIR]      # default: data/small_parallel_enja under the repository root
#
# Files already present are kept (delete one to fetch it again). Each file is
# downloaded to DIR/.NAME.part and renamed only when complete, so an
# interrupted run never leaves a truncated file that later runs would skip.
# Uses curl, or wget when curl is missing.
set -euo pipefail

BASE_URL="https://raw.githubusercontent.com/odashi/small_parallel_enja/master"
FILES=(train.en train.ja dev.en dev.ja test.en test.ja)

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$repo_root/data/small_parallel_enja}"

die() {
  echo "get_data: $*" >&2
  exit 1
}

if command -v curl >/dev/null 2>&1; then
  fetch() { curl --fail --location --silent --show-error --retry 3 --connect-timeout 20 -o "$2" "$1"; }
elif command -v wget >/dev/null 2>&1; then
  fetch() { wget --quiet --tries=3 --timeout=20 -O "$2" "$1"; }
else
  die "neither curl nor wget is installed; install one of them (e.g. apt-get install curl)"
fi

mkdir -p "$dest" || die "cannot create folder $dest"

for name in "${FILES[@]}"; do
  target="$dest/$name"
  if [ -s "$target" ]; then
    echo "get_data: $target already present, skipped"
    continue
  fi
  part="$dest/.$name.part"
  rm -f "$part"
  echo "get_data: downloading $BASE_URL/$name"
  if ! fetch "$BASE_URL/$name" "$part"; then
    rm -f "$part"
    die "download of $BASE_URL/$name failed (no network, a proxy, or the repository moved?); nothing was written to $target"
  fi
  if [ ! -s "$part" ]; then
    rm -f "$part"
    die "download of $BASE_URL/$name returned an empty file"
  fi
  mv -f "$part" "$target"
done

# The pairs must line up: each .en has as many lines as its .ja.
for split in train dev test; do
  n_en=$(wc -l <"$dest/$split.en")
  n_ja=$(wc -l <"$dest/$split.ja")
  [ "$n_en" -eq "$n_ja" ] || die "$dest/$split.en has $n_en lines but $dest/$split.ja has $n_ja; delete both and run again"
  echo "get_data: $split: $n_en pairs"
done
echo "get_data: corpus ready in $dest"
