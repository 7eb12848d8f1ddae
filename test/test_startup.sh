#!/usr/bin/env bash
# train_mt's start-up phases (src/app/startup.h): one line before the first
# step, "train_mt: start-up T s: name v, ...", and the same phases as
# "startup_s" in the first training record of --metrics only. Checked for a
# --task run, a corpus run (its data phases; at tp 1 no decoding model: the
# training model decodes itself, and --eval-interval 0 decodes nothing), a
# resumed run (the resume phase) and two ranks (one line, from rank 0): the
# line comes before the first step's line; the record's phases are the
# line's, in its order, each equal to the printed figure to its two
# decimals, none negative; their sum is the line's total and at most the
# record's since_launch_s (both read the process's age from /proc, whose
# clock ticks every 10 ms: AGE_TOL allows one tick each).
#   test_startup.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
corpus=$(cd "$2" && pwd)
. "$(dirname "$0")/corpus_cache.sh"
. "$(dirname "$0")/lib.sh"
enter_workdir
use_corpus_cache cache

check() {  # name log metrics phases-that-must-be-there... (!phase: must not be)
  /usr/bin/python3 - "$@" <<'PY'
import json, re, sys
name, log, metrics, need = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
AGE_TOL = 0.02  # two ticks of /proc's 10 ms clock (the launch phase and since_launch_s)
ROUND = 0.00005  # each phase is recorded to 4 decimals
lines = open(log).read().splitlines()
at = [i for i, l in enumerate(lines) if re.match(r"^(\[rank \d+\] )?train_mt: start-up ", l)]
assert len(at) == 1, f"{name}: {len(at)} start-up lines"
steps = [i for i, l in enumerate(lines) if re.match(r"^(\[rank \d+\] )?step +\d+/", l)]
assert steps and at[0] < steps[0], f"{name}: the start-up line is not before the first step's"
m = re.match(r"^(?:\[rank 0\] )?train_mt: start-up (\d+\.\d\d) s: (.*)$", lines[at[0]])
assert m, f"{name}: malformed line: {lines[at[0]]}"
total = float(m.group(1))
printed = [(p.split(" ")[0], float(p.split(" ")[1])) for p in m.group(2).split(", ")]
rows = [json.loads(l) for l in open(metrics)]
train = [r for r in rows if "loss" in r]
with_boot = [r for r in rows if "startup_s" in r]
assert len(with_boot) == 1 and with_boot[0] is train[0], f"{name}: startup_s in {len(with_boot)} records, not the first only"
boot = list(train[0]["startup_s"].items())
assert [k for k, _ in boot] == [k for k, _ in printed], f"{name}: record {boot} against line {printed}"
for (k, v), (_, p) in zip(boot, printed):
    assert v >= 0, f"{name}: phase {k} is {v}"
    assert abs(v - p) <= 0.005 + 1e-9, f"{name}: phase {k}: record {v}, line {p}"
for k in need:
    if k.startswith("!"):
        assert k[1:] not in dict(boot), f"{name}: phase {k[1:]} in {boot}"
    else:
        assert k in dict(boot), f"{name}: no phase {k} in {boot}"
s = sum(v for _, v in boot)
assert abs(total - s) <= 0.005 + ROUND * len(boot) + 1e-9, f"{name}: line total {total}, phases add up to {s}"
launch = train[0]["since_launch_s"]
assert s <= launch + AGE_TOL + ROUND * len(boot), f"{name}: phases add up to {s} s, more than since_launch_s {launch}"
print(f"ok   {name}: start-up {s:.3f} s of since_launch_s {launch} s in {len(boot)} phases")
PY
}

tiny=(--preset tiny --max-steps 3 --log-interval 1 --eval-interval 0)
"$build/train_mt" --task copy "${tiny[@]}" --metrics copy.jsonl --save ckpt > copy.log 2>&1 || { cat copy.log; exit 1; }
check copy copy.log copy.jsonl launch arguments device ranks model optimizer first_batch

"$build/train_mt" --task copy --preset tiny --max-steps 5 --log-interval 1 --eval-interval 0 --resume ckpt \
    --metrics resumed.jsonl > resumed.log 2>&1 || { cat resumed.log; exit 1; }
check resumed resumed.log resumed.jsonl model optimizer resume first_batch

"$build/train_mt" --data "$corpus" --cache-dir cache "${tiny[@]}" --metrics corpus.jsonl > corpus.log 2>&1 ||
    { cat corpus.log; exit 1; }
check corpus corpus.log corpus.jsonl corpus tokenizer text_form batching model '!decode_model' optimizer first_batch

"$build/tprun" --standalone --nproc_per_node 2 "$build/train_mt" --task copy "${tiny[@]}" --tp 2 \
    --metrics tp2.jsonl > tp2.log 2>&1 || { cat tp2.log; exit 1; }
check tp2 tp2.log tp2.jsonl device ranks model first_batch
