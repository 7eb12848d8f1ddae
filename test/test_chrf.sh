#!/usr/bin/env bash
# chrF (src/data/chrf.c) against an independent Python implementation of
# sacreBLEU's default chrF2 (character 1..6-grams, whitespace removed as
# ''.join(line.split()) does, precision and recall averaged over the orders
# both sides have, beta 2, corpus level from summed counts), per sentence
# and per corpus, to 1e-6:
#   fixed     English and Japanese pairs with the edge cases: an empty
#             hypothesis, an empty reference, sentences shorter than 6
#             characters, identical text spaced differently, U+3000
#   corpus    sentences of the corpus (test.ja, test.en) against edited
#             copies of themselves (characters dropped, doubled, replaced,
#             words swapped), when CORPUS_DIR is given
#   random    random strings of kana, kanji, ASCII, emoji, every kind of
#             Unicode whitespace and bytes that are not UTF-8 (read by the
#             oracle with surrogateescape, one character per byte)
# Usage: test_chrf.sh TEST_CHRF [CORPUS_DIR]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
metric_test "$@" <<'PY'   # the hand-computed fixtures first, then the oracle
import os, random, subprocess, sys
from collections import Counter

tool, work, corpus = sys.argv[1:]
TOL = 1e-6

def ngram_stats(hyp, ref, order=6):
    """[(hyp n-grams, ref n-grams, clipped matches)] for n = 1..order."""
    h, r = "".join(hyp.split()), "".join(ref.split())
    out = []
    for n in range(1, order + 1):
        hc = Counter(h[i:i + n] for i in range(len(h) - n + 1))
        rc = Counter(r[i:i + n] for i in range(len(r) - n + 1))
        out.append((sum(hc.values()), sum(rc.values()), sum((hc & rc).values())))
    return out

def chrf(stats, beta=2.0):
    """(chrF in [0, 100], averaged precision, averaged recall)."""
    p = r = 0.0
    k = 0
    for nh, nr, m in stats:
        if nh > 0 and nr > 0:
            p += m / nh
            r += m / nr
            k += 1
    if k:
        p, r = p / k, r / k
    if p + r == 0:
        return 0.0, p, r
    b2 = beta * beta
    return 100 * (1 + b2) * p * r / (b2 * p + r), p, r

def check(name, hyps, refs):
    hp, rp = os.path.join(work, name + ".hyp"), os.path.join(work, name + ".ref")
    for path, lines in ((hp, hyps), (rp, refs)):
        with open(path, "wb") as f:
            f.write(b"".join(l.encode("utf-8", "surrogateescape") + b"\n" for l in lines))
    out = subprocess.run([tool, hp, rp], check=True, capture_output=True, text=True).stdout.splitlines()
    assert len(out) == len(hyps) + 1, f"{name}: {len(out)} output lines for {len(hyps)} pairs"
    # The oracle reads the bytes back itself: Python's UTF-8 decoder, not the generator's strings.
    def load(path):
        return [l.decode("utf-8", "surrogateescape") for l in open(path, "rb").read().split(b"\n")[:-1]]
    H, R = load(hp), load(rp)
    total = [[0, 0, 0] for _ in range(6)]
    worst = 0.0
    for i, (h, r) in enumerate(zip(H, R)):
        st = ngram_stats(h, r)
        for t, s in zip(total, st):
            for j in range(3):
                t[j] += s[j]
        want = chrf(st)
        got = [float(x) for x in out[i].split()]
        err = max(abs(a - b) for a, b in zip(got, want))
        worst = max(worst, err)
        assert err <= TOL, f"{name}: pair {i + 1} {h!r} / {r!r}: C {got}, oracle {want}"
    want = chrf(total)
    fields = out[-1].split()
    assert fields[0] == "corpus", out[-1]
    got = [float(x) for x in fields[1:]]
    err = max(abs(a - b) for a, b in zip(got, want))
    worst = max(worst, err)
    assert err <= TOL, f"{name}: corpus: C {got}, oracle {want}"
    print(f"ok   {name}: {len(H)} pairs, corpus chrF2 {got[0]:.4f} (P {got[1]:.4f}, R {got[2]:.4f}), "
          f"worst difference {worst:.1e}")

# Fixed pairs: (hypothesis, reference).
fixed = [
    ("彼 は 昨日 東京 に 行 っ た 。", "彼 は 昨日 東京 へ 行 っ た 。"),
    ("私 は 猫 が 好き で す 。", "私 は 犬 が 大好き で す 。"),
    ("この 本 は とても 面白 い 。", "この本はとても面白い。"),          # the same text, spaced differently
    ("", "彼女 は 医者 で す 。"),                                      # empty hypothesis
    ("はい 。", ""),                                                     # empty reference
    ("猫", "猫"),                                                         # one character
    ("猫 が", "猫 が い る"),                                             # shorter than 6 characters
    ("あいう", "あいうえお"),
    ("東京\u3000タワー", "東京 タワー"),                                 # ideographic space
    ("i can 't swim .", "i cannot swim ."),
    ("the cat sat on the mat .", "the cat is on the mat ."),
    ("hello", "help"),
    ("a", "b"),
    ("", ""),
    ("   ", "x"),
    ("ｘｙｚ ＡＢＣ １２３", "xyz ABC 123"),                                # full-width vs ASCII: different characters
    ("😀 です", "😀 でした"),                                             # a 4-byte character
    ("ｶﾀｶﾅ と カタカナ", "カタカナ と カタカナ"),
]
check("fixed", [h for h, _ in fixed], [r for _, r in fixed])
check("fixed_short", ["猫 が", "はい"], ["猫", "い"])   # a corpus of sentences below 6 characters

rng = random.Random(14)

def edit(s):
    chars = list(s)
    for _ in range(rng.randint(0, 4)):
        if not chars:
            break
        i = rng.randrange(len(chars))
        op = rng.random()
        if op < 0.35:
            del chars[i]
        elif op < 0.6:
            chars.insert(i, chars[i])
        else:
            chars[i] = rng.choice(chars)
    words = "".join(chars).split(" ")
    if len(words) > 2 and rng.random() < 0.5:
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)

if corpus:
    for side in ("ja", "en"):
        path = os.path.join(corpus, f"test.{side}")
        refs = [l.rstrip("\n") for l in open(path, encoding="utf-8")][:400]
        check(f"corpus_test_{side}", [edit(r) for r in refs], refs)

KANA = [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)]
KANJI = list("日本語東京大学生先私彼女猫犬本読書見行来食飲")
ASCII = list("abcdefgABC0123.,!?'-")
SPACE = [" ", "\t", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
         "\u2005", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
NOT_SPACE = ["\u200b", "\u180e", "\ufeff", "\u00ad"]   # zero-width and format characters: not whitespace
EMOJI = ["😀", "🍣", "𠮷"]
# Not UTF-8: overlong forms (C0 80, E0 80 AF, F0 80 80 AF), a lone continuation byte, a cut sequence,
# an encoded surrogate (ED A0 80), past U+10FFFF (F4 90 80 80), bytes never in UTF-8 (F5, FF).
BAD = ["\udcc0\udc80", "\udce0\udc80\udcaf", "\udcf0\udc80\udc80\udcaf", "\udc80", "\udce3\udc81",
       "\udced\udca0\udc80", "\udcf4\udc90\udc80\udc80", "\udcf5\udc80\udc80\udc80", "\udcff"]

def rand_text(pool, length):
    return "".join(rng.choice(pool) for _ in range(length))

def rand_pair():
    pool = rng.choice([KANA, KANA + KANJI, ASCII, KANA + ASCII + SPACE, KANA + KANJI + SPACE + NOT_SPACE + EMOJI])
    if rng.random() < 0.15:
        pool = pool + BAD
    small = rng.random() < 0.3
    ref = rand_text(pool, rng.randint(0, 7 if small else 40))
    hyp = edit(ref) if rng.random() < 0.6 else rand_text(pool, rng.randint(0, 7 if small else 40))
    return hyp, ref

pairs = [rand_pair() for _ in range(600)]
check("random", [h for h, _ in pairs], [r for _, r in pairs])
for k in range(5):   # small random corpora: the corpus sums over few sentences
    pairs = [rand_pair() for _ in range(rng.randint(1, 4))]
    check(f"random_corpus_{k}", [h for h, _ in pairs], [r for _, r in pairs])
PY
echo "test_chrf: all checks passed"
