#!/usr/bin/python3
"""Function length check: no function in src/ longer than 120 lines, no
program's main (src/*.c, src/tprun/tprun.c) longer than 60.

A function that fits a screen is one a reader can hold; a program's main
that fits half of one reads as the table of contents of what the program
does. kernels/ is left out: a kernel's body is one long computation by
nature. Lengths count from the first line of the signature to the closing
brace, both included.

The functions still over the limits when the check arrived are listed in
ALLOW with the reason they stand; each change that brings one under takes
it off the list (an entry whose function fits, or is gone, fails the
check, so the list only shrinks).

Functions are found on the text with comments, string and character
literals and preprocessor lines blanked: a brace at file level (or in an
`extern "C"`, namespace, struct or class body) opens a function when what
precedes it since the last `;`, `{`, `}` or directive ends in a parameter
list and is not an initializer (multi-line signatures, static and inline,
attributes, K&R braces: the opening brace on the signature's line).

usage: check_function_length.py [--root DIR] [--allow PATH:NAME ...] [--list]
  --root DIR   the tree to check (default: this repository, with ALLOW);
               another tree is checked with only the --allow entries given
  --list       print every function with its length (for a look around)
Exit status: 0 when every function fits, 1 with each offender named
(path:line name: N lines, limit L), 2 on a usage error.
"""
import os
import re
import sys

FUNCTION_LIMIT = 120  # lines, any function in src/
MAIN_LIMIT = 60       # lines, a program's main

# (path, function): why it still stands. Take an entry off when its function fits.
ALLOW = {}

SOURCE_EXT = (".c", ".cc", ".h")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
AGGREGATE = ("struct", "union", "class")  # their bodies may define member functions (C++)
ATTRIBUTE_TAIL = re.compile(r"(__attribute__\s*\(\(.*\)\)|noexcept|const|override)\s*$", re.S)


def blank(text):
    """The text with comments, string and character literals and
    preprocessor lines (with their continuations) replaced by spaces;
    newlines kept, so offsets keep their line numbers."""
    out = list(text)
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            i += 1
            continue
        if at_line_start and c == "#":  # a directive, to its unescaped end of line
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                if text[i] != "\n":
                    out[i] = " "
                i += 1
            continue
        at_line_start = c == "\n"
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def function_name(header):
    """The name of the function whose signature is header (the text since
    the previous declaration), or None when header is not a signature."""
    h = header.strip()
    init = re.search(r"\)\s*:(?!:)", h)  # a C++ constructor's member initializers
    if init:
        h = h[:init.start() + 1]
    while True:  # trailing attributes and qualifiers
        m = ATTRIBUTE_TAIL.search(h)
        if not m or m.start() == 0:
            break
        h = h[:m.start()].rstrip()
    if not h.endswith(")"):
        return None
    words = IDENT.findall(h)
    if not words or words[0] == "typedef":
        return None
    depth = 0  # back from the closing parenthesis to the opening one of the parameter list
    for k in range(len(h) - 1, -1, -1):
        if h[k] == ")":
            depth += 1
        elif h[k] == "(":
            depth -= 1
            if depth == 0:
                break
    else:
        return None
    before = h[:k].rstrip()
    if "=" in re.sub(r"\([^()]*\)", "", before):  # an initializer, not a definition
        return None
    m = re.search(r"([A-Za-z_][A-Za-z0-9_:~]*)$", before)
    if not m or m.group(1) in ("if", "for", "while", "switch", "return", "sizeof", "__attribute__"):
        return None
    return m.group(1).split("::")[-1]


def functions(path):
    """[(name, first line, last line)] of the functions defined in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = blank(f.read())
    found = []
    depth = 0
    transparent = 0  # extern "C", namespace, struct and class bodies open at file level
    start = 0        # where the current file-level declaration began
    open_at = None   # (name, first line) of the function whose body is open
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            if depth == 0:
                label = re.match(r"\s*(public|private|protected)\s*:(?!:)", text[start:i])
                if label:  # a C++ access label is not part of the signature
                    start += label.end()
                header = text[start:i]
                words = IDENT.findall(header)
                opens_block = words[:1] == ["namespace"] or (words[:1] == ["extern"] and len(words) == 1)
                opens_block |= any(w in AGGREGATE for w in words) and "=" not in header and \
                    not header.rstrip().endswith(")")
                if opens_block:
                    transparent += 1
                    start = i + 1
                    continue
                name = function_name(header)
                if name:
                    skipped = len(header) - len(header.lstrip())
                    open_at = (name, text.count("\n", 0, start + skipped) + 1)
            depth += 1
        elif c == "}":
            if depth == 0 and transparent:
                transparent -= 1
                start = i + 1
                continue
            depth -= 1
            if depth == 0:
                if open_at:
                    found.append((open_at[0], open_at[1], line))
                    open_at = None
                start = i + 1
        elif c == ";" and depth == 0:
            start = i + 1
    return found


def sources(root):
    for d, subdirs, files in os.walk(os.path.join(root, "src")):
        subdirs.sort()
        for name in sorted(files):
            if name.endswith(SOURCE_EXT):
                yield os.path.relpath(os.path.join(d, name), root)


def is_program(rel):
    """src/*.c and the launcher: the files with a program's main."""
    return rel == "src/tprun/tprun.c" or (os.path.dirname(rel) == "src" and rel.endswith(".c"))


def check(root, allow, listing):
    over, seen = [], set()
    for rel in sources(root):
        for name, first, last in functions(os.path.join(root, rel)):
            n = last - first + 1
            limit = MAIN_LIMIT if name == "main" and is_program(rel) else FUNCTION_LIMIT
            if listing:
                print(f"{rel}:{first} {name}: {n} lines")
            if n <= limit:
                continue
            if (rel, name) in allow:
                seen.add((rel, name))
                continue
            over.append(f"{rel}:{first} {name}: {n} lines, limit {limit}")
    stale = [f"{p} {f}: allowed to be long, but it fits now (or is gone): take it off the list"
             for p, f in sorted(set(allow) - seen)]
    for msg in over:
        print(f"check_function_length: {msg}")
    for msg in stale:
        print(f"check_function_length: {msg}")
    if over or stale:
        print(f"check_function_length: {len(over)} function(s) over the limits ({FUNCTION_LIMIT} lines; a program's "
              f"main {MAIN_LIMIT}), {len(stale)} stale allow-list entr{'y' if len(stale) == 1 else 'ies'}")
        return 1
    print(f"check_function_length: every function fits ({FUNCTION_LIMIT} lines; a program's main {MAIN_LIMIT}); "
          f"{len(allow)} allowed over")
    return 0


def main(argv):
    root, allow, listing = None, {}, False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--root" and args:
            root = args.pop(0)
        elif a == "--allow" and args and ":" in args[0]:
            p, f = args.pop(0).rsplit(":", 1)
            allow[(p, f)] = "given on the command line"
        elif a == "--list":
            listing = True
        else:
            print(__doc__.split("\n\n")[-2], file=sys.stderr)
            return 2
    if root is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        allow = {**ALLOW, **allow}
    if not os.path.isdir(os.path.join(root, "src")):
        print(f"check_function_length: {root} has no src/ folder", file=sys.stderr)
        return 2
    return check(root, allow, listing)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
