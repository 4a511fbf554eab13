#!/usr/bin/env python3
"""Writes the tarballs of the bad-input tests (tests/io/bad_input_test.cpp)
into DIR, one per case, with Python's tarfile, which writes what it is told:
absolute paths, '..', links that escape, names too long, duplicates."""
import io
import os
import sys
import tarfile


def add(t, name, data=b"x", kind=tarfile.REGTYPE, link="", mode=0o644):
    i = tarfile.TarInfo(name)
    i.type = kind
    i.mode = mode
    i.mtime = 1700000000
    if kind == tarfile.REGTYPE:
        i.size = len(data)
        t.addfile(i, io.BytesIO(data))
    else:
        i.linkname = link
        t.addfile(i)


def write(path, entries, fmt=tarfile.PAX_FORMAT):
    with tarfile.open(path, "w", format=fmt) as t:
        for e in entries:
            add(t, *e)


def main(out):
    cases = {
        "absolute": [("/abs/file", b"absolute")],
        "dotdot": [("a/../../escape", b"evil")],
        "dotdot-start": [("../escape", b"evil")],
        "symlink-escape": [("link", b"", tarfile.SYMTYPE, "/etc"), ("link/passwd", b"evil")],
        "symlink-escape-rel": [("d/", b"", tarfile.DIRTYPE, "", 0o755), ("d/up", b"", tarfile.SYMTYPE, "../.."),
                               ("d/up/escape", b"evil")],
        "hardlink-escape": [("h", b"", tarfile.LNKTYPE, "../../etc/passwd")],
        "hardlink-missing": [("f", b"data"), ("h", b"", tarfile.LNKTYPE, "not-there")],
        "hardlink-absolute": [("h", b"", tarfile.LNKTYPE, "/etc/passwd")],
        "file-as-dir": [("f", b"data"), ("f/g", b"under a file")],
        "long-name": [("d/" + "n" * 256, b"too long")],
        "duplicates": [("d/f", b"first"), ("d/f", b"second, later wins"), ("e/", b"", tarfile.DIRTYPE, "", 0o700),
                       ("e/inside", b"gone with e"), ("e", b"a file replaces the directory"),
                       ("e2", b"a file first"), ("e2/", b"", tarfile.DIRTYPE, "", 0o750)],
        "whiteout-missing": [(".wh.ghost", b""), ("d/", b"", tarfile.DIRTYPE, "", 0o755), ("d/.wh.nothing", b""),
                             ("d/.wh..wh..opq", b""), ("d/kept", b"kept")],
    }
    for name, entries in cases.items():
        write(os.path.join(out, name + ".tar"), entries)
    # A tarball cut in the middle of a member, and one with a damaged header.
    blob = os.urandom(300000)
    with tarfile.open(os.path.join(out, "whole.tar"), "w", format=tarfile.PAX_FORMAT) as t:
        add(t, "big", blob)
        add(t, "after", b"after")
    whole = open(os.path.join(out, "whole.tar"), "rb").read()
    open(os.path.join(out, "truncated.tar"), "wb").write(whole[:150000])
    damaged = bytearray(whole)
    hdr = whole.find(b"after") - 0  # the second member's name in its header
    hdr = whole.rfind(b"ustar", 0, len(whole)) - 257
    damaged[hdr + 148:hdr + 156] = b"garbage!"  # its checksum
    open(os.path.join(out, "damaged.tar"), "wb").write(bytes(damaged))
    open(os.path.join(out, "not-a-tar"), "wb").write(b"this is not an archive\n" * 100)


if __name__ == "__main__":
    main(sys.argv[1])
