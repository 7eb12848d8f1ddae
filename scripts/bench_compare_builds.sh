#!/usr/bin/env bash
# CPU step time of two builds side by side (not a test): the same training
# run (corpus, preset, steps, seed, layout) with build A and build B,
# alternated REPEATS times so both see the same machine, then the training
# seconds of each (median), the ratio B / A, and whether their losses agree.
#   bash scripts/bench_compare_builds.sh BUILD_A BUILD_B CORPUS_DIR [STEPS] [RANKS] [REPEATS] [extra train_mt flags...]
# BUILD_x: a build folder holding train_mt and tprun (e.g. build, or a build of
# an older commit: git worktree add /tmp/old REV && cmake ... -DTPTRAIN_CUDA=OFF).
# Each build gets its own token cache (the cache format may differ between them).
set -euo pipefail
a=$(cd "$1" && pwd) b=$(cd "$2" && pwd) corpus=$3
steps=${4:-100} ranks=${5:-1} repeats=${6:-2}
shift $(( $# < 6 ? $# : 6 ))
out=${BENCH_DIR:-$(mktemp -d)}
mkdir -p "$out"
flags=(--data "$corpus" --preset tiny --max-steps "$steps" --log-interval 10 --eval-interval 1000000 --seed 1 "$@")
run() {  # $1: label, $2: build folder, $3: repeat
    local log=$out/$1.$3.log
    "$2/tprun" --nproc_per_node="$ranks" train_mt --cache-dir "$out/cache-$1" --metrics "$out/$1.$3.jsonl" \
        "${flags[@]}" > "$log" 2>&1 || { echo "bench_compare_builds: $1 failed:"; tail -n 20 "$log"; exit 1; }
}
# A warm-up of each (tokenizer and token cache), not timed.
run A "$a" 0
run B "$b" 0
for r in $(seq 1 "$repeats"); do
    run A "$a" "$r"
    run B "$b" "$r"
done
/usr/bin/python3 - "$out" "$repeats" "$ranks" "$steps" "$a" "$b" <<'PY'
import json, re, statistics, sys
out, repeats, ranks, steps, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def train_s(label, r):
    m = re.search(r"steps in \S+ \(([\d.]+) s training", open(f"{out}/{label}.{r}.log").read())
    return float(m.group(1))
def losses(label, r):
    return [json.loads(l)["loss"] for l in open(f"{out}/{label}.{r}.jsonl") if '"loss"' in l]
t = {x: [train_s(x, r) for r in range(1, repeats + 1)] for x in "AB"}
ma, mb = statistics.median(t["A"]), statistics.median(t["B"])
la, lb = losses("A", 1), losses("B", 1)
gap = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
print(f"{steps} steps, {ranks} rank(s), {repeats} alternated repeats")
print(f"  A {a}: training s {' '.join(f'{x:.2f}' for x in t['A'])} (median {ma:.2f})")
print(f"  B {b}: training s {' '.join(f'{x:.2f}' for x in t['B'])} (median {mb:.2f})")
print(f"  B / A = {mb / ma:.3f}; losses of the {len(la)} logged steps: largest relative gap {gap:.2e}"
      f"{' (identical)' if la == lb else ''}")
PY
