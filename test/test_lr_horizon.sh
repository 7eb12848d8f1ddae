#!/usr/bin/env bash
# --max-minutes as the schedule's horizon: a time-bounded cosine run falls
# to 0 by its last step. Rank 0's clock is made exact with the test-only
# TPTRAIN_FAKE_STEP_SECONDS=6 (each step takes 6 s on it), so a 1-minute
# budget with a 3-step warmup ends after step 10 and the lr of step s >= 3
# is peak (1 + cos(pi min(1, (6 s - 12) / 48))) / 2 (the decay's span runs
# from the warmup's end at 12 s to 60 s; a step's lr is taken at its end).
#   1. one rank: the logged lr is that formula at every step, 0 at step 10,
#      where the run ends (saved) although --max-steps is 1000;
#   2. tp 2 through tprun: the same lr and stop on both ranks' schedule
#      (rank 1's clock is never read: a rank on its own clock would train
#      other weights), the loss equal to the single rank's (LOSS_RTOL, as
#      test_parallel.sh);
#   3. --resume from step 5 continues the same schedule (the checkpoint
#      carries the time spent; ckpt inspect shows it): steps 6-10 bit for
#      bit; a resume of the spent run trains nothing; a damaged clock is
#      refused naming its field;
#   4. --max-steps 6 ends first: the cosine follows the steps to 0 at step 6.
# Usage: test_lr_horizon.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "test_lr_horizon: FAIL: $*" >&2; exit 1; }
export TPTRAIN_FAKE_STEP_SECONDS=6
args=(--preset tiny --task copy --lr-schedule cosine --lr 5e-3 --warmup 3 --max-minutes 1 --log-interval 1
      --eval-interval 0 --dropout 0 --activation gelu --batch-size 32 --comm-timeout 60)

# check METRICS LAST: the lr formula at every step, the run's last training row step LAST.
check() {
  /usr/bin/python3 - "$@" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
last, steps_end = int(sys.argv[2]), (int(sys.argv[3]) if len(sys.argv) > 3 else None)
LR_RTOL = 1e-6  # the metrics print 7 significant digits
peak, warmup = 5e-3, 3
def want(s):
    if s < warmup:
        return peak * s / warmup
    q = min(1.0, (6.0 * s - 12.0) / 48.0)
    if steps_end:
        q = max(q, (s - warmup) / (steps_end - warmup))
    return 0.0 if q >= 1.0 else peak * 0.5 * (1.0 + math.cos(math.pi * q))
assert rows[-1]["step"] == last, f"last training row is step {rows[-1]['step']}, not {last}"
for r in rows:
    w = want(r["step"])
    assert abs(r["lr"] - w) <= LR_RTOL * peak, f"step {r['step']}: lr {r['lr']}, expected {w}"
assert rows[-1]["lr"] == 0.0, f"the last step's lr is {rows[-1]['lr']}, not the floor 0"
PY
}

"$build/train_mt" "${args[@]}" --max-steps 1000 --save ck --save-interval 5 --metrics m1.jsonl > r1.log 2>&1 ||
  { cat r1.log; fail "one rank: exit $?"; }
grep -q -- "--max-minutes 1 reached at step 10 of 1000" r1.log || fail "one rank: no stop at step 10: $(tail -n 3 r1.log)"
check m1.jsonl 10 || fail "one rank: the schedule"
[ "$(cat ck/latest)" = step_00000010 ] || fail "one rank: latest is $(cat ck/latest)"
echo "one rank: lr 0 at step 10, where 1 minute ends"

"$build/tprun" --standalone --nproc_per_node 2 "$build/train_mt" "${args[@]}" --max-steps 1000 --tp 2 \
  --metrics m2.jsonl > r2.log 2>&1 || { cat r2.log; fail "tp 2: exit $?"; }
grep -q -- "--max-minutes 1 reached at step 10 of 1000" r2.log || fail "tp 2: no stop at step 10: $(tail -n 3 r2.log)"
check m2.jsonl 10 || fail "tp 2: the schedule"
/usr/bin/python3 - m1.jsonl m2.jsonl <<'PY' || fail "tp 2: the loss differs from one rank's"
import json, sys
LOSS_RTOL = 1e-5  # as test_parallel.sh: fp32 sums in another order
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(a) == len(b) == 10, (len(a), len(b))
for s, (x, y) in enumerate(zip(a, b), 1):
    assert abs(x - y) <= LOSS_RTOL * abs(x), f"step {s}: loss {x} one rank, {y} tp 2"
PY
echo "tp 2: the same lr, stop and loss as one rank"

"$build/train_mt" "${args[@]}" --max-steps 1000 --resume ck/step_00000005 --metrics m3.jsonl > r3.log 2>&1 ||
  { cat r3.log; fail "resume: exit $?"; }
grep -q -- "--max-minutes 1 reached at step 10 of 1000" r3.log || fail "resume: no stop at step 10: $(tail -n 3 r3.log)"
/usr/bin/python3 - m1.jsonl m3.jsonl <<'PY' || fail "resume: steps 6-10 differ from the straight run"
import json, sys
a, b = ([(r["step"], r["lr"], r["loss"]) for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:])
assert b == a[5:], f"resumed {b}\nstraight {a[5:]}"
PY
"$build/train_mt" "${args[@]}" --max-steps 1000 --resume ck > r4.log 2>&1 || { cat r4.log; fail "spent: exit $?"; }
grep -q -- "--max-minutes 1 already spent (1.0 minutes trained up to step 10): nothing to train" r4.log ||
  fail "spent: $(cat r4.log)"
if grep -q "^step " r4.log; then fail "spent: a step was trained"; fi
"$build/ckpt" inspect ck/step_00000005 > inspect.log || fail "ckpt inspect: $(cat inspect.log)"
grep -q "^clock      30.0 s of training (--max-minutes), the last step 6.000 s; warm-up over" inspect.log ||
  fail "ckpt inspect: no clock line: $(cat inspect.log)"
cp -r ck/step_00000005 bad
sed -i 's/"train_seconds":\t30/"train_seconds":\t-30/' bad/manifest.json
/usr/bin/python3 "$here/manifest_seal.py" reseal bad/manifest.json
if "$build/train_mt" "${args[@]}" --max-steps 1000 --resume bad > r6.log 2>&1; then fail "a negative clock was resumed"; fi
grep -q "field 'clock.train_seconds' must be a finite number in \[0, 1e+12\], got -30" r6.log ||
  fail "bad clock: $(cat r6.log)"
echo "resume: the schedule goes on from the checkpoint's clock; a bad clock is refused naming its field"

"$build/train_mt" "${args[@]}" --max-steps 6 --metrics m5.jsonl > r5.log 2>&1 || { cat r5.log; fail "steps: exit $?"; }
check m5.jsonl 6 6 || fail "--max-steps ending first"
echo "--max-steps first: the cosine ends at step 6"
echo "test_lr_horizon: PASS"
