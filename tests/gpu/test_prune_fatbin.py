#!/usr/bin/env python3
"""Tests scripts/prune-fatbin.py on a shared library built here with a synthetic `.nv_fatbin`
section (a C compiler and Python 3 only; no CUDA, no wheel; a few seconds, run by
scripts/test.sh):

    python3 tests/gpu/test_prune_fatbin.py

The library holds three fat binaries laid out as nvcc lays them out (container header, entries
of header + payload, 8-byte aligned): one with machine code for sm_80, sm_90a and sm_100a plus
PTX, one with PTX for compute_75 and compute_80 only, one with sm_75 only. Checked: pruning to
sm_90 keeps exactly the sm_90a entry of the first (payload bytes unchanged, header size shrunk,
the rest zeroed) and the newest PTX not newer than sm_90 of the second; the third is refused,
naming what it has; the file keeps its size and layout and still loads (`dlopen`);
`--drop-symtab` empties the static symbol table and keeps the dynamic one.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRUNE = os.path.join(ROOT, "scripts", "prune-fatbin.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
prune_fatbin = __import__("prune-fatbin")

ARCH_SPECIFIC = 1 << 20  # the "a" of sm_90a


def entry(kind: int, arch: int, payload: bytes, flags: int = 0x11) -> bytes:
    header = bytearray(64)
    padded = payload + b"\0" * (-len(payload) % 8)
    struct.pack_into("<HHIQ", header, 0, kind, 0x0101, 64, len(padded))
    struct.pack_into("<I", header, 16, len(payload))
    struct.pack_into("<I", header, 28, arch)
    struct.pack_into("<Q", header, 40, flags)
    return bytes(header) + padded


def container(entries: list[bytes]) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def c_array(name: str, data: bytes) -> str:
    values = ",".join(str(b) for b in data)
    return (f'__attribute__((section(".nv_fatbin"), aligned(8), used))\n'
            f"static const unsigned char {name}[{len(data)}] = {{{values}}};\n")


def build(tmp: str, blobs: list[bytes]) -> str:
    source = os.path.join(tmp, "fat.c")
    with open(source, "w") as f:
        for i, blob in enumerate(blobs):
            f.write(c_array(f"fatbin{i}", blob))
        f.write("int hunch_fat_probe(void) { return 42; }\n")
    lib = os.path.join(tmp, "libfat.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-o", lib, source], check=True)
    return lib


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, PRUNE, *args], capture_output=True, text=True)


def main() -> int:
    if shutil.which("cc") is None:
        print("test_prune_fatbin: no C compiler (cc); install gcc", file=sys.stderr)
        return 1
    sm90 = b"SM90A-MACHINE-CODE" * 7
    ptx80 = b".version 8.0 .target sm_80" * 3
    first = container([entry(2, 80, b"sm80" * 40), entry(2, 90, sm90, 0x11 | ARCH_SPECIFIC),
                       entry(2, 100, b"sm100" * 50, 0x11 | ARCH_SPECIFIC), entry(1, 120, b"ptx120" * 9)])
    second = container([entry(1, 75, b".target sm_75" * 4), entry(1, 80, ptx80)])
    third = container([entry(2, 75, b"sm75" * 30)])
    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp, [first, second])
        out = os.path.join(tmp, "libfat.sm90.so")
        result = run(lib, out, "--sm", "90", "--drop-symtab")
        check(result.returncode == 0, f"pruning failed: {result.stderr}")
        if result.returncode == 0:
            before, after = open(lib, "rb").read(), open(out, "rb").read()
            check(len(before) == len(after), "the file changed size")
            secs = prune_fatbin.sections(after)
            _h, start, size = secs[".nv_fatbin"]
            found = list(prune_fatbin.containers(after, start, size))
            check(len(found) == 2, f"{len(found)} fat binaries after pruning, not 2")
            kept = [[(k, a) for _e, k, a, _f, _t in entries] for _p, _hs, _fs, entries in found]
            check(kept == [[(2, 90)], [(1, 80)]], f"kept {kept}")
            check(sm90 in after and ptx80 in after, "a kept payload changed")
            check(b"sm100" not in after and b"ptx120" not in after and b"sm_75" not in after,
                  "a dropped payload is still there")
            check(secs[".symtab"][2] == 0 or ".symtab" not in secs, ".symtab still has content")
            try:
                probe = ctypes.CDLL(out).hunch_fat_probe
                check(probe() == 42, "the pruned library's function answers wrongly")
            except OSError as e:
                failures.append(f"the pruned library does not load: {e}")
        listing = run(lib, "--list")
        check("sm_90a" in listing.stdout and "ptx compute_120" in listing.stdout,
              f"--list does not name the architectures: {listing.stdout}")

        refused = build(tmp, [first, third])
        result = run(refused, os.path.join(tmp, "never.so"), "--sm", "90")
        check(result.returncode == 1 and "no code an sm_90 device can run" in result.stderr
              and "sm_75" in result.stderr, f"a library without sm_90 code was not refused: {result}")
        check(not os.path.exists(os.path.join(tmp, "never.so")), "a refused library was written")

        not_elf = os.path.join(tmp, "not-elf")
        with open(not_elf, "wb") as f:
            f.write(b"hello")
        result = run(not_elf, "--list")
        check(result.returncode == 1 and "not a little-endian 64-bit ELF" in result.stderr,
              f"a non-ELF file was not refused clearly: {result}")

    for f in failures:
        print(f"test_prune_fatbin: FAILED: {f}", file=sys.stderr)
    if not failures:
        print("test_prune_fatbin: ok (kept sm_90a and the newest usable PTX, refused a library "
              "with no sm_90 code, file size and loading unchanged)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
