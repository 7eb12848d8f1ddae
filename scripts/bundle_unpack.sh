#!/usr/bin/env bash
# bundle_unpack.sh: unpacks the archives scripts/gpu_bundle.sh makes (bin/test.tar.xz,
# lib.tar.xz), sourced by scripts/gpu_check.sh and scripts/gpu_kernel_times.sh on the
# GPU machine:
#
#   . scripts/bundle_unpack.sh
#   bundle_unpack ARCHIVE DIR [MEMBER...]    # extract into DIR; status 0 on success
#
# xz, not gzip: every test program carries the same CUDA kernels, and xz's window
# (16 MiB at -7) stores them once across the programs, where gzip's 32 KiB cannot
# (149 MiB of programs: 65 MiB gzipped, 4.5 MiB in xz). tar -J needs the xz program,
# which a machine may lack; python3's tarfile (its lzma module) then does it.
# BUNDLE_XZ: the xz to use ("none": python3's tarfile, as where xz is missing).
bundle_unpack() {
  local archive=$1 dir=$2 xz=${BUNDLE_XZ:-xz}
  shift 2
  case $archive in
    *.tar.gz) tar -xzf "$archive" -C "$dir" "$@"; return ;;
    *.tar.xz) ;;
    *) echo "bundle_unpack: $archive: not a .tar.xz or .tar.gz" >&2; return 2 ;;
  esac
  if [ "$xz" != none ] && command -v "$xz" > /dev/null; then
    "$xz" -dc -- "$archive" | tar -xf - -C "$dir" "$@"
    return
  fi
  python3 - "$archive" "$dir" "$@" <<'PY'
import sys, tarfile
archive, dest, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with tarfile.open(archive, "r:xz") as t:
    names = set(t.getnames())
    missing = [m for m in members if m not in names]
    if missing:
        sys.exit(f"bundle_unpack: {archive} lacks {' '.join(missing)}")
    chosen = [t.getmember(m) for m in members] if members else None
    # the bundle's own archive: plain files, folders and links inside dest
    kw = {"filter": "tar"} if hasattr(tarfile, "data_filter") else {}
    t.extractall(dest, members=chosen, **kw)
PY
}
