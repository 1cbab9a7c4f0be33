#!/usr/bin/env python3
"""Keeps one GPU architecture's kernels in a CUDA shared library, so it compresses to a fraction.

    scripts/prune-fatbin.py IN OUT --sm 90 [--drop-symtab]
    scripts/prune-fatbin.py IN --list

MLX's CUDA wheel builds `libmlx.so` for many GPU generations: every CUDA translation unit left a
*fat binary* (a container of one machine-code image per architecture, plus PTX) in the ELF
section `.nv_fatbin`, 65 MB in all. At run time the CUDA runtime hands each container to the
driver, which picks the image for the device's architecture; an sm_90 device (H100, H200) can
only ever use the sm_90/sm_90a images (machine code runs only on its own major architecture, and
PTX for a newer one cannot be compiled for an older one).

What this does is what `nvprune` does, without moving anything: each container is rewritten *in
place* holding only the kept entries, its header's size shrunk to match, and the bytes it no
longer uses zeroed. Addresses do not change (the registration records in `.nvFatBinSegment`
point at the containers' starts, which stay where they were), the ELF layout does not change,
and the zeroed bytes compress to nothing. A container with no image for the architecture keeps
the newest PTX not newer than it (the driver compiles that at load); one with neither is refused,
since the library could not run that code on the device.

`--drop-symtab` zeroes `.symtab` and `.strtab` (the static symbol table: 26 MB in the wheel's
libmlx; the dynamic loader, exceptions and backtraces use `.dynsym`, which stays) and marks the
two sections empty, again without moving anything.

Format of a container (little-endian): header {u32 magic 0xBA55ED50, u16 version, u16
header_size, u64 entries_size}, then entries, each {u16 kind (1 PTX, 2 ELF), u16 version,
u32 header_size, u64 payload_size (padded), ..., u32 arch at +28 (e.g. 90), ..., u64 flags at
+40}, payload following its header. Containers follow one another, 8-byte aligned.
"""

from __future__ import annotations

import argparse
import collections
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2
SHT_NOBITS = 8


class FatbinError(Exception):
    pass


def sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """Section name -> (header offset, file offset, size) of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FatbinError("not a little-endian 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        h = shoff + i * shentsize
        name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, h)
        headers.append((name, h, off, size))
    strtab_off = headers[shstrndx][2]
    out = {}
    for name, h, off, size in headers:
        end = data.index(b"\0", strtab_off + name)
        out[data[strtab_off + name:end].decode()] = (h, off, size)
    return out


def containers(data: bytes, start: int, size: int):
    """(offset, header_size, entries_size, [(entry offset, kind, arch, flags, total size)])."""
    p, end = start, start + size
    while p < end:
        magic, _version, hsz, fsz = struct.unpack_from("<IHHQ", data, p)
        if magic != FATBIN_MAGIC:
            # Padding between containers (they are 8-byte aligned) or after the last one.
            if data[p:p + 8] == b"\0" * min(8, end - p):
                p += 8
                continue
            raise FatbinError(f"no fat binary at offset {p:#x} (magic {magic:#x})")
        entries = []
        e, cend = p + hsz, p + hsz + fsz
        if cend > end:
            raise FatbinError(f"container at {p:#x} runs past the section")
        while e < cend:
            kind, _v, ehs, padded = struct.unpack_from("<HHIQ", data, e)
            arch, = struct.unpack_from("<I", data, e + 28)
            flags, = struct.unpack_from("<Q", data, e + 40)
            if ehs == 0 or e + ehs + padded > cend:
                raise FatbinError(f"bad entry at {e:#x} in the container at {p:#x}")
            entries.append((e, kind, arch, flags, ehs + padded))
            e += ehs + padded
        yield p, hsz, fsz, entries
        p = cend


def arch_name(kind: int, arch: int, flags: int) -> str:
    # Bit 20 marks the architecture-specific variant ("a": sm_90a); seen in MLX's wheel, where
    # cuobjdump names those images sm_90a/sm_100a/sm_120a.
    suffix = "a" if flags & (1 << 20) else ""
    return f"{'ptx compute' if kind == KIND_PTX else 'sm'}_{arch}{suffix}"


def summary(data: bytes, start: int, size: int) -> tuple[int, dict[str, int]]:
    count, sizes = 0, collections.Counter()
    for _p, _h, _f, entries in containers(data, start, size):
        count += 1
        for _e, kind, arch, flags, total in entries:
            sizes[arch_name(kind, arch, flags)] += total
    return count, dict(sizes)


def keep_entries(entries, sm: int):
    machine = [e for e in entries if e[1] == KIND_ELF and e[2] == sm]
    if machine:
        return machine
    ptx = [e for e in entries if e[1] == KIND_PTX and e[2] <= sm]
    if ptx:
        return [max(ptx, key=lambda e: e[2])]
    return None


def prune(data: bytearray, start: int, size: int, sm: int) -> int:
    """Rewrites every container in place; returns the bytes zeroed."""
    zeroed = 0
    for p, hsz, fsz, entries in list(containers(bytes(data), start, size)):
        kept = keep_entries(entries, sm)
        if kept is None:
            have = sorted({arch_name(k, a, f) for _e, k, a, f, _t in entries})
            raise FatbinError(
                f"the container at {p:#x} has no code an sm_{sm} device can run (it has {have})")
        body = b"".join(bytes(data[e:e + total]) for e, _k, _a, _f, total in kept)
        struct.pack_into("<Q", data, p + 8, len(body))
        data[p + hsz:p + hsz + len(body)] = body
        rest = fsz - len(body)
        data[p + hsz + len(body):p + hsz + fsz] = b"\0" * rest
        zeroed += rest
    return zeroed


def drop_symtab(data: bytearray, secs) -> int:
    zeroed = 0
    for name in (".symtab", ".strtab"):
        if name not in secs:
            continue
        h, off, size = secs[name]
        data[off:off + size] = b"\0" * size
        # An empty NOBITS section: tools see no symbol table rather than zeroed symbols.
        struct.pack_into("<I", data, h + 4, SHT_NOBITS)
        struct.pack_into("<Q", data, h + 32, 0)
        zeroed += size
    return zeroed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output", nargs="?")
    ap.add_argument("--sm", type=int, help="the architecture to keep, e.g. 90 for H100/H200")
    ap.add_argument("--list", action="store_true", help="print the architectures and sizes")
    ap.add_argument("--drop-symtab", action="store_true")
    args = ap.parse_args()
    data = bytearray(open(args.input, "rb").read())
    try:
        secs = sections(bytes(data))
        if ".nv_fatbin" not in secs:
            raise FatbinError(f"{args.input} has no .nv_fatbin section")
        _h, start, size = secs[".nv_fatbin"]
        count, sizes = summary(bytes(data), start, size)
        if args.list:
            print(f"{args.input}: {count} fat binaries, {size} bytes in .nv_fatbin")
            for name, n in sorted(sizes.items()):
                print(f"  {name}: {n} bytes")
            return 0
        if args.output is None or args.sm is None:
            ap.error("pruning needs OUTPUT and --sm")
        zeroed = prune(data, start, size, args.sm)
        if args.drop_symtab:
            zeroed += drop_symtab(data, secs)
        # Check what was written parses and holds only what was asked for.
        count2, sizes2 = summary(bytes(data), start, size)
        if count2 != count:
            raise FatbinError(f"{count} fat binaries before, {count2} after")
    except FatbinError as e:
        print(f"prune-fatbin: {e}", file=sys.stderr)
        return 1
    with open(args.output, "wb") as f:
        f.write(data)
    kept = ", ".join(f"{k} {v}" for k, v in sorted(sizes2.items()))
    print(f"prune-fatbin: {count} fat binaries, kept {kept} bytes; zeroed {zeroed} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
