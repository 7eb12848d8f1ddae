#!/usr/bin/env bash
# train_mt --profile on the CPU:
#   1. the table is printed, with every class and the remainder row;
#   2. every class the tiny model uses (GEMM, attention, LayerNorm, loss,
#      element-wise, embedding, optimizer, copies) has calls and time, and a
#      class without calls has no time;
#   3. the classes sum to the measured step time within 5% (the remainder
#      row is that difference, and is what the metrics record says);
#   4. profiling changes no result: the loss and gradient-norm curve is bit
#      for bit that of the same run without --profile, which writes no
#      profile record;
#   5. the table by op: its rows sum to each class's row and to the metrics
#      record's op_ms/op_calls within rounding, sorted by time; linear_fwd,
#      linear_bwd, attention_fwd and attention_bwd run as often per step as
#      the model's shape says (encoder and decoder layers told apart: 2+3);
#   6. with tp 2 (two ranks), the collectives are counted as communication,
#      and as the op "collectives".
# Usage: test_profile.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "test_profile: FAIL: $*" >&2; exit 1; }
run=(--preset tiny --decoder-layers 3 --task copy --max-steps 12 --log-interval 1 --eval-interval 0 --seed 3 --lr 5e-3
     --warmup 4)

"$build/train_mt" "${run[@]}" --metrics plain.jsonl > plain.log || { cat plain.log; fail "plain run"; }
"$build/train_mt" "${run[@]}" --metrics prof.jsonl --profile > prof.log || { cat prof.log; fail "--profile run"; }
grep -A 16 "^profile: time per class" prof.log || fail "no profile table in: $(tail -n 3 prof.log)"
for row in GEMM attention LayerNorm loss "element-wise and dropout" embedding optimizer "dtype conversion" \
           communication "host<->device copies" "host gaps" "remainder" "step (measured"; do
  grep -q "^  $row" prof.log || fail "the table has no row '$row'"
done
grep -q "^profile:" plain.log && fail "a run without --profile printed a profile"
grep -A 60 "^profile: time per op" prof.log | sed '/^  all ops/q' || fail "no table by op"
grep -q "^  all ops" prof.log || fail "the table by op has no 'all ops' row"

$py - plain.jsonl prof.jsonl <<'PY'
import json, sys
def rows(p):
    return [json.loads(l) for l in open(p)]
plain, prof = rows(sys.argv[1]), rows(sys.argv[2])
assert not any("profile" in r for r in plain), "a run without --profile wrote a profile record"
curve = lambda rs: [(r["step"], r["loss"], r["grad_norm"]) for r in rs if "loss" in r]
assert curve(plain) == curve(prof), f"--profile changed the curve:\n{curve(plain)}\n{curve(prof)}"
print(f"loss curve of {len(curve(plain))} steps bit for bit the same with --profile")
p = [r["profile"] for r in prof if "profile" in r]
assert len(p) == 1, f"{len(p)} profile records"
p = p[0]
ms, ops, step = p["classes_ms"], p["ops_per_step"], p["step_ms"]
assert p["steps"] == 12 and p["skipped"] == 0, p
used = ("gemm", "attention", "layernorm", "loss", "elementwise", "embedding", "optimizer", "copy")
for c in used:
    assert ops[c] > 0 and ms[c] > 0, f"class {c}: {ops[c]} calls per step, {ms[c]} ms"
for c, n in ops.items():  # time exactly where there are calls
    assert (ms[c] > 0) if n > 0 else (ms[c] == 0), f"class {c}: {n} calls per step, {ms[c]} ms"
total = sum(ms.values())
# The classes and the host gaps cover the span of each step's marks; the
# wall-clock step time holds little more (the calls that open and close it).
TOLERANCE = 0.05
assert abs(total - step) <= TOLERANCE * step, f"classes sum to {total:.3f} ms of a {step:.3f} ms step"
assert abs(p["remainder_ms"] - (step - total)) < 1e-3, p
print(f"classes {total:.3f} ms of a measured {step:.3f} ms step (remainder {p['remainder_ms']:.4f} ms)")
PY
$py "$here/check_profile_ops.py" prof.log prof.jsonl || fail "the table by op"

echo "== two ranks, tp 2: communication"
"$build/tprun" --standalone --nproc_per_node 2 "$build/train_mt" "${run[@]}" --tp 2 --max-steps 4 --profile \
  --metrics tp2.jsonl > tp2.log 2>&1 || { cat tp2.log; fail "tp 2 run"; }
$py - tp2.jsonl <<'PY'
import json, sys
p = [json.loads(l)["profile"] for l in open(sys.argv[1]) if "profile" in l][0]
assert p["ops_per_step"]["comm"] > 0 and p["classes_ms"]["comm"] > 0, p
total = sum(p["classes_ms"].values())
assert abs(total - p["step_ms"]) <= 0.05 * p["step_ms"], p
print(f"tp 2: {p['ops_per_step']['comm']:.0f} collectives per step, {p['classes_ms']['comm']:.3f} ms")
assert p["op_calls"]["collectives"] == p["ops_per_step"]["comm"], p
assert abs(p["op_ms"]["collectives"] - p["classes_ms"]["comm"]) < 1e-5, p
PY
echo "test_profile: PASS"
