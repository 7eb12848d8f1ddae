#!/usr/bin/env bash
# Hardening: data that must survive and input that must not be trusted, one
# case per defect; each asserts the preserved data or the one-sentence
# refusal (naming the file or field).
#   1. deleting never follows a link: a step_N, step_N.tmp or .discard entry
#      that is a symlink to another folder loses only the link;
#   2. a resume past --max-steps is refused, and a save never replaces a
#      newer or equal checkpoint with other contents;
#   3. --metrics write errors (/dev/full) fail the run naming the file;
#   4. manifest.json is checksummed (bit flips refused, edited-and-resealed
#      fields parsed strictly: integers, ranges, trailing bytes, old format);
#   5. a resume with another tokenizer is refused;
#   6. a token cache with a damaged body is rebuilt, not reused;
#   7. huge dimensions (config.json, manifest) are refused by name, before a
#      model is built;
#   8. a shard whose data section is misaligned loads (aligned copy);
#   9. named pipes in place of manifest.json, a shard, `latest`, train.en
#      are refused at once (under `timeout`, so a regression fails, not hangs);
#  10. an oversized `latest` falls back to the newest complete checkpoint;
#      an export that runs out of space leaves nothing behind; --resume
#      refusals leak nothing (checked under the ASan build).
# Every log is also searched for sanitizer reports (UBSan's "runtime error",
# LeakSanitizer) so that the ASan build of this test checks those too.
# Usage: test_hardening.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$1 corpus=$2
. "$(dirname "$0")/lib.sh"
enter_workdir
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
train=$build/train_mt ckpt=$build/ckpt translate=$build/translate_mt
HANG_LIMIT=20   # seconds: a reader that waits on a named pipe fails the case instead of hanging the suite
t0=$SECONDS

elapsed() { echo "$((SECONDS - t0)) s"; }
# flip_bit FILE OFFSET BIT: flips one bit in place.
flip_bit() {
  /usr/bin/python3 - "$@" <<'PY'
import sys
path, at, bit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = bytearray(open(path, "rb").read())
b[at] ^= 1 << bit
open(path, "wb").write(bytes(b))
PY
}
# offset_of FILE TEXT: byte offset of the first TEXT in FILE.
offset_of() { grep -boF -- "$2" "$1" | head -n 1 | cut -d: -f1; }

synth=(--preset tiny --task copy --lr 5e-3 --warmup 5 --log-interval 1)

# ---- 1. deleting never follows a link ------------------------------------------------
mkdir -p victim1 victim2 victim3 links
for v in victim1 victim2 victim3; do echo keep > "$v/sentinel"; done
: > victim1/manifest.json   # looks complete: pruning (--keep-last 1) discards step_00000001
ln -s "$work/victim1" links/step_00000001
ln -s "$work/victim2" links/step_00000002.tmp   # a "leftover" of the save of step 2
ln -s "$work/victim3" links/step_00000007.discard   # a "leftover" discard
run links.log "$train" "${synth[@]}" --max-steps 4 --save links --save-interval 2 --keep-last 1
for v in victim1 victim2 victim3; do
  [[ -f $v/sentinel ]] || fail "$v/sentinel was deleted through a symbolic link"
done
[[ -f victim1/manifest.json ]] || fail "victim1/manifest.json was deleted through a symbolic link"
[[ ! -e links/step_00000001 && ! -L links/step_00000001 ]] || fail "the pruned link step_00000001 is still there"
[[ ! -L links/step_00000007.discard ]] || fail "the leftover link step_00000007.discard is still there"
[[ -d links/step_00000004 && ! -L links/step_00000004 && $(cat links/latest) == step_00000004 ]] ||
  fail "the run with links in its folder did not save step 4"
echo "case 1: step_N, step_N.tmp and step_N.discard links to other folders: only the links were removed," \
     "the sentinels survive ($(elapsed))"

# ---- 2. a resume past --max-steps; saves never replace newer or equal checkpoints ----------
run two.log "$train" "${synth[@]}" --max-steps 4 --save two --save-interval 2
sum4=$(cat two/step_00000004/*  | md5sum)
refuse past-max "two/step_00000004 is at step 4, past this run's last step 2 (--max-steps / --epochs)" \
    "$train" "${synth[@]}" --max-steps 2 --save two --resume auto
[[ $(cat two/latest) == step_00000004 && $(cat two/step_00000004/* | md5sum) == "$sum4" ]] ||
  fail "the refused resume changed the step-4 checkpoint or latest"
run at-max.log "$train" "${synth[@]}" --max-steps 4 --save two --resume auto
grep -qF "two/step_00000004 is already at step 4, this run's last step: nothing to train" at-max.log ||
  fail "a resume at --max-steps did not say that there is nothing to train"
# From step 2 with another learning rate into the folder that holds step 4:
# the save of step 3 would sit behind step 4, the save of step 4 would
# replace it with other weights; both are refused, step 4 stays.
refuse older-save "two already holds step 4, newer than the step 3 this run would save" \
    "$train" "${synth[@]}" --lr 1e-3 --max-steps 3 --save two --resume two/step_00000002
refuse other-save "two/step_00000004 already holds a checkpoint of step 4 with other contents" \
    "$train" "${synth[@]}" --lr 1e-3 --max-steps 4 --save two --resume two/step_00000002
[[ $(cat two/latest) == step_00000004 && $(cat two/step_00000004/* | md5sum) == "$sum4" ]] ||
  fail "a refused save changed the step-4 checkpoint or latest"
! ls -d two/*.tmp > /dev/null 2>&1 || fail "a refused save left its .tmp folder"
# The same continuation (same flags) saves step 4 again with the same contents: allowed.
run same-save.log "$train" "${synth[@]}" --max-steps 4 --save two --resume two/step_00000002
[[ $(cat two/step_00000004/* | md5sum) == "$sum4" ]] || fail "the bit-exact re-save of step 4 differs"
echo "case 2: resume past --max-steps refused, at --max-steps nothing to train; saves behind or over a" \
     "checkpoint with other contents refused; the same contents re-saved ($(elapsed))"

# ---- 3. --metrics write errors ---------------------------------------------------------
refuse metrics-full "train_mt: --metrics /dev/full: writing the file failed (No space left on device)" \
    "$train" "${synth[@]}" --max-steps 3 --metrics /dev/full
echo "case 3: --metrics /dev/full fails the run naming the file ($(elapsed))"

# ---- corpus runs (cases 4-6, 9): small slices of the corpus, a 1000-piece tokenizer ---------
slice() {  # slice DIR FIRST: 2000 training pairs from line FIRST, 100 dev and test pairs
  mkdir -p "$1"
  for l in en ja; do
    sed -n "$2,$(($2 + 1999))p" "$corpus/train.$l" > "$1/train.$l"
    sed -n "1,100p" "$corpus/dev.$l" > "$1/dev.$l"
    sed -n "1,100p" "$corpus/test.$l" > "$1/test.$l"
  done
}
slice corpA 1
slice corpB 20001
cflags=(--preset tiny --spm-vocab-size 1000 --batch-tokens 512 --lr 3e-3 --warmup 5 --log-interval 1 --eval-interval 1000)
run corpA.log "$train" "${cflags[@]}" --data corpA --cache-dir cacheA --max-steps 2 --save ckA
ck=ckA/step_00000002

# ---- 4. the manifest's checksum and strict parsing -----------------------------------------
run inspect-good.log "$ckpt" inspect "$ck"
seal check "$ck/manifest.json" || fail "the manifest's checksum line does not match its content"
n=0
for field in '"lr":' '"seed":' '"position":' '"max_len":' '"label_smoothing":' '"ln_eps":' '"spm.model":'; do
  n=$((n + 1))
  copy_of "flip$n" "$ck"
  at=$(offset_of "flip$n/manifest.json" "$field")
  [[ -n $at ]] || fail "the manifest has no $field"
  case $field in
    '"spm.model":') flip_bit "flip$n/manifest.json" $((at + 8)) 1 ;;   # the key: "spm.model" -> "spm.modgl"
    *) flip_bit "flip$n/manifest.json" $((at + ${#field} + 2)) 0 ;;   # a digit of the value
  esac
  refuse "flip$n" "flip$n/manifest.json: manifest_crc32c is " "$ckpt" inspect "flip$n"
  grep -qF "(damaged or edited)" "refuse-flip$n.log" || fail "flip $field: not called damaged"
done
refuse flip-export "flip7/manifest.json: manifest_crc32c is " "$ckpt" export flip7 flip7-out
[[ ! -e flip7-out ]] || fail "a refused export wrote flip7-out"
refuse flip-resume "flip1/manifest.json: manifest_crc32c is " \
    "$train" "${cflags[@]}" --data corpA --cache-dir cacheA --max-steps 3 --resume flip1
# Edited and resealed: each field is then parsed strictly.
edit() {  # edit NAME SED-EXPRESSION: a resealed copy of the checkpoint with one edit
  copy_of "$1" "$ck"
  sed -i "$2" "$1/manifest.json"
  cmp -s "$1/manifest.json" "$ck/manifest.json" && fail "$1: the edit '$2' changed nothing"
  seal reseal "$1/manifest.json"
}
edit frac 's/"step":\t2,/"step":\t2.5,/'
refuse frac "frac/manifest.json: field 'step' must be an integer in [0, 2147483646], got 2.5" "$ckpt" inspect frac
edit bigstep 's/"step":\t2,/"step":\t2147483647,/'
refuse bigstep "bigstep/manifest.json: field 'step' must be an integer in [0, 2147483646], got 2147483647" \
    "$ckpt" inspect bigstep
edit bigdp 's/"dp":\t1,/"dp":\t3e9,/'
refuse bigdp "bigdp/manifest.json: field 'mesh.dp' must be an integer in [1, 1048576], got 3000000000" \
    "$ckpt" inspect bigdp
edit badlr 's/"lr":\t[^,]*,/"lr":\t1e400,/'
refuse badlr "badlr/manifest.json: field 'optimizer.lr' must be a finite number in (0, inf), got inf" "$ckpt" inspect badlr
edit strseed 's/"seed":\t1,/"seed":\t"1",/'
refuse strseed "strseed/manifest.json: field 'rng.seed' must be an integer in [0, 2147483647], got something that is not a number" \
    "$ckpt" inspect strseed
edit kind 's/"kind":\t"corpus"/"kind":\t"corpos"/'
refuse kind "kind/manifest.json: field 'data.kind' must be \"corpus\" or \"synthetic\"" "$ckpt" inspect kind
edit spmkey 's/"spm.model":/"spm.modgl":/'
refuse spmkey "spmkey/manifest.json: field 'files' does not list 'spm.model'" "$ckpt" export spmkey spmkey-out
[[ ! -e spmkey-out ]] || fail "a refused export wrote spmkey-out"
copy_of trailing "$ck"
printf 'x' >> trailing/manifest.json
seal reseal trailing/manifest.json
refuse trailing "trailing/manifest.json: not valid JSON (or bytes follow the object)" "$ckpt" inspect trailing
# A manifest without the checksum line (format version 1, or hand-written).
copy_of v1 "$ck"
/usr/bin/python3 - v1/manifest.json <<'PY'
import sys
p = sys.argv[1]
b = open(p, "rb").read()
line = b.index(b"\n", 2) + 1
open(p, "wb").write(b"{\n" + b[line:].replace(b'"format_version":\t2', b'"format_version":\t1'))
PY
refuse v1 "v1/manifest.json: refused: it does not begin with its \"manifest_crc32c\" line" "$ckpt" inspect v1
echo "case 4: one-bit flips of lr, seed, position, max_len, label_smoothing, ln_eps and the spm.model key" \
     "refused by the manifest checksum (inspect, export, resume); resealed edits refused by name: fractional" \
     "and overflowing step, dp 3e9, lr 1e400, a string seed, an unknown data kind, a renamed file, trailing" \
     "bytes, no checksum line ($(elapsed))"

# ---- 5. another tokenizer -------------------------------------------------------------------
run corpB.log "$train" "${cflags[@]}" --data corpB --cache-dir cacheB --max-steps 1
cmp -s cacheA/spm-unigram-v1000-s2000000/spm.model cacheB/spm-unigram-v1000-s2000000/spm.model && fail "the two corpus slices trained the same tokenizer"
refuse other-spm "$ck was trained with another tokenizer: its spm.model" \
    "$train" "${cflags[@]}" --data corpB --cache-dir cacheB --max-steps 3 --resume "$ck"
grep -qF "is not cacheB/spm-unigram-v1000-s2000000/spm.model" refuse-other-spm.log || fail "other tokenizer: cacheB/spm-unigram-v1000-s2000000/spm.model not named"
run same-spm.log "$train" "${cflags[@]}" --data corpA --cache-dir cacheA --max-steps 3 --resume "$ck"
echo "case 5: resuming a corpus checkpoint with another corpus's tokenizer refused; with its own it resumes" \
     "($(elapsed))"

# ---- 6. a token cache with a damaged body ------------------------------------------------
size=$(stat -c %s cacheA/spm-unigram-v1000-s2000000/train.tok)
flip_bit cacheA/spm-unigram-v1000-s2000000/train.tok $((size - 4)) 0   # the last token id, header and key untouched
run rebuild.log "$train" "${cflags[@]}" --data corpA --cache-dir cacheA --max-steps 1
grep -qF "corpus: train: building cacheA/spm-unigram-v1000-s2000000/train.tok (the existing file is unusable: token file cacheA/spm-unigram-v1000-s2000000/train.tok has a damaged body" \
    rebuild.log || { cat rebuild.log; fail "the damaged train.tok was not rebuilt"; }
grep -qF "corpus: dev: reusing cacheA/spm-unigram-v1000-s2000000/dev.tok" rebuild.log || fail "dev.tok was not reused"
run reuse.log "$train" "${cflags[@]}" --data corpA --cache-dir cacheA --max-steps 1
grep -qF "corpus: train: reusing cacheA/spm-unigram-v1000-s2000000/train.tok" reuse.log || fail "the rebuilt train.tok was not reused"
echo "case 6: a train.tok with one token id changed (header and key intact) is rebuilt, then reused ($(elapsed))"

# ---- 7. huge dimensions ---------------------------------------------------------------------
run syn.log "$train" "${synth[@]}" --max-steps 2 --save syn --export synexp
run cexp.log "$ckpt" export "$ck" cexp
huge_export() {  # huge_export NAME SED-EXPRESSION: a copy of the corpus export with config.json edited
  copy_of "$1" cexp
  sed -i "$2" "$1/config.json"
}
huge_export huge1 's/"d_model":\t32,/"d_model":\t65536,/; s/"d_ff":\t64,/"d_ff":\t1048576,/; s/"enc_layers":\t2,/"enc_layers":\t255,/'
refuse huge1 "huge1/model.safetensors: tensor 'embed.weight' is F32 [1000, 32] but config.json needs F32 [1000, 65536]" \
    "$translate" --model huge1 --src corpA/dev.en
huge_export huge2 's/"vocab_size":\t1000,/"vocab_size":\t2147483647,/'
refuse huge2 "huge2/config.json: vocab_size must be at most 16777216, got 2147483647" "$translate" --model huge2 --src corpA/dev.en
huge_export huge3 's/"d_model":\t32,/"d_model":\t4000,/'
refuse huge3 "config.json needs F32 [1000, 4000]" "$translate" --model huge3 --src corpA/dev.en
copy_of hugeck syn/step_00000002
sed -i 's/"d_model":\t32,/"d_model":\t4000,/' hugeck/manifest.json
seal reseal hugeck/manifest.json
refuse hugeck "hugeck/manifest.json: file 'model-tp0-pp0.safetensors' is listed with $(stat -c %s syn/step_00000002/model-tp0-pp0.safetensors) bytes, but the manifest's config (d_model 4000," \
    "$ckpt" export hugeck hugeck-out
copy_of hugevocab syn/step_00000002
sed -i 's/"vocab_size":\t64,/"vocab_size":\t2147483647,/' hugevocab/manifest.json
seal reseal hugevocab/manifest.json
refuse hugevocab "hugevocab/manifest.json: config: vocab_size must be at most 16777216, got 2147483647" \
    "$ckpt" inspect hugevocab
echo "case 7: config.json with d_model 65536 / d_ff 2^20 / 255 layers, d_model 4000, vocab_size 2^31-1, and" \
     "manifests with d_model 4000 and vocab_size 2^31-1 refused by name before a model is built ($(elapsed))"

# ---- 8. a shard with a misaligned data section ----------------------------------------------
copy_of odd syn/step_00000002
/usr/bin/python3 - odd/model-tp0-pp0.safetensors <<'PY'
import struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
(n,) = struct.unpack("<Q", b[:8])
# one more space in the header: the data section moves to an odd offset
open(p, "wb").write(struct.pack("<Q", n + 1) + b[8 : 8 + n] + b" " + b[8 + n :])
PY
seal relist odd/manifest.json model-tp0-pp0.safetensors odd/model-tp0-pp0.safetensors
run odd-export.log "$ckpt" export odd odd-out
run even-export.log "$ckpt" export syn/step_00000002 even-out
cmp -s odd-out/model.safetensors even-out/model.safetensors || fail "the misaligned shard exported other weights"
echo "case 8: a shard whose data section sits at an odd offset loads (aligned copy) and exports the same" \
     "weights ($(elapsed))"

# ---- 9. named pipes ---------------------------------------------------------------------------
copy_of pipe-man syn/step_00000002
rm pipe-man/manifest.json && mkfifo pipe-man/manifest.json
refuse pipe-man "pipe-man/manifest.json: not a regular file (a named pipe)" "$ckpt" inspect pipe-man
refuse pipe-man-resume "pipe-man/manifest.json: not a regular file (a named pipe)" \
    "$train" "${synth[@]}" --max-steps 3 --resume pipe-man
copy_of pipe-shard syn/step_00000002
rm pipe-shard/model-tp0-pp0.safetensors && mkfifo pipe-shard/model-tp0-pp0.safetensors
refuse pipe-shard "pipe-shard/model-tp0-pp0.safetensors: not a regular file (a named pipe)" \
    "$train" "${synth[@]}" --max-steps 3 --resume pipe-shard
refuse pipe-shard-inspect "pipe-shard/model-tp0-pp0.safetensors: not a regular file (a named pipe)" \
    "$ckpt" inspect pipe-shard
mkdir pipe-latest
cp -r syn/step_00000002 pipe-latest/
mkfifo pipe-latest/latest
run pipe-latest.log timeout "$HANG_LIMIT" "$train" "${synth[@]}" --max-steps 3 --resume pipe-latest
grep -qF "checkpoint: pipe-latest/latest: not a regular file (a named pipe); looking for the newest complete checkpoint" \
    pipe-latest.log || fail "a named pipe as latest: no message"
grep -qF "resumed from pipe-latest/step_00000002:" pipe-latest.log || fail "a named pipe as latest: no fallback"
copy_of pipe-corpus corpA
rm pipe-corpus/train.en && mkfifo pipe-corpus/train.en
refuse pipe-corpus "pipe-corpus/train.en: not a regular file (a named pipe)" \
    "$train" "${cflags[@]}" --data pipe-corpus --cache-dir cache-pipe --max-steps 1
echo "case 9: named pipes as manifest.json, a shard, latest and train.en refused at once (latest: fallback)" \
     "($(elapsed))"

# ---- 10. oversized latest, exports out of space, leaks on refusals ----------------------------
mkdir long-latest
cp -r syn/step_00000002 long-latest/
head -c 5000 /dev/zero | tr '\0' 'a' > long-latest/latest
run long-latest.log "$train" "${synth[@]}" --max-steps 3 --resume long-latest
grep -qF "checkpoint: long-latest/latest: 5000 bytes, more than the 64 this file may hold; looking for the newest complete checkpoint" \
    long-latest.log || fail "a 5000-byte latest: no message"
grep -qF "resumed from long-latest/step_00000002:" long-latest.log || fail "a 5000-byte latest: no fallback"
printf 'step_00000002/../../victim1\n' > long-latest/latest
run odd-latest.log "$train" "${synth[@]}" --max-steps 3 --resume long-latest
grep -qF "long-latest/latest does not name a step directory" odd-latest.log || fail "a path in latest: no message"
# Out of space while exporting (a file-size limit: writes fail with EFBIG
# past 100 KiB; the tiny model's weights are about 190 KiB): nothing is left.
(
  trap '' XFSZ
  ulimit -f 100
  refuse export-full "train_mt: --export: " "$train" "${synth[@]}" --max-steps 1 --export full-exp
  refuse ckpt-export-full "ckpt: " "$ckpt" export syn/step_00000002 full-ckpt-exp
)
[[ ! -e full-exp && ! -e full-ckpt-exp ]] || fail "an export that ran out of space left $(ls -d full-* | tr '\n' ' ')"
mkdir kept-exp && echo old > kept-exp/notes.txt
(
  trap '' XFSZ
  ulimit -f 100
  refuse export-full-existing "train_mt: --export: " "$train" "${synth[@]}" --max-steps 1 --export kept-exp
)
[[ $(ls kept-exp) == notes.txt ]] || fail "an export into an existing folder that ran out of space left $(ls kept-exp)"
# --resume refusals end without leaks (LeakSanitizer reports, under the ASan
# build, fail `refuse`): another seed, another data kind, a missing folder.
refuse leak-seed "was saved with --seed 1, this run has --seed 2" \
    "$train" "${synth[@]}" --max-steps 3 --resume syn --seed 2
refuse leak-kind "was saved from a synthetic-task run, this run trains on a corpus" \
    "$train" "${cflags[@]}" --data corpA --cache-dir cacheA --max-steps 3 --resume syn
refuse leak-none "nowhere holds no complete checkpoint" "$train" "${synth[@]}" --max-steps 3 --resume nowhere
echo "case 10: a 5000-byte latest and a latest naming a path fall back to the newest complete checkpoint;" \
     "exports out of space leave no file behind (new and existing folder); --resume refusals exit cleanly" \
     "($(elapsed))"
echo "test_hardening: ok"
