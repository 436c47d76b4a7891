# SPDX-License-Identifier: Apache-2.0
"""Fails unless each shared library given exports xlogrt_* functions and nothing else
(`nm -D --defined-only`): no libstdc++, no C++ symbol of the library's own.

    python3 bridge/torch/check_exports.py LIB.so [LIB.so ...]
"""
import subprocess
import sys


def exports(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def main(paths):
    if not paths:
        print("usage: check_exports.py LIB.so [LIB.so ...]")
        return 2
    bad = 0
    for p in paths:
        names = exports(p)
        foreign = [n for n in names if not n.startswith("xlogrt_")]
        ours = [n for n in names if n.startswith("xlogrt_")]
        if foreign or not ours:
            bad += 1
            print(f"FAIL {p}: {len(ours)} xlogrt_* functions, {len(foreign)} other symbols exported, e.g. {foreign[:8]}")
        else:
            print(f"ok   {p}: exports {len(ours)} symbols, all xlogrt_*")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
