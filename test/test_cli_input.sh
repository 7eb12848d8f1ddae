#!/usr/bin/env bash
# Bad numbers on the command line, in the launcher's environment and in a
# checkpoint's config are refused with one sentence naming the flag (or
# field) and the value, exit 2 for flags: never a wrapped, clamped or
# non-finite value that runs. Also --epochs: counted in 64 bits, bounded,
# and never combined with --max-steps (which it used to override silently).
# Usage: test_cli_input.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
. "$(dirname "$0")/lib.sh"
enter_workdir

# refused WANT_RC SENTENCE CMD...: CMD exits WANT_RC and its stderr has SENTENCE as a whole line.
refused() {
    local want_rc=$1 sentence=$2
    shift 2
    "$@" > out.txt 2> err.txt < /dev/null
    local rc=$?
    if [ $rc -eq "$want_rc" ] && grep -qxF -- "$sentence" err.txt; then
        ok "$sentence"
    else
        bad "'$*': rc $rc (want $want_rc), stderr: $(head -c 600 err.txt), want the line: $sentence"
    fi
}

tr=$build/translate_mt
tm=$build/train_mt
tprun=$build/tprun

# ---- flags match exactly: an unknown one is one sentence naming the nearest flag (common/flags.c) ----
refused 2 "train_mt: unknown flag --max-stpes; did you mean --max-steps?" "$tm" --task copy --max-stpes 3
refused 2 "train_mt: unknown flag --max-step; did you mean --max-steps?" "$tm" --task copy --max-step 3
refused 2 "train_mt: unknown flag --max-step; did you mean --max-steps?" "$tm" --task copy --max-step=3
refused 2 "train_mt: unknown flag --zzzzzzzzzz; see train_mt --help" "$tm" --zzzzzzzzzz
refused 2 "train_mt: --strict takes no value, got '--strict=1'" "$tm" --task copy --strict=1
refused 2 "train_mt: --save needs a value" "$tm" --task copy --save
refused 2 "translate_mt: unknown flag --mdel; did you mean --model?" "$tr" --mdel nowhere
refused 2 "translate_mt: unknown flag --bea; did you mean --beam?" "$tr" --model nowhere --bea 4
refused 2 "ckpt: unknown flag --hepl; did you mean --help?" "$build/ckpt" --hepl
refused 2 "ckpt: unknown command 'inspec'; did you mean inspect?" "$build/ckpt" inspec x
refused 2 "tprun: unknown flag --nnode; did you mean --nnodes?" "$tprun" --nnode 1 "$tm"
[ "$(wc -l < err.txt)" -eq 1 ] && ok "an unknown flag is one line, not the usage" || bad "unknown flag: $(cat err.txt)"
# a value that looks like a flag belongs to the flag before it
"$tm" --task copy --max-steps 1 --layers 1 --d-model 16 --heads 2 --ffn-hidden-size 16 --metrics --max-stpes \
    > out.txt 2> err.txt < /dev/null
rc=$?
[ $rc -eq 0 ] && [ -s ./--max-stpes ] && ok "a flag's value is not checked as a flag" || bad "value as flag: rc $rc: $(cat err.txt)"

# ---- run_main.sh: only the default folder is downloaded into; a path given must hold the corpus ----
bash "$here/../scripts/run_main.sh" "$work/a/mistyped/path" > out.txt 2> err.txt < /dev/null
rc=$?
if [ $rc -eq 2 ] && grep -qF "run_main: $work/a/mistyped/path does not hold the corpus" err.txt && [ ! -e "$work/a" ]; then
    ok "run_main.sh with a mistyped corpus path: $(cat err.txt)"
else
    bad "run_main.sh with a mistyped path: rc $rc, $work/a $([ -e "$work/a" ] && echo exists || echo absent): $(head -c 400 err.txt)"
fi

# ---- translate_mt: flags are checked before the model is read ----
refused 2 "translate_mt: --beam expects an integer in [0, 1000], got '4294967297'" "$tr" --model nowhere --beam 4294967297
refused 2 "translate_mt: --beam expects an integer in [0, 1000], got ''" "$tr" --model nowhere --beam ''
refused 2 "translate_mt: --beam expects an integer in [0, 1000], got ' 4'" "$tr" --model nowhere --beam ' 4'
refused 2 "translate_mt: --beam expects an integer in [0, 1000], got '4k'" "$tr" --model nowhere --beam 4k
refused 2 "translate_mt: --batch-size expects an integer in [1, 1048576], got '4294967297'" \
    "$tr" --model nowhere --batch-size 4294967297
refused 2 "translate_mt: --batch-size expects an integer in [1, 1048576], got '0'" "$tr" --model nowhere --batch-size 0
refused 2 "translate_mt: --lenpen expects a number in [0, 10], got 'nan'" "$tr" --model nowhere --lenpen nan
refused 2 "translate_mt: --lenpen expects a number in [0, 10], got 'inf'" "$tr" --model nowhere --lenpen inf
refused 2 "translate_mt: --lenpen expects a number in [0, 10], got '1e400'" "$tr" --model nowhere --lenpen 1e400
refused 2 "translate_mt: --lenpen expects a number in [0, 10], got ''" "$tr" --model nowhere --lenpen=

# ---- train_mt ----
refused 2 "train_mt: --max-steps expects an integer in [1, 1073741824], got '4294967297'" \
    "$tm" --task copy --max-steps 4294967297
refused 2 "train_mt: --batch-size expects an integer in [1, 1048576], got ''" "$tm" --task copy --batch-size ''
# translate_mt's inputs, read before the model is loaded: each refusal one sentence, exit 1, nothing
# leaked (under the sanitizers a leak report would change the exit status)
mkdir -p a-folder && printf 'a\nb\n' > two.en && printf 'a\n' > one.ja
refused 1 "translate_mt: missing.en: No such file or directory" "$tr" --model nowhere --src missing.en
refused 1 "translate_mt: a-folder: read error (Is a directory)" "$tr" --model nowhere --src a-folder
refused 1 "translate_mt: missing.ja: No such file or directory" "$tr" --model nowhere --src two.en --ref missing.ja
refused 1 "translate_mt: two.en has 2 lines but one.ja has 1" "$tr" --model nowhere --src two.en --ref one.ja
# an empty path: refused, not taken as '/' or '.' (--cache-dir '' wrote its tokenizer into /)
refused 2 "train_mt: --cache-dir expects DIR, got ''" "$tm" --task copy --cache-dir ''
refused 2 "train_mt: --save expects DIR, got ''" "$tm" --task copy --save=
refused 2 "translate_mt: --model expects DIR, got ''" "$tr" --model ''
refused 2 "tprun: --log_dir expects DIR, got ''" "$(dirname "$tm")/tprun" --log_dir '' true
refused 2 "train_mt: --seed expects an integer in [0, 2147483647], got '18446744073709551617'" \
    "$tm" --task copy --seed 18446744073709551617
refused 2 "train_mt: --dropout expects a number in [0, 1), got 'nan'" "$tm" --task copy --dropout nan
refused 2 "train_mt: --attention-dropout expects a number in [0, 1), got '1'" "$tm" --task copy --attention-dropout 1
refused 2 "train_mt: --activation-dropout expects a number in [0, 1), got '-0.1'" "$tm" --task copy \
    --activation-dropout -0.1
# attention dropout drops the probabilities where they are held: flash holds none
refused 2 "train_mt: --attention-dropout 0.1 needs --attention exact: flash attention never holds the probabilities it would drop" \
    "$tm" --task copy --attention flash --attention-dropout 0.1
refused 2 "train_mt: --lr expects a number in (0, 10], got 'inf'" "$tm" --task copy --lr inf
refused 2 "train_mt: --lr expects a number in (0, 10], got ' 1e-3'" "$tm" --task copy --lr ' 1e-3'
refused 2 "train_mt: --adam-eps expects a number in (0, 1], got '0'" "$tm" --task copy --adam-eps 0
refused 2 "train_mt: --label-smoothing expects a number in [0, 1), got '1'" "$tm" --task copy --label-smoothing 1
refused 2 "train_mt: --comm-timeout expects a number in (0, 1e+06], got '-nan'" "$tm" --task copy --comm-timeout -nan

# ---- tprun ----
refused 2 "tprun: --nproc_per_node expects an integer in [1, 4096], got '4294967298'" \
    "$tprun" --nproc_per_node 4294967298 true
refused 2 "tprun: --grace expects a number in [0, 86400], got 'inf'" "$tprun" --grace inf true
refused 2 "tprun: --master_port expects an integer in [0, 65535], got '+80'" "$tprun" --master_port +80 true

# ---- the launcher's environment, read by every rank ----
refused 2 "train_mt: environment variable WORLD_SIZE expects an integer in [0, 1048576], got '4294967297'" \
    env WORLD_SIZE=4294967297 "$tm" --task copy --max-steps 1
refused 2 "train_mt: environment variable RANK expects an integer in [0, 1048576], got ''" \
    env RANK= "$tm" --task copy --max-steps 1

# ---- --epochs ----
refused 2 "train_mt: --epochs 2 and --max-steps 30 both set the length of the run; give one of them" \
    "$tm" --data nowhere --epochs 2 --max-steps 30
refused 2 "train_mt: --epochs 2 and --max-steps 30 both set the length of the run; give one of them" \
    "$tm" --data nowhere --max-steps 30 --epochs 2
refused 2 "train_mt: --epochs 1 counts passes over a corpus; a --task run takes --max-steps" \
    "$tm" --task copy --epochs 1
refused 2 "train_mt: --epochs expects an integer in [1, 1048576], got '4294967297'" "$tm" --data nowhere --epochs 4294967297

# A corpus of 8000 short pairs and a 12-token budget: about 2570 batches an
# epoch, so 2^20 epochs are more steps than an int holds (they used to wrap
# to a negative step count, save step_-1596981248 and exit 0).
mkdir -p corpus
for split in train:8000 dev:40 test:40; do
    n=${split#*:}
    s=${split%%:*}
    awk -v n="$n" 'BEGIN { srand(7); split("ab cd ef gh ij kl mn op qr st", w, " ");
        for (i = 0; i < n; i++) { k = 1 + int(rand() * 3); l = "";
            for (j = 0; j < k; j++) l = l (j ? " " : "") w[1 + int(rand() * 10)]; print l } }' > "corpus/$s.en"
    awk -v n="$n" 'BEGIN { srand(8); split("あい うえ おか きく けこ さし すせ そた ちつ てと", w, " ");
        for (i = 0; i < n; i++) { k = 1 + int(rand() * 3); l = "";
            for (j = 0; j < k; j++) l = l (j ? " " : "") w[1 + int(rand() * 10)]; print l } }' > "corpus/$s.ja"
done
# The tiny preset: the step counts below are the batcher's, whatever the model
# (the cpu preset that --preset auto picks here took 40 s for the same steps).
corpus_flags=(--data corpus --cache-dir cache --preset tiny --spm-vocab-size 64 --batch-tokens 12)
"$tm" "${corpus_flags[@]}" --epochs 1048576 --save ck > out.txt 2> err.txt
rc=$?
if [ $rc -eq 2 ] &&
    grep -Eqx "train_mt: --epochs 1048576 is [0-9]+ steps at [0-9]+ batches per epoch; a run takes 1 to 1073741824 steps" err.txt &&
    [ ! -e ck ]; then
    ok "$(cat err.txt)"
else
    bad "--epochs 1048576: rc $rc, checkpoints: $(ls ck 2>&1), stderr: $(cat err.txt)"
fi
# A small --epochs runs exactly epochs x batches-per-epoch steps.
"$tm" "${corpus_flags[@]}" --batch-tokens 4096 --epochs 2 --log-interval 1000 --eval-interval 1000000 \
    > out.txt 2> err.txt
rc=$?
per=$(sed -n 's/.* \([0-9]*\) batches per epoch.*/\1/p' out.txt err.txt | head -1)
steps=$(sed -n 's/^train_mt: \([0-9]*\) steps in .*/\1/p' out.txt)
if [ $rc -eq 0 ] && [ -n "$per" ] && [ "$steps" = $((2 * per)) ]; then
    ok "--epochs 2 ran $steps steps ($per batches per epoch)"
else
    bad "--epochs 2: rc $rc, $per per epoch, $steps steps: $(tail -n 5 out.txt err.txt)"
fi

# ---- a checkpoint whose config holds ln_eps 1e39 (inf as a float) ----
"$tm" --task copy --max-steps 1 --save synth > out.txt 2> err.txt || bad "synthetic save: $(cat err.txt)"
man=$(ls -d synth/step_*/manifest.json 2>/dev/null | head -1)
if [ -n "$man" ]; then
    "$build/ckpt" inspect synth > /dev/null 2>&1 || bad "ckpt inspect refuses the good checkpoint"
    # The field edited in place and the checksum line recomputed, so the
    # refusal comes from the field's check, not from the seal.
    /usr/bin/python3 - "$man" <<'EOF'
import re, sys
p = sys.argv[1]
text = open(p).read()
text, n = re.subn(r'("ln_eps":\s*)[^,\n}]+', r'\g<1>1e39', text)
assert n == 1, "ln_eps not found once in " + p
open(p, "w").write(text)
EOF
    /usr/bin/python3 "$here/manifest_seal.py" reseal "$man" || bad "cannot reseal $man"
    "$build/ckpt" inspect synth > out.txt 2> err.txt
    rc=$?
    if [ $rc -eq 1 ] && grep -q "config: field 'ln_eps' is 1e+39, beyond the range of a 32-bit float" err.txt; then
        ok "ckpt inspect: $(cat err.txt)"
    else
        bad "ckpt inspect with ln_eps 1e39: rc $rc: $(cat out.txt err.txt)"
    fi
    "$build/ckpt" export synth exported > out.txt 2> err.txt
    rc=$?
    [ $rc -eq 1 ] && [ ! -e exported/config.json ] && grep -q "ln_eps" err.txt &&
        ok "ckpt export refuses it too (no config.json with null written)" ||
        bad "ckpt export with ln_eps 1e39: rc $rc: $(cat err.txt; cat exported/config.json 2>/dev/null)"
else
    bad "no checkpoint saved: $(cat err.txt)"
fi

if [ $fails -ne 0 ]; then
    echo "test_cli_input: $fails failed"
    exit 1
fi
echo "test_cli_input: all passed"
