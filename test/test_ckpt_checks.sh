#!/usr/bin/env bash
# What a load relies on, checked by every reader of a checkpoint:
#   1. train_mt --resume checks the checkpoint's own spm.model (deleted,
#      truncated, a named pipe): refused naming the file, as ckpt inspect
#      and ckpt export refuse it;  a folder holding both checkpoints and an
#      export is refused by translate_mt and by ckpt inspect, export and
#      average alike;
#   2. ckpt inspect runs every check a load runs: a duplicate tensor name in
#      a shard header, an optimizer tensor renamed or reshaped (with the
#      manifest resealed over the edited file) are refused naming the file;
#   3. ckpt export of a checkpoint whose optimizer shard is missing,
#      truncated or stale (another step's) warns naming the file (exit 0,
#      the model exported); --strict makes it an error (exit 1).
# Usage: test_ckpt_checks.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$1 corpus=$2
. "$(dirname "$0")/lib.sh"
enter_workdir
train=$build/train_mt ckpt=$build/ckpt
HANG_LIMIT=20
# edit_header FILE OLD NEW: replaces text in a safetensors header (length field rewritten).
edit_header() {
  /usr/bin/python3 - "$@" <<'PY'
import struct, sys
p, old, new = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
b = open(p, "rb").read()
(n,) = struct.unpack("<Q", b[:8])
h = b[8:8 + n]
assert old in h, (old, h[:200])
h = h.replace(old, new, 1)
open(p, "wb").write(struct.pack("<Q", len(h)) + h + b[8 + n:])
PY
}
# first_tensor FILE PREFIX: the first non-square matrix in FILE's header that starts with PREFIX.
first_tensor() {
  /usr/bin/python3 - "$@" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", b[:8])
h = json.loads(b[8:8 + n])
print(sorted(k for k in h if k.startswith(sys.argv[2]) and k != "__metadata__" and len(h[k]["shape"]) == 2 and h[k]["shape"][0] != h[k]["shape"][1])[0])
PY
}

synth=(--preset tiny --task copy --lr 5e-3 --warmup 5 --log-interval 1)

# ---- 1. the resume checks the checkpoint's own spm.model ------------------------------
mkdir corp
for l in en ja; do
  head -n 2000 "$corpus/train.$l" > "corp/train.$l"
  head -n 50 "$corpus/dev.$l" > "corp/dev.$l"
  head -n 50 "$corpus/test.$l" > "corp/test.$l"
done
cflags=(--preset tiny --spm-vocab-size 1000 --batch-tokens 512 --lr 3e-3 --warmup 5 --log-interval 1
        --eval-interval 1000 --data corp --cache-dir cache)
run corp.log "$train" "${cflags[@]}" --max-steps 2 --save ckc
ck=ckc/step_00000002
copy_of spm-gone "$ck"; rm spm-gone/spm.model
refuse spm-gone "spm-gone/spm.model: " "$train" "${cflags[@]}" --max-steps 3 --resume spm-gone
copy_of spm-cut "$ck"; truncate -s 100 spm-cut/spm.model
refuse spm-cut "spm-cut/spm.model: 100 bytes, the manifest says" \
    "$train" "${cflags[@]}" --max-steps 3 --resume spm-cut
copy_of spm-pipe "$ck"; rm spm-pipe/spm.model; mkfifo spm-pipe/spm.model
refuse spm-pipe "spm-pipe/spm.model: not a regular file (a named pipe)" \
    "$train" "${cflags[@]}" --max-steps 3 --resume spm-pipe
refuse spm-pipe-inspect "spm-pipe/spm.model: not a regular file (a named pipe)" "$ckpt" inspect spm-pipe
run corp-resume.log "$train" "${cflags[@]}" --max-steps 3 --resume "$ck"   # the intact one still resumes
echo "case 1: --resume refuses a deleted, truncated or named-pipe spm.model in the checkpoint"

# ---- 2. inspect runs every check a load runs --------------------------------------------
run syn.log "$train" "${synth[@]}" --dp 1 --max-steps 2 --save syn --save-interval 1
ck=syn/step_00000002
run inspect-good.log "$ckpt" inspect "$ck"
grep -q "verify     ok" inspect-good.log || fail "inspect of an intact checkpoint"
model=model-tp0-pp0.safetensors optim=optim-tp0-pp0-dp0.safetensors
a=$(first_tensor "$ck/$model" "encoder")
b=$(first_tensor "$ck/$model" "decoder")
copy_of dup "$ck"
edit_header "dup/$model" "\"$b\"" "\"$a\""   # two entries named $a
seal relist dup/manifest.json "$model" "dup/$model"
refuse dup-inspect "dup/$model: tensor name '$a' appears twice in the header" "$ckpt" inspect dup
refuse dup-resume "dup/$model: tensor name '$a' appears twice in the header" \
    "$train" "${synth[@]}" --max-steps 3 --resume dup
o=$(first_tensor "$ck/$optim" "exp_avg_sq.")
copy_of renamed "$ck"
edit_header "renamed/$optim" "\"$o\"" "\"${o}_x\""
seal relist renamed/manifest.json "$optim" "renamed/$optim"
refuse renamed-inspect "renamed/$optim: tensor '$o' is missing" "$ckpt" inspect renamed
refuse renamed-resume "renamed/$optim: tensor '$o' is missing" "$train" "${synth[@]}" --max-steps 3 --resume renamed
shape=$(/usr/bin/python3 -c "
import json,struct,sys
b=open('$ck/$optim','rb').read(); (n,)=struct.unpack('<Q',b[:8]); s=json.loads(b[8:8+n])['$o']['shape']
print('%d,%d %d,%d' % (s[0], s[1], s[1], s[0]))")
copy_of reshaped "$ck"
edit_header "reshaped/$optim" "\"$o\":{\"dtype\":\"F32\",\"shape\":[${shape% *}]" \
    "\"$o\":{\"dtype\":\"F32\",\"shape\":[${shape#* }]"
seal relist reshaped/manifest.json "$optim" "reshaped/$optim"
refuse reshaped-inspect "reshaped/$optim: tensor '$o' is not an F32 shard of shape" "$ckpt" inspect reshaped
refuse reshaped-resume "reshaped/$optim: tensor '$o' is not an F32 shard of shape" \
    "$train" "${synth[@]}" --max-steps 3 --resume reshaped
# the manifest records the synthetic task: a reverse run does not resume a copy checkpoint, nor do the
# two average
run rev.log "$train" "${synth[@]}" --task reverse --max-steps 2 --save rev
refuse task-resume "$ck was saved from a run of the copy task, this run has --task reverse" \
    "$train" "${synth[@]}" --task reverse --max-steps 3 --resume "$ck"
refuse task-average "cannot average rev/step_00000002 (the reverse task) with $ck (the copy task)" \
    "$ckpt" average mixed "$ck" rev/step_00000002
[ ! -e mixed ] || fail "a refused average left mixed/"
# a key twice in the manifest (resealed): cJSON would read the first, Python's json the last; refused
copy_of dupkey "$ck"
/usr/bin/python3 - dupkey/manifest.json <<'PY'
import re, sys
p = sys.argv[1]
t = open(p).read()
t2 = re.sub(r'("step":\s*)(\d+),', lambda m: m.group(0) + '\n\t"step":\t99,', t, count=1)
assert t2 != t, "no step field in the manifest"
open(p, "w").write(t2)
PY
seal reseal dupkey/manifest.json
refuse dupkey-inspect "dupkey/manifest.json: key 'step' appears twice; refusing to guess which value is meant" \
    "$ckpt" inspect dupkey
refuse dupkey-resume "dupkey/manifest.json: key 'step' appears twice" "$train" "${synth[@]}" --max-steps 3 --resume dupkey
# and in an export's config.json
run exp.log "$ckpt" export "$ck" exp
/usr/bin/python3 -c '
import sys
p = sys.argv[1]
t = open(p).read()
i = t.index("\"d_model\"")
open(p, "w").write(t[:i] + "\"d_model\": 999, " + t[i:])' exp/config.json
[ "$(grep -o '"d_model"' exp/config.json | wc -l)" = 2 ] || fail "the config.json edit did not make a duplicate"
refuse dupkey-config "key 'd_model' appears twice; refusing to guess which value is meant" \
    "$build/translate_mt" --model exp --src /dev/null
# an export and checkpoints never share a folder, so no loader can take a stale export for the model
refuse export-is-save "--export and --save name the same folder (same)" \
    "$train" "${synth[@]}" --max-steps 2 --save same --export same/
[ ! -e same ] || fail "the refused run made same/"
refuse export-into-ckpts "syn holds checkpoints (the newest syn/step_00000002)" "$ckpt" export syn syn
refuse save-into-export "exp holds an exported model (config.json)" "$train" "${synth[@]}" --max-steps 2 --save exp
cp -r syn both && cp exp/config.json exp/model.safetensors both/
refuse both-kinds "both holds both an exported model (config.json) and checkpoints" \
    "$build/translate_mt" --model both --src /dev/null
# every loader of the model agrees: the checkpoint tool too (it would take the newest checkpoint)
refuse both-inspect "both holds both an exported model (config.json) and checkpoints" "$ckpt" inspect both
refuse both-export "both holds both an exported model (config.json) and checkpoints" "$ckpt" export both out-both
[ ! -e out-both ] || fail "a refused export wrote out-both"
refuse both-average "both holds both an exported model (config.json) and checkpoints" "$ckpt" average avg both syn
echo "case 2: inspect refuses a duplicate tensor name, a renamed and a reshaped optimizer tensor (resealed)," \
     "as the resume does"

# ---- 3. export warns about a damaged optimizer shard; --strict refuses ------------------
export_warns() {  # export_warns NAME EXPECTED
  local name=$1 want=$2
  run "export-$name.log" "$ckpt" export "$name" "out-$name"
  grep -qF "ckpt: warning: $want" "export-$name.log" || { cat "export-$name.log"; fail "$name: no warning '$want'"; }
  cmp -s "out-$name/model.safetensors" out-good/model.safetensors || fail "$name: other weights exported"
  refuse "strict-$name" "ckpt: error (--strict): $want" "$ckpt" export --strict "$name" "strict-out-$name"
  # refused before anything is written: no export a script checking only for the folder would use
  [ ! -e "strict-out-$name" ] || fail "$name: --strict refused but left $(ls "strict-out-$name" | tr '\n' ' ')in strict-out-$name"
}
run export-good.log "$ckpt" export "$ck" out-good
! grep -q warning export-good.log || fail "an intact checkpoint's export warned"
run export-good-strict.log "$ckpt" export --strict "$ck" out-good-strict
copy_of opt-gone "$ck"; rm "opt-gone/$optim"
export_warns opt-gone "opt-gone/$optim: missing (listed in the manifest)"
copy_of opt-cut "$ck"; truncate -s 300000 "opt-cut/$optim"
export_warns opt-cut "opt-cut/$optim: "
copy_of opt-stale "$ck"; cp "syn/step_00000001/$optim" "opt-stale/$optim"
export_warns opt-stale "opt-stale/$optim: CRC-32C"
echo "case 3: export of a missing, truncated or stale optimizer shard warns naming it; --strict refuses and writes nothing"
echo "test_ckpt_checks: ok"
