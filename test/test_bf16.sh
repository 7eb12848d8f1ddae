#!/usr/bin/env bash
# Mixed precision on the CPU backend (bf16 GEMM operands, fp32 accumulation,
# fp32 master weights and optimizer): the same 200-step copy-task run in
# fp32 and bf16 from the same seed.
#  - the bf16 run really rounds: its losses are not bit-identical to fp32;
#  - it tracks fp32: every logged loss within BAND (relative) of fp32's, and
#    both learn (final held-out loss below 0.5 x the first loss);
#  - master weights stay fp32: the exported bf16-run weights are mostly not
#    representable in bf16 (a run that kept bf16 masters would have all
#    their low 16 bits zero).
#   test_bf16.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for dt in fp32 bf16; do
  "$build/train_mt" --task copy --preset tiny --max-steps 200 --lr 5e-3 --warmup 50 --log-interval 20 \
    --eval-interval 200 --seed 5 --device cpu --dtype "$dt" --metrics "$work/$dt.jsonl" \
    --export "$work/$dt" > "$work/$dt.log" 2>&1 || { cat "$work/$dt.log"; exit 1; }
done
grep -q "device CPU, bf16" "$work/bf16.log" || { echo "FAIL: the bf16 run does not say it runs bf16"; exit 1; }
/usr/bin/python3 - "$work" "$here/reference" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
import torch
import safetensors_io as st
BAND = 0.05   # relative: bf16 keeps 8 bits of mantissa; over 200 steps the curves may drift this far, no further
work = sys.argv[1]
def losses(dt):
    rows = [json.loads(l) for l in open(f"{work}/{dt}.jsonl")]
    return [r["loss"] for r in rows if "loss" in r], [r["dev_loss"] for r in rows if "dev_loss" in r]
f32, dev32 = losses("fp32")
b16, dev16 = losses("bf16")
assert len(f32) == len(b16) > 5, (len(f32), len(b16))
assert f32 != b16, "bf16 losses are bit-identical to fp32: no rounding happened"
worst = max(abs(a - b) / a for a, b in zip(f32, b16))
print(f"fp32 {f32[0]:.4f} -> {dev32[-1]:.4f}, bf16 {b16[0]:.4f} -> {dev16[-1]:.4f}; worst relative loss gap {worst:.4f} (band {BAND})")
assert worst < BAND, f"bf16 curve left the band: {worst:.4f}"
assert dev16[-1] < 0.5 * b16[0] and dev32[-1] < 0.5 * f32[0], "a run did not learn"
w = st.load(f"{work}/bf16/model.safetensors")[0]
bits = torch.cat([t.flatten() for t in w.values()]).view(torch.int32)
frac = ((bits & 0xFFFF) != 0).float().mean().item()
print(f"master weights with non-bf16 low bits: {frac:.3f}")
assert frac > 0.5, f"only {frac:.3f} of the master weights carry fp32 bits: masters were rounded to bf16"
PY
