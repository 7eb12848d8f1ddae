"""score_reference.py EXPORT_DIR SRC_FILE REF_FILE: log p(ref | src) per line
with the independent PyTorch model, the counterpart of
`translate_mt --model EXPORT_DIR --src SRC_FILE --ref REF_FILE --score`.

The export is loaded by model.load_model in float64, lines are encoded with
python3-sentencepiece from EXPORT_DIR/spm.model, and each pair is built as
docs/model-and-export.md describes a batch (what src/mt.c mt_score_ids does):
pieces are cut to max_len - 1, source = pieces + eos, target_in = bos +
pieces, target_out = pieces + eos. The score is the sum over target_out of
log softmax(logits) at the target id, eos included, without label smoothing.
Pairs are scored one at a time, so no padding enters the oracle at all.
Prints one score per line with the same format as translate_mt (%.6f).

Run by /usr/bin/python3 (python3-torch, python3-sentencepiece).
"""
import os
import sys

import sentencepiece as spm
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_model  # noqa: E402


def read_lines(path):
    """Lines as translate_mt reads them: split on '\\n', trailing '\\r'/'\\n' stripped."""
    with open(path, "rb") as f:
        data = f.read().decode("utf-8")
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r\n") for line in lines]


def score_pair(model, src_pieces, tgt_pieces):
    cfg = model.cfg
    cap = cfg["max_len"] - 1
    src_pieces, tgt_pieces = src_pieces[:cap], tgt_pieces[:cap]
    src = torch.tensor([src_pieces + [cfg["eos_id"]]])
    tgt_in = torch.tensor([[cfg["bos_id"]] + tgt_pieces])
    tgt_out = torch.tensor([tgt_pieces + [cfg["eos_id"]]])
    src_len = torch.tensor([src.shape[1]])
    tgt_len = torch.tensor([tgt_in.shape[1]])
    logits = model(src, src_len, tgt_in, tgt_len)                   # (1, T, V)
    logp = torch.log_softmax(logits, dim=-1)
    return float(logp.gather(-1, tgt_out[..., None]).sum())


def main():
    if len(sys.argv) != 4:
        print("usage: score_reference.py EXPORT_DIR SRC_FILE REF_FILE", file=sys.stderr)
        return 2
    export_dir, src_path, ref_path = sys.argv[1:]
    model = load_model(export_dir, torch.float64).eval()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(export_dir, "spm.model"))
    cfg = model.cfg
    if sp.get_piece_size() != cfg["vocab_size"]:
        print(f"score_reference.py: {export_dir}/spm.model has {sp.get_piece_size()} pieces, "
              f"config.json says vocab_size {cfg['vocab_size']}", file=sys.stderr)
        return 1
    specials = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if specials != (cfg["pad_id"], cfg["unk_id"], cfg["bos_id"], cfg["eos_id"]):
        print(f"score_reference.py: tokenizer pad/unk/bos/eos {specials} differ from config.json",
              file=sys.stderr)
        return 1
    srcs, refs = read_lines(src_path), read_lines(ref_path)
    if len(srcs) != len(refs):
        print(f"score_reference.py: {src_path} has {len(srcs)} lines but {ref_path} has {len(refs)}",
              file=sys.stderr)
        return 1
    with torch.no_grad():
        for s, r in zip(srcs, refs):
            print(f"{score_pair(model, sp.encode(s), sp.encode(r)):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
