#!/usr/bin/env bash
# BLEU (src/data/bleu.c) against an independent Python implementation of
# sacreBLEU's corpus BLEU with tokenize="none" (the corpus is tokenized:
# tokens are what Python's str.split() returns), one reference, 4-grams,
# clipped counts summed over the corpus, brevity penalty exp(1 - r/c):
# every sentence's counts exactly, corpus BLEU with smooth_method="none"
# to 1e-9 (the figure train_mt and translate_mt print). sacreBLEU's default
# "exp" smoothing gives the same figure whenever every order has a match;
# the test shows where it does not (an order without a match: 0 here).
#   fixed     English and Japanese pairs: empty sides, one-word sentences,
#             U+3000 and other Unicode whitespace, bytes that are not UTF-8
#   corpus    test.en / test.ja against edited copies of themselves, when
#             CORPUS_DIR is given
#   random    random token strings over a small vocabulary with every kind
#             of whitespace between tokens
# Usage: test_bleu.sh TEST_BLEU [CORPUS_DIR]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
metric_test "$@" <<'PY'   # the hand-computed fixtures first, then the oracle
import math, os, random, subprocess, sys
from collections import Counter

tool, work, corpus = sys.argv[1:]
TOL = 1e-9

def stats(hyp, ref):
    """sacreBLEU's per-sentence statistics: clipped matches and hypothesis
    n-gram counts for n = 1..4, hypothesis and reference lengths."""
    h, r = hyp.split(), ref.split()
    match, total = [], []
    for n in range(1, 5):
        hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
        rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
        match.append(sum((hc & rc).values()))
        total.append(sum(hc.values()))
    return match + total + [len(h), len(r)]

def corpus_bleu(rows, smooth="none"):
    m = [sum(r[k] for r in rows) for k in range(4)]
    t = [sum(r[4 + k] for r in rows) for k in range(4)]
    c, r = sum(x[8] for x in rows), sum(x[9] for x in rows)
    if c == 0:
        return 0.0
    prec, smooth_mteval = [], 1.0
    for k in range(4):
        if t[k] == 0:
            prec.append(0.0)
        elif m[k] == 0 and smooth == "exp":
            smooth_mteval *= 2
            prec.append(100.0 / (smooth_mteval * t[k]))
        else:
            prec.append(100.0 * m[k] / t[k])
    if min(prec) <= 0:
        return 0.0
    bp = 1.0 if c >= r else math.exp(1 - r / c)
    return bp * math.exp(sum(math.log(p) for p in prec) / 4)

def run(name, pairs):
    hp, rp = os.path.join(work, name + ".hyp"), os.path.join(work, name + ".ref")
    with open(hp, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        f.writelines(h + "\n" for h, _ in pairs)
    with open(rp, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        f.writelines(r + "\n" for _, r in pairs)
    out = subprocess.run([tool, hp, rp], check=True, capture_output=True, text=True).stdout.splitlines()
    assert len(out) == len(pairs) + 1, f"{name}: {len(out)} lines for {len(pairs)} pairs"
    rows = []
    for i, (h, r) in enumerate(pairs):
        got = [int(v) for v in out[i].split()]
        want = stats(h, r)
        assert got == want, f"{name}: pair {i} {h!r} / {r!r}: counts {got}, sacreBLEU's {want}"
        rows.append(want)
    got_bleu = float(out[-1].split()[1])
    want_bleu = corpus_bleu(rows)
    assert abs(got_bleu - want_bleu) <= TOL * max(1.0, want_bleu), f"{name}: BLEU {got_bleu} != {want_bleu}"
    print(f"test_bleu.sh: {name}: {len(pairs)} pairs, counts equal, BLEU {got_bleu:.6f} "
          f"(sacreBLEU exp smoothing: {corpus_bleu(rows, 'exp'):.6f})")
    return got_bleu, rows

fixed = [
    ("the cat sat on the mat", "the cat sat on the mat"),
    ("", "a reference"),
    ("a hypothesis", ""),
    ("", ""),
    ("word", "word"),
    ("は の で す", "は の です"),
    ("は\u3000の\u00a0です\u2009。", "は の です 。"),
    ("\x0bthe\x0ccat\x1csat\x85on", "the cat sat on"),
    ("bad\udcffbyte ok", "bad\udcffbyte ok"),
]
run("fixed", fixed)

# An order without a match: BLEU 0 with no smoothing, as printed; sacreBLEU's
# default exp smoothing makes it positive. Shown, and the counts checked.
bleu0, rows0 = run("no 4-gram match", [("a b c d e", "a b c x d e")])
assert bleu0 == 0.0 and corpus_bleu(rows0, "exp") > 0.0

if corpus:
    rng = random.Random(7)
    for side in ("test.en", "test.ja"):
        path = os.path.join(corpus, side)
        if not os.path.exists(path):
            continue
        refs = open(path, encoding="utf-8", errors="surrogateescape").read().splitlines()
        pairs = []
        for ref in refs:
            words = ref.split()
            edit = list(words)
            for _ in range(rng.randrange(0, 4)):
                if not edit:
                    break
                i = rng.randrange(len(edit))
                op = rng.randrange(3)
                if op == 0:
                    del edit[i]
                elif op == 1:
                    edit.insert(i, edit[i])
                else:
                    j = rng.randrange(len(edit))
                    edit[i], edit[j] = edit[j], edit[i]
            pairs.append((" ".join(edit), ref))
        run("corpus " + side, pairs)

rng = random.Random(11)
vocab = ["a", "b", "ab", "の", "は", "です", "。", "\udcfe"]
spaces = [" ", "\t", "  ", "\u3000", "\u00a0", "\u2009", "\x0b", "\x0c", "\u2028"]
pairs = []
for _ in range(400):
    def sent():
        n = rng.randrange(0, 20)
        return "".join(rng.choice(vocab) + rng.choice(spaces) for _ in range(n)).rstrip("\n")
    pairs.append((sent(), sent()))
run("random", pairs)
PY
echo "test_bleu.sh: all checks passed"
