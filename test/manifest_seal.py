"""manifest_seal.py: the checksum line of a checkpoint's manifest.json
(format version 2, docs/checkpoints.md), computed independently of the C code.

    manifest_seal.py check MANIFEST     exit 0 when the checksum line matches the rest
    manifest_seal.py reseal MANIFEST    recompute it after an edit, so that a test
                                        reaches the check behind it (the edited field)
    manifest_seal.py relist MANIFEST NAME FILE
                                        set the bytes and crc32c the manifest lists for
                                        NAME to those of FILE, then reseal

The file begins with the line  {<LF><TAB>"manifest_crc32c":<TAB>"XXXXXXXX",<LF>
whose 8 hex digits are the CRC-32C (Castagnoli) of every byte after that line.
"""
import re
import sys

HEAD = b'{\n\t"manifest_crc32c":\t"'
TAIL = b'",\n'
LINE = len(HEAD) + 8 + len(TAIL)


def crc32c(data: bytes) -> int:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def main() -> int:
    cmd, path = sys.argv[1], sys.argv[2]
    data = open(path, "rb").read()
    if not data.startswith(HEAD) or data[len(HEAD) + 8 : LINE] != TAIL:
        print(f"{path}: no manifest_crc32c line", file=sys.stderr)
        return 1
    rest = data[LINE:]
    want = b"%08x" % crc32c(rest)
    if cmd == "check":
        if data[len(HEAD) : len(HEAD) + 8] != want:
            print(f"{path}: checksum line does not match", file=sys.stderr)
            return 1
        return 0
    if cmd == "relist":
        name, file = sys.argv[3], sys.argv[4]
        blob = open(file, "rb").read()
        pattern = re.compile(
            rb'("' + re.escape(name.encode()) + rb'":\s*\{\s*"bytes":\s*)\d+(,\s*"crc32c":\s*")[0-9a-f]{8}"')
        rest, n = pattern.subn(
            lambda m: m.group(1) + str(len(blob)).encode() + m.group(2) + b"%08x" % crc32c(blob) + b'"', rest)
        if n != 1:
            print(f"{path}: no entry for {name}", file=sys.stderr)
            return 1
        cmd = "reseal"
    if cmd == "reseal":
        open(path, "wb").write(HEAD + b"%08x" % crc32c(rest) + TAIL + rest)
        return 0
    print(f"unknown command {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
