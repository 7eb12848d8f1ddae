#!/usr/bin/env bash
# The memory report against the sizes the config and layout imply: for one
# rank, tp 2, tp 4 and tp 2 x dp 2 (through tprun), every rank's final
# metrics record must give exactly the bytes computed here, independently of
# the parameter table, for the master weights, gradients and AdamW state
# (fp32, one 4-byte float each, 2 for the optimizer), no compute copy on
# the CPU, the step's scalars as workspace, and activations the same on
# every rank of a layout and smaller per rank as tp grows. The GPU-only
# figures (device_used, mem_device_used_mib) are absent, and the table's
# device column shows "-".
# On the corpus (tp 2), rank 0 also holds the whole model for dev BLEU:
# its weights are counted, but it keeps no gradients, so both ranks'
# gradient bytes are equal.
#   test_memory.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
corpus=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
run() {  # name nproc flags...
  local name=$1 n=$2
  shift 2
  "$build/tprun" --nproc_per_node="$n" "$build/train_mt" --task copy --preset tiny --vocab-size 64 \
    --max-steps 3 --log-interval 1 --eval-interval 100 --metrics "$name.jsonl" "$@" > "$name.log" 2>&1 ||
    { cat "$name.log"; exit 1; }
  grep -q "peak memory per rank" "$name.log" || { echo "FAIL: $name printed no memory table"; exit 1; }
  # On the CPU the table's last column (device used) is "-" on every rank row.
  local row_re='^(\[rank 0\] )? +[0-9]+ \([0-9]+,[0-9]+,[0-9]+\) ' rows dashes
  rows=$(grep -cE "$row_re" "$name.log" || true)
  dashes=$(grep -E "$row_re" "$name.log" | grep -cE ' -$' || true)
  [ "$rows" -ge "$n" ] && [ "$dashes" -eq "$rows" ] ||
    { echo "FAIL: $name: $dashes of $rows rank rows show '-' for device memory"; grep -E "$row_re" "$name.log"; exit 1; }
}
run tp1 1
run tp2 2 --tp 2
run tp4 4 --tp 4
run tp2dp2 4 --tp 2 --dp 2
"$build/tprun" --nproc_per_node=2 "$build/train_mt" --data "$corpus" --preset tiny --tp 2 --max-steps 2 \
  --log-interval 1 --eval-interval 2 --metrics corpus.jsonl > corpus.log 2>&1 || { cat corpus.log; exit 1; }
/usr/bin/python3 - <<'PY'
import json, math
C, H, F, L_ENC, L_DEC, V = 32, 4, 64, 2, 2, 64     # the tiny preset, --vocab-size 64
def params_per_rank(t):
    vp = math.ceil(V / t) * t
    attn = 2 * C + 3 * C * (C // t) + 2 * (C // t) + (C // t) * C + C   # LN, q k v (bias on q, v), out + bias
    ffn = 2 * C + (F // t) * C + F // t + C * (F // t) + C             # LN, fc1 + bias, fc2 + bias
    return vp // t * C + L_ENC * (attn + ffn) + L_DEC * (2 * attn + ffn) + 4 * C
bad = []
acts = {}
for name, tp, world in (("tp1", 1, 1), ("tp2", 2, 2), ("tp4", 4, 4), ("tp2dp2", 2, 4)):
    rows = [json.loads(l) for l in open(f"{name}.jsonl")]
    mem = [r for r in rows if "memory" in r]
    # one record at the first log point, one more whenever a peak grew, one at the end
    steps = [r["step"] for r in mem]
    assert len(mem) >= 2 and steps == sorted(steps) and steps[0] == 1, f"{name}: memory records at steps {steps}"
    assert steps[-1] == max(r["step"] for r in rows if "loss" in r), f"{name}: no memory record at the end: {steps}"
    ranks = mem[-1]["memory"]
    assert len(ranks) == world, f"{name}: {len(ranks)} ranks in the memory record, expected {world}"
    p = params_per_rank(tp) * 4
    want = {"master": p, "grads": p, "optimizer": 2 * p, "compute": 0, "library": 0,
            "workspace": 4 * (2 + 5)}   # the model's loss scalars and the step's scalars
    for r in ranks:
        for k, v in want.items():
            if r[k] != v:
                bad.append(f"{name} rank {r['rank']}: {k} {r[k]} != {v}")
        if r["allocator_peak"] < sum(r[k] for k in ("master", "grads", "optimizer", "activations")):
            bad.append(f"{name} rank {r['rank']}: allocator peak below its parts")
        if "device_used" in r:   # a GPU-only key: the CPU has no device memory to report
            bad.append(f"{name} rank {r['rank']}: device_used on the CPU")
        if r["tp"] != r["rank"] % tp or r["dp"] != r["rank"] // tp:
            bad.append(f"{name} rank {r['rank']}: coordinates ({r['tp']},{r['dp']})")
    a = {r["activations"] for r in ranks}
    if len(a) != 1 and name != "tp2dp2":   # dp ranks see other sentences, tp ranks the same
        bad.append(f"{name}: activations differ across tp ranks: {sorted(a)}")
    acts[name] = max(a)
    steps = [r for r in rows if "loss" in r]
    if not all(len(r["mem_peak_mib"]) == world for r in steps):
        bad.append(f"{name}: per-step memory arrays do not have {world} entries")
    if any("mem_device_used_mib" in r for r in steps):
        bad.append(f"{name}: per-step device memory on the CPU")
end = [json.loads(l) for l in open("corpus.jsonl") if "memory" in l][-1]["memory"]
if end[0]["grads"] != end[1]["grads"] or end[0]["master"] <= end[1]["master"]:
    bad.append(f"corpus tp 2: rank 0 grads {end[0]['grads']} (rank 1 {end[1]['grads']}), master "
               f"{end[0]['master']} (rank 1 {end[1]['master']}): the decoding model must hold weights, not gradients")
if not acts["tp1"] > acts["tp2"] > acts["tp4"]:
    bad.append(f"activations per rank do not shrink with tp: {acts}")
print("\n".join(bad) if bad else f"memory report matches the config: params per rank {[params_per_rank(t) for t in (1, 2, 4)]}, activations {acts}")
raise SystemExit(1 if bad else 0)
PY
