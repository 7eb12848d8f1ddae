#!/usr/bin/env bash
# Checkpoints: exact resume, resharding on load, crash safety and refusals.
#  1. Exact resume, tp=2 x dp=2 through tprun, dropout 0.1, on the synthetic
#     copy task and on the corpus: 10 steps + save + resume to 20 must give
#     the losses of steps 11..20 (as printed, all digits) and the final
#     weights (every tensor, torch.equal) of a straight 20-step run.
#  2. Resharding: a tp=2 x dp=2 checkpoint (GELU, dropout 0: ReLU kinks and
#     dp-dependent dropout masks differ legitimately between layouts)
#     resumes as tp=1, tp=4 and dp=4; the step-11 loss must match the
#     straight run within relative LOSS_RTOL and the run must reach step 20.
#  2c. Pipeline stages: tp=2 x dp=2 x pp=2 with dropout and 2 micro-batches
#     resumes exactly (losses, every exported tensor; ckpt inspect and ckpt
#     export of the stage files); resharded 2x2x2 -> 1x1x1 -> 1x2x2 (ZeRO-2)
#     -> 2x1x2 and into 4 stages, every resumed loss within LOSS_RTOL of the
#     straight run.
#  3. Crash safety: TPTRAIN_FAULT_POINT=K SIGKILLs the process at its K-th
#     save point; for every K until the run survives, --resume auto must
#     pick the newest published complete checkpoint (or start from scratch),
#     and the continued run must reproduce the reference run exactly
#     (metrics and export). Then the same with a non-zero rank dying under
#     tprun (TPTRAIN_FAULT_RANK=1 and 3): tprun stops the job, resume exact.
#  4. Refusals with one clear sentence naming the file: truncated shard,
#     flipped byte, missing optimizer shard, replaced shard, edited crc32c,
#     edited config (other model; invalid; not fitting the shards), unknown
#     format_version, empty --resume folder, other seed or data kind;
#     --resume auto on an empty --save folder starts fresh. Manifest edits
#     are resealed (test/manifest_seal.py) so that the check of the edited
#     field is reached; unsealed edits are test_hardening.sh's.
# Usage: test_checkpoint.sh BUILD_DIR CORPUS_DIR [PARTS]
# PARTS: all (default); main (parts 1, 2 and 4: what loads a checkpoint,
# also run under the sanitizers); crash (part 3: the same loading after
# kills at every save point, in the Release build only). ctest registers
# main and crash as the tests checkpoint and checkpoint_crash.
set -euo pipefail
build=$1 corpus=$2 parts=${3:-all}
case $parts in all | main | crash) ;; *) echo "test_checkpoint: PARTS must be all, main or crash, got '$parts'"; exit 2 ;; esac
. "$(dirname "$0")/lib.sh"
enter_workdir
train=$build/train_mt
LOSS_RTOL=1e-5
t0=$SECONDS

# fail and run: lib.sh (fail writes to stderr: also seen from inside $(...)).
# status LOG CMD...: runs CMD (output to LOG) and prints its exit status
# (137 = killed by SIGKILL); the subshell keeps bash's "Killed" notice quiet.
status() {
  local log=$1; shift
  local rc=0
  ( "$@" > "$log" 2>&1; exit $? ) 2> /dev/null || rc=$?
  echo "$rc"
}
tprun4() { "$build/tprun" --standalone --nproc_per_node 4 "$train" "$@"; }
elapsed() { echo "$((SECONDS - t0)) s"; }
# resumed_step LOG: the step a run continued from (0: started from scratch).
resumed_step() {
  local line
  if line=$(grep -o "resumed from [^ ]*: step [0-9]*" "$1"); then echo "${line##* }"
  elif grep -q "no checkpoint in .* yet: starting from step 1" "$1"; then echo 0
  else fail "$1 says neither where it resumed from nor that it started from scratch"; fi
}
# complete_steps DIR: the step directories of DIR that hold a manifest.json.
complete_steps() {
  local d
  for d in "$1"/step_*; do
    [[ -d $d && $d != *.tmp && -f $d/manifest.json ]] && basename "$d"
  done
  return 0
}

# verify CHECKS: one line per comparison, fields separated by '|':
#   label | reference metrics | metrics | first | last | rows | reference export | export
# The rows (all: training and held-out rows; train: training rows only) of
# steps first..last must be the same in both files, every field but
# tokens_per_s, elapsed_s, since_launch_s, startup_s, the memory figures and the time record, numbers compared as the digits printed; the file must have
# no row before first (a resumed run logs only the steps it ran). With
# first "prefix", the file must be a prefix of the reference (a killed run).
# Exports ("-" for none) must hold the same tensors, each torch.equal.
verify() {
  /usr/bin/python3 - "$here/reference" "$1" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import safetensors_io as st

def rows(path):
    out = []
    for line in open(path):
        r = json.loads(line, parse_float=str)  # keep the printed digits
        if "memory" in r or "time" in r:  # a memory or time record: measurements of the process, not training results
            continue
        for k in ("tokens_per_s", "elapsed_s", "since_launch_s", "startup_s", "mem_peak_mib", "mem_rss_mib", "mem_device_used_mib"):  # measurements, not results
            r.pop(k, None)
        out.append(r)
    return out

bad, n = [], 0
for line in open(sys.argv[2]):
    label, ref_m, got_m, lo, hi, kinds, ref_e, got_e = line.rstrip("\n").split("|")
    n += 1
    ref, got = rows(ref_m), rows(got_m)
    if lo == "prefix":
        want = ref[: len(got)]
    else:
        lo, hi = int(lo), int(hi)
        pick = lambda r: lo <= r["step"] <= hi and (kinds == "all" or "loss" in r)
        if any(r["step"] < lo for r in got):
            bad.append(f"{label}: {got_m} has rows before step {lo}")
        want, got = list(filter(pick, ref)), list(filter(pick, got))
        if lo <= hi and not want:
            bad.append(f"{label}: the reference has no rows for steps {lo}..{hi}")
    if got != want:
        diff = next((f"{w} != {g}" for w, g in zip(want, got) if w != g), f"{len(want)} rows != {len(got)} rows")
        bad.append(f"{label}: metrics differ: {diff}")
    if ref_e != "-":
        a, _ = st.load(ref_e + "/model.safetensors")
        b, _ = st.load(got_e + "/model.safetensors")
        if set(a) != set(b):
            bad.append(f"{label}: exports hold different tensors")
        else:
            differ = [k for k in a if not torch.equal(a[k], b[k])]
            if differ:
                bad.append(f"{label}: {len(differ)} of {len(a)} exported tensors differ, e.g. {differ[0]}")
if bad:
    sys.exit("FAIL:\n  " + "\n  ".join(bad))
print(f"{n} comparisons exact")
PY
}

# ---- 1. exact resume at tp=2 x dp=2 --------------------------------------------------
# resume_exact NAME RESUME-ARG train_mt-flags...: straight 20 steps vs 10 + resume to 20.
resume_exact() {
  local name=$1 resume_arg=$2; shift 2
  local flags=("$@" --tp 2 --dp 2 --dropout 0.1 --log-interval 1 --comm-timeout 60)
  run "$name-straight.log" tprun4 "${flags[@]}" --max-steps 20 --metrics "$name-straight.jsonl" --export "$name-straight"
  run "$name-half.log" tprun4 "${flags[@]}" --max-steps 10 --save "$name-ckpt" --metrics "$name-half.jsonl"
  local resume_flags=(--resume "$resume_arg")
  [[ $resume_arg == auto ]] && resume_flags+=(--save "$name-ckpt")
  run "$name-resumed.log" tprun4 "${flags[@]}" --max-steps 20 "${resume_flags[@]}" \
      --metrics "$name-resumed.jsonl" --export "$name-resumed"
  [[ $(resumed_step "$name-resumed.log") == 10 ]] || fail "$name: did not resume from step 10"
  grep -q "saved as tp 2 x dp 2 x pp 1, loaded as tp 2 x dp 2 x pp 1" "$name-resumed.log" || fail "$name: no layout line"
  {
    echo "$name first half|$name-straight.jsonl|$name-half.jsonl|1|10|train|-|-"
    echo "$name resumed|$name-straight.jsonl|$name-resumed.jsonl|11|20|all|$name-straight|$name-resumed"
  } > "$name-checks.txt"
  local out
  out=$(verify "$name-checks.txt") || { echo "$out"; exit 1; }
}
synth=(--preset tiny --task copy --lr 5e-3 --warmup 5)
if [[ $parts != crash ]]; then
resume_exact copy auto "${synth[@]}"
[[ $(cat copy-ckpt/latest) == step_00000020 ]] || fail "the resumed copy run did not save step 20 as latest"
echo "part 1a: copy task, tp 2 x dp 2, dropout 0.1: steps 11..20 after resuming at 10 equal the straight run" \
     "exactly (losses, lr, grad norms, held-out loss, every exported tensor) ($(elapsed))"

# The corpus runs share one cache, prepared here once, and a copy of the
# corpus whose dev and test sets are their first 64 pairs: every run ends
# with a dev evaluation (loss and BLEU, compared digit for digit like the
# rest), which on the 500 dev pairs took as long as 10 training steps (2.3 s
# of CPU a run, 0.1 s with 64); the training pairs, the tokenizer and so the
# batches are the corpus's own. The tokenizer and training tokens (keyed on
# the training text alone) come from the fixture corpus_cache
# (test/corpus_cache.sh) when ctest gives it: prep.log then only encodes the
# 64-pair dev and test sets (the tokenizer's training is test_spm's and
# translate_e2e's to prove).
mkdir small-dev
ln -s "$corpus/train.en" "$corpus/train.ja" small-dev/
for f in dev.en dev.ja test.en test.ja; do head -n 64 "$corpus/$f" > "small-dev/$f"; done
. "$here/corpus_cache.sh"
use_corpus_cache cache
corpus_flags=(--preset tiny --data small-dev --cache-dir cache --batch-tokens 1024 --lr 3e-3 --warmup 5)
run prep.log "$train" "${corpus_flags[@]}" --max-steps 1 --eval-interval 1000
resume_exact corpus corpus-ckpt/step_00000010 "${corpus_flags[@]}"
grep -q "reusing cache/spm-unigram-v8000-s2000000/spm.model" corpus-resumed.log || fail "the corpus runs did not reuse the prepared cache"
test -s corpus-ckpt/step_00000010/spm.model || fail "the corpus checkpoint lacks spm.model"
grep -q '"kind":[[:space:]]*"corpus"' corpus-ckpt/step_00000010/manifest.json || fail "corpus manifest kind"
echo "part 1b: corpus, tp 2 x dp 2, dropout 0.1, 1024-token batches: steps 11..20 after resuming at 10 equal" \
     "the straight run exactly (losses, dev loss and BLEU, every exported tensor) ($(elapsed))"

# ---- 2. resharding ---------------------------------------------------------------------
reshard=("${synth[@]}" --activation gelu --dropout 0 --log-interval 1 --comm-timeout 60)
run rs-straight.log tprun4 "${reshard[@]}" --tp 2 --dp 2 --max-steps 20 --metrics rs-straight.jsonl
run rs-half.log tprun4 "${reshard[@]}" --tp 2 --dp 2 --max-steps 10 --save rs-ckpt
run rs-tp1.log "$train" "${reshard[@]}" --max-steps 20 --resume rs-ckpt --metrics rs-tp1.jsonl
run rs-tp4.log tprun4 "${reshard[@]}" --tp 4 --max-steps 20 --resume rs-ckpt/step_00000010 --metrics rs-tp4.jsonl
run rs-dp4.log tprun4 "${reshard[@]}" --tp 1 --dp 4 --max-steps 20 --resume rs-ckpt --metrics rs-dp4.jsonl
grep -q "saved as tp 2 x dp 2 x pp 1, loaded as tp 1 x dp 1 x pp 1" rs-tp1.log || fail "tp=1 resume: no layout line"
grep -q "saved as tp 2 x dp 2 x pp 1, loaded as tp 4 x dp 1 x pp 1" rs-tp4.log || fail "tp=4 resume: no layout line"
grep -q "saved as tp 2 x dp 2 x pp 1, loaded as tp 1 x dp 4 x pp 1" rs-dp4.log || fail "dp=4 resume: no layout line"
/usr/bin/python3 - "$LOSS_RTOL" "$(elapsed)" "$here" <<'PY' || exit 1
import sys
sys.path.insert(0, sys.argv[3])
from loss_log import finish, losses, start
rtol, ref, parts, bad = start("rs-straight")
for name in ("tp1", "tp4", "dp4"):
    got = losses("rs-" + name)
    if sorted(got) != list(range(11, 21)):
        bad.append(f"{name}: logged steps {sorted(got)}, not 11..20")
        continue
    rel = abs(got[11] - ref[11]) / abs(ref[11])
    later = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in range(11, 21))
    parts.append(f"{name} {rel:.1e} (max over 11..20: {later:.1e})")
    if rel > rtol:
        bad.append(f"{name}: step-11 loss {got[11]!r} vs {ref[11]!r}, relative difference {rel:.2e} > {rtol:g}")
finish(bad, f"part 2: tp 2 x dp 2 checkpoint resumed as tp 1, tp 4, dp 4 to step 20; step-11 loss relative "
            f"difference: {', '.join(parts)} (limit {rtol:g}) ({sys.argv[2]})")
PY

# ---- 2b. ZeRO: pieces saved as they lie, exact resume, resharding across stages --------------
zero=("${synth[@]}" --activation gelu --log-interval 1 --comm-timeout 60 --grad-bucket-mb 0.01)
run z-straight.log tprun4 "${zero[@]}" --dropout 0.1 --tp 2 --dp 2 --zero 1 --max-steps 20 --metrics z-straight.jsonl \
  --export z-straight-export
run z-half.log tprun4 "${zero[@]}" --dropout 0.1 --tp 2 --dp 2 --zero 1 --max-steps 10 --save z-ckpt
run z-inspect.log "$build/ckpt" inspect z-ckpt
grep -q "state saved as ZeRO-1 pieces" z-inspect.log || fail "ckpt inspect does not name the ZeRO stage"
run z-rest.log tprun4 "${zero[@]}" --dropout 0.1 --tp 2 --dp 2 --zero 1 --max-steps 20 --resume z-ckpt \
  --metrics z-rest.jsonl --export z-rest-export
# zero 1 dp 4 -> zero 0 dp 1 -> zero 2 dp 2 (dropout 0: the masks depend on dp)
run zr-straight.log tprun4 "${zero[@]}" --dropout 0 --tp 1 --dp 4 --zero 1 --max-steps 30 --metrics zr-straight.jsonl
run zr-a.log tprun4 "${zero[@]}" --dropout 0 --tp 1 --dp 4 --zero 1 --max-steps 10 --save zr-ckpt
run zr-b.log "$train" "${zero[@]}" --dropout 0 --max-steps 20 --resume zr-ckpt --save zr-ckpt --metrics zr-b.jsonl
run zr-c.log "$build/tprun" --standalone --nproc_per_node 2 "$train" "${zero[@]}" --dropout 0 --tp 1 --dp 2 --zero 2 \
  --max-steps 30 --resume zr-ckpt --metrics zr-c.jsonl
/usr/bin/python3 - "$here/reference" "$LOSS_RTOL" "$(elapsed)" <<'PY' || exit 1
import json, sys
sys.path.insert(0, sys.argv[1])
import safetensors_io as st
import torch
rtol = float(sys.argv[2])
def rows(name):
    return {r["step"]: r for r in map(json.loads, open(name + ".jsonl")) if "loss" in r}
a, b = rows("z-straight"), rows("z-rest")
assert sorted(b) == list(range(11, 21)), sorted(b)
same = all(a[s]["loss"] == b[s]["loss"] and a[s]["grad_norm"] == b[s]["grad_norm"] for s in b)
wa, wb = st.load("z-straight-export/model.safetensors")[0], st.load("z-rest-export/model.safetensors")[0]
diff = [k for k in wa if not torch.equal(wa[k], wb[k])]
if not same or diff:
    sys.exit(f"FAIL: ZeRO-1 tp 2 x dp 2 resume is not exact (losses equal: {same}; tensors differing: {diff[:3]})")
ref, legs, bad = rows("zr-straight"), [], []
for name, first, last in (("zr-b", 11, 20), ("zr-c", 21, 30)):
    got = rows(name)
    if sorted(got) != list(range(first, last + 1)):
        bad.append(f"{name}: logged steps {sorted(got)}")
        continue
    rel = abs(got[first]["loss"] - ref[first]["loss"]) / ref[first]["loss"]
    worst = max(abs(got[s]["loss"] - ref[s]["loss"]) / ref[s]["loss"] for s in got)
    legs.append(f"{name} step {first} {rel:.1e} (max {worst:.1e})")
    if rel > rtol:
        bad.append(f"{name}: step-{first} loss {got[first]['loss']!r} vs {ref[first]['loss']!r}")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print(f"part 2b: ZeRO-1 tp 2 x dp 2 resume exact (10 losses, every tensor); ZeRO-1 dp 4 -> ZeRO-0 dp 1 -> ZeRO-2 dp 2 "
      f"against a straight ZeRO-1 dp 4 run: {', '.join(legs)} (limit {rtol:g}) ({sys.argv[3]})")
PY
grep -q "saved as tp 1 x dp 4 x pp 1, loaded as tp 1 x dp 1 x pp 1" zr-b.log || fail "ZeRO resharding: no layout line"

# ---- 2c. pipeline stages: one file per (tp, pp) shard, exact resume, resharding across pp ----
# dp x M stays 4: micro-batch i of dp rank r draws the dropout masks of global micro-batch
# r + i dp at every global layer, so every layout below trains the same steps.
pipe=("${synth[@]}" --activation gelu --dropout 0.1 --log-interval 1 --comm-timeout 60)
tprun8() { "$build/tprun" --standalone --nproc_per_node 8 "$train" "$@"; }
l222=(--tp 2 --dp 2 --pp 2 --micro-batches 2)
run pp-straight.log tprun8 "${pipe[@]}" "${l222[@]}" --max-steps 40 --metrics pp-straight.jsonl
run pp-straight20.log tprun8 "${pipe[@]}" "${l222[@]}" --max-steps 20 --metrics pp-straight20.jsonl --export pp-straight20
run pp-half.log tprun8 "${pipe[@]}" "${l222[@]}" --max-steps 10 --save pp-ckpt --metrics pp-half.jsonl
run pp-rest.log tprun8 "${pipe[@]}" "${l222[@]}" --max-steps 20 --resume pp-ckpt --save pp-exact \
  --metrics pp-rest.jsonl --export pp-rest
grep -q "saved as tp 2 x dp 2 x pp 2, loaded as tp 2 x dp 2 x pp 2" pp-rest.log || fail "pp resume: no layout line"
run pp-inspect.log "$build/ckpt" inspect pp-ckpt/step_00000010
grep -q "mesh       tp 2 x dp 2 x pp 2" pp-inspect.log && grep -q "stages     enc:0-1|dec:0-1" pp-inspect.log &&
  grep -q "verify     ok (12 files" pp-inspect.log || { cat pp-inspect.log; fail "ckpt inspect of a pp checkpoint"; }
# ckpt export assembles the stages: the same tensors as the run's own --export of step 20
run pp-export.log "$build/ckpt" export pp-exact pp-exact-export
{
  echo "pp 2x2x2 resumed|pp-straight20.jsonl|pp-rest.jsonl|11|20|all|pp-straight20|pp-rest"
  echo "pp ckpt export of step 20|pp-straight20.jsonl|pp-straight20.jsonl|1|20|all|pp-straight20|pp-exact-export"
} > pp-checks.txt
out=$(verify pp-checks.txt) || { echo "$out"; exit 1; }
# Resharding (tp x dp x pp) 2x2x2 -> 1x1x1 -> 1x2x2 (ZeRO-2) -> 2x1x2, ten steps each, each leg
# saving what the next one resumes; and the step-10 checkpoint as four stages (an explicit layout).
run pp-leg1.log "$train" "${pipe[@]}" --micro-batches 4 --max-steps 20 --resume pp-ckpt --save pp-ckpt \
  --metrics pp-leg1.jsonl
run pp-leg2.log "$build/tprun" --standalone --nproc_per_node 4 "$train" "${pipe[@]}" --dp 2 --pp 2 --micro-batches 2 \
  --zero 2 --max-steps 30 --resume pp-ckpt --save pp-ckpt --metrics pp-leg2.jsonl
run pp-leg3.log tprun4 "${pipe[@]}" --tp 2 --pp 2 --micro-batches 4 --max-steps 40 --resume pp-ckpt --metrics pp-leg3.jsonl
run pp-to4.log tprun4 "${pipe[@]}" --pp 4 --pp-layout 'enc:0|enc:1|dec:0|dec:1' --micro-batches 4 --max-steps 20 \
  --resume pp-ckpt/step_00000010 --metrics pp-to4.jsonl
grep -q "saved as tp 2 x dp 2 x pp 2, loaded as tp 1 x dp 1 x pp 1" pp-leg1.log || fail "pp leg 1: no layout line"
grep -q "saved as tp 1 x dp 1 x pp 1, loaded as tp 1 x dp 2 x pp 2" pp-leg2.log || fail "pp leg 2: no layout line"
grep -q "saved as tp 1 x dp 2 x pp 2, loaded as tp 2 x dp 1 x pp 2" pp-leg3.log || fail "pp leg 3: no layout line"
run pp-inspect2.log "$build/ckpt" inspect pp-ckpt   # leg 2's ZeRO-2 stage shards, checked against the layout
grep -q "verify     ok" pp-inspect2.log || { cat pp-inspect2.log; fail "ckpt inspect of a ZeRO-2 pp checkpoint"; }
grep -q "saved as tp 2 x dp 2 x pp 2, loaded as tp 1 x dp 1 x pp 4" pp-to4.log || fail "pp -> pp 4: no layout line"
/usr/bin/python3 - "$LOSS_RTOL" "$(elapsed)" "$here" <<'PY' || exit 1
import sys
sys.path.insert(0, sys.argv[3])
from loss_log import finish, losses, start
rtol, ref, parts, bad = start("pp-straight")
for name, first, last in (("pp-leg1", 11, 20), ("pp-leg2", 21, 30), ("pp-leg3", 31, 40), ("pp-to4", 11, 20)):
    got = losses(name)
    if sorted(got) != list(range(first, last + 1)):
        bad.append(f"{name}: logged steps {sorted(got)}, not {first}..{last}")
        continue
    rel = abs(got[first] - ref[first]) / abs(ref[first])
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
    parts.append(f"{name} step {first} {rel:.1e} (max {worst:.1e})")
    if worst > rtol:
        bad.append(f"{name}: losses of steps {first}..{last} differ from the straight run by up to {worst:.2e} "
                   f"(relative) > {rtol:g}")
finish(bad, f"part 2c: tp 2 x dp 2 x pp 2 (dropout 0.1, 2 micro-batches) resumed exactly (losses, every tensor; "
            f"ckpt export of the stages equals the run's export); resharded 2x2x2 -> 1x1x1 -> 1x2x2 (ZeRO-2) -> "
            f"2x1x2 and into 4 stages, relative loss difference to the straight run: {', '.join(parts)} "
            f"(limit {rtol:g}) ({sys.argv[2]})")
PY

fi  # parts 1 and 2

if [[ $parts != main ]]; then
# ---- 3. crash safety -------------------------------------------------------------------
crash_flags=("${synth[@]}" --dropout 0.1 --log-interval 1 --max-steps 15 --save-interval 5 --keep-last 2
             --comm-timeout 60)
# expected_resume DIR: checks the state a killed save left (`latest`, when
# present, names a complete checkpoint) and prints the step a resume must
# continue from: the checkpoint `latest` names, else (killed before the
# first `latest`) the newest complete step directory, else 0.
expected_resume() {
  local dir=$1 latest newest
  if [[ -f $dir/latest ]]; then
    latest=$(cat "$dir/latest")
    [[ $latest == step_* && -f $dir/$latest/manifest.json ]] || fail "$dir/latest names '$latest': not complete"
    echo $((10#${latest#step_}))
  else
    newest=$(complete_steps "$dir" | sort | tail -n 1)
    [[ -n $newest ]] && echo $((10#${newest#step_})) || echo 0
  fi
}
# after_resume NAME DIR WANT LOG: the resumed run chose the expected, complete
# checkpoint and left a clean folder: no unfinished save, `latest` = the last
# step, at most --keep-last complete checkpoints (one more when the resumed
# run had nothing left to save: the kill interrupted the pruning).
after_resume() {
  local name=$1 dir=$2 want=$3 log=$4 got n
  got=$(resumed_step "$log")
  [[ $got == "$want" ]] || fail "$name: resumed from step $got, expected step $want"
  if ((want > 0)); then
    grep -q "resumed from $dir/step_$(printf %08d "$want"):" "$log" || fail "$name: resumed from an unexpected path"
  fi
  ! ls -d "$dir"/*.tmp > /dev/null 2>&1 || fail "$name: an unfinished save is left after the resumed run"
  [[ $(cat "$dir/latest") == step_00000015 ]] || fail "$name: latest is not step_00000015 after the resumed run"
  n=$(complete_steps "$dir" | wc -l)
  ((n <= 2 || (want == 15 && n == 3))) || fail "$name: $n complete checkpoints left with --keep-last 2"
}

run ref.log "$train" "${crash_flags[@]}" --save ref-ckpt --metrics ref.jsonl --export ref
[[ $(complete_steps ref-ckpt | tr '\n' ' ') == "step_00000010 step_00000015 " ]] ||
  fail "--keep-last 2 left $(complete_steps ref-ckpt | tr '\n' ' ')"
: > crash-checks.txt
declare -A resumed_from=()
k=0 points=0
while :; do
  k=$((k + 1))
  ((k <= 100)) || fail "still killed at save point 100"
  d=$work/crash$k
  rc=$(status "crash$k.log" env TPTRAIN_FAULT_POINT=$k "$train" "${crash_flags[@]}" --save "$d" \
       --metrics "crash$k.jsonl" --export "crash$k")
  if [[ $rc == 0 ]]; then
    grep -q "fault injection" "crash$k.log" && fail "save point $k: killed, yet exit status 0"
    echo "survivor|ref.jsonl|crash$k.jsonl|1|15|all|ref|crash$k" >> crash-checks.txt
    break
  fi
  [[ $rc == 137 ]] || { tail -n 20 "crash$k.log"; fail "save point $k: exit status $rc, not 137 (SIGKILL)"; }
  grep -q "killing rank 0 at save point $k " "crash$k.log" || fail "save point $k: no fault injection line"
  points=$k
  want=$(expected_resume "$d")
  run "resume$k.log" "$train" "${crash_flags[@]}" --save "$d" --resume auto --metrics "resume$k.jsonl" \
      --export "resume$k"
  after_resume "save point $k" "$d" "$want" "resume$k.log"
  resumed_from[$want]=$((${resumed_from[$want]:-0} + 1))
  {
    echo "killed at point $k|ref.jsonl|crash$k.jsonl|prefix|||-|-"
    echo "resumed after point $k|ref.jsonl|resume$k.jsonl|$((want + 1))|15|all|ref|resume$k"
  } >> crash-checks.txt
done
((points >= 20)) || fail "only $points save points were exercised (want at least 20)"

# A `latest` naming a step without manifest.json is not followed: resolution
# falls back to the newest complete step and reports what it skipped.
cp -r ref-ckpt fallback
mkdir fallback/step_00000099
cp fallback/step_00000015/*.safetensors fallback/step_00000099/
echo step_00000099 > fallback/latest
run fallback.log "$train" "${synth[@]}" --dropout 0.1 --max-steps 15 --resume fallback
grep -q "fallback/latest names an incomplete checkpoint" fallback.log || fail "no message about latest"
grep -q "skipping fallback/step_00000099: incomplete (no manifest.json)" fallback.log || fail "no skip message"
grep -q "resumed from fallback/step_00000015:" fallback.log || fail "fallback: wrong checkpoint chosen"
# Killed while saving again the step `latest` names (a resume from an older
# checkpoint into the same folder), between removing the old step_00000015
# and renaming the new one into place (save point 9 of the one save left):
# resolution falls back to the newest complete step, and the result is exact.
cp -r ref-ckpt resave
rc=$(status resave-crash.log env TPTRAIN_FAULT_POINT=9 "$train" "${crash_flags[@]}" --save resave \
     --resume resave/step_00000010)
[[ $rc == 137 ]] || fail "re-save: exit status $rc, not 137"
grep -q "at save point 9 (before renaming the directory)" resave-crash.log || fail "re-save: not killed as planned"
run resave.log "$train" "${crash_flags[@]}" --save resave --resume auto --metrics resave.jsonl --export resave-out
grep -q "resave/latest names an incomplete checkpoint" resave.log || fail "re-save: no message about latest"
grep -q "ignoring resave/step_00000015.tmp: a save that did not finish" resave.log || fail "re-save: no .tmp message"
grep -q "resumed from resave/step_00000010:" resave.log || fail "re-save: wrong checkpoint chosen"
echo "re-save of step 15, killed|ref.jsonl|resave.jsonl|11|15|all|ref|resave-out" >> crash-checks.txt
out=$(verify crash-checks.txt) || { echo "$out"; exit 1; }
summary=""
for s in $(printf '%s\n' "${!resumed_from[@]}" | sort -n); do
  summary+="${summary:+, }${resumed_from[$s]}x $( ((s == 0)) && echo scratch || echo "step $s")"
done
echo "part 3a: single process, 3 saves: killed at each of save points 1..$points, then resumed ($summary);" \
     "fault point $k is past the last save; a stale latest and a killed re-save fall back to the newest" \
     "complete step; $out against the uninterrupted run ($(elapsed))"

# A non-zero rank dies under tprun: rank 1 (tp 1, dp 0) passes 5 save points
# per save (it writes a model and an optimizer shard), rank 3 (tp 1, dp 1) 3.
crash_tp=("${crash_flags[@]}" --tp 2 --dp 2)
run tpref.log tprun4 "${crash_tp[@]}" --save "$work/tpref-ckpt" --metrics tpref.jsonl --export tpref
: > tpcrash-checks.txt
tp_summary=""
for rk in 1:2 1:8 1:15 3:1 3:5 3:9; do
  r=${rk%:*} k=${rk#*:}
  d=$work/tpcrash-r$r-k$k
  start=$SECONDS
  rc=$(status "tpcrash-r$r-k$k.log" env TPTRAIN_FAULT_RANK=$r TPTRAIN_FAULT_POINT=$k \
       "$build/tprun" --standalone --nproc_per_node 4 "$train" "${crash_tp[@]}" --save "$d" --metrics "tpcrash$r-$k.jsonl")
  took=$((SECONDS - start))
  log=tpcrash-r$r-k$k.log
  [[ $rc != 0 ]] || fail "rank $r, save point $k: the job succeeded"
  grep -q "\[rank $r\] fault injection: killing rank $r at save point $k " "$log" || fail "rank $r, point $k: no kill"
  grep -q "tprun: rank $r .* failed first: killed by signal SIGKILL" "$log" || { cat "$log"; fail "tprun did not report rank $r"; }
  ((took < 30)) || fail "rank $r, point $k: the job took $took s to stop"
  ! pgrep -f -- "$d" > /dev/null || fail "rank $r, point $k: workers left running"
  want=$(expected_resume "$d")
  run "tpresume-r$r-k$k.log" tprun4 "${crash_tp[@]}" --save "$d" --resume auto --metrics "tpresume$r-$k.jsonl" \
      --export "tpresume$r-$k"
  after_resume "rank $r, save point $k" "$d" "$want" "tpresume-r$r-k$k.log"
  tp_summary+="${tp_summary:+, }rank $r point $k ($(grep -o "at save point $k ([^)]*)" "$log" | sed 's/.*(\(.*\))/\1/'))"
  tp_summary+=" -> $( ((want == 0)) && echo scratch || echo "step $want")"
  {
    echo "rank $r killed at point $k|tpref.jsonl|tpcrash$r-$k.jsonl|prefix|||-|-"
    echo "resumed after rank $r point $k|tpref.jsonl|tpresume$r-$k.jsonl|$((want + 1))|15|all|tpref|tpresume$r-$k"
  } >> tpcrash-checks.txt
done
out=$(verify tpcrash-checks.txt) || { echo "$out"; exit 1; }
echo "part 3b: tp 2 x dp 2, a non-zero rank killed: $tp_summary; tprun stopped every job; $out ($(elapsed))"

fi  # part 3

if [[ $parts != crash ]]; then
# ---- 4. refusals -------------------------------------------------------------------------
# refuse NAME EXPECTED CMD...: CMD must fail with a plain exit status (not a
# signal) and print EXPECTED (a fixed string: the key phrase with the file).
refuse() {
  local name=$1 want=$2; shift 2
  local rc
  rc=$(status "refuse-$name.log" "$@")
  ((rc != 0)) || fail "$name: accepted"
  ((rc < 128)) || { tail -n 20 "refuse-$name.log"; fail "$name: died with exit status $rc"; }
  grep -qF -- "$want" "refuse-$name.log" || { cat "refuse-$name.log"; fail "$name: no '$want'"; }
}
crc_of() { sed -n "/\"$2\"/,/}/s/.*\"crc32c\":[[:space:]]*\"\([0-9a-f]*\)\".*/\1/p" "$1/manifest.json"; }
# reseal DIR: recomputes the manifest's checksum line after an edit, so that
# the check behind it (of the edited field) is the one that refuses.
reseal() { /usr/bin/python3 "$here/manifest_seal.py" reseal "$1/manifest.json"; }
synth_ck=copy-ckpt/step_00000010   # tp 2 x dp 2, synthetic task
mt_ck=corpus-ckpt/step_00000010     # tp 2 x dp 2, corpus (with spm.model): translate_mt loads it
resume_synth=("$train" "${synth[@]}" --dropout 0.1 --max-steps 12 --resume)
translate=("$build/translate_mt" --model)
head -n 3 "$corpus/dev.en" > src.en
run translate-good.log "${translate[@]}" "$mt_ck" --src src.en

for ck in "$synth_ck" "$mt_ck"; do
  kind=${ck%%-*}
  tool=("${resume_synth[@]}"); [[ $kind == corpus ]] && tool=("${translate[@]}")

  copy_of "$kind-trunc" "$ck"
  truncate -s -100 "$kind-trunc/model-tp1-pp0.safetensors"
  refuse "$kind-trunc" "$kind-trunc/model-tp1-pp0.safetensors: tensor 'decoder.final_ln.bias' data [" \
      "${tool[@]}" "$kind-trunc"
  grep -qF "(file truncated?)" "refuse-$kind-trunc.log" || fail "$kind-trunc: not called truncated"

  copy_of "$kind-flip" "$ck"
  size=$(stat -c %s "$kind-flip/model-tp0-pp0.safetensors")
  byte=$(od -An -tu1 -j $((size - 9)) -N1 "$kind-flip/model-tp0-pp0.safetensors" | tr -d ' ')
  printf "\\$(printf %03o $((byte ^ 1)))" |
    dd of="$kind-flip/model-tp0-pp0.safetensors" bs=1 seek=$((size - 9)) conv=notrunc status=none
  refuse "$kind-flip" "$kind-flip/model-tp0-pp0.safetensors: checksum mismatch: data section crc32c is " \
      "${tool[@]}" "$kind-flip"
  grep -qF "(file corrupted)" "refuse-$kind-flip.log" || fail "$kind-flip: not called corrupted"

  # A shard replaced by another valid file: caught by the manifest's size and CRC.
  copy_of "$kind-swap" "$ck"
  cp "$kind-swap/model-tp1-pp0.safetensors" "$kind-swap/model-tp0-pp0.safetensors"
  refuse "$kind-swap" "$kind-swap/model-tp0-pp0.safetensors: CRC-32C $(crc_of "$ck" model-tp1-pp0.safetensors), the manifest says $(crc_of "$ck" model-tp0-pp0.safetensors) (corrupted)" \
      "${tool[@]}" "$kind-swap"

  copy_of "$kind-crc" "$ck"
  old=$(crc_of "$ck" model-tp1-pp0.safetensors)
  new=$(printf %08x $((0x$old ^ 0x10)))
  sed -i "s/\"crc32c\":\([[:space:]]*\)\"$old\"/\"crc32c\":\1\"$new\"/" "$kind-crc/manifest.json"
  reseal "$kind-crc"
  refuse "$kind-crc" "$kind-crc/model-tp1-pp0.safetensors: CRC-32C $old, the manifest says $new (corrupted)" \
      "${tool[@]}" "$kind-crc"

  copy_of "$kind-version" "$ck"
  sed -i '0,/"format_version":[[:space:]]*2,/s//"format_version":\t7,/' "$kind-version/manifest.json"
  reseal "$kind-version"
  refuse "$kind-version" "$kind-version/manifest.json: field 'format_version' is 7, this build reads version 2" \
      "${tool[@]}" "$kind-version"

  copy_of "$kind-invalid" "$ck"
  sed -i 's/"n_heads":\([[:space:]]*\)4,/"n_heads":\13,/' "$kind-invalid/manifest.json"
  reseal "$kind-invalid"
  refuse "$kind-invalid" "$kind-invalid/manifest.json: config: n_heads (3) must divide d_model (32)" \
      "${tool[@]}" "$kind-invalid"

  # A config that does not fit the shards: refused from the manifest, before
  # a model of it is built (translate_mt builds the manifest's model).
  copy_of "$kind-dmodel" "$ck"
  sed -i 's/"d_model":\([[:space:]]*\)32,/"d_model":\148,/' "$kind-dmodel/manifest.json"
  reseal "$kind-dmodel"
  refuse "$kind-dmodel" \
      "$kind-dmodel/manifest.json: file 'model-tp0-pp0.safetensors' is listed with $(stat -c %s "$ck/model-tp0-pp0.safetensors") bytes, but the manifest's config (d_model 48," \
      "${tool[@]}" "$kind-dmodel"
done
# Another model of the same shapes: train_mt builds its own model, and the
# configs differ.
copy_of copy-other "$synth_ck"
sed -i 's/"label_smoothing":\([[:space:]]*\)0.1[0-9]*,/"label_smoothing":\10.2,/' copy-other/manifest.json
reseal copy-other
refuse copy-other \
    "copy-other/manifest.json: the checkpoint's model differs from this run's: the checkpoint has label_smoothing 0.2, this run 0.1" \
    "${resume_synth[@]}" copy-other
# A manifest written before attention and activation dropout (the two fields
# absent) reads them as 0, this run's default, and resumes; asking for
# another value is refused as any other change of the model is.
copy_of copy-old "$synth_ck"
sed -i '/"attention_dropout"/d; /"activation_dropout"/d' copy-old/manifest.json
reseal copy-old
! grep -q '_dropout"' copy-old/manifest.json || fail "copy-old: the inner dropouts still in its manifest"
run resume-old.log "${resume_synth[@]}" copy-old
refuse copy-old-attn \
    "copy-old/manifest.json: the checkpoint's model differs from this run's: the checkpoint has attention_dropout 0, this run 0.1" \
    "${resume_synth[@]}" copy-old --attention-dropout 0.1

# The optimizer state: needed to resume, not to translate.
copy_of no-optim "$mt_ck"
rm no-optim/optim-tp1-pp0-dp1.safetensors
refuse no-optim "no-optim/optim-tp1-pp0-dp1.safetensors: missing (listed in the manifest)" \
    "$train" "${corpus_flags[@]}" --dropout 0.1 --max-steps 12 --resume no-optim
run translate-no-optim.log "${translate[@]}" no-optim --src src.en
# A checkpoint saved with another seed or from the other kind of run.
refuse seed "$synth_ck was saved with --seed 1, this run has --seed 2" "${resume_synth[@]}" "$synth_ck" --seed 2
refuse kind "$synth_ck was saved from a synthetic-task run, this run trains on a corpus" \
    "$train" "${corpus_flags[@]}" --dropout 0.1 --max-steps 12 --resume "$synth_ck"
# The stages of a pipeline checkpoint: a layout that is not one of this model, or
# another split than the shards were cut for.
copy_of pp-bad pp-ckpt/step_00000010
sed -i 's/"stages":\([[:space:]]*\)"enc:0-1|dec:0-1"/"stages":\1"enc:0-2|dec:0-1"/' pp-bad/manifest.json
reseal pp-bad
refuse pp-bad "pp-bad/manifest.json: field 'mesh.stages' does not fit the config: --pp-layout 'enc:0-2|dec:0-1': 'enc:0-2' is not a range of the 2 encoder layers" \
    "$train" "${pipe[@]}" --max-steps 12 --resume pp-bad
copy_of pp-split pp-ckpt/step_00000010
sed -i 's/"stages":\([[:space:]]*\)"enc:0-1|dec:0-1"/"stages":\1"enc:0|enc:1,dec:0-1"/' pp-split/manifest.json
reseal pp-split
refuse pp-split "pp-split/manifest.json: file 'model-tp0-pp1.safetensors' is listed with" \
    "$train" "${pipe[@]}" --max-steps 12 --resume pp-split
# Empty folders: an error for --resume DIR, a fresh start for --resume auto.
mkdir empty-ckpt empty-save
refuse empty "empty-ckpt holds no complete checkpoint" "${resume_synth[@]}" empty-ckpt
refuse nowhere "nowhere holds no complete checkpoint" "${resume_synth[@]}" nowhere
run fresh.log "$train" "${synth[@]}" --max-steps 2 --save empty-save --resume auto
grep -qF "no checkpoint in empty-save yet: starting from step 1" fresh.log || fail "--resume auto on an empty folder"
test -f empty-save/step_00000002/manifest.json || fail "the fresh run did not save"
echo "part 4: refused with the file named: truncated shard, flipped data byte, swapped shard, edited crc32c," \
     "format_version 7, invalid and other-model config (train_mt and translate_mt each), missing optimizer shard" \
     "(translate_mt still loads), other seed, other data kind, pipeline stages not of this model or not of the shards," \
     "empty or missing --resume folder; --resume auto on an empty" \
     "--save folder starts from step 1 ($(elapsed))"
fi  # part 4
echo "test_checkpoint ($parts): ok"
