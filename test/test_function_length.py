#!/usr/bin/python3
"""scripts/check_function_length.py on small source trees written here.

A tree whose functions sit exactly at the limits (120 lines; a program's
main 60), written in every style the code base uses (multi-line
signatures, static inline in a header, attributes, K&R braces, braces in
strings, characters, comments and macros, file-level initializers and
structs, extern "C" and a C++ class), passes; one line more on a function
and on a main fails, naming exactly those two; the allow-list lets a
named one stand, and an entry whose function fits fails as stale;
kernels/ and test/ are not checked.

usage: test_function_length.py path/to/check_function_length.py
"""
import os
import subprocess
import sys
import tempfile


def body(n_lines, indent="    "):
    """n_lines statements, with braces hidden in strings, characters and comments."""
    out = []
    for i in range(n_lines):
        k = i % 4
        if k == 0:
            out.append(f'{indent}s = "}}{{ {i}";  /* }} */')
        elif k == 1:
            out.append(f"{indent}c = '}}';  // {{")
        elif k == 2:
            out.append(f"{indent}c = '\\'';")
        else:
            out.append(f'{indent}s = "\\"}}";')
    return out


def function(sig_lines, total):
    """A definition of exactly `total` lines: the signature lines, the body, the closing brace."""
    n_body = total - len(sig_lines) - 1
    return sig_lines + ["    const char *s; char c;"] + body(n_body - 1) + ["}"]


def write(root, rel, lines):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def good_tree(root):
    write(root, "src/prog.c", ["/* a program */", "#include <stdio.h>", ""] +
          function(["int main(int argc,", "         char **argv) {"], 60) + [""])
    lib = ["#include <string.h>",
           "#define BLOCK(x) do { \\",
           "    if (x) { \\",
           "    } \\",
           "} while (0)",
           "static const int TABLE[] = {1, 2, 3};",
           "typedef struct {",
           "    int a;",
           "    void (*f)(int);",
           "} Thing;",
           "struct Pair { int x, y; };",
           "enum { A = 1, B };",
           ""]
    lib += function(["__attribute__((unused)) static int",
                     "exactly_at_limit(const char *a,",
                     "                 int b)",
                     "{"], 120)
    lib += [""] + function(["static void kr_brace(void) {"], 30)
    write(root, "src/lib/ok.c", lib)
    write(root, "src/lib/inline.h", ["#ifndef INLINE_H", "#define INLINE_H"] +
          function(["static inline int in_header(int v) {"], 120) + ["#endif"])
    write(root, "src/lib/shim.cc", ['extern "C" {'] + function(["int in_extern_c(int v) {"], 120) + ["}", "",
          "class Lines {", "  public:", "    Lines(int n) : n_(n) { step(); }", "", "  private:"] +
          ["    " + x for x in function(["void step() {"], 120)] + ["    int n_;", "};"])
    # not checked: kernels/ (outside src/) and test/
    write(root, "kernels/k.c", function(["void kernel(void) {"], 300))
    write(root, "test/t.c", function(["int main(void) {"], 300))


def bad_tree(root):
    good_tree(root)
    write(root, "src/lib/long.c", ["/* one line over */", ""] +
          function(["static inline void",
                    "one_over(int a,",
                    "         int b) {"], 121))
    write(root, "src/prog2.c", function(["int main(void) {"], 61))


def run(checker, root, *extra):
    p = subprocess.run(["/usr/bin/python3", checker, "--root", root, *extra], capture_output=True, text=True)
    return p.returncode, [l for l in p.stdout.splitlines() if l]


def main(checker):
    failures = []

    def expect(what, cond, detail):
        if not cond:
            failures.append(f"{what}: {detail}")

    with tempfile.TemporaryDirectory() as good, tempfile.TemporaryDirectory() as bad:
        good_tree(good)
        bad_tree(bad)
        rc, out = run(checker, good)
        expect("at the limits", rc == 0, f"exit {rc}, output {out}")
        rc, out = run(checker, good, "--list")
        listed = {l.split(" ", 1)[1] for l in out if not l.startswith("check_function_length")}
        want = {"main: 60 lines", "exactly_at_limit: 120 lines", "kr_brace: 30 lines", "in_header: 120 lines",
                "in_extern_c: 120 lines", "step: 120 lines", "Lines: 1 lines"}
        expect("every function found", listed == want, f"found {sorted(listed)}, want {sorted(want)}")
        starts = {l.split(" ")[1]: l.split(" ")[0] for l in out if not l.startswith("check_function_length")}
        expect("multi-line signature starts at its first line", starts.get("exactly_at_limit:") == "src/lib/ok.c:14",
               f"listed at {starts.get('exactly_at_limit:')}")

        rc, out = run(checker, bad)
        offenders = [l for l in out if " lines, limit " in l]
        want = ["check_function_length: src/lib/long.c:3 one_over: 121 lines, limit 120",
                "check_function_length: src/prog2.c:1 main: 61 lines, limit 60"]
        expect("one line over", rc == 1 and sorted(offenders) == want, f"exit {rc}, offenders {offenders}")

        rc, out = run(checker, bad, "--allow", "src/lib/long.c:one_over")
        offenders = [l for l in out if " lines, limit " in l]
        expect("allowed", rc == 1 and offenders == [want[1]], f"exit {rc}, offenders {offenders}")
        rc, out = run(checker, bad, "--allow", "src/lib/long.c:one_over", "--allow", "src/prog2.c:main")
        expect("all allowed", rc == 0, f"exit {rc}, output {out}")

        rc, out = run(checker, good, "--allow", "src/lib/ok.c:kr_brace")
        expect("stale entry", rc == 1 and any("src/lib/ok.c kr_brace: allowed to be long, but it fits now" in l
                                              for l in out), f"exit {rc}, output {out}")

        rc, _ = run(checker, os.path.join(good, "src"))
        expect("a tree without src/", rc == 2, f"exit {rc}")

    for f in failures:
        print(f"test_function_length: FAIL {f}")
    if failures:
        return 1
    print("test_function_length: the checker passes the tree at the limits, fails exactly the two over them, "
          "honours and ratchets its allow-list")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
