#!/usr/bin/env bash
# Subword sampling through train_mt (--spm-alpha), on the corpus with the
# cpu preset:
#  1. --spm-alpha 0 trains on the token files as they are: its losses are
#     those of a run without the flag, all digits; --spm-alpha 0.2 draws
#     other segmentations, so its losses differ.
#  2. A resume mid-epoch replays the samples: 3 steps + save + resume to 6
#     gives the losses of steps 4..6 of a straight 6-step run, all digits.
#  3. dev keeps the best segmentation: with no weight change (--lr 1e-30)
#     the dev loss is the same with and without sampling, all digits.
#  4. The checkpoint records the values: resuming with another --spm-alpha
#     (or none) is refused, naming both.
#  5. The cache's token files are the same bytes after every run.
# Usage: test_spm_alpha.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$1 corpus=$2
. "$(dirname "$0")/lib.sh"
corpus_workdir
HANG_LIMIT=120
common=(--preset cpu --data "$corpus" --log-interval 1 --eval-interval 1000)
train() { "$build/train_mt" "${common[@]}" "$@"; }
losses() { grep -oE "^step +[0-9]+/[0-9]+ \| loss [0-9.]+" "$1" | sed -E 's/^step +([0-9]+)\/[0-9]+ \| loss /\1 /'; }

run plain.log train --max-steps 6
cache=$(find cache -name train.tok -printf '%h\n' | head -n 1)
[ -n "$cache" ] || fail "no train.tok under cache/"
cp "$cache/train.tok" train.tok.before
cp "$cache/dev.tok" dev.tok.before

run zero.log train --max-steps 6 --spm-alpha 0
[ "$(losses zero.log)" = "$(losses plain.log)" ] || fail "--spm-alpha 0 changed the losses: $(losses zero.log) vs $(losses plain.log)"
[ "$(losses plain.log | wc -l)" = 6 ] || fail "plain.log: not 6 losses"
ok "--spm-alpha 0: the losses of the token files"

run straight.log train --max-steps 6 --spm-alpha 0.2 --save straight
grep -q "subword sampling (--spm-alpha 0.2" straight.log || fail "straight.log: no subword sampling line"
[ "$(losses straight.log)" != "$(losses plain.log)" ] || fail "--spm-alpha 0.2 gave the losses of the best segmentation"
ok "--spm-alpha 0.2: other losses"

run first.log train --max-steps 3 --spm-alpha 0.2 --save resumed
run second.log train --max-steps 6 --spm-alpha 0.2 --save resumed --resume auto
grep -q "resumed from .*: step 3" second.log || fail "second.log did not resume from step 3"
want=$(losses straight.log | tail -n 3) got=$(losses second.log)
[ "$got" = "$want" ] || fail "resumed losses '$got' differ from the straight run's '$want'"
ok "resume at step 3 replays the samples: losses 4..6 equal the straight run's"

dev_loss() { grep -oE "dev loss [0-9.]+" "$1"; }
run dev0.log train --max-steps 1 --lr 1e-30 --eval-interval 1
run dev2.log train --max-steps 1 --lr 1e-30 --eval-interval 1 --spm-alpha 0.2
[ -n "$(dev_loss dev0.log)" ] && [ "$(dev_loss dev0.log)" = "$(dev_loss dev2.log)" ] ||
  fail "dev loss with sampling '$(dev_loss dev2.log)' is not the one without '$(dev_loss dev0.log)'"
[ "$(losses dev0.log)" != "$(losses dev2.log)" ] || fail "the training loss of step 1 did not change with sampling"
ok "dev keeps the best segmentation"

refuse other-alpha "--spm-alpha 0.2 --spm-nbest -1, this run has --spm-alpha 0.1" \
  "$build/train_mt" "${common[@]}" --max-steps 8 --spm-alpha 0.1 --save straight --resume auto
refuse no-alpha "this run has --spm-alpha 0 " "$build/train_mt" "${common[@]}" --max-steps 8 --save straight --resume auto
ok "a resume with other sampling values is refused"

cmp -s train.tok.before "$cache/train.tok" && cmp -s dev.tok.before "$cache/dev.tok" ||
  fail "a run changed the cache's token files"
ok "token files unchanged"
