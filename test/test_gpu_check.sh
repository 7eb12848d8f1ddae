#!/usr/bin/env bash
# scripts/gpu_check.sh without a GPU: a fake bundle around this build and
# stand-ins for nvidia-smi and compute-sanitizer drive every path of the
# script, so that the one GPU run it gets is not spent on a script bug.
#  - bin/train_mt wraps the real (CPU) train_mt: it lists the flags named in
#    FAKE_FLAGS in --help and drops them, so "--device cuda" trains on CPU;
#  - tests.tsv holds a passing "GPU" op test (test_backend_ops_gpu), one that hangs
#    (timeout), a CPU canary, and a test that needs the corpus.
# Scenarios:
#  1. a fake GPU and every flag, sections a c d f p e: each step runs; c and
#     e (corpus given) and d (tp 2, tp 4, dp 2 vs tp 1) compare their curves
#     and PASS; the hang is a FAIL "timed out"; d's memory checks FAIL on the
#     CPU records (no device_used, no staging buffer; none asked of one rank);
#  1b. section b alone (its op tests found without section a): the stand-in
#     sanitizer reports NCCL-internal errors under memcheck (PASS, listed)
#     and one of tptrain's under synccheck (FAIL); racecheck's training run
#     is the small one;
#  2. no GPU: every GPU step SKIPs, setup.gpu FAILs, nothing else runs long;
#  3. train_mt without --dtype and --comm, and a 6 s budget: c, d and f SKIP
#     naming the flag, later steps SKIP for lack of time, the run stays short;
#  4. no bundle: setup.bundle FAILs;
#  5. (with the corpus) GPU_CHECK_STEPS=g: every other section SKIPs; the
#     main job (run_main.sh with the bundle's programs: its GPU recipe, the
#     best checkpoint kept, the test BLEU from score_run.sh), its plot, four
#     ranks and their memory table PASS; GPU_CHECK_PACK=1 leaves report.md
#     and report.tar.gz.
# Usage: test_gpu_check.sh GPU_CHECK_SH BUILD_DIR [CORPUS_DIR]
set -euo pipefail
script=$1 build=$2 corpus=${3:-}
work=$(mktemp -d)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$work"' EXIT
# The corpus as the script sees it: its training pairs, and the first 64
# pairs of dev and test (the script's paths are the same; the dev and test
# BLEU of its training runs decode 64 sentences, not 500 each).
if [ -s "$corpus/train.en" ]; then
  mkdir "$work/corpus"
  ln -s "$(cd "$corpus" && pwd -P)"/train.{en,ja} "$work/corpus/"
  for f in dev.en dev.ja test.en test.ja; do head -n 64 "$corpus/$f" > "$work/corpus/$f"; done
  corpus=$(cd "$work/corpus" && pwd -P)
else
  corpus=""
fi
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# ---- the fake bundle -------------------------------------------------------------
b=$work/bundle fake=$work/fakebin
mkdir -p "$b/bin/test" "$b/lib/fallback" "$fake"
touch "$b/.gpu_bundle"
cat > "$b/bin/train_mt" <<EOF
#!/usr/bin/env bash
# Test stand-in: the CPU train_mt, with the flags in \$FAKE_FLAGS listed and ignored
# and those in \$FAKE_HIDE left out of --help (a train_mt that lacks them).
args=()
while [ \$# -gt 0 ]; do
  case " \${FAKE_FLAGS:-} " in *" \$1 "*) shift 2; continue ;; esac
  if [ "\$1" = --help ]; then
    hide='^\$'
    for f in \${FAKE_HIDE:-}; do hide="\$hide|^ *\$f "; done
    "$build/train_mt" --help | grep -Ev -- "\$hide"
    for f in \${FAKE_FLAGS:-}; do echo "  \$f VALUE              (test stand-in)"; done
    exit 0
  fi
  args+=("\$1"); shift
done
exec "$build/train_mt" "\${args[@]}"
EOF
ln -s "$build/tprun" "$b/bin/tprun"
ln -s "$build/translate_mt" "$b/bin/translate_mt"
printf '#!/bin/sh\necho "test_backend_ops_gpu (stand-in): 7 checks, 0 failed"\n' > "$b/bin/test/test_backend_ops_gpu"
printf '#!/bin/sh\necho "hanging"\nsleep 600\n' > "$b/bin/test/test_hang"
# shellcheck disable=SC2016  # expanded by the stand-in, not here
printf '#!/bin/sh\necho "cpu_ok: in $(pwd), corpus arg: $1, FAKE_VAR=$FAKE_VAR"\n' > "$b/bin/test/cpu_ok"
chmod +x "$b/bin/train_mt" "$b"/bin/test/*
# bin/test travels packed, as gpu_bundle.sh packs it (xz): gpu_check.sh unpacks it first.
tar -cf - -C "$b/bin" test | xz -T1 > "$b/bin/test.tar.xz" && rm -rf "$b/bin/test"
# lib/ too (a marker file stands for the libraries): it must be back in place after a run.
touch "$b/lib/fallback/marker.so.0"
tar -cf - -C "$b" lib | xz -T1 > "$b/lib.tar.xz" && rm -rf "$b/lib"
{
  printf '# name labels timeout folder env command...\n'
  printf 'test_backend_ops_gpu\tgpu\t300\t@BUNDLE@/bin/test\t-\t@BUNDLE@/bin/test/test_backend_ops_gpu\n'
  printf 'test_hang\tgpu\t2\t@BUNDLE@/bin/test\t-\t@BUNDLE@/bin/test/test_hang\n'
  printf 'cpu_ok\tcpu\t60\t@BUNDLE@/bin/test\tFAKE_VAR=1\t@BUNDLE@/bin/test/cpu_ok\tplain\n'
  printf 'needs_corpus\tcpu\t60\t@BUNDLE@/bin/test\t-\t@BUNDLE@/bin/test/cpu_ok\t@CORPUS@\n'
} > "$b/tests.tsv"
printf 'glibc 2.17\nglibcxx none\nbin/train_mt\t-\n' > "$b/needs.txt"
printf 'commit fake\ndate now\nnvcc 13.0\n' > "$b/BUILD_INFO"
cat > "$fake/nvidia-smi" <<'EOF'
#!/bin/sh
case "$1" in
  -L) echo "GPU 0: Fake H100 (UUID: GPU-00000000)" ;;
  --query-gpu=*) echo "Fake H100, 580.00, 81559 MiB" ;;
  *) echo "| NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: 13.0 |" ;;
esac
EOF
cat > "$fake/compute-sanitizer" <<'EOF'
#!/bin/bash
# Test stand-in: runs the program and reports like the real one. Its
# command lines go to $FAKE_SAN_LOG. On train_mt, memcheck reports what
# NCCL's start-up probe does on a real GPU (two errors inside libnccl) and,
# with FAKE_SAN_OURS=TOOL, that tool reports an error in tptrain's own kernel.
tool="" code=0
[ -z "${FAKE_SAN_LOG:-}" ] || echo "$*" >> "$FAKE_SAN_LOG"
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool=$2; shift 2 ;;
    --error-exitcode) code=$2; shift 2 ;;
    --print-limit|--target-processes) shift 2 ;;
    --version) echo "stand-in sanitizer"; exit 0 ;;
    *) break ;;
  esac
done
echo "========= COMPUTE-SANITIZER"
"$@"; rc=$?
n=0
if [ "${1##*/}" = train_mt ] && [ "$tool" = memcheck ]; then
  for k in 1 2; do
    echo "========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to \"no kernel image is available for execution on the device\" on CUDA API call to cudaFuncGetAttributes."
    echo "=========     Saved host backtrace up to driver entry point at error"
    echo "=========         Host Frame: [0x2ee2d5] in /usr/lib/x86_64-linux-gnu/libcuda.so.1"
    echo "=========         Host Frame:ncclInitKernelsForDevice(int, unsigned long*) [0x8f0b1] in /opt/nvidia/nccl/lib/libnccl.so.2"
    echo "=========         Host Frame:comm_nccl_create [0x4410] in $1"
    echo "========="
  done
  n=2
fi
if [ "${1##*/}" = train_mt ] && [ "$tool" = "${FAKE_SAN_OURS:-}" ]; then
  echo "========= Invalid __global__ read of size 4 bytes"
  echo "=========     at layernorm_fwd_kernel(float*, const float*)+0x70 in /src/kernels/cuda/layernorm.cu:88"
  echo "=========     by thread (3,0,0) in block (0,0,0)"
  echo "=========     Saved host backtrace up to driver entry point at kernel launch time"
  echo "=========         Host Frame: [0x2ee2d5] in /usr/lib/x86_64-linux-gnu/libcuda.so.1"
  echo "=========         Host Frame:cuda_op_layernorm_fwd [0x5510] in $1"
  echo "========="
  n=$((n + 1))
fi
echo "========= ERROR SUMMARY: $n error$([ $n = 1 ] || echo s)"
[ $n -gt 0 ] && [ $rc -eq 0 ] && rc=$code
exit $rc
EOF
chmod +x "$fake"/*

# check_run NAME ENV...: gpu_check.sh from a scratch folder (no corpus nearby) with ENV.
check_run() {
  local name=$1 t0=$SECONDS rc=0
  shift
  mkdir -p "$work/$name"
  (cd "$work/$name" && env OUT="$work/$name/out" GPU_CHECK_CPU_TESTS='^(cpu_ok|needs_corpus)$' \
     GPU_CHECK_SANITIZER="$fake/compute-sanitizer" "$@" \
     timeout 600 bash "$script" "$b" > "$work/$name/stdout.txt" 2>&1) || rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s"
  report=$work/$name/out/report.md
  [ -f "$report" ] || { bad "$name: no report.md"; cat "$work/$name/stdout.txt"; return; }
  echo "$rc" > "$work/$name/rc"
  echo "$((SECONDS - t0))" > "$work/$name/secs"
}
# row NAME STATUS STEP [TEXT]: report.md has STEP with STATUS (and TEXT in its note).
row() {
  local name=$1 status=$2 stp=$3 text=${4:-} line
  line=$(grep -F "| $stp |" "$work/$name/out/report.md" | head -n 1)
  if [[ $line == "| $status | $stp |"* ]] && [[ $line == *"$text"* ]]; then
    ok "$name: $stp $status${text:+ ($text)}"
  else
    bad "$name: $stp: expected $status${text:+ with \"$text\"}, got: ${line:-no row}"
  fi
}
norow() { if grep -qF "| $2 |" "$work/$1/out/report.md"; then bad "$1: unexpected row $2"; else ok "$1: no $2 row"; fi; }
# check WHAT CMD...: CMD must succeed.
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
# scripts/bundle_unpack.sh with the xz program and without it (BUNDLE_XZ=none:
# python3's tarfile): the whole archive, one member (gpu_kernel_times.sh's),
# and a member the archive lacks.
unpack() {  # unpack XZ DIR [MEMBER...]: bundle_unpack of the stand-in's test programs into a new DIR
  local xz=$1 dir=$work/unpack/$2
  shift 2
  mkdir -p "$dir"
  BUNDLE_XZ=$xz bash -c '. "$1" && shift && bundle_unpack "$@"' _ "$(dirname "$script")/bundle_unpack.sh" \
    "$b/bin/test.tar.xz" "$dir" "$@" 2> "$dir.err"
}
not() { ! "$@"; }
check "bundle_unpack without xz: the whole archive" unpack none all
check "bundle_unpack without xz: the programs back, executable" \
  test -x "$work/unpack/all/test/cpu_ok" -a -x "$work/unpack/all/test/test_hang"
check "bundle_unpack without xz: one member alone" unpack none one test/cpu_ok
check "bundle_unpack without xz: only that member" \
  test -x "$work/unpack/one/test/cpu_ok" -a ! -e "$work/unpack/one/test/test_hang"
check "bundle_unpack without xz: a member the archive lacks fails" not unpack none lacks test/nothing
check "bundle_unpack with xz: one member alone" unpack xz xz test/cpu_ok
check "bundle_unpack with xz: only that member" \
  test -x "$work/unpack/xz/test/cpu_ok" -a ! -e "$work/unpack/xz/test/test_hang"
max_steps=3

# ---- 1. a fake GPU, every flag ----------------------------------------------------------
c_args=()
[ -z "$corpus" ] || c_args=(TPTRAIN_CORPUS_DIR="$corpus")
# the benchmark at the tiny size on the CPU (its flags for that, passed through)
bench_env=(BENCH_DEVICE=cpu BENCH_PRESETS=tiny BENCH_TOKENS=256 BENCH_BUCKETS=1 BENCH_STEPS=3 BENCH_WARMUP=1
           BENCH_MODES=eager BENCH_PYTHON=/usr/bin/python3)
# (p: two of test_plan.sh's layouts, one staged and one with the corpus: its plumbing, not the planner)
# (d: without --zero and --sequence-parallel listed, the layouts that need them are left out: 3 runs fewer)
check_run full GPU_CHECK_SMI="$fake/nvidia-smi" FAKE_FLAGS="--device --dtype --comm" GPU_CHECK_STEPS="a c d f p e" \
  FAKE_HIDE="--zero --sequence-parallel" \
  PLAN_LAYOUTS="tp2sp-sel corpus-tp2" \
  GPU_CHECK_TRAIN_STEPS=$max_steps "${bench_env[@]}" "${c_args[@]}"
row full PASS setup.gpu "Fake H100"
row full PASS setup.train_mt "--device --dtype --comm"
row full PASS a.test_backend_ops_gpu "7 checks, 0 failed"
row full FAIL a.test_hang "timed out after 2 s"
row full PASS a.cpu.cpu_ok "corpus arg: plain, FAKE_VAR=1"
row full SKIP b "not in GPU_CHECK_STEPS"
if [ -n "$corpus" ]; then
  row full PASS a.cpu.needs_corpus "corpus arg: $corpus"
  row full PASS c.cpu
  row full PASS c.cuda_fp32
  row full PASS c.compare_fp32 "PASS fp32"
  row full PASS c.compare_bf16 "PASS bf16"
  check "full: c metrics kept" grep -q '"loss"' "$work/full/out/c_cuda_bf16.jsonl"
else
  row full SKIP a.cpu.needs_corpus "needs the corpus"
  row full SKIP c.cpu "no corpus"
fi
# The memory checks read the CPU stand-in's records, which have no device
# memory and no staging buffer: they must FAIL naming what is missing.
row full FAIL d.memory_tp1 "no device_used"
for l in tp2 tp4 dp2; do
  row full PASS "d.$l"
  row full PASS "d.compare_$l" "PASS fp32"
  row full FAIL "d.memory_$l" "holds no 4 MiB staging buffer"
done
row full PASS d.nccl1
row full PASS d.compare_nccl1 "PASS fp32"
# not staged (NCCL; one rank): no staging buffer asked for
for l in nccl1 tp1sel; do
  row full FAIL "d.memory_$l" "no device_used"
  if grep -F "| d.memory_$l |" "$work/full/out/report.md" | grep -q staging; then
    bad "full: d.memory_$l asks a run of one rank for a staging buffer"
  else
    ok "full: d.memory_$l asks for no staging buffer"
  fi
done
# f: the checkpoint resumes (on the CPU stand-in: exact, and within fp32)
for s in straight resume straight0 gpu_to_cpu cpu_tp2 cpu_to_gpu; do row full PASS "f.$s"; done
row full PASS f.compare_resume "exported weights identical"
row full PASS f.compare_gpu_to_cpu "PASS fp32"
row full PASS f.compare_cpu_to_gpu "PASS fp32"
norow full g.main
if [ -n "$corpus" ]; then
  row full PASS p.plan_memory "every rank's predicted peak within 5%"
  row full PASS e.bench_gpu "results in"
  check "full: the benchmark's table" grep -q '^| tiny | 256 | 1 | pytorch eager |' "$work/full/out/bench/bench.md"
else
  row full SKIP p.plan_memory "no corpus"
  row full SKIP e.bench_gpu "no corpus"
fi
check "full: exit 1 (a step failed; got $(cat "$work/full/rc"))" [ "$(cat "$work/full/rc")" = 1 ]
check "full: step logs" test -s "$work/full/out/logs/d.tp4.log"
check "full: lib.tar.xz unpacked into the bundle's lib/" test -f "$b/lib/fallback/marker.so.0"
check "full: nvidia-smi printed" grep -q 'CUDA Version: 13.0' "$work/full/stdout.txt"
check "full: totals line" grep -Eq '[0-9]+ passed, [1-9][0-9]* failed, [0-9]+ skipped' "$work/full/out/report.md"
check "full: training notes" grep -q '| PASS | d.tp2 | [0-9.]* | \[rank 0\] train_mt: 3 steps in' "$work/full/out/report.md"

# ---- 1b. the sanitizers alone (GPU_CHECK_STEPS=b: section a never ran) ---------------------------
check_run san GPU_CHECK_SMI="$fake/nvidia-smi" FAKE_FLAGS="--device --dtype --comm" GPU_CHECK_STEPS=b \
  FAKE_SAN_LOG="$work/san/calls.txt" FAKE_SAN_OURS=synccheck
for tool in memcheck racecheck synccheck initcheck; do
  row san PASS "b.$tool.test_backend_ops_gpu" "tptrain 0 error(s), library-internal 0; ERROR SUMMARY: 0 errors"
done
norow san b.op_tests
norow san b.memcheck.test_hang
# NCCL's own reports are listed, not failed; tptrain's fail
row san PASS b.memcheck.train_mt "tptrain 0 error(s), library-internal 2 (first: Host Frame:ncclInitKernelsForDevice"
row san PASS b.racecheck.train_mt "tptrain 0 error(s), library-internal 0"
row san PASS b.initcheck.train_mt "tptrain 0 error(s)"
row san FAIL b.synccheck.train_mt "tptrain 1 error(s), library-internal 0; first of tptrain's: Invalid __global__ read"
check "san: exit 1 (tptrain's error)" [ "$(cat "$work/san/rc")" = 1 ]
# racecheck trains 2 steps of a 1+1-layer model on 8 sequences (5 steps of tiny did not end in its 90 s cap)
race=$(grep -- '--tool racecheck' "$work/san/calls.txt" | grep train_mt)
if [[ $race == *"--max-steps 2 "* ]] && [[ $race == *"--layers 1 "* ]] && [[ $race == *"--batch-size 8 "* ]]; then
  ok "san: racecheck's training run is the small one"
else
  bad "san: racecheck's training run: $race"
fi
mem=$(grep -- '--tool memcheck' "$work/san/calls.txt" | grep train_mt)
[[ $mem == *"--max-steps 5 "* ]] && ok "san: the other tools keep 5 steps" || bad "san: memcheck's run: $mem"

# ---- 2. no GPU ------------------------------------------------------------------------------------
check_run nogpu GPU_CHECK_SMI=none FAKE_FLAGS="--device --dtype --comm"
row nogpu FAIL setup.gpu "no GPU"
row nogpu SKIP a.test_backend_ops_gpu "no GPU"
row nogpu SKIP a.test_hang "no GPU"
row nogpu PASS a.cpu.cpu_ok
row nogpu SKIP b.sanitizer "no GPU"
for s in c.cpu c.cuda_fp32 c.cuda_bf16 d.tp1 d.tp2 d.tp4 d.dp2; do row nogpu SKIP "$s" "no GPU"; done
norow nogpu d.memory_tp1
row nogpu SKIP e.bench_gpu
row nogpu SKIP p.plan_memory "no GPU"
for s in straight compare_resume cpu_to_gpu; do row nogpu SKIP "f.$s" "no GPU"; done
n=$(grep -c '^| FAIL' "$work/nogpu/out/report.md")
check "nogpu: setup.gpu is the only FAIL ($n FAIL rows)" [ "$n" -eq 1 ]
check "nogpu: short run ($(cat "$work/nogpu/secs") s)" [ "$(cat "$work/nogpu/secs")" -lt 30 ]

# ---- 3. flags missing, tight budget -----------------------------------------------------------
check_run tight GPU_CHECK_SMI="$fake/nvidia-smi" FAKE_FLAGS="--device" FAKE_HIDE="--dtype --comm" GPU_CHECK_BUDGET=6 \
  GPU_CHECK_TRAIN_STEPS=$max_steps "${c_args[@]}"
row tight PASS setup.train_mt "--device"
for s in c.cpu c.cuda_fp32 c.cuda_bf16; do row tight SKIP "$s" "does not list --dtype"; done
for s in d.tp1 d.tp2 d.tp4 d.dp2; do row tight SKIP "$s" "does not list --comm"; done
row tight SKIP f.straight "does not list --dtype"
row tight SKIP p.plan_memory "does not list --comm"
check "tight: steps skipped for lack of time" grep -q '^| SKIP | [^|]* | 0 | time budget spent' "$work/tight/out/report.md"
check "tight: ended in $(cat "$work/tight/secs") s with a 6 s budget" [ "$(cat "$work/tight/secs")" -lt 20 ]

# ---- 5. the main job alone (GPU_CHECK_STEPS=g), packed ----------------------------------------
if [ -n "$corpus" ]; then
  check_run main GPU_CHECK_SMI="$fake/nvidia-smi" FAKE_FLAGS="--device --dtype --comm" GPU_CHECK_STEPS=g \
    GPU_CHECK_MAIN_EVAL=10 GPU_CHECK_PACK=1 GPU_CHECK_TP4_STEPS=5 \
    GPU_CHECK_MAIN_ARGS="--preset tiny --batch-tokens 1024 --max-steps 20 --warmup 5" "${c_args[@]}"
  for s in a b c d f p e; do row main SKIP "$s" "not in GPU_CHECK_STEPS"; done
  row main PASS g.main "score_run: test BLEU"
  if /usr/bin/python3 -c 'import matplotlib' 2> /dev/null; then row main PASS g.plot; else row main SKIP g.plot; fi
  row main PASS g.tp4
  row main PASS g.tp4_table "ranks [0, 1, 2, 3]"
  # (the fake GPU has no driver library: setup.libs is the one FAIL)
  n=$(grep -c '^| FAIL' "$work/main/out/report.md")
  check "main: setup.libs is the only FAIL ($n FAIL rows)" [ "$n" -eq 1 ]
  check "main: only report.md and report.tar.gz left" \
    [ "$(cd "$work/main/out" && find . -mindepth 1 -maxdepth 1 | sort | tr '\n' ' ')" = "./report.md ./report.tar.gz " ]
  check "main: the archive holds the logs and metrics" \
    bash -c 'tar -tzf "$1" | grep -q "logs/g.main.log" && tar -tzf "$1" | grep -q "g_main.jsonl"' _ "$work/main/out/report.tar.gz"
  check "main: the main job's GPU recipe (bounded by time, the best kept)" \
    bash -c 'tar -xzOf "$1" logs/g.main.log | grep -q -- "--max-minutes [0-9.]* --eval-interval 10 --save-interval 10 --keep-last 3 --keep-best bleu --average-last 3"' _ "$work/main/out/report.tar.gz"
fi

# ---- 4. no bundle ---------------------------------------------------------------------------------
rc=0
OUT=$work/nobundle bash "$script" "$work/absent" > "$work/nobundle.txt" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] && grep -q '| FAIL | setup.bundle |' "$work/nobundle/report.md"; then
  ok "no bundle: FAIL setup.bundle, exit $rc"
else
  bad "no bundle: exit $rc"; cat "$work/nobundle.txt"
fi

if [ "$fails" -ne 0 ]; then
  for r in "$work"/*/out/report.md; do echo "---- $r"; cat "$r"; done
  echo "$fails check(s) failed"
  exit 1
fi
echo "gpu_check: all checks passed"
