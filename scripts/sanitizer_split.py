#!/usr/bin/env python3
"""Runs a compute-sanitizer command and splits its reports: the project's
errors (they fail the run) and those raised inside NCCL or cuBLAS
(reported, never failing it: e.g. NCCL's start-up probe of kernels built
for other architectures, "no kernel image is available", in
ncclInitKernelsForDevice).

    sanitizer_split.py [--error-exitcode N] -- COMPUTE-SANITIZER-COMMAND...

The command's output is passed through. A report is a block of the
sanitizer's "========= " lines that starts unindented ("Program hit ...",
"Invalid __global__ read ...", "Error: Race reported ..."); warnings, the
summaries and "Target application returned an error" are not reports. A
report is library-internal when the code it names is NCCL's or cuBLAS's:
its device location (the "at ... in FILE" line) is in libnccl/libcublas or a
kernel named nccl*, or, without one, its innermost host frame outside the
CUDA driver and runtime and the C/C++ runtime lies in libnccl, libcublas or
libcublasLt. Anything else, a report without frames included, is the
project's. Exit status: the command's, except that the sanitizer's error
exit code (--error-exitcode, default 99) becomes 0 when every report is
library-internal. The last line sums it up (with the sanitizer's ERROR
SUMMARY).
"""
import re
import subprocess
import sys

PREFIX = "========= "
LIBRARY_RE = re.compile(r"lib(nccl|cublasLt|cublas)[^/\s]*\.so")
RUNTIME_RE = re.compile(r"lib(cuda|cudart|c|pthread|stdc\+\+|gcc_s|m|dl)[.-][^/\s]*$|ld-linux|libc\.so|\[vdso\]")
NOT_REPORTS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Warning",
               "Target application returned", "This can happen", "Note:")


def blocks(lines):
    """The sanitizer's reports: lists of lines, the header first."""
    out, cur = [], None
    for line in lines:
        if not line.startswith("========="):
            continue
        body = line[len(PREFIX):] if line.startswith(PREFIX) else ""
        if not body.strip():
            cur = None
        elif not body.startswith(" "):
            cur = None if body.startswith(NOT_REPORTS) else [body]
            if cur is not None:
                out.append(cur)
        elif cur is not None:
            cur.append(body.strip())
    return out


def module_of(frame):
    m = re.search(r" in (\S+)\s*$", frame)
    return m.group(1) if m else ""


def library_frame(report):
    """The NCCL/cuBLAS place a report comes from, or None (the project's)."""
    for line in report[1:]:
        if line.startswith("at "):  # the device code the error is in
            where = module_of(line)
            if LIBRARY_RE.search(where) or re.match(r"at (void )?nccl", line):
                return line
            return None
    for line in report[1:]:
        if "Host Frame" not in line:
            continue
        mod = module_of(line)
        if not mod or RUNTIME_RE.search(mod):
            continue
        return line if LIBRARY_RE.search(mod) else None
    return None


def main(argv):
    err_code = 99
    if argv[:1] == ["--error-exitcode"]:
        err_code, argv = int(argv[1]), argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        sys.exit("usage: sanitizer_split.py [--error-exitcode N] -- COMMAND...")
    proc = subprocess.Popen(argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line.rstrip("\n"))
    rc = proc.wait()
    sys.stdout.flush()
    reports = blocks(lines)
    lib = [(r, library_frame(r)) for r in reports]
    ours = [r for r, f in lib if f is None]
    theirs = [f for _, f in lib if f is not None]
    summary = [l[len(PREFIX):] for l in lines if l.startswith(PREFIX + "ERROR SUMMARY")]
    where = ""
    if theirs:
        f = theirs[0]
        where = f" (first: {re.sub(r'0x[0-9a-f]+', '', f)[:120].strip()})"
    text = f"tptrain {len(ours)} error(s), library-internal {len(theirs)}{where}"
    if ours:
        text += f"; first of tptrain's: {ours[0][0][:120]}"
    print(f"sanitizer_split: {text}; {summary[-1] if summary else 'no ERROR SUMMARY'}")
    if rc == err_code and reports and not ours:
        return 0
    if rc == 0 and ours:
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
