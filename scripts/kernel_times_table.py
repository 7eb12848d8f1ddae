#!/usr/bin/env python3
"""kernel_times_table.py NCU_CSV: the table by kernel of an Nsight Compute
raw CSV (scripts/gpu_kernel_times.sh): total GPU time, launches, mean time
per launch and share, by kernel name, largest first (markdown)."""
import csv
import sys

UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


def main(path):
    rows = list(csv.reader(open(path, errors="replace")))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "gpu__time_duration.sum" in r), None)
    if head is None:
        sys.exit(f"{path}: no header with 'Kernel Name' and 'gpu__time_duration.sum'")
    name_col, t_col = rows[head].index("Kernel Name"), rows[head].index("gpu__time_duration.sum")
    units = rows[head + 1] if head + 1 < len(rows) else []
    scale = UNIT_NS.get(units[t_col].strip(), None) if len(units) > t_col else None
    first = head + (2 if scale is not None else 1)
    scale = scale or 1.0
    total, calls = {}, {}
    for r in rows[first:]:
        if len(r) <= max(name_col, t_col):
            continue
        try:
            ns = float(r[t_col].replace(",", "")) * scale
        except ValueError:
            continue
        name = r[name_col].split("(")[0].strip()[:100]
        total[name] = total.get(name, 0.0) + ns
        calls[name] = calls.get(name, 0) + 1
    if not total:
        sys.exit(f"{path}: no kernel rows")
    all_ns = sum(total.values())
    print(f"{sum(calls.values())} launches, {all_ns / 1e6:.3f} ms of kernel time in all\n")
    print("| kernel | ms | launches | us/launch | share |")
    print("|---|---|---|---|---|")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"| `{name}` | {total[name] / 1e6:.3f} | {calls[name]} | {total[name] / calls[name] / 1e3:.1f} "
              f"| {100 * total[name] / all_ns:.1f}% |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: kernel_times_table.py NCU_CSV")
    main(sys.argv[1])
