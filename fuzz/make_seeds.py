#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/seed-*):
small valid inputs in each format, made from the format descriptions
(src/common/safetensors.h, docs/checkpoints.md, src/data/corpus.h), so the
fuzzers start from files the readers accept. Regression inputs (regress-*)
sit beside them and are kept by hand. Usage: make_seeds.py [CORPUS_DIR]"""
import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")

sys.path.insert(0, os.path.join(here, "..", "test"))
from manifest_seal import crc32c  # noqa: E402  (CRC-32C, as the checkpoint writer computes it)


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None, with_crc=True):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    m = dict(meta or {})
    if with_crc:
        m["crc32c"] = "%08x" % crc32c(data)
    if m:
        header["__metadata__"] = m
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


f32 = lambda xs: struct.pack("<%df" % len(xs), *xs)
put("safetensors", "seed-two-tensors", safetensors(
    [("encoder.layers.0.ffn.fc1.weight", "F32", [2, 3], f32([0.5, -1, 2, 0, 1e-3, 3])),
     ("ids", "I32", [4], struct.pack("<4i", 1, 2, 3, -4))],
    {"split.encoder.layers.0.ffn.fc1.weight": "COL", "tp_rank": "0"}))
put("safetensors", "seed-dtypes", safetensors(
    [("a", "BF16", [2, 2], b"\x80\x3f" * 4), ("b", "F16", [3], b"\x00\x3c" * 3), ("c", "U8", [5], b"abcde"),
     ("d", "I64", [1, 1], struct.pack("<q", -7)), ("e", "F32", [], f32([1.0])), ("f", "F32", [0, 4], b"")],
    with_crc=False))
put("safetensors", "seed-empty", safetensors([], with_crc=False))

config = {"format": "tptrain-model", "format_version": 1, "d_model": 32, "n_heads": 4, "d_ff": 64,
          "enc_layers": 2, "dec_layers": 2, "vocab_size": 64, "max_len": 64, "dropout": 0,
          "label_smoothing": 0.10000000149011612, "activation": "relu", "ln_eps": 9.99999974737875e-06,
          "pad_id": 0, "bos_id": 2, "eos_id": 3, "unk_id": 1}
put("config", "seed-tiny.json", json.dumps(config, indent="\t"))


def sealed(obj):
    """A manifest of format version 2: the checksum line first, then the
    members, tab-indented; the 8 hex digits are the CRC-32C of every byte
    after that line (docs/checkpoints.md)."""
    rest = json.dumps(obj, indent="\t").encode()[2:]  # from the first member on
    return b'{\n\t"manifest_crc32c":\t"%08x",\n' % crc32c(rest) + rest


put("config", "seed-gelu.json", json.dumps(dict(config, activation="gelu", dropout=0.1, d_model=256,
                                                n_heads=8, d_ff=1024, vocab_size=8000, max_len=128)))

manifest = {
    "format": "tptrain-checkpoint", "format_version": 2, "step": 1, "config": config,
    "mesh": {"tp": 2, "dp": 2, "pp": 1},
    "optimizer": {"name": "adamw", "lr": 0.002, "warmup": 200, "beta1": 0.9, "beta2": 0.98, "eps": 1e-9,
                  "weight_decay": 0.01, "clip_norm": 1, "t": 1, "schedule": "linear warmup"},
    "data": {"kind": "corpus", "epoch": 0, "position": 3, "synth_index": 0},
    "rng": {"seed": 1, "scheme": "philox4x32-10"},
    "files": {name: {"bytes": 194192 if name.startswith("model") else 382968, "crc32c": "%08x" % (0x19ced88a + k)}
              for k, name in enumerate(["model-tp%d-pp0.safetensors" % t for t in range(2)] +
                                       ["optim-tp%d-pp0-dp%d.safetensors" % (t, d) for t in range(2) for d in range(2)] +
                                       ["spm.model"])}}
put("manifest", "seed-tp2dp2.json", sealed(manifest))
synthetic = dict(manifest, mesh={"tp": 1, "dp": 1, "pp": 1},
                 files={k: v for k, v in manifest["files"].items() if "tp0" in k and "dp1" not in k and k != "spm.model"},
                 data={"kind": "synthetic", "epoch": 0, "position": 0, "synth_index": 1})
put("manifest", "seed-synthetic.json", sealed(synthetic))
# A past finding, kept as a regression input: a synth_index of 7.8e78 was
# converted to an integer unchecked (undefined behaviour) before the strict
# manifest parsing; it must now be refused with the field named.
put("manifest", "regress-synth-index-huge.json", sealed(dict(
    synthetic, data=dict(synthetic["data"], synth_index=int("7" * 78 + "1")))))


def token_file(pairs):
    """pairs: list of (en ids, ja ids); corpus.c's layout, version 2: a
    40-byte header whose bytes 28..31 are the body's CRC-32C and 36..39 the
    header's (of bytes 0..35)."""
    en_off, ja_off, toks = [0], [], []
    for en, _ in pairs:
        toks += en
        en_off.append(len(toks))
    ja_off.append(len(toks))
    for _, ja in pairs:
        toks += ja
        ja_off.append(len(toks))
    body = struct.pack("<%dQ" % len(en_off), *en_off) + struct.pack("<%dQ" % len(ja_off), *ja_off)
    body += struct.pack("<%dI" % len(pairs), *range(1, len(pairs) + 1))
    body += struct.pack("<%di" % len(toks), *toks)
    hdr = b"TPTOK\0\0\1" + struct.pack("<IIQI", 2, len(pairs), len(toks), 0x1234abcd)
    hdr += struct.pack("<II", crc32c(body), 0)
    hdr += struct.pack("<I", crc32c(hdr))
    return hdr + body


put("token_file", "seed-three-pairs", token_file([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14]), ([4] * 5, [4])]))
put("token_file", "seed-empty", token_file([]))
