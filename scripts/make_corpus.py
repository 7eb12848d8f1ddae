#!/usr/bin/python3
"""make_corpus.py: a corpus of N training pairs made from any corpus folder,
for measuring the data pipeline at sizes no test corpus has.

    make_corpus.py SRC_DIR OUT_DIR N

The training pairs of SRC_DIR are repeated until there are N; copy c of a
pair has two of its words swapped on both sides (at a position chosen by c),
so the lines differ from copy to copy and a tokenizer or a cache cannot take
shortcuts over duplicates. dev and test are copied as they are.
"""
import os
import shutil
import sys


def vary(words, c):
    if c == 0 or len(words) < 2:
        return words
    i = (c * 7919) % (len(words) - 1)
    w = list(words)
    w[i], w[i + 1] = w[i + 1], w[i]
    return w


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: make_corpus.py SRC_DIR OUT_DIR N")
    src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(os.path.join(src, "train.en"), encoding="utf-8") as f:
        en = f.read().splitlines()
    with open(os.path.join(src, "train.ja"), encoding="utf-8") as f:
        ja = f.read().splitlines()
    if len(en) != len(ja) or not en:
        sys.exit(f"make_corpus: {src}: train.en and train.ja must have the same, non-zero number of lines")
    os.makedirs(out, exist_ok=True)
    for split in ("dev", "test"):
        for lang in ("en", "ja"):
            shutil.copyfile(os.path.join(src, f"{split}.{lang}"), os.path.join(out, f"{split}.{lang}"))
    en_split = [s.split(" ") for s in en]
    ja_split = [s.split(" ") for s in ja]
    with open(os.path.join(out, "train.en"), "w", encoding="utf-8") as fe, \
            open(os.path.join(out, "train.ja"), "w", encoding="utf-8") as fj:
        done = 0
        c = 0
        while done < n:
            take = min(len(en), n - done)
            fe.write("".join(" ".join(vary(en_split[i], c + i)) + "\n" for i in range(take)) if c else
                     "".join(en[i] + "\n" for i in range(take)))
            fj.write("".join(" ".join(vary(ja_split[i], c + i)) + "\n" for i in range(take)) if c else
                     "".join(ja[i] + "\n" for i in range(take)))
            done += take
            c += 1


if __name__ == "__main__":
    main()
