#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, -fsanitize=fuzzer,address,
# undefined, no recovery from undefined behaviour) and runs each for SECONDS
# on its seed corpus (fuzz/corpus/<target>: seeds and regression inputs,
# read only) plus a working corpus kept in the build folder between runs.
#
#   scripts/fuzz.sh [SECONDS] [BUILD_DIR]     SECONDS per target (default 60);
#                                             BUILD_DIR default build-fuzz
#   FUZZ_TARGETS="fuzz_config fuzz_manifest" scripts/fuzz.sh 300   some targets only
#   FUZZ_PARALLEL=2 scripts/fuzz.sh 60        two targets at a time (default
#                                             1): each is one process on one
#                                             core, so on two free cores each
#                                             still gets SECONDS of a core
#
# Prints one line per target (executions, corpus size, findings). Exit 0
# when nothing was found, 1 on a finding (the input is saved as
# BUILD_DIR/artifacts/<target>-crash-...: reproduce with
# BUILD_DIR/fuzz/<target> FILE), 77 when clang with libFuzzer is not
# available (ctest reports the smoke test as skipped).
set -uo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$root/build-fuzz}
targets=${FUZZ_TARGETS:-fuzz_safetensors fuzz_config fuzz_manifest fuzz_token_file}
[[ $secs =~ ^[0-9]+$ ]] && [ "$secs" -ge 1 ] || { echo "fuzz.sh: SECONDS must be a positive integer, got '$secs'"; exit 2; }
par=${FUZZ_PARALLEL:-1}
[[ $par =~ ^[0-9]+$ ]] && [ "$par" -ge 1 ] || { echo "fuzz.sh: FUZZ_PARALLEL must be a positive integer, got '$par'"; exit 2; }

# ---- clang with libFuzzer, or skip ----
cc=${FUZZ_CC:-clang}
cxx=${FUZZ_CXX:-clang++}
if ! command -v "$cc" > /dev/null || ! command -v "$cxx" > /dev/null; then
    echo "SKIP: $cc / $cxx not found (the fuzz targets need clang with libFuzzer)"
    exit 77
fi
mkdir -p "$build"
probe=$build/probe
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    > "$probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" 2> "$probe.log"; then
    echo "SKIP: $cc cannot build a libFuzzer program: $(head -c 300 "$probe.log")"
    exit 77
fi

# ---- build ----
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_FUZZ=ON -DTPTRAIN_TESTS=OFF \
        -DTPTRAIN_CUDA=OFF -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" > "$build/configure.log" 2>&1; then
    echo "fuzz.sh: configuring $build failed:"
    tail -n 30 "$build/configure.log"
    exit 1
fi
if ! cmake --build "$build" --target fuzz_targets -j "${FUZZ_JOBS:-2}" > "$build/build.log" 2>&1; then
    echo "fuzz.sh: building the fuzz targets failed:"
    grep -E "error|Error" "$build/build.log" | head -20
    exit 1
fi

# ---- run ----
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$build/artifacts" "$build/tmp"
# fuzz_one T: runs target T for SECONDS, its log in $build/T.log.
fuzz_one() {
    local t=$1
    local seeds=$root/fuzz/corpus/${t#fuzz_} work=$build/corpus/${t#fuzz_}
    mkdir -p "$work" "$build/tmp/$t"
    TMPDIR=$build/tmp/$t "$build/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -error_exitcode=1 -timeout_exitcode=1 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$work" "$seeds" > "$build/$t.log" 2>&1
}
# report T RC: one line for target T (exit status RC); returns 1 on a finding.
report() {
    local t=$1 rc=$2 log=$build/$1.log
    local runs n_corpus artifact
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    n_corpus=$(ls "$build/corpus/${t#fuzz_}" | wc -l)
    if [ "$rc" -eq 0 ]; then
        echo "$t: ${runs:-?} executions in ${secs} s, working corpus $n_corpus inputs, no findings"
        return 0
    fi
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "$t: FINDING after ${runs:-?} executions (exit $rc): ${artifact:-see $log}"
    grep -E "ERROR: |runtime error|fuzz invariant failed|SUMMARY" "$log" | head -5 | sed 's/^/    /'
    return 1
}
found=0
set -- $targets
while [ $# -gt 0 ]; do  # a batch of up to FUZZ_PARALLEL targets, then their lines in order
    batch=() pids=()
    while [ $# -gt 0 ] && [ ${#batch[@]} -lt "$par" ]; do
        fuzz_one "$1" &
        batch+=("$1") pids+=($!)
        shift
    done
    for i in "${!batch[@]}"; do
        rc=0
        wait "${pids[$i]}" || rc=$?
        report "${batch[$i]}" "$rc" || found=1
    done
done
rm -rf "$build/tmp"
exit $found
