#!/usr/bin/env bash
# End to end on the corpus: train_mt prepares the data, trains a few steps
# and saves a model directory; translate_mt loads it, translates, scores and
# computes BLEU; bad invocations fail with a clear message.
# Usage: test_translate.sh BUILD_DIR CORPUS_DIR
set -euo pipefail
build=$1 corpus=$2
. "$(dirname "$0")/lib.sh"
enter_workdir
dev_pairs 40

"$build/train_mt" --data "$corpus" --cache-dir cache --preset tiny --max-steps 30 --warmup 10 --lr 3e-3 \
    --batch-tokens 512 --log-interval 10 --eval-interval 30 --metrics m.jsonl --save ckpt --export model > train.log
for f in config.json model.safetensors spm.model; do test -s "model/$f"; done
test -s ckpt/step_00000030/manifest.json
grep -q '"dev_bleu"' m.jsonl
grep -q "reusing" train.log && { echo "FAIL: first run claims to reuse a cache"; exit 1; }
# A second run reuses the prepared cache instead of rebuilding it.
"$build/train_mt" --data "$corpus" --cache-dir cache --preset tiny --max-steps 1 --batch-tokens 512 --eval-interval 0 \
    > again.log
grep -q "reusing cache/spm-unigram-v8000-s2000000/spm.model" again.log || { echo "FAIL: tokenizer not reused"; cat again.log; exit 1; }
grep -q "train: reusing" again.log || { echo "FAIL: token file not reused"; cat again.log; exit 1; }

"$build/translate_mt" --model model --src src.en --beam 0 > greedy.ja
"$build/translate_mt" --model model --src src.en --beam 1 > beam1.ja
"$build/translate_mt" --model model --beam 4 --ref ref.ja < src.en > beam4.ja 2> bleu.txt
test "$(wc -l < greedy.ja)" -eq 40
test "$(wc -l < beam4.ja)" -eq 40
cmp greedy.ja beam1.ja || { echo "FAIL: beam 1 differs from greedy"; exit 1; }
# The checkpoint folder (its latest) and one checkpoint directory translate like the export.
"$build/translate_mt" --model ckpt --src src.en --beam 0 > ckpt.ja
"$build/translate_mt" --model ckpt/step_00000030 --src src.en --beam 0 > ckpt_step.ja
cmp greedy.ja ckpt.ja || { echo "FAIL: the checkpoint translates differently from the export"; exit 1; }
cmp greedy.ja ckpt_step.ja || { echo "FAIL: the checkpoint directory translates differently"; exit 1; }
grep -Eq '^BLEU = [0-9]+\.[0-9]{2} ' bleu.txt || { echo "FAIL: no BLEU line"; cat bleu.txt; exit 1; }
grep -Eq '^chrF2 = [0-9]+\.[0-9]{2} \(character 1\.\.6-grams: P = [0-9.]+, R = [0-9.]+\)$' bleu.txt \
  || { echo "FAIL: no chrF line"; cat bleu.txt; exit 1; }
# The chrF printed is the corpus chrF of the outputs written (test_chrf.sh proves the metric itself).
/usr/bin/python3 - beam4.ja ref.ja bleu.txt <<'PY'
import re, sys
from collections import Counter
hyps = open(sys.argv[1], encoding="utf-8").read().split("\n")[:-1]
refs = open(sys.argv[2], encoding="utf-8").read().split("\n")[:-1]
tot = [[0, 0, 0] for _ in range(6)]
for h, r in zip(hyps, refs):
    h, r = "".join(h.split()), "".join(r.split())
    for n in range(1, 7):
        hc = Counter(h[i:i + n] for i in range(len(h) - n + 1))
        rc = Counter(r[i:i + n] for i in range(len(r) - n + 1))
        for j, v in enumerate((sum(hc.values()), sum(rc.values()), sum((hc & rc).values()))):
            tot[n - 1][j] += v
ords = [(m / a, m / b) for a, b, m in tot if a and b]
p, r = sum(x for x, _ in ords) / len(ords), sum(y for _, y in ords) / len(ords)
want = 0.0 if p + r == 0 else 100 * 5 * p * r / (4 * p + r)
got = float(re.search(r"^chrF2 = ([0-9.]+)", open(sys.argv[3]).read(), re.M).group(1))
assert abs(got - want) <= 0.005 + 1e-9, f"translate_mt printed chrF2 {got}, the outputs give {want:.4f}"
print(f"chrF2 {got} (outputs: {want:.4f})")
PY

"$build/translate_mt" --model model --src src.en --ref ref.ja --score > scores.txt
test "$(wc -l < scores.txt)" -eq 40
/usr/bin/python3 - scores.txt <<'PY'
import sys
s = [float(x) for x in open(sys.argv[1])]
assert all(v < 0 for v in s), "a log-probability is not negative"
assert len(set(s)) > 30, "scores do not depend on the sentence"
PY

# Plain text in, plain Japanese out: the model records its training text's
# form; mixed case, attached punctuation and curly quotes translate (and
# score) exactly as the corpus's form does; the output is joined back
# unless --tokenized; an older model without the record works as before.
grep -q '"lowercase":[[:space:]]*true' model/config.json || { echo "FAIL: no text record in config.json"; exit 1; }
cat > corpus_form.en <<'EOF2'
where is the station ?
i can 't tell who will arrive first .
he said to me , '' it 's nine o 'clock . ''
EOF2
cat > plain.en <<'EOF2'
Where is the station?
I can’t tell who will arrive first.
He said to me, "It's nine o'clock."
EOF2
head -n 3 ref.ja > ref3.ja
"$build/translate_mt" --model model --src corpus_form.en --beam 0 --tokenized > form.tok.ja
"$build/translate_mt" --model model --src plain.en --beam 0 --tokenized > plain.tok.ja
cmp form.tok.ja plain.tok.ja || { echo "FAIL: plain text translates differently from the corpus's form"; paste form.tok.ja plain.tok.ja; exit 1; }
"$build/translate_mt" --model model --src corpus_form.en --ref ref3.ja --score > form.score
"$build/translate_mt" --model model --src plain.en --ref ref3.ja --score > plain.score
cmp form.score plain.score || { echo "FAIL: plain text scores differently from the corpus's form"; exit 1; }
"$build/translate_mt" --model model --src plain.en --beam 0 > plain.ja
/usr/bin/python3 - plain.tok.ja plain.ja <<'PY'
import re, sys
tok = open(sys.argv[1], encoding="utf-8").read().split("\n")
out = open(sys.argv[2], encoding="utf-8").read().split("\n")
latin = r"[0-9A-Za-z\u00c0-\u024f\uff10-\uff19\uff21-\uff3a\uff41-\uff5a]"
for t, o in zip(tok, out):
    want = re.sub(r"(?<=" + latin + r") +(?=" + latin + r")", "\0", " ".join(t.split()))
    want = want.replace(" ", "").replace("\0", " ")
    assert o == want, f"detokenized {o!r}, want {want!r} from {t!r}"
assert any(" " in t for t in tok), "the tokenized output has no spaces to join"
print("detokenized output checked:", out[0])
PY
cp -r model old-model
/usr/bin/python3 - old-model/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["text"]
json.dump(c, open(sys.argv[1], "w"), indent="\t")
PY
"$build/translate_mt" --model old-model --src plain.en --beam 0 > old.ja 2> old.err
cmp old.ja plain.ja || { echo "FAIL: a model without the record translates differently"; exit 1; }
grep -q "does not record its training text's form.*assuming small_parallel_enja's" old.err ||
  { echo "FAIL: no note on the assumed form"; cat old.err; exit 1; }

# --device and --dtype: the CPU asked for by name is what auto chose here;
# bf16 GEMMs (emulated on the CPU) still translate every line; cuda where
# no GPU can be used, or a device that does not exist, is refused in one
# sentence (exit 2).
"$build/translate_mt" --model model --src src.en --beam 0 --device cpu --dtype bf16 > bf16.ja
test "$(wc -l < bf16.ja)" -eq 40
refused() {  # WHAT EXPECTED_PREFIX ARGS...: exit 2 and one line starting with the prefix
  local what=$1 want=$2
  shift 2
  one_line_refusal "$what" "$want" "$build/translate_mt" "$@"
}
refused "--device tpu" "translate_mt: --device must be auto, cpu or cuda" --model model --src src.en --device tpu
refused "--dtype fp16" "translate_mt: --dtype must be fp32 or bf16" --model model --src src.en --dtype fp16
if ! nvidia-smi -L > /dev/null 2>&1; then
  "$build/translate_mt" --model model --src src.en --beam 0 --device cpu > cpu.ja
  cmp greedy.ja cpu.ja || { echo "FAIL: --device cpu differs from auto on a machine without a GPU"; exit 1; }
  refused "--device cuda without a GPU" "translate_mt: --device cuda: " --model model --src src.en --device cuda
fi

# Bad input: clear messages, non-zero exit.
if "$build/translate_mt" --model nowhere --src src.en 2> err.txt; then echo "FAIL: missing model accepted"; exit 1; fi
grep -q "nowhere/config.json" err.txt || { echo "FAIL: message does not name the file"; cat err.txt; exit 1; }
head -n 39 ref.ja > short.ja
if "$build/translate_mt" --model model --src src.en --ref short.ja > /dev/null 2> err.txt; then
  echo "FAIL: line count mismatch accepted"; exit 1
fi
grep -q "src.en has 40 lines but short.ja has 39" err.txt || { cat err.txt; exit 1; }
if "$build/train_mt" --data "$work/no_corpus" --cache-dir cache2 --max-steps 1 > /dev/null 2> err.txt; then
  echo "FAIL: missing corpus accepted"; exit 1
fi
grep -q "no_corpus" err.txt || { cat err.txt; exit 1; }
echo "test_translate: ok"
