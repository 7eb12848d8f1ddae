#!/usr/bin/env bash
# Training learns: train_mt on the synthetic copy task for 300 steps must
# bring the held-out loss well below where it started, and its export must
# load back. Usage: test_train_copy.sh TRAIN_MT
set -euo pipefail
train=$1
. "$(dirname "$0")/lib.sh"
enter_workdir
"$train" --preset tiny --task copy --max-steps 300 --lr 5e-3 --warmup 50 --log-interval 50 \
         --eval-interval 100 --seed 3 --metrics "$work/metrics.jsonl" --export "$work/model"
test -s "$work/model/model.safetensors"
test -s "$work/model/config.json"
/usr/bin/python3 - "$work/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in rows if "loss" in r]
dev = [r for r in rows if "dev_loss" in r]
for r in train:
    for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "mem_peak_mib", "mem_rss_mib"):
        assert k in r, f"metrics row lacks {k}: {r}"
    assert len(r["mem_peak_mib"]) == 1 and r["mem_peak_mib"][0] > 0, f"memory figures of one rank expected: {r}"
times = [r["elapsed_s"] for r in rows if "elapsed_s" in r]
assert len(times) == len(train) + len(dev), "a training or held-out row lacks elapsed_s"
assert times[0] >= 0 and all(b >= a for a, b in zip(times, times[1:])), f"elapsed_s goes backwards: {times}"
first, last_dev = train[0]["loss"], dev[-1]["dev_loss"]
print(f"first training loss {first:.4f}, held-out loss at step {dev[-1]['step']}: {last_dev:.4f}")
# Uniform guessing over 64 symbols costs ln(64) = 4.16; the label-smoothing
# floor (eps 0.1) is about 0.73. Learning to copy must reach below 0.4x start.
assert first > 3.5, f"initial loss {first} is not near ln(V)"
assert last_dev < 0.4 * first, f"held-out loss {last_dev} did not fall below 0.4 x {first}"
assert dev[-1]["step"] == 300
PY

# --device cuda where no GPU can be used: refused in one sentence, exit 2.
if ! nvidia-smi -L > /dev/null 2>&1; then
  one_line_refusal "--device cuda without a GPU" "train_mt: --device cuda: " \
    "$1" --device cuda --task copy --preset tiny --max-steps 1
fi

# --comm nccl for a model in host memory: refused in one sentence, exit 2
# (the reason this build has: no NCCL, or the model is not on a GPU).
one_line_refusal "--comm nccl on the CPU" "train_mt: --comm nccl " \
  "$1" --device cpu --comm nccl --task copy --preset tiny --max-steps 1
