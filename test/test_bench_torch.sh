#!/usr/bin/env bash
# The GPU benchmark's PyTorch side, held on the CPU:
#   1. its model is the reference model (float64, same weights and batch:
#      loss and every gradient; test/check_bench_model.py);
#   2. the batches train_mt --dump-batches writes are the ones it trained on:
#      resumed from a checkpoint at step 1, the PyTorch model started from
#      that step's export computes tptrain's logged loss of step 2 on the
#      dump's first batch (fp32, dropout off);
#   3. bench_torch_mt.py run, tptrain and table produce their rows (a timing
#      is printed, never judged here), and --dump-batches refuses bad use;
#   4. scripts/bench_gpu.sh, the whole harness, runs on the CPU (tiny model,
#      fp32) and writes its table.
# Usage: test_bench_torch.sh BUILD_DIR CORPUS_DIR [dump]; with "dump", only
# tptrain's side (the dump written, and the refusals of --dump-batches):
# ctest's bench_dump, the part that runs under the sanitizers.
set -euo pipefail
build=$1 corpus=$2 only_dump=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "test_bench_torch: FAIL: $*" >&2; exit 1; }
# tiny model, small batches: a few seconds per run on one core
common=(--data "$corpus" --cache-dir "$work/cache" --preset tiny --batch-tokens 512 --dropout 0
        --eval-interval 0 --log-interval 1 --lr 1e-3 --warmup 2)

"$build/train_mt" "${common[@]}" --max-steps 1 --save ck --export e1 > a.log
"$build/train_mt" "${common[@]}" --max-steps 8 --resume ck --dump-batches b.st --metrics m.jsonl > b.log \
  || { cat b.log; fail "train_mt --dump-batches"; }
grep -q "7 steps' batches written to b.st" b.log || fail "no dump line in: $(tail -n 2 b.log)"

dump_refusals() {
  if "$build/train_mt" "${common[@]}" --max-steps 1 --dump-batches /nonexistent/dir/b.st > bad.log 2>&1; then
    fail "an unwritable --dump-batches path was accepted"
  fi
  grep -q "dump-batches: .*/nonexistent/dir/b.st" bad.log || fail "the error does not name the file: $(cat bad.log)"
  grep -q "step " bad.log && fail "an unwritable --dump-batches path was refused only after training"
  if "$build/train_mt" "${common[@]}" --max-steps 1 --dump-batches "$work" > bad2.log 2>&1; then
    fail "a folder as --dump-batches was accepted"
  fi
  grep -q "is a folder, not a file" bad2.log || fail "a folder as --dump-batches: $(cat bad2.log)"
  if "$build/tprun" --standalone --nproc_per_node 2 "$build/train_mt" --preset tiny --task copy --max-steps 1 --tp 2 \
       --dump-batches b2.st > bad3.log 2>&1; then
    fail "--dump-batches with two ranks was accepted"
  fi
  grep -q "batches of a one-rank run; this run has 2 ranks" bad3.log || fail "two ranks: $(cat bad3.log)"
}
if [ "$only_dump" = dump ]; then
  test -s b.st || fail "no dump written"
  dump_refusals
  echo "test_bench_torch (dump): PASS"
  exit 0
fi

echo "== 1. the bench model against the float64 reference"
$py "$root/test/check_bench_model.py" e1 b.st

echo "== 2. the dump is what tptrain trained on"
$py "$root/scripts/bench_torch_mt.py" run b.st --mode eager --device cpu --dtype fp32 --warmup 1 --init e1 \
    --dropout 0 --loss-out losses.json > run.json
$py - m.jsonl losses.json <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
c_loss = next(r["loss"] for r in rows if r.get("step") == 2 and "loss" in r)
t_loss = json.load(open(sys.argv[2]))[0]
# fp32 on both sides, different summation orders through 1+1 layers: ~1e-6
# relative; a different batch or different weights move it by 1e-2 or more.
err = abs(c_loss - t_loss) / abs(c_loss)
print(f"step 2 loss: tptrain {c_loss:.7f} PyTorch {t_loss:.7f} (relative {err:.1e}; bound 1e-5)")
sys.exit(0 if err < 1e-5 else 1)
PY

echo "== 3. the rows and the table"
$py "$root/scripts/bench_torch_mt.py" tptrain b.st m.jsonl --warmup 1 --dtype fp32 > tp.json
$py "$root/scripts/bench_torch_mt.py" run b.st --mode compile --device cpu --dtype fp32 --warmup 1 > compile.json
for f in run.json tp.json; do
  $py - "$f" <<'PY' || fail "$f: $(cat "$f")"
import json, sys
r = json.load(open(sys.argv[1]))
need = ("tokens_per_s", "step_s", "tflops", "tokens", "steps")
assert all(k in r and r[k] > 0 for k in need), r
assert r["steps"] == 6, r  # 7 steps dumped, 1 of warmup
PY
done
$py - run.json tp.json b.st <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
# one definition of tokens and FLOPs on both sides, from the same batches
assert a["tokens"] == b["tokens"] and abs(a["tflops"] * a["seconds"] - b["tflops"] * b["seconds"]) < 1e-9 * a["tflops"] * a["seconds"] + 1e-12, (a, b)
PY
{ for f in tp.json run.json compile.json; do
    $py -c 'import json,sys; r=json.load(open(sys.argv[1])); r.update(preset="tiny", batch_tokens=512); print(json.dumps(r))' "$f"
  done; } > results.jsonl
$py "$root/scripts/bench_torch_mt.py" table results.jsonl | tee table.md
[ "$(grep -c '^| tiny | 512 |' table.md)" -eq 3 ] || fail "the table lacks a row"
grep -q '| pytorch eager | .* | 1.00x |' table.md || fail "eager is not its own 1.00x"

echo "== 4. refusals"
dump_refusals
printf 'not safetensors' > junk.st
if $py "$root/scripts/bench_torch_mt.py" run junk.st --device cpu > junk.log 2>&1; then fail "a junk batch file was read"; fi
grep -q "junk.st" junk.log || fail "the error does not name the file: $(cat junk.log)"
echo "== 5. the harness, on the CPU"
TPTRAIN_BIN=$build BENCH_DEVICE=cpu BENCH_PRESETS=tiny BENCH_TOKENS="512 256" BENCH_STEPS=4 BENCH_WARMUP=1 \
  BENCH_DIR=$work/bench BENCH_PYTHON=$py bash "$root/scripts/bench_gpu.sh" "$corpus" > harness.log 2>&1 \
  || { cat harness.log; fail "bench_gpu.sh"; }
cat "$work/bench/bench.md"
for btok in 512 256; do
  for run in "tptrain" "pytorch eager" "pytorch compile"; do
    grep -q "^| tiny | $btok | $run |" "$work/bench/bench.md" || fail "bench.md has no row for $run at $btok tokens"
  done
done
[ "$(wc -l < "$work/bench/results.jsonl")" -eq 6 ] || fail "results.jsonl: $(wc -l < "$work/bench/results.jsonl") rows, not 6"
echo "test_bench_torch: PASS"
