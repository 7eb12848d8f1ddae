#!/usr/bin/python3
"""The benchmark's PyTorch model (scripts/bench_torch_mt.py) against the
float64 reference (test/reference/model.py): same weights (a tptrain export),
same batch (the first of a `train_mt --dump-batches` file, some rows
shortened so that every mask matters), dropout off, both
in float64. The loss and every parameter's gradient must agree to
float64 rounding: the two are written differently (fused attention call or a
plain softmax, the decoder's self-attention causal-only, the loss inside the
model), so any difference in the function they compute shows at 1e-3 or
more, far above this bound.

Usage: check_bench_model.py EXPORT_DIR BATCHES
"""
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "reference"))
sys.path.insert(0, os.path.join(here, "..", "scripts"))
import bench_torch_mt as bench  # noqa: E402
from model import load_model  # noqa: E402
from safetensors_io import load as load_safetensors  # noqa: E402

# float64 on both sides; the two orders of summation differ, so results agree
# to ~1e-12 relative, not bit for bit. 1e-9 leaves room and still catches
# any formula difference by orders of magnitude.
RTOL = 1e-9


def with_padding(b, cfg):
    """The corpus batches are cut from length-sorted pairs, so most have no
    padding at all: shorten a few rows, so that every mask is exercised."""
    B, S = b["src"].shape
    T = b["tgt_in"].shape[1]
    if B < 3 or S < 2 or T < 3:
        raise SystemExit(f"check_bench_model: the first batch ({B} x {S}, {T}) is too small to pad")
    pad, eos = cfg["pad_id"], cfg["eos_id"]
    for r in range(0, B, 3):  # every third source row cut to half its length
        n = max(1, int(b["src_len"][r]) // 2)
        b["src"][r, n:], b["src_len"][r] = pad, n
    for r in range(1, B, 3):  # every third target row likewise (it ends with eos)
        n = max(2, int(b["tgt_len"][r]) // 2)
        b["tgt_in"][r, n:], b["tgt_out"][r, n - 1], b["tgt_out"][r, n:], b["tgt_len"][r] = pad, eos, pad, n
    return b


def main():
    export, batches_path = sys.argv[1], sys.argv[2]
    cfg, batches, _ = bench.load_batches(batches_path)
    b = with_padding({k: v.long().clone() for k, v in batches[0].items()}, cfg)
    print(f"batch of {b['src'].shape[0]} rows, S {b['src'].shape[1]}, T {b['tgt_in'].shape[1]}; "
          f"source lengths {b['src_len'].min().item()}..{b['src_len'].max().item()}, "
          f"target lengths {b['tgt_len'].min().item()}..{b['tgt_len'].max().item()}")

    ref = load_model(export, torch.float64)
    ref.eval()
    ref_loss = ref.loss(ref(b["src"], b["src_len"], b["tgt_in"], b["tgt_len"]), b["tgt_out"])
    ref_loss.backward()

    cfg = dict(cfg, dropout=0.0)
    mod = bench.Seq2Seq(cfg)
    tensors, _ = load_safetensors(os.path.join(export, "model.safetensors"))
    mod.load_state_dict(tensors, strict=True)
    mod = mod.double()
    mod.pe = bench.sinusoidal(cfg["max_len"], cfg["d_model"], torch.float64)  # not rounded through float32
    mod.eval()
    loss = mod(b["src"], b["src_len"], b["tgt_in"], b["tgt_out"])
    loss.backward()

    bad = 0
    err = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
    print(f"loss: bench {loss.item():.12f} reference {ref_loss.item():.12f} (relative {err:.1e})")
    bad += err > RTOL
    ref_params = dict(ref.named_parameters())
    scale = max(p.grad.abs().max().item() for p in ref_params.values())
    worst, n = 0.0, 0
    for name, p in mod.named_parameters():
        g_ref = ref_params[name].grad
        e = (p.grad - g_ref).abs().max().item() / scale
        n += 1
        if e > RTOL:
            print(f"gradient of {name}: off by {e:.2e} of the largest gradient")
            bad += 1
        worst = max(worst, e)
    if n != len(ref_params):
        print(f"the bench model has {n} parameters, the reference {len(ref_params)}")
        bad += 1
    print(f"{n} gradients: worst {worst:.1e} of the largest gradient (bound {RTOL:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
