"""spm_ids.py MODEL FILE...: encodes every line of each FILE with the Python
SentencePiece package and prints one line of space-separated ids per input
line (an empty line for an empty sentence). test_spm compares these ids with
the C API's, so both sides must load the same model file.

Run by /usr/bin/python3 (python3-sentencepiece). Lines are split on '\n'
only and a final '\r' is kept, exactly as given: the C side feeds the same
bytes.
"""
import sys

import sentencepiece as spm


def main() -> int:
    if len(sys.argv) < 3:
        print("usage: spm_ids.py MODEL FILE...", file=sys.stderr)
        return 2
    sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
    out = sys.stdout
    for path in sys.argv[2:]:
        with open(path, "rb") as f:
            data = f.read().decode("utf-8")
        lines = data.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for line in lines:
            out.write(" ".join(str(i) for i in sp.encode(line)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
