#!/usr/bin/env bash
# The whole GPU check in one run, on the GPU machine, from the repository
# root, with the folder scripts/gpu_bundle.sh made here:
#
#   bash scripts/gpu_check.sh [BUNDLE_DIR] [CORPUS_DIR]     # default gpu_bundle
#
# GPU time is scarce, so one run does everything and keeps going after a
# failure; every step has a timeout and the run ends within GPU_CHECK_BUDGET
# seconds (default 540). Steps, in order (PASS / FAIL / SKIP with a reason):
#   setup  the bundle, the GPU (nvidia-smi), the CUDA/cuBLASLt/NCCL/cuDNN
#          libraries (toolkit folders, the system's, PyTorch's nvidia wheels),
#          every bundled binary's libraries resolved (ldd), glibc and
#          libstdc++ versions, train_mt --help (the flags later steps need),
#          the corpus
#   a      the GPU tests (label gpu in tests.tsv), and the CPU tests named by
#          GPU_CHECK_CPU_TESTS (a regex, default ^(test_ops|compare_curves)$:
#          canaries for the bundled OpenBLAS and python3)
#   b      compute-sanitizer memcheck, racecheck, synccheck, initcheck on the
#          GPU op tests and on 5 training steps (train_mt --device cuda, one
#          rank: no NCCL communicator); racecheck, the slowest tool, on 2 steps
#          of a 1+1-layer model with 8 sequences a batch, to end well inside
#          its cap. Reports raised inside NCCL or cuBLAS are listed apart and
#          do not fail a step; the project's do (scripts/sanitizer_split.py)
#   c      50 steps on the corpus: --device cpu, then --device cuda with
#          --dtype fp32 and bf16 (same seed, data, flags, dropout 0); the
#          curves judged by scripts/compare_curves.py (its bands); then
#          --attention flash against exact attention, both bf16 with heads
#          of 16 on the GPU, in the bf16 band, through the tiled kernels and
#          the short-sequence ones (TPTRAIN_FLASH_KERNEL=short)
#   d      tp = 2, tp = 4 and dp = 2 on the one GPU through tprun (--comm shm:
#          device buffers staged through page-locked host memory), each against
#          tp = 1 on the synthetic copy task, judged the same way (and one
#          rank with --comm nccl, NCCL's world of one); each run's
#          final memory record checked (every rank's device_used covers its
#          persistent buffers and library overhead; staged runs hold their
#          staging buffer under comm)
#   f      checkpoints (cuBLASLt tuning off: TPTRAIN_GEMM_TUNE=0): 10 steps
#          + save + resume to 20 on the GPU equals the
#          straight 20 steps digit for digit (dropout on) and in the exported
#          weights byte for byte; a GPU checkpoint resumed on the CPU, and a
#          CPU tp = 2 checkpoint resumed on the GPU as tp = 1 (resharded),
#          within the fp32 band of the run they continue
#   p      the planner on the GPU: test/test_plan.sh's ten layouts (tp, dp, pp,
#          ZeRO, sequence parallelism, recomputation; the ranks sharing the
#          GPU) run with --device cuda, every rank's predicted memory by tag
#          within 5% of the measured (PLAN_DEVICE=cuda PLAN_MEMORY_ONLY=1)
#   e      scripts/bench_gpu.sh CORPUS_DIR (tptrain against PyTorch eager and
#          torch.compile), the configurations that fit in the time left
#   g      (only when GPU_CHECK_STEPS names it: it takes a budget of its own)
#          the main job: scripts/run_main.sh itself with this bundle's
#          programs (RUN_MAIN_BIN), its recipe ended by RUN_MAIN_MINUTES
#          inside the budget, dev BLEU and a checkpoint every
#          GPU_CHECK_MAIN_EVAL steps, the best or averaged checkpoint and the
#          length penalty chosen on dev, the test BLEU; the curves over wall
#          time (plot_metrics.py, where matplotlib is); then four ranks on
#          the one GPU (tp = 4, shm staged) for their memory table
#   s      (only when GPU_CHECK_STEPS names it) scripts/sweep_recipe.sh: the
#          training recipes side by side on the one GPU, then the winner alone
#          (SWEEP_STEPS, SWEEP_WINNER_MINUTES and the rest from the environment;
#          SWEEP_WINNER=NAME: the winner alone, the second of two commands)
# Output under $OUT (else ./gpu_report): report.md (environment, one line
# per step with its time, totals), logs/STEP.log, the metrics files, and
# nvidia-smi.txt, libraries.txt. Exit status 0 when no step failed.
# Steps needing a train_mt flag (--device, --dtype, --comm) SKIP when
# train_mt --help does not list it. Environment: GPU_CHECK_BUDGET (seconds),
# GPU_CHECK_FORCE=1 (run the GPU steps even when no GPU is seen),
# GPU_CHECK_STEPS (the sections to run, default "a b c d f p e"; "g" for the
# main job), GPU_CHECK_MAIN_EVAL (500), GPU_CHECK_MAIN_ARGS (more train_mt
# flags for g's runs), GPU_CHECK_TP4_STEPS (50: g's four-rank run; 0 leaves
# it out, its time to the main job), GPU_CHECK_PACK=1 (pack logs/ and the metrics
# into report.tar.gz beside report.md: for a machine that returns few files),
# GPU_CHECK_CPU_TESTS, GPU_CHECK_TRAIN_STEPS (50), TPTRAIN_CORPUS_DIR,
# CUDA_HOME, and for tests of this script GPU_CHECK_SMI (an nvidia-smi to
# use, or none) and GPU_CHECK_SANITIZER (a compute-sanitizer, or none).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle_arg=${1:-gpu_bundle}
corpus_arg=${2:-${TPTRAIN_CORPUS_DIR:-}}
out=${OUT:-$PWD/gpu_report}
budget=${GPU_CHECK_BUDGET:-540}
cpu_tests_re=${GPU_CHECK_CPU_TESTS-^(test_ops|compare_curves)$}
sections=" ${GPU_CHECK_STEPS:-a b c d f p e} "
MIN_STEP_S=5          # a step with less time left than this is skipped
SAN_TOOLS=(memcheck racecheck synccheck initcheck)
SAN_TARGETS_RE='^(test_backend_ops_gpu)$'
# Training runs of steps c and d: the tiny preset, 50 steps, one log row per step.
TRAIN_STEPS=${GPU_CHECK_TRAIN_STEPS:-50}
# A training step's note: train_mt's "N steps in ..." line, or an error line.
TRAIN_NOTE_RE='train_mt: [0-9]+ steps in|error|Error|ERROR|FAIL|not |refus|invalid'
TRAIN_ARGS=(--preset tiny --max-steps "$TRAIN_STEPS" --lr 2e-3 --warmup 10 --log-interval 1
            --eval-interval "$TRAIN_STEPS" --dropout 0 --seed 1)

mkdir -p "$out/logs" || { echo "gpu_check: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
report=$out/report.md
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || { echo "gpu_check: mktemp failed" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
t_start=$SECONDS
deadline=$((t_start + budget))
phase_deadline=$deadline
n_pass=0 n_fail=0 n_skip=0

# ---- report ------------------------------------------------------------------------
say() { echo "gpu_check: $*"; }
note() { echo "$*" >> "$report"; }
# record STATUS STEP SECONDS NOTE: one table row in report.md and one line on stdout.
record() {
  local status=$1 step=$2 secs=$3 text=${4//|/\\|}
  text=${text//$'\n'/ }
  case $status in PASS) n_pass=$((n_pass + 1)) ;; FAIL) n_fail=$((n_fail + 1)) ;; *) n_skip=$((n_skip + 1)) ;; esac
  printf '| %s | %s | %s | %s |\n' "$status" "$step" "$secs" "${text:0:300}" >> "$report"
  printf '%-4s  %-34s %7s s  %s\n' "$status" "$step" "$secs" "${text:0:200}"
}
skip() { record SKIP "$1" 0 "$2"; }
# last_line LOG [REGEX]: the last line of a log matching REGEX (else the last
# non-empty one), trimmed.
last_line() {
  local l
  l=$( { [ -z "${2:-}" ] || grep -E -- "$2" "$1"; } 2>/dev/null | tail -n 1)
  [ -n "$l" ] || l=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1)
  echo "$l" | tr -s ' \t' ' ' | cut -c1-240
}
# section X: whether GPU_CHECK_STEPS names section X (else one SKIP row for it).
section() {
  [[ $sections == *" $1 "* ]] && return 0
  skip "$1" "not in GPU_CHECK_STEPS ($sections)"
  return 1
}
# phase SECONDS: steps from here on end by now + SECONDS (and by the global deadline).
phase() {
  phase_deadline=$((SECONDS + $1))
  [ "$phase_deadline" -le "$deadline" ] || phase_deadline=$deadline
}

# step NAME CAP CMD...: runs CMD with a timeout of CAP seconds (less when the
# phase or the run is nearly out of time), output to logs/NAME.log, and
# records the result with the log's last line (or its last line matching
# $STEP_NOTE_RE). Exit 77 with a "gpu_check SKIP: why" line is a SKIP.
# Returns 0 on PASS, 1 on FAIL, 2 on SKIP.
step() {
  local name=$1 cap=$2 log=$out/logs/$1.log rc t0 secs left
  shift 2
  left=$((phase_deadline - SECONDS))
  if [ "$left" -lt "$MIN_STEP_S" ]; then
    skip "$name" "time budget spent ($budget s for the run; GPU_CHECK_BUDGET)"
    return 2
  fi
  [ "$cap" -le "$left" ] || cap=$left
  t0=$(date +%s.%N)
  echo "+ $*" > "$log"
  timeout -k 5 "$cap" "$@" >> "$log" 2>&1 < /dev/null
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq 0 ]; then
    record PASS "$name" "$secs" "$(last_line "$log" "${STEP_NOTE_RE:-}")"
    return 0
  elif [ "$rc" -eq 77 ] && grep -q '^gpu_check SKIP: ' "$log"; then
    record SKIP "$name" "$secs" "$(sed -n 's/^gpu_check SKIP: //p' "$log" | tail -n 1)"
    return 2
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record FAIL "$name" "$secs" "timed out after $cap s; last output: $(last_line "$log")"
  else
    record FAIL "$name" "$secs" "exit $rc: $(last_line "$log" "${STEP_NOTE_RE:-}")"
  fi
  return 1
}

# run_tsv LINE [PREFIX...]: runs one tests.tsv test (PREFIX, e.g. a sanitizer,
# before its command) in its folder with its environment. Run through
# `bash -c` by step(), so it reads BUNDLE and CORPUS from the environment.
run_tsv() {
  local line=$1 f e
  shift
  local -a fields cmd kv
  IFS=$'\t' read -r -a fields <<< "$line"
  if [[ $line == *@CORPUS@* ]] && [ -z "${CORPUS:-}" ]; then
    echo "gpu_check SKIP: ${fields[0]} needs the corpus, and none was found"
    return 77
  fi
  for f in "${fields[@]:5}"; do
    f=${f//@BUNDLE@/$BUNDLE}
    cmd+=("${f//@CORPUS@/${CORPUS:-}}")
  done
  local wd=${fields[3]//@BUNDLE@/$BUNDLE} env=${fields[4]//@BUNDLE@/$BUNDLE}
  mkdir -p "$wd" && cd "$wd" || return 1
  if [ "$env" != "-" ]; then
    IFS=';' read -r -a kv <<< "${env//@CORPUS@/${CORPUS:-}}"
    for e in "${kv[@]}"; do export "${e?}"; done
  fi
  exec "$@" "${cmd[@]}"
}
export -f run_tsv

# ---- setup: the bundle ------------------------------------------------------------
{
  echo "# tptrain GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); host: $(uname -n) ($(uname -srm))"
} > "$report"
if ! command -v timeout > /dev/null; then
  echo "gpu_check: coreutils' timeout is missing; cannot bound the steps" | tee -a "$report" >&2
  exit 2
fi
bundle=""
if [ -f "$bundle_arg/tests.tsv" ] && [ -x "$bundle_arg/bin/train_mt" ]; then
  bundle=$(cd "$bundle_arg" && pwd)
fi
BIN=$bundle/bin
# The test programs travel packed (gpu_bundle.sh): unpacked once, beside the
# programs; so do the bundled shared libraries (lib/, the programs'
# $ORIGIN/../lib). scripts/bundle_unpack.sh: tar -J, or python3's tarfile.
# shellcheck source=scripts/bundle_unpack.sh
. "$(dirname "$0")/bundle_unpack.sh"
if [ -n "$bundle" ]; then
  for packed in "$BIN/test.tar.xz:$BIN:test" "$bundle/lib.tar.xz:$bundle:lib"; do
    IFS=: read -r archive into member <<< "$packed"
    if [ -f "$archive" ] && [ ! -d "$into/$member" ]; then
      bundle_unpack "$archive" "$into" || { echo "gpu_check: cannot unpack $archive" >&2; exit 2; }
    fi
  done
fi
export BUNDLE=$bundle
note "- bundle: ${bundle:-$bundle_arg (missing)}; $(grep -h '^commit' "$bundle/BUILD_INFO" 2>/dev/null || echo 'no BUILD_INFO')"
note "- output: $out; time budget ${budget} s"

# ---- setup: the GPU ------------------------------------------------------------------
# GPU_CHECK_SMI: the nvidia-smi to use, or "none" to see no GPU (tests of this script).
smi=${GPU_CHECK_SMI:-$(command -v nvidia-smi || true)}
for c in /usr/bin/nvidia-smi /usr/local/nvidia/bin/nvidia-smi; do
  [ -n "$smi" ] || { [ -x "$c" ] && smi=$c; }
done
have_gpu=0 gpu_note="" driver_cuda=""
if [ "$smi" = none ]; then
  gpu_note="no GPU (GPU_CHECK_SMI=none)"
elif [ -n "$smi" ]; then
  timeout 60 "$smi" > "$out/nvidia-smi.txt" 2>&1
  smi_rc=$?
  cat "$out/nvidia-smi.txt"
  n_gpu=$(timeout 30 "$smi" -L 2>/dev/null | grep -c '^GPU ')
  driver_cuda=$(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' "$out/nvidia-smi.txt" | head -n 1)
  gpu_line=$(timeout 30 "$smi" --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
  if [ "$n_gpu" -gt 0 ]; then
    have_gpu=1 gpu_note="$n_gpu GPU(s): $gpu_line; driver supports CUDA ${driver_cuda:-?}"
  else
    gpu_note="nvidia-smi (exit $smi_rc) lists no GPU: $(last_line "$out/nvidia-smi.txt")"
  fi
elif nv=(/dev/nvidia[0-9]*) && [ -e "${nv[0]}" ]; then
  have_gpu=1 gpu_note="no nvidia-smi, but ${nv[*]} present"
else
  gpu_note="no GPU: no nvidia-smi (PATH, /usr/bin, /usr/local/nvidia/bin) and no /dev/nvidia0"
fi
gpu_seen=$have_gpu
[ "${GPU_CHECK_FORCE:-0}" = 1 ] && [ "$have_gpu" = 0 ] && have_gpu=1 gpu_note="$gpu_note (GPU_CHECK_FORCE=1: GPU steps run anyway)"
note "- GPU: $gpu_note"
built_cuda=$(sed -n 's/^nvcc \([0-9]*\).*/\1/p' "$bundle/BUILD_INFO" 2>/dev/null)
if [ -n "$driver_cuda" ] && [ -n "$built_cuda" ] && [ "${driver_cuda%%.*}" -lt "$built_cuda" ]; then
  note "- WARNING: the driver supports CUDA $driver_cuda but the bundle was built with CUDA $built_cuda: expect 'CUDA driver version is insufficient'"
fi

# ---- setup: libraries ------------------------------------------------------------------
# Candidate folders, in order of preference: the toolkit (CUDA_HOME, then
# /usr/local/cuda*, newest first), PyTorch's nvidia wheels and torch/lib for
# python3 and /usr/bin/python3, then the system's folders and ld.so's cache.
dirs=()
add_dir() { local d; for d in "$@"; do [ -d "$d" ] && dirs+=("$(cd "$d" && pwd -P)"); done; }
mapfile -t cuda_dirs < <(printf '%s\n' /usr/local/cuda-* | sort -rV)
for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "${cuda_dirs[@]}"; do
  [ -n "$c" ] && add_dir "$c/lib64" "$c/lib" "$c/targets/x86_64-linux/lib"
done
pys=()
for p in python3 /usr/bin/python3; do
  p=$(command -v "$p" 2>/dev/null) || continue
  [[ " ${pys[*]} " == *" $p "* ]] || pys+=("$p")
done
for p in "${pys[@]}"; do
  # Without importing torch (slow): the folders holding shared libraries under
  # the nvidia namespace package and torch/lib.
  mapfile -t found < <(timeout 60 "$p" - 2>/dev/null <<'PY'
import importlib.util, os
roots = []
for mod, sub in (("nvidia", ""), ("torch", "lib")):
    try:
        spec = importlib.util.find_spec(mod)
    except Exception:
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        roots.append(os.path.join(loc, sub) if sub else loc)
for r in roots:
    for d, subdirs, files in os.walk(r):
        if d[len(r):].count(os.sep) > 3:
            subdirs[:] = []
        if any(".so" in f for f in files):
            print(d)
PY
)
  [ "${#found[@]}" -gt 0 ] && add_dir "${found[@]}"
done
add_dir /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib
mapfile -t dirs < <(printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++')
ldconfig_bin=$(command -v ldconfig || echo /sbin/ldconfig)
ldcache=$("$ldconfig_bin" -p 2>/dev/null || true)
# find_lib PATTERN: the first file matching PATTERN (a soname or a glob) in dirs, else ld.so's cache.
find_lib() {
  local d f
  for d in "${dirs[@]}"; do
    for f in "$d"/$1; do [ -e "$f" ] && { echo "$f"; return 0; }; done
  done
  awk -v s="$1" '$1 == s && /x86-64/ { print $NF; exit }' <<< "$ldcache" | grep . && return 0
  return 1
}
needs=$bundle/needs.txt
mapfile -t needed < <(grep -v '^#' "$needs" 2>/dev/null | grep $'\t' | cut -f2 | tr ' ' '\n' | grep '^lib' | sort -u)
lib_dirs=()
{
  echo "# libraries (needed by the bundle: *; others reported only)"
  for s in "${needed[@]}" libcuda.so.1 'libcudart.so.*' 'libcublasLt.so.*' 'libnccl.so.*' 'libcudnn.so.*'; do
    mark=" "
    for n in "${needed[@]}"; do [ "$n" = "$s" ] && mark="*"; done
    if path=$(find_lib "$s"); then
      echo "$mark $s => $path"
      if [ "$mark" = "*" ] || [ "$s" = libcuda.so.1 ]; then lib_dirs+=("$(dirname "$path")"); fi
    else
      echo "$mark $s => not found"
    fi
  done
} > "$out/libraries.txt"
cat "$out/libraries.txt"
system_dirs=" /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /lib64 /usr/lib /lib "
ld_path=$bundle/lib
# libstdc++: the machine's when it has every GLIBCXX version the bundle uses, else the bundled one.
glibcxx=$(sed -n 's/^glibcxx //p' "$needs" 2>/dev/null)
sys_stdcxx=$(find_lib libstdc++.so.6 || true)
if [ -n "$glibcxx" ] && [ "$glibcxx" != none ] \
   && { [ -z "$sys_stdcxx" ] || ! grep -qa "GLIBCXX_$glibcxx" "$sys_stdcxx"; }; then
  ld_path=$ld_path:$bundle/lib/fallback
  stdcxx_note="bundled libstdc++ (the machine's ${sys_stdcxx:-none} lacks GLIBCXX_$glibcxx)"
else
  stdcxx_note="the machine's libstdc++ (${sys_stdcxx:-?}) has the GLIBCXX version needed (${glibcxx:-none})"
fi
for d in $(printf '%s\n' "${lib_dirs[@]}" | awk '!seen[$0]++'); do
  [[ $system_dirs == *" $d "* ]] || ld_path=$ld_path:$d
done
export LD_LIBRARY_PATH=$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
note "- LD_LIBRARY_PATH: \`$LD_LIBRARY_PATH\`; $stdcxx_note"
note "- libraries: $(grep -v '^#' "$out/libraries.txt" | sed 's/^[ *] //' | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
note
note "| status | step | seconds | note |"
note "| --- | --- | --- | --- |"

# ---- setup steps ----------------------------------------------------------------------
if [ -z "$bundle" ]; then
  record FAIL setup.bundle 0 "no bundle at '$bundle_arg' (tests.tsv, bin/train_mt): run scripts/gpu_bundle.sh on the build machine and carry its folder"
  note; note "**$n_pass passed, $n_fail failed, $n_skip skipped**"
  exit 1
fi
record PASS setup.bundle 0 "$(grep -vc '^#' "$bundle/tests.tsv") tests in tests.tsv; built $(sed -n 's/^date //p' "$bundle/BUILD_INFO" 2>/dev/null)"
if [ "$gpu_seen" = 1 ]; then record PASS setup.gpu 0 "$gpu_note"; else record FAIL setup.gpu 0 "$gpu_note"; fi

# Every bundled binary's libraries, glibc's version.
missing=""
for b in "$BIN"/* "$BIN"/test/*; do
  if [ ! -f "$b" ] || [ ! -x "$b" ]; then continue; fi
  nf=$(ldd "$b" 2>&1 | awk '/not found/ { print $1 }' | tr '\n' ' ')
  [ -z "$nf" ] || missing="$missing ${b#"$bundle"/}: $nf;"
done
glibc_need=$(sed -n 's/^glibc //p' "$needs" 2>/dev/null)
glibc_have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
glibc_ok=1
if [ -n "$glibc_need" ] && [ "$glibc_need" != none ] && [ -n "$glibc_have" ] \
   && [ "$(printf '%s\n%s\n' "$glibc_need" "$glibc_have" | sort -V | head -n 1)" != "$glibc_need" ]; then
  glibc_ok=0
fi
# Needed libraries ldd does not see (cuBLASLt, opened at run time).
nf=$(awk '$1 == "*" && $2 ~ /^libcublasLt/ && $4 == "not" { print $2 }' "$out/libraries.txt" | tr '\n' ' ')
[ -z "$nf" ] || missing="$missing needed by the bundle: $nf;"
if [ "$have_gpu" = 1 ] && grep -q '^  libcuda.so.1 => not found' "$out/libraries.txt"; then
  missing="$missing the driver's libcuda.so.1;"
fi
if [ -n "$missing" ] || [ "$glibc_ok" = 0 ]; then
  record FAIL setup.libs 0 "${missing:+not found:${missing%;} }$([ "$glibc_ok" = 0 ] && echo "glibc $glibc_have < $glibc_need needed")"
else
  record PASS setup.libs 0 "every bundled binary resolves its libraries; glibc ${glibc_have:-?} >= ${glibc_need:-?}"
fi

# train_mt --help: which of the flags the later steps need this build has.
timeout 30 "$BIN/train_mt" --help > "$out/train_mt_help.txt" 2>&1
help_rc=$?
if [ "$help_rc" -eq 0 ]; then
  flags=""
  for f in --device --dtype --comm --zero --pp --sequence-parallel --recompute --attention --cuda-graphs; do
    grep -Eq -- "(^|[^a-z-])$f([^a-z-]|$)" "$out/train_mt_help.txt" && flags="$flags $f"
  done
  record PASS setup.train_mt 0 "train_mt --help lists:${flags:- none of --device, --dtype, --comm}"
else
  record FAIL setup.train_mt 0 "train_mt --help failed (exit $help_rc): $(last_line "$out/train_mt_help.txt")"
fi
has_flag() { [ "$help_rc" -eq 0 ] && [[ " $flags " == *" $1 "* ]]; }
# why_not FLAGS...: empty when the GPU and every flag are there, else the reason to skip.
why_not() {
  local f
  [ "$have_gpu" = 1 ] || { echo "no GPU (see setup.gpu)"; return; }
  [ "$help_rc" -eq 0 ] || { echo "train_mt --help failed (see setup.train_mt)"; return; }
  for f in "$@"; do has_flag "$f" || { echo "train_mt --help does not list $f (not in this build yet)"; return; }; done
}

# The corpus: the argument, $TPTRAIN_CORPUS_DIR, the places run_tests.sh
# looks, else the copy packed in the bundle (unpacked into a scratch folder).
CORPUS=""
for c in "$corpus_arg" ../shared/data/small_parallel_enja data/small_parallel_enja shared/data/small_parallel_enja; do
  if [ -n "$c" ] && [ -s "$c/train.en" ]; then CORPUS=$(cd "$c" && pwd); break; fi
done
if [ -z "$CORPUS" ] && [ -n "$corpus_arg" ]; then
  record FAIL setup.corpus 0 "no corpus at '$corpus_arg' (no train.en)"
elif [ -n "$CORPUS" ]; then
  record PASS setup.corpus 0 "$CORPUS"
else
  tarballs=("$bundle"/data/*.tar.gz)
  tarball=${tarballs[0]}
  if [ -f "$tarball" ] && tar -xzf "$tarball" -C "$work" 2>> "$out/logs/setup.corpus.log"; then
    for c in "$work"/*/train.en; do [ -s "$c" ] && CORPUS=$(dirname "$c"); done
  fi
  if [ -n "$CORPUS" ]; then record PASS setup.corpus 0 "unpacked ${tarball#"$bundle"/} (no corpus folder found)"
  else record SKIP setup.corpus 0 "no corpus (argument, TPTRAIN_CORPUS_DIR, ../shared/data, data/, bundle data/): steps needing it skip"; fi
fi
export CORPUS
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3 || echo python3)
compare=$root/scripts/compare_curves.py
[ -f "$compare" ] || compare=$bundle/scripts/compare_curves.py

# ---- a: GPU tests (and CPU canaries) --------------------------------------------------------
cd "$work" || exit 2   # the training runs' scratch folder (tests.tsv tests run in their own)
mapfile -t tsv < <(grep -v '^#' "$bundle/tests.tsv")  # sections a and b both read it
if section a; then  # (sections are not indented)
phase 180
n_gpu_tests=0
for line in "${tsv[@]}"; do
  IFS=$'\t' read -r name labels timeout_s _ <<< "$line"
  if [[ ,$labels, == *,gpu,* ]]; then
    n_gpu_tests=$((n_gpu_tests + 1))
    if [ "$have_gpu" = 1 ]; then
      step "a.$name" "$((timeout_s < 150 ? timeout_s : 150))" bash -c 'run_tsv "$@"' run_tsv "$line"
    else
      skip "a.$name" "no GPU (see setup.gpu)"
    fi
  elif [ -n "$cpu_tests_re" ] && [[ $name =~ $cpu_tests_re ]]; then
    step "a.cpu.$name" "$((timeout_s < 120 ? timeout_s : 120))" bash -c 'run_tsv "$@"' run_tsv "$line"
  fi
done
[ "$n_gpu_tests" -gt 0 ] || record FAIL a.gpu_tests 0 "tests.tsv has no test labelled gpu (built without CUDA?)"
fi

# ---- b: compute-sanitizer -------------------------------------------------------------------
if section b; then
phase 200
san=${GPU_CHECK_SANITIZER:-}
[ "$san" != none ] || san=""
[ -n "${GPU_CHECK_SANITIZER:-}" ] || for c in "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" /usr/local/cuda/bin/compute-sanitizer \
         "${cuda_dirs[@]/%//bin/compute-sanitizer}" "$(command -v compute-sanitizer)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then san=$c; break; fi
done
split=$root/scripts/sanitizer_split.py
[ -f "$split" ] || split=$bundle/scripts/sanitizer_split.py
# racecheck: the slowest tool (5 steps of the tiny preset reached step 4 in 90 s on an H200)
RACE_TRAIN=(--max-steps 2 --layers 1 --batch-size 8 --max-len 16)
san_targets=()
for line in "${tsv[@]}"; do
  name=${line%%$'\t'*}
  [[ $name =~ $SAN_TARGETS_RE ]] && san_targets+=("$line")
done
train_why=$(why_not --device)
if [ -z "$san" ]; then
  skip b.sanitizer "compute-sanitizer not found (CUDA_HOME/bin, /usr/local/cuda*/bin, PATH)"
elif [ "$have_gpu" != 1 ]; then
  skip b.sanitizer "no GPU (see setup.gpu)"
else
  say "compute-sanitizer: $san ($("$san" --version 2>/dev/null | tail -n 1))"
  [ "${#san_targets[@]}" -gt 0 ] || skip b.op_tests "tests.tsv has no test_backend_ops_gpu"
  for tool in "${SAN_TOOLS[@]}"; do
    sargs=("$py" "$split" --error-exitcode 99 -- "$san" --tool "$tool" --error-exitcode 99 --print-limit 100
           --target-processes all)
    train=(--max-steps 5)
    [ "$tool" != racecheck ] || train=("${RACE_TRAIN[@]}")
    for line in "${san_targets[@]}"; do
      IFS=$'\t' read -r name _ timeout_s _ <<< "$line"
      STEP_NOTE_RE='sanitizer_split:|ERROR SUMMARY' step "b.$tool.$name" "$((timeout_s < 90 ? timeout_s : 90))" \
        bash -c 'run_tsv "$@"' run_tsv "$line" "${sargs[@]}"
    done
    if [ -n "$train_why" ]; then
      skip "b.$tool.train_mt" "$train_why"
    else
      STEP_NOTE_RE='sanitizer_split:|ERROR SUMMARY|steps in' step "b.$tool.train_mt" 90 "${sargs[@]}" \
        "$BIN/train_mt" --device cuda --task copy --preset tiny "${train[@]}" --log-interval 1 --seed 1
    fi
  done
fi

fi

# ---- c: CPU vs GPU on the corpus ------------------------------------------------------------
judge() {  # judge NAME BAND REF RUN REFNAME RUNNAME [--from STEP]: the curve comparison as a step.
  step "$1" 30 "$py" "$compare" --band "$2" --names "$5,$6" "${@:7}" "$3" "$4"
}
if section c; then
phase 200
c_why=$(why_not --device --dtype)
[ -n "$CORPUS" ] || c_why=${c_why:-no corpus}
if [ -n "$c_why" ]; then
  for s in cpu cuda_fp32 cuda_bf16; do skip "c.$s" "$c_why"; done
else
  data=(--data "$CORPUS" --cache-dir "$work/cache")
  STEP_NOTE_RE=$TRAIN_NOTE_RE step c.cpu 240 \
    "$BIN/train_mt" --device cpu "${data[@]}" "${TRAIN_ARGS[@]}" --metrics "$out/c_cpu.jsonl"
  cpu_rc=$?
  for dt in fp32 bf16; do
    if STEP_NOTE_RE=$TRAIN_NOTE_RE step "c.cuda_$dt" 120 \
         "$BIN/train_mt" --device cuda --dtype "$dt" "${data[@]}" "${TRAIN_ARGS[@]}" --metrics "$out/c_cuda_$dt.jsonl" \
       && [ "$cpu_rc" -eq 0 ]; then
      judge "c.compare_$dt" "$dt" "$out/c_cpu.jsonl" "$out/c_cuda_$dt.jsonl" cpu "cuda_$dt"
    else
      skip "c.compare_$dt" "needs c.cpu and c.cuda_$dt to pass"
    fi
  done
  # flash attention (heads of 16) against exact attention, both bf16 on the GPU, the bf16 band
  f_why=$(why_not --attention)
  if [ -n "$f_why" ]; then
    skip c.flash "$f_why"
  elif STEP_NOTE_RE=$TRAIN_NOTE_RE step c.cuda_bf16_heads2 120 "$BIN/train_mt" --device cuda --dtype bf16 --heads 2 \
         "${data[@]}" "${TRAIN_ARGS[@]}" --metrics "$out/c_cuda_exact.jsonl" &&
       STEP_NOTE_RE=$TRAIN_NOTE_RE step c.cuda_flash 120 "$BIN/train_mt" --device cuda --dtype bf16 --heads 2 \
         --attention flash "${data[@]}" "${TRAIN_ARGS[@]}" --metrics "$out/c_cuda_flash.jsonl"; then
    judge c.compare_flash bf16 "$out/c_cuda_exact.jsonl" "$out/c_cuda_flash.jsonl" cuda_exact cuda_flash
    # the same run through the short-sequence kernels (kernels/cuda/attention_short.cu)
    if TPTRAIN_FLASH_KERNEL=short STEP_NOTE_RE=$TRAIN_NOTE_RE step c.cuda_flash_short 120 "$BIN/train_mt" \
         --device cuda --dtype bf16 --heads 2 --attention flash "${data[@]}" "${TRAIN_ARGS[@]}" \
         --metrics "$out/c_cuda_flash_short.jsonl"; then
      judge c.compare_flash_short bf16 "$out/c_cuda_exact.jsonl" "$out/c_cuda_flash_short.jsonl" cuda_exact \
        cuda_flash_short
    else
      skip c.compare_flash_short "needs c.cuda_flash_short to pass"
    fi
  else
    skip c.compare_flash "needs c.cuda_bf16_heads2 and c.cuda_flash to pass"
    skip c.compare_flash_short "needs c.cuda_bf16_heads2 and c.cuda_flash to pass"
  fi
fi

fi

# ---- d: tensor and data parallel on one GPU ---------------------------------------------------
if section d; then
phase 180
# The final memory record of a GPU run (argv: metrics file, 1 when the data
# groups were staged): every rank reports device_used (cudaMemGetInfo, the
# whole device) of at least its master weights, gradients, optimizer state
# and library overhead; staged ranks hold the 4 MiB page-locked staging
# buffer of their shared-memory groups under comm.
MEMORY_CHECK_PY='
import json, sys
path, staged = sys.argv[1], sys.argv[2] == "1"
recs = [json.loads(l) for l in open(path) if "memory" in json.loads(l)]
if not recs:
    sys.exit(path + ": no final memory record")
ranks, bad = recs[-1]["memory"], []
for r in ranks:
    k, used, comm = r["rank"], r.get("device_used"), r["comm"]
    floor = r["master"] + r["grads"] + r["optimizer"] + r["library"]
    if used is None:
        bad.append(f"rank {k}: no device_used in the memory record")
    elif used < floor:
        bad.append(f"rank {k}: device_used {used} B < allocations + library {floor} B")
    if staged and comm < 4 << 20:
        bad.append(f"rank {k}: comm {comm} B holds no 4 MiB staging buffer")
mib = [round(r.get("device_used", 0) / 2**20) for r in ranks]
note = "; staging buffers under comm" if staged else ""
print("; ".join(bad) if bad else f"{len(ranks)} rank(s): device_used {mib} MiB covers allocations + library{note}")
sys.exit(1 if bad else 0)
'
memory_check() {  # STEP METRICS STAGED
  step "$1" 30 "$py" -c "$MEMORY_CHECK_PY" "$2" "$3"
}
d_why=$(why_not --device --comm)
# the layouts against tp1; the data-parallel reduction's stages where the build has them
# (nccl1: one rank with NCCL collectives, the world of one GPU; its flag comes after --comm shm)
d_layouts=("tp2 2 --tp 2" "tp4 4 --tp 4" "dp2 2 --tp 1 --dp 2" "nccl1 1 --tp 1 --comm nccl")
if has_flag --zero; then
  d_layouts+=("dp2z1 2 --tp 1 --dp 2 --zero 1 --grad-bucket-mb 0.01" "dp2z2 2 --tp 1 --dp 2 --zero 2 --grad-bucket-mb 0.01")
fi
# pipeline stages (send/recv of device buffers), sequence parallelism and
# recomputation where the build has them
has_flag --pp && d_layouts+=("pp2m2 2 --tp 1 --pp 2 --micro-batches 2" "tp2pp2m2 4 --tp 2 --pp 2 --micro-batches 2")
has_flag --sequence-parallel && d_layouts+=("tp2sp 2 --tp 2 --sequence-parallel")
has_flag --recompute && d_layouts+=("tp2full 2 --tp 2 --recompute full" "tp1sel 1 --tp 1 --recompute selective")
d_names=(tp1)
for l in "${d_layouts[@]}"; do d_names+=("${l%% *}"); done
if [ -n "$d_why" ]; then
  for s in "${d_names[@]}"; do skip "d.$s" "$d_why"; done
else
  # fp32 when the build has --dtype (the tight band), else its default precision.
  d_dtype=() band=bf16
  if has_flag --dtype; then d_dtype=(--dtype fp32); band=fp32; fi
  # The synthetic copy task, as test_parallel.sh: a global batch of 32 sequences
  # that dp splits (the corpus batcher budgets tokens per dp rank, so dp would
  # change the batches); GELU keeps a pre-activation near 0 from flipping a
  # ReLU between layouts.
  d_args=(--device cuda "${d_dtype[@]}" --task copy --batch-size 32 "${TRAIN_ARGS[@]}" --activation gelu)
  if STEP_NOTE_RE=$TRAIN_NOTE_RE step d.tp1 120 \
       "$BIN/train_mt" "${d_args[@]}" --metrics "$out/d_tp1.jsonl"; then
    memory_check d.memory_tp1 "$out/d_tp1.jsonl" 0
    for layout in "${d_layouts[@]}"; do
      read -r lname nproc lflags <<< "$layout"
      # shellcheck disable=SC2086  # lflags: the layout's flags, split on purpose
      if STEP_NOTE_RE=$TRAIN_NOTE_RE step "d.$lname" 120 \
           "$BIN/tprun" --standalone --nproc_per_node "$nproc" "$BIN/train_mt" "${d_args[@]}" --comm shm $lflags \
           --comm-timeout 60 --metrics "$out/d_$lname.jsonl"; then
        judge "d.compare_$lname" "$band" "$out/d_tp1.jsonl" "$out/d_$lname.jsonl" tp1 "$lname"
        staged=1  # a rank alone, or with NCCL, has nothing to stage
        [[ " $lflags " != *" --comm nccl "* ]] && [ "$nproc" -gt 1 ] || staged=0
        memory_check "d.memory_$lname" "$out/d_$lname.jsonl" "$staged"
      fi
    done
  else
    for s in "${d_names[@]:1}"; do skip "d.$s" "needs d.tp1 to pass"; done
  fi
fi

fi

# ---- f: checkpoints on the GPU ----------------------------------------------------------------
if section f; then
phase 200
# resumes are compared bit for bit across processes: the heuristic's first cuBLASLt algorithm for every GEMM,
# not the per-process timed choice (kernels/cuda/gemm_tune.cu)
export TPTRAIN_GEMM_TUNE=0
f_why=$(why_not --device --dtype)
f_names=(straight resume compare_resume straight0 gpu_to_cpu compare_gpu_to_cpu cpu_tp2 cpu_to_gpu compare_cpu_to_gpu)
if [ -n "$f_why" ]; then
  for s in "${f_names[@]}"; do skip "f.$s" "$f_why"; done
else
  # fp32: the cross-device resumes are judged in the fp32 band; 20 steps, saved at 10 and 20
  f_args=(--task copy --preset tiny --batch-size 32 --lr 2e-3 --warmup 10 --log-interval 1 --eval-interval 10
          --seed 1 --dtype fp32 --max-steps 20)
  # the same device and layout: dropout on (its keys must resume too), digit for digit
  if STEP_NOTE_RE=$TRAIN_NOTE_RE step f.straight 90 "$BIN/train_mt" --device cuda "${f_args[@]}" --dropout 0.1 \
       --save "$work/f_ck" --save-interval 10 --metrics "$out/f_straight.jsonl" --export "$work/f_straight" &&
     STEP_NOTE_RE=$TRAIN_NOTE_RE step f.resume 90 "$BIN/train_mt" --device cuda "${f_args[@]}" --dropout 0.1 \
       --resume "$work/f_ck/step_00000010" --metrics "$out/f_resume.jsonl" --export "$work/f_resume"; then
    # shellcheck disable=SC2016  # expanded by the inner bash
    step f.compare_resume 30 bash -c '"$1" "$2" --band exact --from 11 --names straight,resumed "$3" "$4" | tail -n 1 &&
        cmp "$5" "$6" && echo "steps 11..20 equal the straight run; exported weights identical"' _ \
      "$py" "$compare" "$out/f_straight.jsonl" "$out/f_resume.jsonl" \
      "$work/f_straight/model.safetensors" "$work/f_resume/model.safetensors"
  else
    skip f.compare_resume "needs f.straight and f.resume to pass"
  fi
  # across devices: dropout off and GELU, so the two arithmetics are all that differ
  x_args=("${f_args[@]}" --dropout 0 --activation gelu)
  if STEP_NOTE_RE=$TRAIN_NOTE_RE step f.straight0 90 "$BIN/train_mt" --device cuda "${x_args[@]}" \
       --save "$work/f_ck0" --save-interval 10 --metrics "$out/f_straight0.jsonl" &&
     STEP_NOTE_RE=$TRAIN_NOTE_RE step f.gpu_to_cpu 90 "$BIN/train_mt" --device cpu "${x_args[@]}" \
       --resume "$work/f_ck0/step_00000010" --metrics "$out/f_gpu_to_cpu.jsonl"; then
    judge f.compare_gpu_to_cpu fp32 "$out/f_straight0.jsonl" "$out/f_gpu_to_cpu.jsonl" gpu cpu_resumed --from 11
  else
    skip f.compare_gpu_to_cpu "needs f.straight0 and f.gpu_to_cpu to pass"
  fi
  if STEP_NOTE_RE=$TRAIN_NOTE_RE step f.cpu_tp2 120 "$BIN/tprun" --standalone --nproc_per_node 2 "$BIN/train_mt" \
       --device cpu "${x_args[@]}" --tp 2 --comm-timeout 60 --save "$work/f_ck_cpu" --save-interval 10 \
       --metrics "$out/f_cpu_tp2.jsonl" &&
     STEP_NOTE_RE='loaded as|steps in|error|refus' step f.cpu_to_gpu 90 "$BIN/train_mt" --device cuda "${x_args[@]}" \
       --resume "$work/f_ck_cpu/step_00000010" --metrics "$out/f_cpu_to_gpu.jsonl"; then
    judge f.compare_cpu_to_gpu fp32 "$out/f_cpu_tp2.jsonl" "$out/f_cpu_to_gpu.jsonl" cpu_tp2 gpu_tp1_resumed --from 11
  else
    skip f.compare_cpu_to_gpu "needs f.cpu_tp2 and f.cpu_to_gpu to pass"
  fi
fi
unset TPTRAIN_GEMM_TUNE
fi

# ---- p: the planner's memory on the GPU ------------------------------------------------------
if section p; then
phase 240
p_why=$(why_not --device --comm --pp)
[ -n "$CORPUS" ] || p_why=${p_why:-no corpus}
if [ -n "$p_why" ]; then
  skip p.plan_memory "$p_why"
elif [ ! -f "$root/test/test_plan.sh" ]; then
  skip p.plan_memory "test/test_plan.sh is not in this tree"
else
  STEP_NOTE_RE='test_plan:|FAIL' step p.plan_memory 240 env PLAN_DEVICE=cuda PLAN_MEMORY_ONLY=1 PYTHON="$py" \
    bash "$root/test/test_plan.sh" "$BIN" "$CORPUS"
fi
fi

# ---- e: benchmark --------------------------------------------------------------------------------
if section e; then
phase "$budget"
if [ ! -f "$root/scripts/bench_gpu.sh" ]; then
  skip e.bench_gpu "scripts/bench_gpu.sh is not in this tree"
elif [ "$have_gpu" != 1 ]; then
  skip e.bench_gpu "no GPU (see setup.gpu)"
elif [ -z "${CORPUS:-}" ]; then
  skip e.bench_gpu "no corpus"
else
  # the benchmark skips the configurations that would not end inside what is left
  step e.bench_gpu 600 env TPTRAIN_BIN="$BIN" BENCH_DIR="$out/bench" BENCH_BUDGET=$((phase_deadline - SECONDS - 20)) \
    bash "$root/scripts/bench_gpu.sh" "${CORPUS:-}"
fi
fi

# The ranks in the last memory table of a run's output (argv: log, ranks
# expected): rows "N (tp,dp,pp) |", maybe behind tprun's "[rank K] ".
TABLE_CHECK_PY='
import re, sys
path, want = sys.argv[1], int(sys.argv[2])
lines = open(path, errors="replace").read().splitlines()
starts = [i for i, l in enumerate(lines) if "peak memory per rank" in l]
if not starts:
    sys.exit(path + ": no memory table")
row = re.compile(r"^(\[rank \d+\] )?\s*(\d+) \(\d+,\d+,\d+\)\s*\|")
ranks = sorted({int(m.group(2)) for l in lines[starts[-1] + 1:] for m in [row.match(l)] if m})
print(f"the last memory table has rows for ranks {ranks}; {want} expected")
sys.exit(0 if ranks == list(range(want)) else 1)
'
# ---- g: the main job on one GPU, and four ranks on it ---------------------------------------------
if [[ $sections == *" g "* ]]; then
phase "$budget"
g_why=$(why_not --device --comm)
[ -n "$CORPUS" ] || g_why=${g_why:-no corpus}
if [ -n "$g_why" ]; then
  for s in main plot tp4 tp4_table; do skip "g.$s" "$g_why"; done
else
  # The main job gets what the four ranks leave; its training ends itself (--max-minutes) 150 s before
  # the step's cap, for its last evaluation and save, the averaging and score_run's four translations.
  read -r -a main_extra <<< "${GPU_CHECK_MAIN_ARGS:-}"
  tp4_steps=${GPU_CHECK_TP4_STEPS:-50}
  g_cap=$((phase_deadline - SECONDS - (tp4_steps > 0 ? 130 : 20)))
  [ "$g_cap" -ge 240 ] || g_cap=240
  g_min=$(awk -v s="$g_cap" 'BEGIN { printf "%.2f", (s - 150) / 60 }')
  # run_main counts the GPUs with the nvidia-smi this check uses
  STEP_NOTE_RE="score_run: test BLEU|$TRAIN_NOTE_RE" step g.main "$g_cap" \
    env PATH="$(dirname "$smi"):$PATH" RUN_MAIN_BIN="$BIN" RUN_MAIN_OUT="$work/g" RUN_MAIN_MINUTES="$g_min" RUN_MAIN_EVAL="${GPU_CHECK_MAIN_EVAL:-500}" \
    bash "$root/scripts/run_main.sh" "$CORPUS" --cache-dir "$work/cache" --log-interval 50 "${main_extra[@]}"
  for f in enja.jsonl enja.test.ja enja.test.log; do [ ! -f "$work/g/$f" ] || cp "$work/g/$f" "$out/g_main${f#enja}"; done
  plot_py=""
  for p in "$py" python3; do "$p" -c 'import matplotlib' 2> /dev/null && { plot_py=$p; break; }; done
  if [ -z "$plot_py" ]; then
    skip g.plot "no python3 with matplotlib"
  elif [ -s "$out/g_main.jsonl" ]; then
    step g.plot 60 "$plot_py" "$root/scripts/plot_metrics.py" --x time "$out/g_main.jsonl" -o "$out/g_main.png"
  else
    skip g.plot "g.main wrote no metrics"
  fi
  # four ranks on the one GPU: every rank's row in the memory table
  if [ "$tp4_steps" -le 0 ]; then
    for s in tp4 tp4_table; do skip "g.$s" "GPU_CHECK_TP4_STEPS=0"; done
  elif STEP_NOTE_RE=$TRAIN_NOTE_RE step g.tp4 120 \
    "$BIN/tprun" --standalone --nproc_per_node 4 "$BIN/train_mt" --data "$CORPUS" --cache-dir "$work/cache" \
    --tp 4 --comm shm --comm-timeout 120 --max-steps "$tp4_steps" --log-interval 10 --eval-interval 0 \
    --metrics "$out/g_tp4.jsonl" "${main_extra[@]}"; then
    step g.tp4_table 30 "$py" -c "$TABLE_CHECK_PY" "$out/logs/g.tp4.log" 4
  fi
fi
fi

# ---- s: the recipe sweep (scripts/sweep_recipe.sh), only when GPU_CHECK_STEPS names it ------------
if [[ $sections == *" s "* ]]; then
phase "$budget"
s_why=$(why_not --device)
[ -n "$CORPUS" ] || s_why=${s_why:-no corpus}
if [ -n "$s_why" ]; then
  skip s.sweep "$s_why"
else
  STEP_NOTE_RE='sweep_recipe: (winner|en-ja|ja-en)' step s.sweep $((phase_deadline - SECONDS - 5)) \
    env SWEEP_BIN="$BIN" SWEEP_DEVICE=cuda bash "$root/scripts/sweep_recipe.sh" "$CORPUS" "$out/sweep"
fi
fi

if [ "${GPU_CHECK_PACK:-0}" = 1 ]; then  # report.md stays; the rest goes into one archive
  (cd "$out" && find . -mindepth 1 -maxdepth 1 ! -name report.md ! -name report.tar.gz -printf '%P\n' |
     tar -czf report.tar.gz -T - && find . -mindepth 1 -maxdepth 1 ! -name report.md ! -name report.tar.gz \
     -exec rm -rf {} +) || say "packing $out failed"
fi
total=$((SECONDS - t_start))
note
note "**$n_pass passed, $n_fail failed, $n_skip skipped** in $total s. Logs: logs/STEP.log."
say "$n_pass passed, $n_fail failed, $n_skip skipped in $total s; report: $report"
[ "$n_fail" -eq 0 ]
