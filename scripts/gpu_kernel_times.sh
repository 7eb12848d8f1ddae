#!/usr/bin/env bash
# GPU time per kernel of a few training steps, through Nsight Compute (ncu,
# clocks left as found), on the GPU machine, from the repository root with
# the folder scripts/gpu_bundle.sh made:
#
#   bash scripts/gpu_kernel_times.sh [BUNDLE_DIR] [-- TRAIN_MT_FLAGS...]
#
# Where train_mt --profile says which op of the backend table takes the
# time, this says which kernel inside it: cuBLASLt's GEMM kernels apart from
# the operand copies, the bias and ReLU passes and the conversions. ncu runs
# every kernel alone (serialised, one replay each), so the times are each
# kernel's own, without overlap; the run is much slower than a plain one.
# Output under $OUT (else ./kernel_times): ncu.csv (one row per launch),
# kernels.md (the table by kernel name, written by
# scripts/kernel_times_table.py where python3 is). Environment: KT_STEPS (2),
# KT_LAUNCH_COUNT (at most this many kernels profiled, 3000), KT_TIMEOUT
# (seconds for the ncu run, 240), KT_TOKENS (16384), KT_PRESET (base).
# First, without ncu, the bundle's bench_ln_ops times the LayerNorm and
# residual + LayerNorm ops alone at the base and big presets' widths
# (GB/s against the bytes each must move) into ln_bandwidth.txt (a few
# seconds; KT_LN_BENCH=0 skips it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${1:-gpu_bundle}
shift || true
[ "${1:-}" != -- ] || shift
out=${OUT:-$PWD/kernel_times}
mkdir -p "$out" || exit 2
[ -x "$bundle/bin/train_mt" ] || { echo "gpu_kernel_times: no bundle at $bundle" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
# shellcheck source=scripts/bundle_unpack.sh
. "$(dirname "$0")/bundle_unpack.sh"
[ -d "$bundle/lib" ] || bundle_unpack "$bundle/lib.tar.xz" "$bundle" || exit 2
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "$ncu" ] || { echo "gpu_kernel_times: ncu not found" >&2; exit 2; }
# The CUDA runtime and cuBLASLt of the toolkit, NCCL from PyTorch's wheels, the driver.
libs=$bundle/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
  [ -d "$d" ] && libs=$libs:$d
done
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl" ] && libs=$libs:$nccl
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
lnb=$bundle/bin/test/bench_ln_ops
[ -x "$lnb" ] || [ ! -f "$bundle/bin/test.tar.xz" ] || bundle_unpack "$bundle/bin/test.tar.xz" "$bundle/bin" test/bench_ln_ops
if [ "${KT_LN_BENCH:-1}" != 0 ] && [ -x "$lnb" ]; then
  timeout -k 5 120 "$lnb" cuda 50 > "$out/ln_bandwidth.txt" 2>&1
  echo "gpu_kernel_times: bench_ln_ops exit $?"; cat "$out/ln_bandwidth.txt"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kernel_times.XXXXXX") || exit 2
tar -xzf "$bundle"/data/*.tar.gz -C "$work" || exit 2
corpus=$(dirname "$(ls "$work"/*/train.en | head -n 1)")
echo "gpu_kernel_times: $ncu; corpus $corpus"
timeout -k 5 "${KT_TIMEOUT:-240}" "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
  --launch-count "${KT_LAUNCH_COUNT:-3000}" \
  "$bundle/bin/train_mt" --data "$corpus" --cache-dir "$work/cache" --preset "${KT_PRESET:-base}" --device cuda \
  --dtype bf16 --batch-tokens "${KT_TOKENS:-16384}" --length-bucket 8 --max-steps "${KT_STEPS:-2}" \
  --eval-interval 0 --log-interval 1 "$@" > "$out/ncu.csv" 2> "$out/ncu.log"
rc=$?
echo "gpu_kernel_times: ncu exit $rc; $(grep -c '^"' "$out/ncu.csv") CSV lines"
tail -n 5 "$out/ncu.log"
if [ -f "$root/scripts/kernel_times_table.py" ]; then
  python3 "$root/scripts/kernel_times_table.py" "$out/ncu.csv" > "$out/kernels.md" && head -n 45 "$out/kernels.md"
fi
rm -rf "$work"
exit "$rc"
