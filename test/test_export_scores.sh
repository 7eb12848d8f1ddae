#!/usr/bin/env bash
# The `ckpt` tool on a real tp=2 x dp=2 checkpoint: tprun trains the tiny
# preset 40 steps on the corpus, saving a sharded checkpoint and a --export.
# Then:
#  - ckpt inspect prints the checkpoint's state and "ok"; with one flipped
#    byte in a shard it names the file and the CRC mismatch and exits 1;
#  - ckpt export equals train_mt's own --export exactly (every tensor, by
#    torch.equal): the shards reassemble into the gathered model;
#  - on the first 100 dev pairs, log p(ref | src) from translate_mt on the
#    export, translate_mt on the checkpoint directly, and the float64 PyTorch
#    reference on the export agree per sentence.
# Tolerances: the two C scores come from bit-identical weights through the
# same code, so they must be equal as printed. C (fp32) vs the reference
# (float64): |c - ref| <= max(SCORE_ATOL, SCORE_RTOL * |ref|). A score sums
# up to 64 (here ~15) token log-probabilities, each from fp32 GEMMs, LayerNorms and a
# log-softmax over 8000 logits (~1e-7 relative error per term), and %.6f
# printing adds 5e-7. Observed: max |C - reference| 3.0e-6, max relative
# 4.8e-8, on scores of -49 to -153. RTOL 1e-4 (at most 1.5e-2 here) or ATOL
# 1e-3 leaves two orders of magnitude of room, yet a reference that drops the
# eos term, starts targets with eos instead of bos, or masks the last source
# key moves the worst of the 100 scores by 4.0, 6.9 and 0.47.
# Usage: test_export_scores.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
. "$(dirname "$0")/corpus_cache.sh"
build=$1 corpus=$2
. "$(dirname "$0")/lib.sh"
enter_workdir
use_corpus_cache cache
dev_pairs 100

t0=$SECONDS
"$build/tprun" --standalone --nproc_per_node 4 "$build/train_mt" --data "$corpus" --cache-dir cache --preset tiny \
    --tp 2 --dp 2 --max-steps 40 --warmup 10 --lr 3e-3 --log-interval 10 --eval-interval 1000 --comm-timeout 300 \
    --save ckpt --export trained > train.log 2>&1 || { cat train.log; exit 1; }
grep -q "tp 2 x dp 2 x pp 1" train.log
echo "trained in $((SECONDS - t0)) s"

# inspect: the state, every file, the total, and "ok".
"$build/ckpt" inspect ckpt > inspect.txt || { echo "FAIL: ckpt inspect on a good checkpoint"; cat inspect.txt; exit 1; }
cat inspect.txt
step_dir=ckpt/step_00000040
for want in "checkpoint $step_dir" "step       40" "tp 2 x dp 2 x pp 1" "corpus: epoch 0, next batch 40" "t 40" \
            "model-tp1-pp0.safetensors" "optim-tp1-pp0-dp1.safetensors" "spm.model" "verify     ok"; do
  grep -qF "$want" inspect.txt || { echo "FAIL: ckpt inspect does not print '$want'"; exit 1; }
done
total=$(find "$step_dir" -type f ! -name manifest.json -printf '%s\n' | awk '{s += $1} END {print s}')
grep -q "^total      $total bytes" inspect.txt || { echo "FAIL: total is not $total bytes"; exit 1; }

# Usage errors exit 2, a missing checkpoint 1.
rc=0; "$build/ckpt" > /dev/null 2>&1 || rc=$?; test $rc -eq 2 || { echo "FAIL: no command: exit $rc"; exit 1; }
rc=0; "$build/ckpt" export ckpt > /dev/null 2>&1 || rc=$?; test $rc -eq 2 || { echo "FAIL: export ckpt: exit $rc"; exit 1; }
rc=0; "$build/ckpt" inspect nowhere > /dev/null 2> err.txt || rc=$?
test $rc -eq 1 && grep -q nowhere err.txt || { echo "FAIL: missing checkpoint: exit $rc"; cat err.txt; exit 1; }

# export, then the three scorers on the same pairs.
"$build/ckpt" export ckpt out > export.log
for f in config.json model.safetensors spm.model; do test -s "out/$f"; done
cmp out/spm.model "$step_dir/spm.model"
t1=$SECONDS
"$build/translate_mt" --model out --src src.en --ref ref.ja --score > c_export.txt
"$build/translate_mt" --model ckpt --src src.en --ref ref.ja --score > c_ckpt.txt
/usr/bin/python3 "$here/reference/score_reference.py" out src.en ref.ja > reference.txt
echo "scored in $((SECONDS - t1)) s"
cmp c_export.txt c_ckpt.txt || { echo "FAIL: the checkpoint scores differently from its export"; exit 1; }

/usr/bin/python3 - "$here/reference" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import torch
import safetensors_io as st

SCORE_RTOL, SCORE_ATOL = 1e-4, 1e-3   # fp32 C vs float64 reference; see the header

def scores(path):
    return [float(x) for x in open(path)]

ref = scores("reference.txt")
assert len(ref) == 100, f"reference printed {len(ref)} scores"
assert all(v < 0 for v in ref), "a log-probability is not negative"
assert len(set(round(v, 3) for v in ref)) > 90, "scores do not depend on the sentence"
for name in ("c_export.txt", "c_ckpt.txt"):
    got = scores(name)
    assert len(got) == 100, f"{name}: {len(got)} scores"
    worst_abs = max(abs(a - b) for a, b in zip(got, ref))
    worst_rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    bad = [(i + 1, a, b) for i, (a, b) in enumerate(zip(got, ref))
           if abs(a - b) > max(SCORE_ATOL, SCORE_RTOL * abs(b))]
    print(f"{name} vs reference: max abs {worst_abs:.3g}, max rel {worst_rel:.3g}")
    if bad:
        sys.exit(f"FAIL: {name}: {len(bad)} lines outside tolerance, first (line, C, reference): {bad[0]}")

# The consolidated checkpoint is the model train_mt exported at the end of the run.
a, ma = st.load("out/model.safetensors")
b, mb = st.load("trained/model.safetensors")
assert set(a) == set(b), f"tensor names differ: {sorted(set(a) ^ set(b))[:5]}"
diff = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
if diff:
    sys.exit(f"FAIL: ckpt export differs from train_mt --export in {len(diff)} tensors, e.g. {diff[0]}")
print(f"ckpt export equals train_mt --export: {len(a)} tensors")
PY
cmp out/config.json trained/config.json || { echo "FAIL: config.json differs from train_mt --export"; exit 1; }

# One flipped byte in a shard: inspect names the file and the CRC, exits 1;
# loading the checkpoint refuses it as well.
cp -r "$step_dir" flipped
/usr/bin/python3 - flipped/model-tp1-pp0.safetensors <<'PY'
import sys
path = sys.argv[1]
b = bytearray(open(path, "rb").read())
b[len(b) // 2] ^= 0x01
open(path, "wb").write(b)
PY
rc=0; "$build/ckpt" inspect flipped > flipped.txt 2> flipped_err.txt || rc=$?
test $rc -eq 1 || { echo "FAIL: ckpt inspect exits $rc on a corrupted checkpoint"; cat flipped.txt; exit 1; }
grep -q "flipped/model-tp1-pp0.safetensors: CRC-32C [0-9a-f]\{8\}, the manifest says [0-9a-f]\{8\} (corrupted)" \
    flipped_err.txt || { echo "FAIL: the CRC problem is not reported"; cat flipped.txt flipped_err.txt; exit 1; }
grep -q "verify     FAILED" flipped.txt
grep -q "verify     ok" flipped.txt && { echo "FAIL: a corrupted checkpoint reads ok"; exit 1; }
if "$build/ckpt" export flipped out_flipped > /dev/null 2>&1; then echo "FAIL: corrupted shard exported"; exit 1; fi
echo "test_export_scores: ok"
