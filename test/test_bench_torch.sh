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
#      attention backends this PyTorch lacks are reported as such and the run
#      falls back to the one it has; the table keeps the fastest row of each
#      mode, names its backend and notes the others;
#   4. a --length-bucket 8 dump carries the bucketed shapes (multiples of 8
#      or max_len), and the PyTorch run warms up on exactly its distinct shapes;
#   5. scripts/bench_gpu.sh, the whole harness, runs on the CPU (tiny model,
#      fp32, buckets 1 and 8, the --profile run) and writes its table, the
#      profile by class and by op under it.
# Usage: test_bench_torch.sh BUILD_DIR CORPUS_DIR [dump]; with "dump", only
# tptrain's side (the dump written, and the refusals of --dump-batches and
# --length-bucket): ctest's bench_dump, the part that runs under the sanitizers.
set -euo pipefail
. "$(dirname "$0")/corpus_cache.sh"
build=$1 corpus=$2 only_dump=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
use_corpus_cache "$work/cache"
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
  if "$build/train_mt" --preset tiny --task copy --max-steps 1 --length-bucket 8 > bad4.log 2>&1; then
    fail "--length-bucket with a synthetic task was accepted"
  fi
  grep -q "length-bucket pads a corpus's batches" bad4.log || fail "--length-bucket with --task: $(cat bad4.log)"
  if "$build/train_mt" "${common[@]}" --max-steps 1 --length-bucket 0 > bad5.log 2>&1; then
    fail "--length-bucket 0 was accepted"
  fi
  grep -q -- "--length-bucket" bad5.log || fail "--length-bucket 0: $(cat bad5.log)"
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
    --dropout 0 --loss-out losses.json --sdpa auto,flash,math > run.jsonl
grep '"tokens_per_s"' run.jsonl | head -n 1 > run.json
$py - run.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ran = [r for r in rows if "tokens_per_s" in r]
if rows[-1]["backend"] == "manual":  # PyTorch < 2.0 (no SDPA): the fallback, after each backend asked for
    gone = [r["backend"] for r in rows if "unavailable" in r]
    assert gone == ["auto", "flash", "math"] and len(ran) == 1 and ran[0]["backend"] == "manual", rows
else:
    assert {r["backend"] for r in rows} == {"auto", "flash", "math"}, rows
assert ran[0]["distinct_shapes"] >= 1 and ran[0]["shape_warmup_s"] > 0 and ran[0]["first_step_s"] > 0, ran[0]
print("backends:", ", ".join(f'{r["backend"]}: {"ran" if "tokens_per_s" in r else "unavailable"}' for r in rows))
PY
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
$py "$root/scripts/bench_torch_mt.py" run b.st --mode compile --device cpu --dtype fp32 --warmup 1 | tail -n 1 > compile.json
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
$py - table.md <<'PY' || fail "the tptrain row lacks its launch-to-first-step time: $(grep tptrain table.md)"
import sys
head = None
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if head is None:
        head = cells
    elif len(cells) > 3 and cells[3] == "tptrain":
        first = float(cells[head.index("first step s")])
        assert first > 0 and cells[head.index("backend")] == "own kernels", cells
        print(f"tptrain: first step {first} s after launch")
        break
else:
    sys.exit(1)
PY

echo "== 3b. several rows per mode: the fastest is kept and named"
$py - run.json <<'PY' > multi.jsonl
import json, sys
r = json.load(open(sys.argv[1]))
base = dict(r, preset="tiny", batch_tokens=512, bucket=8)
rows = [dict(base, backend="math", tokens_per_s=100.0, peak_allocated_mib=50.0),
        dict(base, backend="efficient", tokens_per_s=300.0, peak_allocated_mib=40.0),
        {"framework": "pytorch", "mode": "eager", "backend": "flash", "preset": "tiny", "batch_tokens": 512,
         "bucket": 8, "rejected": "No available kernel. Aborting execution."},
        dict(base, backend="cudnn", tokens_per_s=200.0, peak_allocated_mib=45.0),
        dict(base, mode="compile", backend="efficient", tokens_per_s=450.0, peak_allocated_mib=30.0, compile_s=12.5),
        dict(base, framework="tptrain", mode="", backend="own kernels", tokens_per_s=600.0, peak_allocated_mib=20.0,
             first_step_s=1.5)]
for x in rows:
    print(json.dumps(x))
PY
$py "$root/scripts/bench_torch_mt.py" table multi.jsonl | tee multi.md
[ "$(grep -c '^| tiny | 512 | 8 |' multi.md)" -eq 3 ] || fail "not one row per mode"
grep -q '^| tiny | 512 | 8 | pytorch eager | efficient | 300 |.* 1.00x | 1.00x | math: 0.33x; flash: rejected (No available kernel. Aborting execution.); cudnn: 0.67x |$' multi.md \
  || fail "eager's fastest (efficient) is not the one kept, or the others are not noted"
grep -q '^| tiny | 512 | 8 | pytorch compile | efficient | 450 |.* 12.5 | .* 1.50x | 0.75x | - |$' multi.md \
  || fail "compile's ratios are not to eager's fastest row"
grep -q '^| tiny | 512 | 8 | tptrain | own kernels | 600 |.* 1.50 | 2.00x | 0.50x | - |$' multi.md \
  || fail "the tptrain row: $(grep tptrain multi.md)"

echo "== 4. a bucketed dump"
"$build/train_mt" "${common[@]}" --max-steps 5 --length-bucket 8 --dump-batches b8.st --metrics m8.jsonl > b8.log \
  || { cat b8.log; fail "train_mt --length-bucket 8 --dump-batches"; }
grep -q "| pad [0-9.]*%" b8.log || fail "no padding share in the log line: $(grep '^step' b8.log | tail -n 1)"
$py "$root/scripts/bench_torch_mt.py" run b8.st --mode eager --device cpu --dtype fp32 --warmup 1 | grep tokens_per_s > run8.json
$py - "$root" b8.st run8.json m8.jsonl <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1] + "/test/reference")
from safetensors_io import load
t, meta = load(sys.argv[2])
max_len = json.loads(meta["config"])["max_len"]
shapes = set()
for name, x in t.items():
    if name.endswith((".src", ".tgt_in", ".tgt_out")):
        L = x.shape[1]
        assert L % 8 == 0 or L == max_len, f"{name}: length {L} is not a multiple of 8 (max_len {max_len})"
    if name.endswith(".src"):
        shapes.add((tuple(x.shape), tuple(t[name[:-4] + ".tgt_in"].shape)))
r = json.load(open(sys.argv[3]))
assert r["distinct_shapes"] == len(shapes), (r["distinct_shapes"], shapes)
pads = [json.loads(l)["pad_frac"] for l in open(sys.argv[4]) if '"loss"' in l]
assert pads and all(0 < p < 1 for p in pads), pads
print(f"bucketed dump: {len(shapes)} distinct shapes, all multiples of 8; padding {pads}")
PY

echo "== 4b. refusals"
dump_refusals
printf 'not safetensors' > junk.st
if $py "$root/scripts/bench_torch_mt.py" run junk.st --device cpu > junk.log 2>&1; then fail "a junk batch file was read"; fi
grep -q "junk.st" junk.log || fail "the error does not name the file: $(cat junk.log)"
echo "== 5. the harness, on the CPU"
TPTRAIN_BIN=$build BENCH_DEVICE=cpu BENCH_PRESETS=tiny BENCH_TOKENS="512" BENCH_BUCKETS="1 8" BENCH_STEPS=4 \
  BENCH_WARMUP=1 BENCH_TORCH=all BENCH_SDPA=auto,flash BENCH_PROFILE=tiny-512-8 \
  BENCH_DIR=$work/bench BENCH_PYTHON=$py bash "$root/scripts/bench_gpu.sh" "$corpus" > harness.log 2>&1 \
  || { cat harness.log; fail "bench_gpu.sh"; }
cat "$work/bench/bench.md"
for bucket in 1 8; do
  for run in "tptrain" "pytorch eager" "pytorch compile"; do
    grep -q "^| tiny | 512 | $bucket | $run |" "$work/bench/bench.md" || fail "bench.md has no row for $run, bucket $bucket"
  done
done
# eager's second trial (BENCH_EAGER_TRIALS, default 2): a fresh process with the backend the first trial
# found fastest, and the table's eager row the faster of the two
$py - "$work/bench/results.jsonl" "$work/bench/bench.md" <<'PY' || fail "eager's trials"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
table = open(sys.argv[2]).read().splitlines()
for bucket in (1, 8):
    eager = [r for r in rows if r.get("mode") == "eager" and r.get("bucket") == bucket and "tokens_per_s" in r]
    first = [r for r in eager if r.get("trial") == 1]  # the backends that ran here (before PyTorch 2: manual)
    second = [r for r in eager if r.get("trial") == 2]
    assert first and len(first) + len(second) == len(eager), eager
    fastest = max(first, key=lambda r: r["tokens_per_s"])
    assert [r["backend"] for r in second] == [fastest["backend"]], (second, fastest)
    best = max(eager, key=lambda r: r["tokens_per_s"])
    line = next(l for l in table if l.startswith(f"| tiny | 512 | {bucket} | pytorch eager |"))
    assert f"| {best['backend']} (trial {best['trial']}) | {best['tokens_per_s']:.0f} |" in line, (line, best)
    other = [r for r in eager if r is not best]
    assert all(f"{r['backend']} (trial {r['trial']}):" in line for r in other), (line, other)
    print(f"bucket {bucket}: eager trial 2 ran {fastest['backend']}; the table's row: {best['backend']} trial {best['trial']}")
PY
# the memory-lean run (BENCH_SELECTIVE: the first configuration and bucket), beside its own eager row
grep -q "^| tiny | 512 | 1 | tptrain recompute selective | own kernels | [0-9]" "$work/bench/bench.md" ||
  fail "bench.md has no --recompute selective row: $(grep 'selective' "$work/bench/bench.md")"
# the graphs runs (BENCH_GRAPHS: each configuration at the largest bucket)
grep -q "^| tiny | 512 | 8 | tptrain cuda graphs | own kernels | [0-9]" "$work/bench/bench.md" ||
  fail "bench.md has no --cuda-graphs row: $(grep 'graphs' "$work/bench/bench.md")"
grep -q '"graphs": {"captured": [1-9]' "$work"/bench/tiny-512-b8-cuda-graphs.metrics.jsonl ||
  fail "the --cuda-graphs run captured no graph"
grep -A 14 "train_mt --profile" "$work/bench/bench.md" | grep -q "^  GEMM" || fail "bench.md has no profile table"
grep -q "^  remainder" "$work/bench/bench.md" || fail "the profile table has no remainder row"
grep -A 60 "^profile: time per op" "$work/bench/bench.md" | grep -q "^  linear_fwd" || fail "bench.md has no table by op"
grep -q "^  all ops" "$work/bench/bench.md" || fail "the table by op has no 'all ops' row"
echo "test_bench_torch: PASS"
