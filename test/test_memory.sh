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
. "$(dirname "$0")/lib.sh"
corpus_workdir
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
# Activation memory against docs/activation-memory.md's formula, for
# recompute {none, selective, full} x sequence parallelism {off, on} x tp
# {1, 2, 4}: every copy-task batch is 32 x (S 12, T 13), so the activation
# tag's peak is one slot and the scratch, each slice rounded up to 16 floats
# (none here: every slice is a multiple of 16).
for rc in none selective full; do
  for t in 1 2 4; do
    for sp in off on; do
      [ "$t" = 1 ] && [ "$sp" = on ] && continue   # one rank holds every row anyway
      flags=(--recompute "$rc")
      [ "$sp" = on ] && flags+=(--sequence-parallel)
      "$build/tprun" --nproc_per_node="$t" "$build/train_mt" --task copy --preset tiny --vocab-size 64 --tp "$t" \
        --max-steps 2 --log-interval 1 --eval-interval 100 --metrics "acts-$rc-$t-$sp.jsonl" "${flags[@]}" \
        > "acts-$rc-$t-$sp.log" 2>&1 || { cat "acts-$rc-$t-$sp.log"; exit 1; }
    done
  done
done
# The FFN keeps its hidden activation before the nonlinearity only for GELU
# (ReLU's gradient needs its output alone); in bf16 the tensors backward
# needs only as GEMM operands are kept in bf16 (model_set_keep_bf16).
for v in "none 1 off gelu fp32" "none 1 off relu bf16" "none 1 off gelu bf16" "none 2 on relu bf16" \
         "full 2 on relu bf16"; do
  read -r rc t sp act dt <<< "$v"
  flags=(--recompute "$rc" --activation "$act" --dtype "$dt")
  [ "$sp" = on ] && flags+=(--sequence-parallel)
  name="acts-$rc-$t-$sp-$act-$dt"
  "$build/tprun" --nproc_per_node="$t" "$build/train_mt" --task copy --preset tiny --vocab-size 64 --tp "$t" \
    --max-steps 2 --log-interval 1 --eval-interval 100 --metrics "$name.jsonl" "${flags[@]}" \
    > "$name.log" 2>&1 || { cat "$name.log"; exit 1; }
done
# Flash attention (bf16, heads of 16: --heads 2) keeps a float per query row
# and head instead of the probabilities.
for v in "none 1 off" "selective 2 on" "full 2 off"; do
  read -r rc t sp <<< "$v"
  flags=(--recompute "$rc" --dtype bf16 --heads 2 --attention flash)
  [ "$sp" = on ] && flags+=(--sequence-parallel)
  name="acts-$rc-$t-$sp-flash"
  "$build/tprun" --nproc_per_node="$t" "$build/train_mt" --task copy --preset tiny --vocab-size 64 --tp "$t" \
    --max-steps 2 --log-interval 1 --eval-interval 100 --metrics "$name.jsonl" "${flags[@]}" \
    > "$name.log" 2>&1 || { cat "$name.log"; exit 1; }
  grep -q "flash attention" "$name.log" || { echo "FAIL: $name does not say it runs flash attention"; exit 1; }
done
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
# the optimizer's two segment tables (kernels/segs.c), a segment and a chunk
# per tensor: embedding, per layer 9 attention tensors (LN 2, q k v, q and v
# biases, out + bias) per attention and 6 FFN ones, the two final LNs
r16 = lambda n: (n + 15) // 16 * 16
n_tensors = 1 + L_ENC * (9 + 6) + L_DEC * (2 * 9 + 6) + 4
seg_table = r16(40 * n_tensors) + r16(4 * (n_tensors + 1)) + r16(16 * n_tensors) + r16(8 * n_tensors) + 16
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
            "workspace": 4 * (2 + 5) + 2 * seg_table}   # the model's loss scalars, the step's scalars, the tables
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
def formula(tp, sp, rc, act="relu", dt="f32", B=32, S=12, T=13, C=32, H=4, F=64, Le=2, Ld=2, V=64, flash=False):
    """Activation bytes per rank: docs/activation-memory.md, term by term."""
    Cl, Fl, Hl, Vl = C // tp, F // tp, H // tp, math.ceil(V / tp)
    kb = 0.5 if dt == "bf16" else 1          # a kept GEMM operand: bf16 halves it
    hid = (1 if act == "gelu" else 0) + kb   # the FFN's hidden: before (GELU, fp32) and after the nonlinearity
    Ns, Nt, maxL = B * S, B * T, max(S, T)
    ns, nt = (math.ceil(Ns / tp), math.ceil(Nt / tp)) if sp else (Ns, Nt)
    Nsf, Ntf = (ns * tp, nt * tp) if sp else (Ns, Nt)
    maxN, maxn, maxNf = max(Ns, Nt), max(ns, nt), max(Nsf, Ntf)
    # what an attention keeps for backward: P per layer (exact, recompute none), or a float per row (flash)
    enc_P = B * Hl * S if flash else B * Hl * S * S if rc == "none" else 0
    dec_P = 2 * B * Hl * T if flash else B * Hl * (T * T + T * S) if rc == "none" else 0
    if rc == "full":
        enc, dec = ns * C, nt * C
    else:   # selective keeps neither the probabilities nor the streams between sub-blocks
        mid = 1 if rc == "none" else 0
        enc = ns * ((1 + mid + 2 * kb) * C + 4) + Ns * (4 * kb * Cl + hid * Fl) + enc_P
        dec = nt * ((1 + 2 * mid + 3 * kb) * C + 6) + Nt * (6 * kb * Cl + hid * Fl) + 2 * kb * Ns * Cl + dec_P
    slot = Le * enc + Ld * dec + ns * C + nt * C                 # the layers, the last layer's output
    slot += Nsf * C + 2 * ns + Ntf * C + 2 * nt + Nt * (kb * Vl + 6)   # final LayerNorms, logits (kept), loss
    slot += Nsf * C / 2 if dt == "bf16" else 0   # the encoder output's bf16 rounding, the cross k/v input
    # (the logits' gradient: over them); the attention's gradients and the FFN's hidden one share a region
    # the attention backward's scratch: dS (exact) or delta per row (flash)
    scratch = ns * C + Nsf * C + nt * C + 2 * maxNf * C + maxN * max(4 * Cl, Fl) + B * Hl * maxL * (1 if flash else maxL)
    if sp:
        scratch += maxNf * C + maxn * C + 9 * C
    if rc != "none" and not flash:   # the probabilities of the one attention being differentiated
        scratch += B * Hl * maxL ** 2
    if rc == "selective":   # one layer's streams between sub-blocks, rebuilt in its backward
        scratch += ns * C + 2 * nt * C
    if rc == "full":   # one layer of each stack, with flash its attentions' rows too
        scratch += ns * ((1 + 2 * kb) * C + 4) + Ns * (4 * kb * Cl + hid * Fl) + \
            nt * ((2 + 3 * kb) * C + 6) + Nt * (6 * kb * Cl + hid * Fl) + 2 * kb * Ns * Cl + \
            ((B * Hl * S + 2 * B * Hl * T) if flash else 0)
    return int(4 * (slot + scratch))   # (the batch's ids are used in place on the CPU; a GPU adds Ns + 2 Nt + 2 B int32)
table = []
for rc in ("none", "selective", "full"):
    for tp in (1, 2, 4):
        for sp in ((False,) if tp == 1 else (False, True)):
            name = f"acts-{rc}-{tp}-{'on' if sp else 'off'}"
            end = [json.loads(l) for l in open(name + ".jsonl") if '"memory"' in l][-1]["memory"]
            got = max(r["activations"] for r in end)
            want = formula(tp, sp, rc)
            table.append((rc, tp, sp, got, want))
            if abs(got - want) > 0.05 * want:
                bad.append(f"{name}: activations {got} bytes, formula {want}")
for rc, tp, sp, act, dt in (("none", 1, False, "gelu", "fp32"), ("none", 1, False, "relu", "bf16"),
                            ("none", 1, False, "gelu", "bf16"), ("none", 2, True, "relu", "bf16"),
                            ("full", 2, True, "relu", "bf16")):
    name = f"acts-{rc}-{tp}-{'on' if sp else 'off'}-{act}-{dt}"
    end = [json.loads(l) for l in open(name + ".jsonl") if '"memory"' in l][-1]["memory"]
    got = max(r["activations"] for r in end)
    want = formula(tp, sp, rc, act, dt)
    table.append((f"{rc} {act} {dt}", tp, sp, got, want))
    if abs(got - want) > 0.05 * want:
        bad.append(f"{name}: activations {got} bytes, formula {want}")
for rc, tp, sp in (("none", 1, False), ("selective", 2, True), ("full", 2, False)):
    name = f"acts-{rc}-{tp}-{'on' if sp else 'off'}-flash"
    end = [json.loads(l) for l in open(name + ".jsonl") if '"memory"' in l][-1]["memory"]
    got = max(r["activations"] for r in end)
    want = formula(tp, sp, rc, "relu", "bf16", H=2, flash=True)
    table.append((f"{rc} flash bf16", tp, sp, got, want))
    if abs(got - want) > 0.05 * want:
        bad.append(f"{name}: activations {got} bytes, formula {want}")
    exact = formula(tp, sp, rc, "relu", "bf16", H=2)
    if not want < exact:
        bad.append(f"{name}: the formula gives flash {want} bytes, not fewer than exact attention's {exact}")
print("activation MiB per rank (measured / formula):")
for rc, tp, sp, got, want in table:
    print(f"  recompute {rc:19} tp {tp} sp {'on ' if sp else 'off'}: {got / 2**20:7.3f} / {want / 2**20:7.3f} "
          f"({(got - want) / want:+.2%})")
by = {(rc, tp, sp): got for rc, tp, sp, got, _ in table}
if not by[("none gelu fp32", 1, False)] > by[("none", 1, False)] > by[("none gelu bf16", 1, False)] > \
        by[("none relu bf16", 1, False)]:
    bad.append("tp 1: GELU's kept input or bf16 keeping does not change the activations as it should")
for tp in (2, 4):   # each lever shrinks the activations
    for rc in ("none", "selective", "full"):
        if not by[(rc, tp, True)] < by[(rc, tp, False)]:
            bad.append(f"tp {tp} recompute {rc}: sequence parallelism does not shrink the activations")
for tp in (1, 2, 4):
    if not by[("none", tp, False)] > by[("selective", tp, False)] > by[("full", tp, False)]:
        bad.append(f"tp {tp}: recomputation does not shrink the activations")
if not acts["tp1"] > acts["tp2"] > acts["tp4"]:
    bad.append(f"activations per rank do not shrink with tp: {acts}")
print("\n".join(bad) if bad else f"memory report matches the config: params per rank {[params_per_rank(t) for t in (1, 2, 4)]}, activations {acts}")
raise SystemExit(1 if bad else 0)
PY
