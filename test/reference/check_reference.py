#!/usr/bin/python3
"""Compare one training step of the C trainer against the PyTorch reference.

Usage: check_reference.py CASE_DIR

CASE_DIR holds `model/` (an export of the initial weights: config.json and
model.safetensors) and `case.safetensors`: the batch (I32 src, src_len,
tgt_in, tgt_out, tgt_len) and what the C trainer computed from it in float32
with dropout off (logits, loss, grad_norm, grad.<param>, adamw.<param>), with
the optimizer hyper-parameters as decimal strings in its metadata.

The reference (model.py) runs in float64 as the oracle: the error of the
float64 result is ~1e-16 relative, so everything measured here is the error of
the C side. Logits, loss, gradients and gradient norm are compared with a
relative tolerance; the AdamW step is compared as the update (new - old) in
units of lr, with a per-element bound that accounts for the conditioning of
the first Adam step (see adamw_tolerance). Every parameter must have both a
grad.* and an adamw.* entry, so the check cannot pass vacuously.

Exit status: 0 when every comparison passes, 1 otherwise.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_model                      # noqa: E402
from safetensors_io import load as load_safetensors   # noqa: E402

# --- Tolerances ---------------------------------------------------------------
# The C side computes in float32 (unit roundoff u = 2^-24 ~ 6e-8). One step runs
# through ~20 sequential layers (embeddings, 2 x layers x {LN, attention, FFN},
# softmax, loss) each made of reductions over at most a few hundred terms. With
# pairwise/blocked or plain sequential summation the accumulated error stays
# near sqrt(n) u to n u per reduction, and it compounds additively through the
# layers: ~20 * (10..300) * 6e-8 ~ 1e-5..4e-4 in the worst case, which random
# rounding rarely approaches (a float32 PyTorch run of the same step is off by
# ~2e-7 on the logits and up to ~5e-6 on the gradients). RTOL = 1e-4 of the
# tensor's largest reference magnitude leaves room for that while still
# catching any real formula error (a wrong scale, a missed mask, a missing
# term), which moves results by percent, not by 1e-4.
RTOL = 1e-4
# Logits and the loss are O(1); this floor only avoids dividing by zero.
ABS_FLOOR = 1e-6
# Gradient errors scale with the size of the back-propagated signals, not with
# each tensor's own result. Some gradients are tiny (dead ReLU units, rows of
# rare tokens) and carry mostly rounding noise. A tensor's error is therefore measured
# against max(its own max |grad|, GRAD_FLOOR_FRAC x the largest |grad| of the
# whole model). A formula error still shows: it moves a tensor's gradients by
# a fair fraction of themselves, far above 1e-4 x 1e-2 of the model's largest.
GRAD_FLOOR_FRAC = 1e-2
# grad_norm reduces over every parameter element, more terms than assumed
# above; it is held to the same RTOL, which a float32 sum of squares meets at
# test sizes (1e5 elements: ~sqrt(n) u ~ 2e-5) and a double accumulator
# meets at any size.
# AdamW updates are compared in units of lr. The float32 arithmetic of the step
# itself (sqrt, division, bias correction) is a few u of lr: 1e-4 lr is ample.
ADAM_RTOL = 1e-4
# Storing the updated weight in float32 rounds it (and the decay product) to
# within one ulp of |w|, which is independent of lr: allow 2 ulps of |w|.
WEIGHT_ULP = 2.0 ** -22
# AdamW elements whose gradient-error allowance (see adamw_tolerance) exceeds
# this many lr are counted as ill-conditioned: their |g| is not resolved
# against adam_eps, so the sign of their update is not determined.
ILL_CONDITIONED = 1e-2

HPARAM_KEYS = ("lr", "beta1", "beta2", "adam_eps", "weight_decay", "clip_norm")
BATCH_KEYS = ("src", "src_len", "tgt_in", "tgt_out", "tgt_len")


def max_abs(t):
    return t.abs().max().item() if t.numel() else 0.0


def check_batch(cfg, src, src_len, tgt_in, tgt_out, tgt_len):
    """The batch layout of the doc; returns a list of problems (empty if fine)."""
    problems = []
    B, S = src.shape
    T = tgt_in.shape[1]
    pad, V = cfg["pad_id"], cfg["vocab_size"]
    if tgt_in.shape != (B, T) or tgt_out.shape != (B, T) or src_len.shape != (B,) \
            or tgt_len.shape != (B,):
        return [f"inconsistent batch shapes src {tuple(src.shape)} tgt_in "
                f"{tuple(tgt_in.shape)} tgt_out {tuple(tgt_out.shape)} src_len "
                f"{tuple(src_len.shape)} tgt_len {tuple(tgt_len.shape)}"]
    for name, tok in (("src", src), ("tgt_in", tgt_in), ("tgt_out", tgt_out)):
        if tok.numel() and (tok.min() < 0 or tok.max() >= V):
            problems.append(f"{name} holds ids outside [0, {V})")
    for name, lens, n in (("src_len", src_len, S), ("tgt_len", tgt_len, T)):
        if (lens < 1).any() or (lens > n).any():
            problems.append(f"{name} outside [1, {n}]: {lens.tolist()}")
    if problems:
        return problems
    for name, tok, lens in (("src", src, src_len), ("tgt_in", tgt_in, tgt_len),
                            ("tgt_out", tgt_out, tgt_len)):
        pad_pos = torch.arange(tok.shape[1])[None, :] >= lens[:, None]
        if (tok[pad_pos] != pad).any():
            problems.append(f"{name} has non-pad ids past its length")
        if (tok[~pad_pos] == pad).any():
            problems.append(f"{name} has pad ids within its length")
    return problems


def masking_invariance(model, src, src_len, tgt_in, tgt_len, tgt_out):
    """Independent of the C code: replacing the padding tokens of src and
    tgt_in by another id must not change the logits of real target positions
    nor the loss (it exercises the key masks). Returns (message, ok)."""
    V, pad = model.cfg["vocab_size"], model.cfg["pad_id"]
    other = (pad + 1) % V
    src_pad = torch.arange(src.shape[1])[None, :] >= src_len[:, None]
    tgt_pad = torch.arange(tgt_in.shape[1])[None, :] >= tgt_len[:, None]
    if not src_pad.any() and not tgt_pad.any():
        return "no padding in the batch: masking invariance not exercised", True
    with torch.no_grad():
        a = model(src, src_len, tgt_in, tgt_len)
        b = model(src.masked_fill(src_pad, other), src_len,
                  tgt_in.masked_fill(tgt_pad, other), tgt_len)
        la, lb = model.loss(a, tgt_out).item(), model.loss(b, tgt_out).item()
    real = ~tgt_pad
    err = max_abs(a[real] - b[real]) / max(max_abs(a[real]), ABS_FLOOR)
    lerr = abs(la - lb) / max(abs(la), ABS_FLOOR)
    ok = err <= 1e-12 and lerr <= 1e-12 and math.isfinite(la)
    return (f"padding tokens replaced: logits changed by {err:.2e} (rel), "
            f"loss by {lerr:.2e} (rel)"), ok


def adamw_tolerance(g, gtol, clip_coef, new_ref, hp):
    """Per-element bound on |update_C - update_ref| for the first AdamW step.

    On step 1, with bias correction, m_hat = g and v_hat = g^2, so the update is
        new - old = -lr * wd * old - lr * g / (|g| + eps)
    for the clipped gradient g. f(g) = g / (|g| + eps) has derivative
    eps / (|g| + eps)^2 <= 1/eps: elements with |g| near 0 (on the scale of eps)
    are ill-conditioned, and an admissible gradient error there can move the
    update by up to 2 lr. The mean value theorem bounds the change of f over
    [g - d, g + d] by d * eps / (max(|g| - d, 0) + eps)^2 (and by 2, since
    |f| < 1), where d is the admissible error of the clipped gradient: the
    tensor's gradient tolerance scaled by the clip coefficient, plus |g| times
    the relative error allowed on the norm (through the clip coefficient; it
    is kept when clipping is off too, as the C norm may fall on the other side
    of the threshold, and costs nothing where |g| >> eps).
    To that we add the float32 arithmetic of the step (ADAM_RTOL lr) and the
    float32 rounding of the stored weight (WEIGHT_ULP |w|).
    """
    lr, eps = hp["lr"], hp["adam_eps"]
    d = clip_coef * gtol + g.abs() * RTOL
    sens = d * eps / ((g.abs() - d).clamp(min=0.0) + eps) ** 2
    sens = sens.clamp(max=2.0)
    return lr * (ADAM_RTOL + sens) + WEIGHT_ULP * new_ref.abs(), sens


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    case_dir = argv[1]
    failures = []

    try:
        model = load_model(os.path.join(case_dir, "model"), torch.float64)
        case, meta = load_safetensors(os.path.join(case_dir, "case.safetensors"))
        missing = [k for k in HPARAM_KEYS if k not in meta] + \
            [k for k in BATCH_KEYS + ("logits", "loss", "grad_norm") if k not in case]
        if missing:
            raise ValueError(f"case.safetensors lacks: {', '.join(missing)}")
        hp = {k: float(meta[k]) for k in HPARAM_KEYS}
    except (OSError, ValueError, RuntimeError) as e:
        # Unreadable files, bad JSON/config, load_state_dict name/shape mismatch.
        print(f"FAIL: {e}")
        return 1
    model.eval()          # dropout off: the C run must also use dropout 0
    cfg = model.cfg
    src, src_len, tgt_in, tgt_out, tgt_len = (case[k].long() for k in BATCH_KEYS)
    print(f"case {case_dir}: B={src.shape[0]} S={src.shape[1]} T={tgt_in.shape[1]} "
          f"V={cfg['vocab_size']} C={cfg['d_model']} H={cfg['n_heads']} "
          f"layers={cfg['enc_layers']}+{cfg['dec_layers']} act={cfg['activation']} "
          f"smoothing={cfg['label_smoothing']}")
    print("hyper-parameters: " + " ".join(f"{k}={hp[k]:g}" for k in HPARAM_KEYS))

    problems = check_batch(cfg, src, src_len, tgt_in, tgt_out, tgt_len)
    if problems:
        for p in problems:
            print(f"FAIL batch: {p}")
        return 1

    # ---- Reference: forward, backward, clip, one AdamW step (float64) -------
    params = dict(model.named_parameters())
    old = {n: p.detach().clone() for n, p in params.items()}
    msg, ok = masking_invariance(model, src, src_len, tgt_in, tgt_len, tgt_out)
    print(f"{'ok  ' if ok else 'FAIL'} self-check: {msg}")
    if not ok:
        failures.append("self-check masking invariance")

    logits = model(src, src_len, tgt_in, tgt_len)
    loss = model.loss(logits, tgt_out)
    if not math.isfinite(loss.item()):
        print(f"FAIL self-check: reference loss is {loss.item()}")
        return 1
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}

    decay = [p for p in params.values() if p.dim() == 2]
    no_decay = [p for p in params.values() if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["adam_eps"])
    norm = torch.nn.utils.clip_grad_norm_(list(params.values()), hp["clip_norm"]).item()
    clip_coef = min(1.0, hp["clip_norm"] / (norm + 1e-6))
    clipped = {n: p.grad.detach().clone() for n, p in params.items()}
    opt.step()
    new = {n: p.detach().clone() for n, p in params.items()}

    # ---- Comparisons ----------------------------------------------------------
    worst = {"logits": 0.0, "loss": 0.0, "grad_norm": 0.0, "grads": 0.0, "adamw": 0.0}

    def compare(category, name, c, ref, scale, unit="of max"):
        """max|c - ref| <= RTOL * scale; print one line; return pass/fail."""
        if c is None:
            print(f"FAIL {category:9s} {name}: missing from case.safetensors")
            failures.append(f"{category} {name} (missing)")
            return False
        if tuple(c.shape) != tuple(ref.shape):
            print(f"FAIL {category:9s} {name}: shape {tuple(c.shape)}, "
                  f"expected {tuple(ref.shape)}")
            failures.append(f"{category} {name} (shape)")
            return False
        c = c.double()
        err = max_abs(c - ref) if torch.isfinite(c).all() else float("inf")
        rel = err / scale
        ok = rel <= RTOL
        worst[category] = max(worst[category], rel)
        print(f"{'ok  ' if ok else 'FAIL'} {category:9s} {name}: max_abs={err:.3e} "
              f"rel={rel:.3e} ({unit} {scale:.3e})")
        if not ok:
            failures.append(f"{category} {name}")
        return ok

    ref_logits = logits.detach()
    if not compare("logits", "logits", case["logits"], ref_logits,
                   max(max_abs(ref_logits), ABS_FLOOR)) \
            and case["logits"].shape == ref_logits.shape:
        # Diagnostic: is the disagreement confined to padding positions?
        real = torch.arange(tgt_in.shape[1])[None, :] < tgt_len[:, None]
        e = max_abs(case["logits"].double()[real] - ref_logits[real])
        print(f"     logits at non-padding positions only: max_abs={e:.3e}")
    compare("loss", "loss", case["loss"], loss.detach().reshape(1),
            max(abs(loss.item()), ABS_FLOOR), unit="of")
    compare("grad_norm", "grad_norm", case["grad_norm"],
            torch.tensor([norm], dtype=torch.float64), max(norm, ABS_FLOOR), unit="of")

    gmax = max(max_abs(g) for g in grads.values())
    gtol = {}
    for n in params:
        scale = max(max_abs(grads[n]), GRAD_FLOOR_FRAC * gmax, 1e-30)  # > 0
        gtol[n] = RTOL * scale
        compare("grads", n, case.get("grad." + n), grads[n], scale)

    lr = hp["lr"]
    n_ill_total = 0
    for n in params:
        c = case.get("adamw." + n)
        if c is None or tuple(c.shape) != tuple(old[n].shape):
            compare("adamw", n, c, new[n], 1.0)      # reports missing / shape
            continue
        upd_c = c.double() - old[n]
        upd_ref = new[n] - old[n]
        tol, sens = adamw_tolerance(clipped[n], gtol[n], clip_coef, new[n], hp)
        diff = (upd_c - upd_ref).abs()
        if not torch.isfinite(upd_c).all():
            diff = torch.full_like(diff, float("inf"))
        ok = bool((diff <= tol).all())
        used = (diff / tol).max().item()
        # The relative error quoted is over the well-conditioned elements; the
        # ill-conditioned ones are counted and held to their own wider bound.
        ill = sens > ILL_CONDITIONED
        n_ill = int(ill.sum())
        err = max_abs(diff[~ill])
        rel = err / lr
        worst["adamw"] = max(worst["adamw"], rel)
        n_ill_total += n_ill
        print(f"{'ok  ' if ok else 'FAIL'} {'adamw':9s} {n}: update max_abs={err:.3e} "
              f"rel={rel:.3e} (of lr) tolerance_used={used:.2f}"
              + (f" ill_conditioned={n_ill}/{diff.numel()} (max_abs there "
                 f"{max_abs(diff[ill]):.3e})" if n_ill else ""))
        if not ok:
            failures.append(f"adamw {n}")

    expected = set(BATCH_KEYS) | {"logits", "loss", "grad_norm"} | \
        {"grad." + n for n in params} | {"adamw." + n for n in params}
    extra = sorted(set(case) - expected)
    for k in extra:
        print(f"FAIL unexpected tensor in case.safetensors: {k} (not a parameter)")
        failures.append(f"unexpected {k}")

    print("summary (worst error relative to the tensor's max; adamw: update "
          "relative to lr, well-conditioned elements):")
    for k, v in worst.items():
        print(f"  {k:9s} {v:.3e}")
    n_total = sum(p.numel() for p in params.values())
    print(f"  adamw ill-conditioned elements (|g| within the gradient error of 0 on "
          f"the scale of adam_eps): {n_ill_total}/{n_total}")
    print(f"tolerance: RTOL={RTOL:g} (grads floored at {GRAD_FLOOR_FRAC:g} x max|grad| "
          f"= {GRAD_FLOOR_FRAC * gmax:.3e}); adamw: {ADAM_RTOL:g} lr + gradient-error "
          f"sensitivity + {WEIGHT_ULP:.2e} |w|; clip coefficient {clip_coef:.6g}")
    if failures:
        print(f"FAILED ({len(failures)}): " + ", ".join(failures))
        return 1
    print(f"PASSED: {2 * len(params) + 3} comparisons over {len(params)} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
