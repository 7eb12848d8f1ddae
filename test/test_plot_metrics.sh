#!/usr/bin/env bash
# scripts/plot_metrics.py on recorded metrics (test/metrics/):
#   tp2.jsonl   a real 60-step corpus run through tprun, tp 2 (train_mt
#               --preset tiny --max-steps 60 --lr 3e-3 --warmup 20
#               --log-interval 5 --eval-interval 20): training rows with
#               elapsed_s and both ranks' memory, dev rows, the memory record
#   dp2.jsonl   the same with --tp 1 --dp 2
# and test/curves/cpu.jsonl (a synthetic task: no dev BLEU, no memory, no
# elapsed_s). Checked: the PNG is a well-formed PNG (signature, chunk CRCs,
# IHDR size, image data that inflates to the size IHDR implies, IEND) of a
# plausible size, not one flat colour, and its Description names the six
# panels, which --list-panels prints too; the default output lies beside the
# metrics file; one PNG per run without -o, an overlay with -o, labels from
# file names or --label; --x time; train_mt's records of other kinds
# (profile, best, early_stop, averaged, time) passed over; malformed input refused with the file
# and line number, exit 1.
# Usage: test_plot_metrics.sh SCRIPTS_DIR METRICS_DIR CURVES_DIR
set -euo pipefail
scripts=$(cd "$1" && pwd) metrics=$(cd "$2" && pwd) curves=$(cd "$3" && pwd)
py=/usr/bin/python3
plot=$scripts/plot_metrics.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$py" -c 'import matplotlib' 2> /dev/null; then
  echo "FAIL: Debian's python3-matplotlib is missing (bash scripts/install_deps.sh --tests installs it)"
  exit 1
fi
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
PANELS='loss|learning rate|gradient norm|tokens/s|dev BLEU|peak memory per rank (MiB)'

# check_png FILE TITLE: a valid PNG of the figure's size whose metadata names the panels.
check_png() {
  "$py" - "$1" "$2" "$PANELS" <<'PY'
import struct, sys, zlib
path, title, panels = sys.argv[1], sys.argv[2], sys.argv[3].split("|")
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
assert 20_000 < len(data) < 2_000_000, f"implausible size {len(data)} bytes"
pos, chunks, text, idat = 8, [], {}, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    crc, = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
    assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind}"
    chunks.append(kind)
    if kind == b"IHDR":
        w, h, depth, color = struct.unpack(">IIBB", body[:10])
    elif kind == b"tEXt":
        k, v = body.split(b"\0", 1)
        text[k.decode("latin-1")] = v.decode("latin-1")
    elif kind == b"iTXt":
        k, rest = body.split(b"\0", 1)
        text[k.decode()] = rest[2:].split(b"\0", 2)[2].decode()
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, f"chunks {chunks}"
assert (w, h) == (1200, 1050) and depth == 8 and color in (2, 6), f"IHDR {w}x{h} depth {depth} colour {color}"
raw = zlib.decompress(idat)
channels = 4 if color == 6 else 3
assert len(raw) == h * (1 + w * channels), f"image data inflates to {len(raw)} bytes, not {h} rows of {w} pixels"
assert len(set(raw[1:1 + w * channels * 300])) > 8, "the image looks empty"
want = "panels: " + "; ".join(panels)
assert text.get("Description") == want, f"Description {text.get('Description')!r}, want {want!r}"
assert text.get("Title") == title, f"Title {text.get('Title')!r}, want {title!r}"
print(f"{w}x{h}, {len(data)} bytes, {text['Description']}")
PY
}

# expect_png WHAT PNG TITLE CMD...: the command succeeds, names the PNG, which checks out.
expect_png() {
  local what=$1 png=$2 title=$3 rc=0
  shift 3
  "$@" > "$work/out.txt" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then bad "$what: exit $rc"; cat "$work/out.txt"; return; fi
  if ! grep -qF "wrote $png " "$work/out.txt"; then bad "$what: the path $png is not printed"; cat "$work/out.txt"; return; fi
  if check_png "$png" "$title" > "$work/png.txt" 2>&1; then ok "$what: $(cat "$work/png.txt")"
  else bad "$what: $png"; cat "$work/png.txt"; fi
}

# expect_error WHAT PATTERN FILE...: exit 1 and a message matching PATTERN.
expect_error() {
  local what=$1 pattern=$2 rc=0
  shift 2
  rm -f "$work/never.png"
  "$py" "$plot" "$@" -o "$work/never.png" > "$work/out.txt" 2>&1 || rc=$?
  if [ "$rc" -eq 1 ] && grep -qE "$pattern" "$work/out.txt" && [ ! -e "$work/never.png" ]; then
    ok "$what: $(head -n 1 "$work/out.txt")"
  else
    bad "$what: exit $rc, expected 1 and /$pattern/"; cat "$work/out.txt"
  fi
}

cp "$metrics/tp2.jsonl" "$metrics/dp2.jsonl" "$curves/cpu.jsonl" "$work/"
cd "$work"

expect_png "one run, -o" "$work/one.png" tp2 "$py" "$plot" tp2.jsonl -o "$work/one.png"
expect_png "one run beside its metrics" tp2.png tp2 "$py" "$plot" tp2.jsonl
expect_png "one run over wall time" "$work/time.png" tp2 "$py" "$plot" --x time tp2.jsonl -o "$work/time.png"
expect_png "overlay of two runs" compare.png "tp2 vs dp2" "$py" "$plot" tp2.jsonl dp2.jsonl -o compare.png
grep -q "(2 runs, " out.txt || bad "overlay: not reported as 2 runs"
expect_png "overlay over wall time, --label" labels.png "tensor vs data" \
  "$py" "$plot" --x time --label tensor --label data tp2.jsonl dp2.jsonl -o labels.png
expect_png "synthetic task (no dev BLEU, no memory)" cpu.png cpu "$py" "$plot" cpu.jsonl

# Several runs without -o: one PNG each, beside its file.
rm -f tp2.png dp2.png
if "$py" "$plot" tp2.jsonl dp2.jsonl > out.txt 2>&1 && check_png tp2.png tp2 > /dev/null && check_png dp2.png dp2 > /dev/null \
   && [ "$(grep -c 'wrote' out.txt)" -eq 2 ]; then ok "two runs without -o: tp2.png and dp2.png"
else bad "two runs without -o"; cat out.txt; fi

# --list-panels: the titles of the figure's panels, one per line; nothing written.
if "$py" "$plot" --list-panels tp2.jsonl -o listed.png > panels.txt 2>&1 && [ ! -e listed.png ] \
   && [ "$(tr '\n' '|' < panels.txt)" = "$PANELS|" ]; then ok "--list-panels: $(tr '\n' ';' < panels.txt)"
else bad "--list-panels"; cat panels.txt; fi

# A resumed run (its clock starts again, steps 31.. logged twice) still plots over steps and time.
"$py" - tp2.jsonl resumed.jsonl <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
t0 = json.loads(lines[7])["elapsed_s"] - 1.0
with open(sys.argv[2], "w") as out:
    out.write("\n".join(lines[:9]) + "\n")   # up to step 35, then resumed from step 30
    for l in lines[7:16]:
        r = json.loads(l)
        r["elapsed_s"] = round(r["elapsed_s"] - t0, 3)
        out.write(json.dumps(r) + "\n")
PY
expect_png "resumed run, over steps" resumed.png resumed "$py" "$plot" resumed.jsonl
expect_png "resumed run, over time" resumed_t.png resumed "$py" "$plot" --x time resumed.jsonl -o resumed_t.png

# train_mt's other records (--profile, --keep-best, --patience, --average-last, the end's time record) are passed over.
{ head -n 4 tp2.jsonl
  echo '{"step": 20, "profile": {"gemm": {"ms": 1.5, "share": 0.4}}}'
  echo '{"step": 20, "best": "bleu", "best_value": 3.1}'
  tail -n +5 tp2.jsonl
  echo '{"step": 60, "early_stop": true, "reason": "patience", "patience": 2}'
  echo '{"averaged": 2, "first_step": 40, "last_step": 60, "dev_loss": 4.2, "dev_bleu": 3.5}'
  echo '{"step": 60, "time": {"wall_s": 9.5, "train_s": 7.0, "eval_s": 2.0, "eval_frac": 0.21, "save_s": 0.1, "save_frac": 0.01}}'
} > side.jsonl
expect_png "profile, best, early-stop, averaged and time records passed over" side.png side "$py" "$plot" side.jsonl

# Malformed input: the file and line number, exit 1, no PNG.
sed '7s/.*/{"step": 30, "loss": 7.2/' tp2.jsonl > cut.jsonl
expect_error "truncated line" '^plot_metrics: cut\.jsonl:7: not a JSON line \(column 25: ' cut.jsonl
sed '3s/.*/[1, 2, 3]/' tp2.jsonl > array.jsonl
expect_error "not an object" '^plot_metrics: array\.jsonl:3: not a JSON object' array.jsonl
sed '5s/"loss": [0-9.]*/"loss": "low"/' tp2.jsonl > text.jsonl
expect_error "a loss that is not a number" '^plot_metrics: text\.jsonl:5: "loss" is not a number' text.jsonl
sed '4s/"step": [0-9]*, //' tp2.jsonl > nostep.jsonl
expect_error "a row without step" '^plot_metrics: nostep\.jsonl:4: no integer "step"' nostep.jsonl
sed '7s/"grad_norm": [0-9.]*, //' tp2.jsonl > partial.jsonl
expect_error "a training row without grad_norm" '^plot_metrics: partial\.jsonl:7: a training row without grad_norm' partial.jsonl
sed '6s/"dev_loss": [0-9.]*/"dev_loss": null/' tp2.jsonl > null.jsonl
expect_error "a dev loss that is null" '^plot_metrics: null\.jsonl:6: "dev_loss" is not a number' null.jsonl
sed '2s/"mem_peak_mib": \[/"mem_peak_mib": ["x", /' tp2.jsonl > mem.jsonl
expect_error "memory that is not numbers" '^plot_metrics: mem\.jsonl:2: "mem_peak_mib" is not a list' mem.jsonl
{ head -n 2 tp2.jsonl; echo '{"step": 7, "what": 1}'; } > unknown.jsonl
expect_error "a row of no known kind" '^plot_metrics: unknown\.jsonl:3: neither a training row' unknown.jsonl
printf '\xff\xfe\n' > binary.jsonl
expect_error "not UTF-8" '^plot_metrics: binary\.jsonl:1: not UTF-8' binary.jsonl
: > empty.jsonl
expect_error "an empty file" '^plot_metrics: empty\.jsonl: no training or evaluation rows' empty.jsonl
expect_error "a missing file" '^plot_metrics: absent\.jsonl: No such file' absent.jsonl
expect_error "--x time without elapsed_s" '^plot_metrics: cpu\.jsonl:1: no "elapsed_s"' --x time tp2.jsonl cpu.jsonl
# The overlay stops at the first bad file, naming it and its line.
expect_error "overlay with one bad file" '^plot_metrics: cut\.jsonl:7:' tp2.jsonl cut.jsonl

# Usage errors: exit 2.
rc=0; "$py" "$plot" --label a tp2.jsonl dp2.jsonl -o x.png > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q -- "--label given 1 times for 2 files" out.txt && ok "--label count checked (exit 2)" \
  || { bad "--label count: exit $rc"; cat out.txt; }
rc=0; "$py" "$plot" tp2.jsonl -o x.jpg > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "the output is a PNG file" out.txt && ok "a non-PNG output name refused (exit 2)" \
  || { bad "non-PNG output: exit $rc"; cat out.txt; }

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "plot_metrics: all checks passed"
