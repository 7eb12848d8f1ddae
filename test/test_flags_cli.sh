#!/usr/bin/env bash
# The programs' flag tables end to end (common/flags.h; the table itself is
# test_flags): train_mt's --help grouped with every flag once, the echo of
# the effective configuration (rank 0's block and FILE.config.jsonl, appended
# on resume), a preset's values overridden by a flag whatever the order, the
# refusals the tables brought (a missing --model, a flag of another ckpt
# command), and readme_flags.py --check failing on a README that drifted.
# Usage: test_flags_cli.sh BUILD_DIR READMEFLAGS_PY README (scripts/readme_flags.py, README.md)
set -uo pipefail
build=$(cd "$1" && pwd)
script=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
readme=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
. "$(dirname "$0")/lib.sh"
enter_workdir
tm=$build/train_mt

# ---- --help: groups in order, every flag listed once ----
"$tm" --help > help.txt 2> err.txt || bad "train_mt --help: $(cat err.txt)"
groups=$(grep -E '^[A-Z][a-z]+:$' help.txt | tr -d ':' | tr '\n' ' ')
[ "$groups" = "Data Model Training Parallelism Evaluation Checkpoints Planner Output " ] &&
    ok "train_mt --help groups: $groups" || bad "train_mt --help groups: '$groups'"
dups=$(grep -oE '^  --[a-z0-9-]+' help.txt | sort | uniq -d)
n=$(grep -cE '^  --[a-z0-9-]+' help.txt)
[ -z "$dups" ] && [ "$n" -ge 60 ] && ok "train_mt --help lists $n flags, each once" ||
    bad "train_mt --help: $n flags, repeated: $dups"
grep -qE '^  --max-steps N +length of the run in steps \(or --epochs\) \(default from the preset; 1 to$' help.txt &&
    ok "a flag's line has its default and range" || bad "--max-steps line: $(grep -A1 -- '--max-steps' help.txt)"

# ---- the configuration echo ----
tiny=(--task copy --layers 1 --d-model 16 --heads 2 --ffn-hidden-size 16 --log-interval 1 --eval-interval 0)
"$tm" "${tiny[@]}" --lr 0.01 --preset tiny --max-steps 1 --save ck --metrics m.jsonl > out.txt 2> err.txt
rc=$?
if [ $rc -eq 0 ] && grep -qx 'train_mt: configuration' out.txt &&
    grep -qE '^  Training +--lr 0.01 --warmup 200 .*--max-steps 1 --seed 1$' out.txt &&
    grep -qE '^  Checkpoints +--save ck --save-mode async$' out.txt; then
    ok "rank 0's log: the configuration block, --lr before --preset still wins"
else
    bad "echo: rc $rc: $(head -12 out.txt) $(cat err.txt)"
fi
"$tm" "${tiny[@]}" --resume auto --save ck --max-steps 2 --metrics m.jsonl > out2.txt 2> err.txt ||
    bad "resume: $(cat err.txt)"
/usr/bin/python3 - m.jsonl.config.jsonl <<'EOF' && ok "FILE.config.jsonl: one record per start, appended on resume" || bad "config.jsonl: $(cat m.jsonl.config.jsonl)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["first_step"] for r in rows] == [1, 2], rows
c0, c1 = rows[0]["config"], rows[1]["config"]
assert c0["lr"] == 0.01 and c0["preset"] == "tiny" and c0["max-steps"] == 1 and c0["task"] == "copy", c0
assert c0["strict"] is False and c0["epochs"] is None and c0["resume"] is None and c0["save"] == "ck", c0
assert c1["resume"] == "auto" and c1["max-steps"] == 2 and c1["lr"] == 0.002, c1  # the tiny preset's lr
EOF
grep -q '"config"' m.jsonl && bad "the metrics file holds the config record (its readers take step records)" ||
    ok "the metrics file itself holds step records only"

# ---- refusals the tables brought ----
"$build/translate_mt" --beam 3 > out.txt 2> err.txt < /dev/null
rc=$?
[ $rc -eq 2 ] && [ "$(cat err.txt)" = "translate_mt: --model DIR is required (a model directory saved by train_mt --save); see translate_mt --help" ] &&
    ok "translate_mt without --model: one sentence" || bad "no --model: rc $rc: $(cat err.txt)"
"$build/ckpt" inspect --strict ck > out.txt 2> err.txt
rc=$?
[ $rc -eq 2 ] && [ "$(cat err.txt)" = "ckpt: --strict belongs to ckpt export, not to inspect" ] &&
    ok "ckpt: a flag of another command" || bad "ckpt inspect --strict: rc $rc: $(cat err.txt)"
"$build/ckpt" average --last 0 ck out > out.txt 2> err.txt
rc=$?
[ $rc -eq 2 ] && [ "$(cat err.txt)" = "ckpt: --last expects an integer in [1, 1000000], got '0'" ] &&
    ok "ckpt average --last 0: its range" || bad "--last 0: rc $rc: $(cat err.txt)"
"$build/tprun" --standalone=1 true > out.txt 2> err.txt
rc=$?
[ $rc -eq 2 ] && [ "$(cat err.txt)" = "tprun: --standalone takes no value, got '--standalone=1'" ] &&
    ok "tprun: a switch with a value" || bad "tprun --standalone=1: rc $rc: $(cat err.txt)"

# ---- the README's lists: --check fails on a drifted copy, passes once regenerated ----
cp "$readme" README.md
sed -i 's/^  --beam K  .*/  --beam K               a stale line/' README.md
/usr/bin/python3 "$script" "$build" --check --readme README.md > out.txt 2> err.txt
rc=$?
[ $rc -ne 0 ] && grep -q "the README's flags of train_mt, translate_mt differ from --help" err.txt &&
    ok "readme_flags --check names the stale lists" || bad "readme_flags on a stale README: rc $rc: $(tail -3 err.txt)"
/usr/bin/python3 "$script" "$build" --readme README.md > out.txt 2>&1 &&
    /usr/bin/python3 "$script" "$build" --check --readme README.md > out.txt 2>&1 &&
    cmp -s README.md "$readme" && ok "regenerated, the copy is the README again" ||
    bad "regenerating: $(cat out.txt)"

if [ $fails -ne 0 ]; then
    echo "test_flags_cli: $fails failed"
    exit 1
fi
echo "test_flags_cli: all passed"
