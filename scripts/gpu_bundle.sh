#!/usr/bin/env bash
# Builds tptrain here for sm_90 (Release, CUDA) and packs what the GPU test
# machine needs into one folder, for scripts/gpu_check.sh to run there. That
# machine has the CUDA toolkit and PyTorch's CUDA/cuDNN/NCCL wheels but likely
# not Debian's OpenBLAS, cJSON or SentencePiece, and nothing can be installed
# on it; ctest may be missing too. So the bundle carries:
#   bin/            train_mt, translate_mt, ckpt, tprun (stripped); the layout
#   bin/test.tar.xz of the build folder, which the test scripts expect (the
#                   test programs packed; gpu_check.sh unpacks them)
#   test/, scripts/ the test scripts and the source files they read (reference/, curves/)
#   lib/            (packed as lib.tar.xz; gpu_check.sh unpacks it first)
#                   the shared libraries outside glibc and CUDA (OpenBLAS,
#                   libgfortran, libquadmath, cJSON, SentencePiece, ...)
#   lib/fallback/   libstdc++ and libgcc_s, used by gpu_check.sh only when the
#                   machine's libstdc++ lacks a GLIBCXX version the bundle needs
#   tests.tsv       every ctest test: name, labels, timeout, folder, environment,
#                   command (generated from ctest --show-only=json-v1, paths rewritten)
#   needs.txt       what each binary needs from the machine (CUDA sonames, glibc)
#   data/           the corpus as a .tar.gz, when one is found here
#   BUILD_INFO      commit, compiler, flags
# CUDA libraries (cudart, cuBLAS(Lt), NCCL, cuDNN) are never bundled: they are
# hundreds of MiB and the machine has them. The binaries carry the RUNPATH
# $ORIGIN/../lib:$ORIGIN/../../lib; gpu_check.sh also sets LD_LIBRARY_PATH
# (needed for the bundled libraries' own dependencies, e.g. OpenBLAS ->
# libgfortran). The folder and the source tree must stay under BUNDLE_MAX_MIB
# (64) MiB together: the GPU machine receives the tree and the git-ignored
# paths named for it up to that size.
#
#   bash scripts/gpu_bundle.sh [DIR]        # default gpu_bundle/ (git-ignored)
# Environment: BUILD_DIR (default build-gpu), JOBS (default 2), BUNDLE_MAX_MIB
# (default 64), TPTRAIN_CORPUS_DIR (the corpus to pack; else found as
# run_tests.sh does; none: no corpus packed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dest=${1:-gpu_bundle}
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-2}
max_mib=${BUNDLE_MAX_MIB:-64}
# The corpus path the bundle's tests are configured with: a marker path that
# tests.tsv names as @CORPUS@ (the corpus lives elsewhere on the GPU machine).
corpus_mark=/TPTRAIN_CORPUS_DIR
PROGRAMS=(train_mt translate_mt ckpt tprun)
# Sonames never bundled. glibc's own: every machine has them (needs.txt
# records the newest GLIBC symbol version used). The CUDA family: the machine
# has them; needs.txt lists them per binary.
SYSTEM_RE='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so)'
CUDA_RE='^(libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libcudnn|libnvrtc|libnvJitLink|libcupti|libcufft|libcurand|libcusparse|libcusolver|libnvidia-)'
FALLBACK_RE='^(libstdc\+\+\.so|libgcc_s\.so)'

die() { echo "gpu_bundle: $*" >&2; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3) || die "python3 is needed to read ctest's JSON"
for tool in cmake ctest ldd strip objdump tar xz; do
  command -v "$tool" > /dev/null || die "$tool not found"
done
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } \
  || die "nvcc not found (PATH, /usr/local/cuda/bin): the bundle needs the CUDA build"

# Refuse to empty a folder that is not a bundle (a mistyped DIR).
case $dest in /|.|..|"$root"|"$HOME") die "refusing to use '$dest' as the bundle folder" ;; esac
if [ -e "$dest" ] && [ ! -e "$dest/.gpu_bundle" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
  die "$dest exists, is not empty and is not a bundle (no $dest/.gpu_bundle); choose another DIR"
fi

# ---- build -------------------------------------------------------------------
# '$ORIGIN' stays literal: the dynamic loader expands it to the binary's folder.
# shellcheck disable=SC2016
rpath='$ORIGIN/../lib;$ORIGIN/../../lib'
mkdir -p "$build"
echo "gpu_bundle: configuring $build (Release, sm_90, CUDA)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_RPATH="$rpath" -DTPTRAIN_CORPUS_DIR="$corpus_mark" > "$build/gpu_bundle.configure.log" 2>&1 \
  || { tail -n 30 "$build/gpu_bundle.configure.log"; die "cmake configure failed (log: $build/gpu_bundle.configure.log)"; }
grep -q "tptrain: CUDA found" "$build/gpu_bundle.configure.log" \
  || die "CMake did not enable CUDA (see $build/gpu_bundle.configure.log); the bundle would have no GPU code"
echo "gpu_bundle: building with -j$jobs (several minutes on 2 cores the first time)"
cmake --build "$build" -j "$jobs" > "$build/gpu_bundle.build.log" 2>&1 \
  || { tail -n 40 "$build/gpu_bundle.build.log"; die "build failed (log: $build/gpu_bundle.build.log)"; }
build_abs=$(cd "$build" && pwd)

# ---- the folder --------------------------------------------------------------
rm -rf "$dest"
mkdir -p "$dest/bin/test" "$dest/lib/fallback" "$dest/test" "$dest/scripts" "$dest/data"
touch "$dest/.gpu_bundle"
dest_abs=$(cd "$dest" && pwd)

# tests.tsv from ctest's JSON: build paths -> @BUNDLE@/bin, source paths ->
# @BUNDLE@/<same relative path>, the corpus -> @CORPUS@. Any other absolute
# path into this checkout is an error: it would not exist there.
(cd "$build" && ctest --show-only=json-v1) > "$build_abs/ctest.json"
"$py" - "$build_abs/ctest.json" "$build_abs" "$root" "$corpus_mark" "$dest_abs" <<'PY'
import json, os, sys
js, build, src, corpus, dest = sys.argv[1:]
tests = json.load(open(js))["tests"]
src_refs = set()

def rewrite(s, name):
    if corpus in s:
        s = s.replace(corpus, "@CORPUS@")
    if s == build or s.startswith(build + "/"):
        return "@BUNDLE@/bin" + s[len(build):]
    if s.startswith(src + "/"):
        rel = s[len(src) + 1:]
        src_refs.add(rel)
        return "@BUNDLE@/" + rel
    if src in s or build in s:
        sys.exit(f"gpu_bundle: test {name}: cannot rewrite '{s}' into the bundle")
    if "\t" in s or "\n" in s:
        sys.exit(f"gpu_bundle: test {name}: an argument holds a tab or newline")
    return s

# Tests that cannot run from a bundle: fuzz_smoke and fuzz_long build the
# fuzz targets from the source tree with clang (their output folder is made
# at run time); ops_list and function_length judge the source tree itself,
# which the CPU suite does, and prove nothing about the machine.
NOT_BUNDLED = {"fuzz_smoke": "builds fuzz/ from the source tree with clang",
               "fuzz_long": "builds fuzz/ from the source tree with clang",
               "ops_list": "compiles the source tree's op declarations (a CPU check)",
               "function_length": "reads the source tree's functions (a CPU check)"}
rows = []
for t in tests:
    name = t["name"]
    if name in NOT_BUNDLED:
        print(f"gpu_bundle: {name} left out of tests.tsv: {NOT_BUNDLED[name]}")
        continue
    if "command" not in t:
        sys.exit(f"gpu_bundle: test {name} has no command (not built?)")
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    labels = ",".join(props.get("LABELS", [])) or "-"
    timeout = str(int(float(props.get("TIMEOUT", 1500))))
    wd = rewrite(props.get("WORKING_DIRECTORY", build), name)
    # KEY=VALUE: the value is a path like any argument (the corpus fixture's folder)
    env = ";".join(e.split("=", 1)[0] + "=" + rewrite(e.split("=", 1)[1], name) if "=" in e else rewrite(e, name)
                   for e in props.get("ENVIRONMENT", [])) or "-"
    cmd = [rewrite(a, name) for a in t["command"]]
    rows.append("\t".join([name, labels, timeout, wd, env] + cmd))
with open(os.path.join(dest, "tests.tsv"), "w") as f:
    f.write("# tptrain tests, from ctest --show-only=json-v1 (scripts/gpu_bundle.sh). Tab-separated:\n"
            "# name, labels (comma-separated), timeout (s), working folder, environment (KEY=VALUE;... or -),\n"
            "# then the command, one argument per field. @BUNDLE@ = this folder, @CORPUS@ = the corpus folder.\n")
    f.write("\n".join(rows) + "\n")
with open(os.path.join(build, "bundle_src_refs.txt"), "w") as f:
    f.write("\n".join(sorted(src_refs)) + "\n")
PY

# Executables: the programs, and every ELF executable of the test folder.
is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
bins=()
for p in "${PROGRAMS[@]}"; do
  [ -x "$build/$p" ] || die "$build/$p was not built"
  strip -o "$dest/bin/$p" "$build/$p"
  bins+=("bin/$p")
done
for f in "$build"/test/*; do
  if [ ! -f "$f" ] || [ ! -x "$f" ] || ! is_elf "$f"; then continue; fi
  strip -o "$dest/bin/test/${f##*/}" "$f"
  bins+=("bin/test/${f##*/}")
done
chmod 755 "$dest"/bin/* "$dest"/bin/test/* 2>/dev/null || true

# Source files: the test scripts and what they read beside them
# (reference/, curves/, spm_ids.py), and any other source path a test names.
(cd test && find . -path ./gpu -prune -o -type f ! -name '*.c' ! -name '*.h' ! -name CMakeLists.txt \
   ! -name '*.pyc' -print) | while read -r f; do
  mkdir -p "$dest/test/$(dirname "$f")"
  cp -p "test/$f" "$dest/test/$f"
done
while read -r rel; do
  [ -n "$rel" ] || continue
  [ -e "$rel" ] || die "a test names $rel, which is not in the source tree"
  if [ -d "$rel" ]; then mkdir -p "$dest/$rel" && cp -pR "$rel/." "$dest/$rel/"
  else mkdir -p "$(dirname "$dest/$rel")" && cp -p "$rel" "$dest/$rel"; fi
done < "$build_abs/bundle_src_refs.txt"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
cp -p scripts/compare_curves.py scripts/sanitizer_split.py scripts/bench_torch_mt.py scripts/bench_gpu.sh scripts/bench_estimate.sh "$dest/scripts/"

# Every @BUNDLE@ path in tests.tsv must now exist in the bundle, or be one a
# test makes in a build folder that does (the corpus_cache fixture's output).
grep -v '^#' "$dest/tests.tsv" | tr '\t' '\n' | grep '^@BUNDLE@' | sort -u | while read -r ref; do
  path=$dest_abs/${ref#@BUNDLE@/}
  [ -e "$path" ] || { [[ $ref == @BUNDLE@/bin/* ]] && [ -d "$(dirname "$path")" ]; } \
    || die "tests.tsv names ${ref}, which the bundle lacks"
done

# ---- shared libraries ----------------------------------------------------------
# ldd lists the whole closure. Bundled: everything outside glibc and the CUDA
# family (libstdc++/libgcc_s go to lib/fallback). needs.txt: per binary, the
# CUDA-family sonames the machine must provide.
{
  echo "# What each bundled binary needs from the GPU machine (not bundled), from ldd here."
  echo "# Lines: 'glibc X' (newest GLIBC symbol version used), 'glibcxx X' (newest GLIBCXX),"
  echo "# then 'BINARY<TAB>SONAME SONAME ...' (CUDA runtime, cuBLAS/cuBLASLt, NCCL, cuDNN, driver)."
} > "$dest/needs.txt"
declare -A copied=()
needs_lines=()
for b in "${bins[@]}"; do
  src_bin=$build/${b#bin/}
  out=$(ldd "$src_bin") || die "ldd $src_bin failed"
  if grep -q "not found" <<< "$out"; then
    die "$src_bin: libraries not found here: $(grep 'not found' <<< "$out" | tr -s ' \t' ' ')"
  fi
  cuda_needs=()
  while read -r soname _ path _; do
    [ -n "$soname" ] || continue
    if [[ $soname =~ $SYSTEM_RE ]] || [[ $soname == /* ]]; then continue; fi
    if [[ $soname =~ $CUDA_RE ]]; then cuda_needs+=("$soname"); continue; fi
    [ -n "${copied[$soname]:-}" ] && continue
    [ -f "$path" ] || die "$src_bin: cannot locate $soname (ldd says '$path')"
    if [[ $soname =~ $FALLBACK_RE ]]; then cp -L "$path" "$dest/lib/fallback/$soname"
    else cp -L "$path" "$dest/lib/$soname"; fi
    copied[$soname]=$path
  done <<< "$out"
  # cuBLASLt is opened at run time (kernels/cuda/cublaslt_load.c), so ldd
  # misses it: the soname the binary opens is in its strings, a whole
  # NUL-ended one (test_cublaslt_load also holds a deliberately wrong name).
  lt=$(grep -aoP 'libcublasLt\.so\.[0-9]+(?=\x00)' "$src_bin" | head -n 1 || true)
  [ -z "$lt" ] || cuda_needs+=("$lt")
  needs_lines+=("$b"$'\t'"${cuda_needs[*]:--}")
done
chmod 644 "$dest"/lib/*.so* "$dest"/lib/fallback/*.so* 2>/dev/null || true

# The newest glibc / libstdc++ symbol versions used by the binaries and the
# bundled libraries: gpu_check.sh compares them with the machine's.
newest() {  # newest PREFIX FILES...: the highest PREFIX_x.y.z version the files reference
  local prefix=$1; shift
  objdump -T "$@" 2>/dev/null | grep -o "(${prefix}_[0-9.]*)" | tr -d '()' | sed "s/^${prefix}_//" | sort -uV | tail -n 1
}
lib_files=("$dest"/lib/*.so*)
[ -e "${lib_files[0]}" ] || lib_files=()
glibc_v=$(newest GLIBC "${bins[@]/#/$dest/}" "${lib_files[@]}")
glibcxx_v=$(newest GLIBCXX "${bins[@]/#/$dest/}" "${lib_files[@]}")
{
  echo "glibc ${glibc_v:-none}"
  echo "glibcxx ${glibcxx_v:-none}"
  printf '%s\n' "${needs_lines[@]}"
} >> "$dest/needs.txt"

# ---- corpus --------------------------------------------------------------------
corpus=${TPTRAIN_CORPUS_DIR:-}
if [ -z "$corpus" ]; then
  for c in ../shared/data/small_parallel_enja data/small_parallel_enja; do
    if [ -s "$c/train.en" ]; then corpus=$c; break; fi
  done
fi
corpus_note="no corpus packed (none found: give TPTRAIN_CORPUS_DIR)"
if [ -n "$corpus" ] && [ -s "$corpus/train.en" ]; then
  cname=$(basename "$(cd "$corpus" && pwd)")
  files=()
  for f in train.en train.ja dev.en dev.ja test.en test.ja SOURCE.md; do
    [ -f "$corpus/$f" ] && files+=("$cname/$f")
  done
  tar -czf "$dest/data/$cname.tar.gz" -C "$(dirname "$(cd "$corpus" && pwd)")" "${files[@]}"
  corpus_note="corpus $(cd "$corpus" && pwd) packed as data/$cname.tar.gz"
fi

# ---- build info ------------------------------------------------------------------
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host $(uname -srm); $(getconf GNU_LIBC_VERSION)"
  echo "nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_RPATH=$rpath"
  echo "$corpus_note"
} > "$dest/BUILD_INFO"

# bin/test/ travels packed: each test program carries the CUDA kernels
# (about 8.7 MiB a program at sm_90 in 2026-11), the same bytes in each, which
# xz's 16 MiB window (-7) stores once: 149 MiB of programs in 4.5 MiB, where
# gzip's 32 KiB window left 65. One thread: xz's threads would cut the
# stream into blocks that cannot see each other. gpu_check.sh unpacks it
# before the first test (scripts/bundle_unpack.sh). So does lib/ (OpenBLAS
# alone is 36 MiB; 41 MiB of libraries in 6.2 MiB).
xz_pack() {  # xz_pack ARCHIVE DIR MEMBER: DIR/MEMBER packed into ARCHIVE, then removed
  tar -cf - -C "$2" "$3" | xz -7 -T1 > "$1" && rm -rf "${2:?}/$3"
}
xz_pack "$dest/bin/test.tar.xz" "$dest/bin" test

# ---- size and summary ---------------------------------------------------------------
echo
echo "gpu_bundle: $dest_abs"
summary() {  # summary LABEL FILES...
  local label=$1; shift
  if [ $# -eq 0 ] || [ ! -e "$1" ]; then printf '  %-14s (none)\n' "$label"; return; fi
  printf '  %-14s %3d files %7s  %s\n' "$label" $# "$(du -cbh "$@" | tail -n 1 | cut -f1)" \
    "$(for f in "$@"; do basename "$f"; done | tr '\n' ' ' | cut -c1-150)"
}
summary "bin/" "${PROGRAMS[@]/#/$dest/bin/}"
summary "bin/test.tar.xz" "$dest/bin/test.tar.xz"
summary "lib/" "$dest"/lib/*.so*
summary "lib/fallback/" "$dest"/lib/fallback/*
xz_pack "$dest/lib.tar.xz" "$dest" lib
summary "lib.tar.xz" "$dest/lib.tar.xz"
mapfile -t srcfiles < <(find "$dest/test" "$dest/scripts" -type f)
summary "test/ scripts/" "${srcfiles[@]}"
summary "data/" "$dest"/data/*
echo "  tests.tsv: $(grep -vc '^#' "$dest/tests.tsv") tests ($(grep -v '^#' "$dest/tests.tsv" | cut -f2 | grep -c 'gpu') gpu);" \
  "needs: $(grep -v '^#' "$dest/needs.txt" | cut -f2 | tr ' ' '\n' | grep -v '^-$' | grep '^lib' | sort -u | tr '\n' ' ')"
echo "  glibc >= ${glibc_v:-?}, GLIBCXX >= ${glibcxx_v:-?}; $corpus_note"
bytes=$(du -sb "$dest" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
# The source tree travels beside the bundle (tracked and untracked files
# git does not ignore), inside the same limit.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard 2> /dev/null | xargs -0 -r stat -c %s 2> /dev/null |
             awk '{ s += $1 } END { print s + 0 }')
tree_mib=$(awk -v b="$tree_bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if [ $((bytes + tree_bytes)) -gt $((max_mib * 1048576)) ]; then
  die "the bundle is $mib MiB ($bytes bytes) and the source tree $tree_mib MiB: over the $max_mib MiB limit together"
fi
echo "gpu_bundle: total $mib MiB ($bytes bytes), with the source tree's $tree_mib MiB under the $max_mib MiB limit"
