#!/usr/bin/python3
"""train_mt --profile's table by op, against its class table and the model.

From one run's log and metrics file:
  - the printed op rows, per class, sum to that class's printed row (ms and
    calls) within the rounding of the printed digits, and all of them to
    the "all ops" row; the rows run by time, descending;
  - the metrics record's op_ms and op_calls hold the same ops, sum per class
    to classes_ms and ops_per_step (the class of each op from the printed
    table), within the rounding of their digits;
  - the GEMM and attention ops run as often per step as the model's shape
    says: an attention block is 4 linear layers (q, k, v, output) and one
    attention, a feed-forward block 2 linear layers; an encoder layer is one
    of each, a decoder layer two attention blocks (self, cross) and one
    feed-forward; the output layer is one more linear layer; each linear
    layer and attention has one backward; all per micro-batch. The shape
    (layers E+D, micro-batches, recompute) is read from the run's own log.

Usage: check_profile_ops.py PROFILE_LOG METRICS_JSONL
"""
import json
import re
import sys

LINEAR_PER_ATTN, LINEAR_PER_FFN, LINEAR_OUTPUT = 4, 2, 1
MS_DIGITS, CALL_DIGITS = 3, 1              # the printed table's decimals
JSON_MS_DIGITS, JSON_CALL_DIGITS = 6, 2   # the metrics record's


def rounding(digits, n_terms):
    """The most n_terms values each rounded to `digits` decimals (and their printed sum) can differ by."""
    return (n_terms + 1) * 0.5 * 10.0 ** -digits + 1e-12


def tables(log):
    """(class rows {name: (ms, calls)} in printed order, op rows [(op, ms, calls, us, class)], all-ops row)."""
    lines = log.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("profile: time per class"))
    classes = {}  # the rows with calls: not the host gaps or the remainder
    for l in lines[start + 2:]:
        if l.startswith("  step (measured"):
            break
        m = re.match(r"^  (.+?)\s+(-?\d+\.\d+)\s+-?\d+\.\d+%\s+(\d+\.\d+)$", l)
        if m:
            classes[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    start = next(i for i, l in enumerate(lines) if l.startswith("profile: time per op"))
    ops, total = [], None
    for l in lines[start + 2:]:
        f = l.split(None, 5)
        if f[0] == "all":
            total = (float(l.split()[2]), float(l.split()[4]))
            break
        ops.append((f[0], float(f[1]), float(f[3]), float(f[4]), f[5]))
    return classes, ops, total


def check_printed(classes, ops, total):
    by_class = {}
    for op, ms, calls, us, cls in ops:
        assert cls in classes, f"op {op}: class '{cls}' is not a row of the class table"
        by_class.setdefault(cls, []).append((ms, calls))
        assert calls > 0, f"op {op} printed with no calls"
    for cls, (ms, calls) in classes.items():
        rows = by_class.get(cls, [])
        s_ms, s_calls = sum(r[0] for r in rows), sum(r[1] for r in rows)
        assert abs(s_ms - ms) <= rounding(MS_DIGITS, len(rows)), f"{cls}: ops sum to {s_ms} ms, the class {ms}"
        assert abs(s_calls - calls) <= rounding(CALL_DIGITS, len(rows)), f"{cls}: ops {s_calls} calls, class {calls}"
    assert abs(sum(r[1] for r in ops) - total[0]) <= rounding(MS_DIGITS, len(ops)), (ops, total)
    times = [r[1] for r in ops]
    assert times == sorted(times, reverse=True), f"the rows are not by time: {times}"
    print(f"{len(ops)} op rows sum to the {len(by_class)} classes that ran; all ops {total[0]:.3f} ms")


def check_record(p, classes, ops):
    op_ms, op_calls = p["op_ms"], p["op_calls"]
    assert set(op_ms) == set(op_calls) == {r[0] for r in ops}, (sorted(op_ms), sorted(r[0] for r in ops))
    assert list(p["ops_per_step"]) == list(p["classes_ms"])[:len(classes)], p  # the class rows' order
    for cls, k in zip(classes, p["ops_per_step"]):
        members = [r[0] for r in ops if r[4] == cls]
        s_ms, s_calls = sum(op_ms[o] for o in members), sum(op_calls[o] for o in members)
        assert abs(s_ms - p["classes_ms"][k]) <= rounding(JSON_MS_DIGITS, len(members)), (k, s_ms, p["classes_ms"])
        assert abs(s_calls - p["ops_per_step"][k]) <= rounding(JSON_CALL_DIGITS, len(members)), (k, s_calls)
    print(f"the record's op_ms and op_calls sum to classes_ms and ops_per_step ({len(op_ms)} ops)")


def check_counts(log, op_calls):
    enc, dec = map(int, re.search(r"layers (\d+)\+(\d+)", log).groups())
    micro = int(re.search(r"--micro-batches (\d+)", log).group(1))
    recompute = re.search(r"--recompute (\w+)", log).group(1)
    assert recompute == "none", f"the counts below assume --recompute none, not {recompute}"
    attn_blocks, ffn_blocks = enc + 2 * dec, enc + dec
    linear = micro * (LINEAR_PER_ATTN * attn_blocks + LINEAR_PER_FFN * ffn_blocks + LINEAR_OUTPUT)
    want = {"linear_fwd": linear, "linear_bwd": linear,
            "attention_fwd": micro * attn_blocks, "attention_bwd": micro * attn_blocks}
    for op, n in want.items():
        # bf16: inputs kept in bf16 (model.c's Kept), outputs stored in bf16 (linear_fwd16)
        got = sum(op_calls.get(op + sfx, 0) for sfx in ("", "_x16", "16"))
        assert got == n, f"{op}: {got} calls per step, the model ({enc}+{dec} layers, " \
                         f"{micro} micro-batch(es)) makes {n}"
    print(f"layers {enc}+{dec}, {micro} micro-batch(es): " + ", ".join(f"{o} {n}" for o, n in want.items()))


def main():
    log = open(sys.argv[1]).read()
    recs = [json.loads(l)["profile"] for l in open(sys.argv[2]) if '"profile"' in l]
    assert len(recs) == 1, f"{len(recs)} profile records"
    classes, ops, total = tables(log)
    assert total is not None, "no 'all ops' row"
    check_printed(classes, ops, total)
    check_record(recs[0], classes, ops)
    check_counts(log, recs[0]["op_calls"])


if __name__ == "__main__":
    main()
