#!/usr/bin/env python3
"""Compare two training-loss curves (train_mt --metrics JSON Lines).

Used by scripts/gpu_check.sh to hold a GPU run against the CPU reference
(same seed, data and flags), and a tensor/data-parallel run against tp = 1.
Prints the per-step losses side by side, the max absolute and relative
difference, and PASS or FAIL against a named band; exits 0 on PASS, 1 on
FAIL, 2 on unusable input (missing file, no common steps, non-finite loss).

    compare_curves.py [--band fp32|bf16|exact] [--names REF,RUN] [--from STEP] REF.jsonl RUN.jsonl

Only rows with "step" and "loss" count (evaluation rows are ignored); the
two files must log the same steps, from STEP on with --from (a run resumed
at STEP - 1 against the straight one). The band exact asks for the same
loss, digit for digit, at every step (a resumed run in the same layout). Relative difference = |run - ref| / |ref|.
Standard library only: runs on any python3.
"""
import json
import math
import sys

# Bands: (first-step loss max relative diff, whole-curve max relative diff).
# fp32: the same fp32 math in another order (cuBLASLt vs OpenBLAS, other
#   reduction trees) moves the first loss by ~1e-6 relative; 1e-4 catches a
#   wrong term (a missing mask, a transposed weight) which moves it by >1e-2.
#   Over 50 steps of AdamW the rounding differences grow, but a correct
#   implementation stays well within 1% of the reference.
# bf16: bf16 weights and activations (8 mantissa bits, ~4e-3 relative per
#   rounding) with fp32 accumulation: the curve must stay within 5%.
BANDS = {
    "fp32": (1e-4, 1e-2),
    "bf16": (5e-2, 5e-2),
    "exact": (0.0, 0.0),
}
REL_FLOOR = 1e-12  # denominator floor: a loss is never near 0 in these runs


def load_losses(path):
    """{step: loss} from the training rows of a metrics file."""
    losses = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            if "loss" in row and "step" in row:
                losses[int(row["step"])] = float(row["loss"])
    return losses


def compare(ref, run, band):
    """(ok, lines, stats) for two {step: loss} maps under a band name."""
    first_tol, curve_tol = BANDS[band]
    lines = []
    steps = sorted(set(ref) & set(run))
    if not steps:
        return None, ["no common logged steps"], {}
    only = sorted(set(ref) ^ set(run))
    bad = [s for s in steps if not (math.isfinite(ref[s]) and math.isfinite(run[s]))]
    if bad:
        return None, [f"non-finite loss at step {bad[0]}: {ref[bad[0]]} vs {run[bad[0]]}"], {}
    max_abs = max_rel = 0.0
    worst = steps[0]
    for s in steps:
        a = abs(run[s] - ref[s])
        r = a / max(abs(ref[s]), REL_FLOOR)
        max_abs = max(max_abs, a)
        if r > max_rel:
            max_rel, worst = r, s
        lines.append((s, ref[s], run[s], a, r))
    first = steps[0]
    first_rel = abs(run[first] - ref[first]) / max(abs(ref[first]), REL_FLOOR)
    stats = {"steps": len(steps), "first_step": first, "first_rel": first_rel, "max_abs": max_abs,
             "max_rel": max_rel, "worst_step": worst, "only_in_one": only}
    if curve_tol == 0.0:  # exact: equal, not merely below a tolerance
        ok = max_abs == 0.0 and not only
    else:
        ok = first_rel < first_tol and max_rel < curve_tol and not only
    return ok, lines, stats


def main(argv):
    band, names, files, start = "fp32", ("ref", "run"), [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--band" and i + 1 < len(argv):
            band, i = argv[i + 1], i + 2
        elif a == "--from" and i + 1 < len(argv) and argv[i + 1].isdigit():
            start, i = int(argv[i + 1]), i + 2
        elif a == "--names" and i + 1 < len(argv):
            names, i = (argv[i + 1].split(",") + ["run"])[:2], i + 2
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            files.append(a)
            i += 1
    if band not in BANDS or len(files) != 2:
        print(f"usage: compare_curves.py [--band {'|'.join(BANDS)}] [--names REF,RUN] [--from STEP] REF.jsonl RUN.jsonl",
              file=sys.stderr)
        return 2
    try:
        ref, run = load_losses(files[0]), load_losses(files[1])
        if start is not None:
            ref = {k: v for k, v in ref.items() if k >= start}
            run = {k: v for k, v in run.items() if k >= start}
    except (OSError, ValueError) as e:
        print(f"compare_curves: {e}", file=sys.stderr)
        return 2
    ok, lines, stats = compare(ref, run, band)
    if ok is None:
        print(f"compare_curves: {files[0]} vs {files[1]}: {lines[0]}", file=sys.stderr)
        return 2
    print(f"{'step':>6} {names[0]:>12} {names[1]:>12} {'abs diff':>10} {'rel diff':>10}")
    for s, a, b, d, r in lines:
        print(f"{s:6d} {a:12.6f} {b:12.6f} {d:10.3e} {r:10.3e}")
    first_tol, curve_tol = BANDS[band]
    print(f"{stats['steps']} steps; first step {stats['first_step']}: rel diff {stats['first_rel']:.3e} "
          f"(band < {first_tol:g}); curve: max abs diff {stats['max_abs']:.3e}, max rel diff "
          f"{stats['max_rel']:.3e} at step {stats['worst_step']} (band < {curve_tol:g})")
    if stats["only_in_one"]:
        print(f"steps logged in only one file: {stats['only_in_one'][:10]}")
    verdict = "PASS" if ok else "FAIL"
    missing = f", {len(stats['only_in_one'])} step(s) logged in one file only" if stats["only_in_one"] else ""
    print(f"{verdict} {band}: {names[1]} vs {names[0]}: first-step rel {stats['first_rel']:.2e}, "
          f"max rel {stats['max_rel']:.2e}{missing}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
