#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A LiveBlocks snapshot opens in tools/memviz: write_snapshot (C++, on SimDriver) dumps
the live blocks when an allocation fails and prints what they are; the page made from
the dump must show those blocks, their bytes, tags and streams, the failure, and what
the stack held then (its sample: held and queued frees, held above the live bytes).

usage: snapshot_check.py WRITE_SNAPSHOT OUTDIR
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "tools", "memviz")
sys.path.insert(0, TOOL)

import memlog    # noqa: E402
import timeline  # noqa: E402


def main(argv):
    writer, outdir = argv[1], os.path.abspath(argv[2])
    os.makedirs(outdir, exist_ok=True)
    csv = os.path.join(outdir, "memviz_snapshot.csv")
    r = subprocess.run([writer, csv], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        return 1
    want = json.loads(r.stdout)
    log = memlog.read_log(csv)
    tl = timeline.build(log)
    got = {"bytes": tl.peak_bytes, "blocks": len(tl.peak_blocks),
           "failure_bytes": tl.failures[0][2] if len(tl.failures) == 1 else None,
           "tags": len(tl.tags), "streams": len(tl.streams),
           "held": tl.held.peak if tl.held else None, "queued": tl.held.peak_queued if tl.held else None}
    page = subprocess.run([sys.executable, os.path.join(TOOL, "memviz.py"), csv, "-o",
                           os.path.join(outdir, "memviz_snapshot.html")], capture_output=True, text=True)
    print(page.stdout + page.stderr)
    problems = [f"{k}: snapshot says {want[k]}, memviz found {got[k]}" for k in want if got[k] != want[k]]
    if tl.held and not (tl.held.peak > tl.peak_bytes and tl.held.peak_live == want["bytes"]):
        problems.append(f"held {tl.held.peak} with live {tl.held.peak_live}: expected more than the "
                        f"{want['bytes']} live bytes (frees are queued)")
    if log.problems:
        problems.append(f"{len(log.problems)} lines of the snapshot did not parse")
    if tl.end_bytes != want["bytes"]:
        problems.append(f"live at the end {tl.end_bytes}, expected {want['bytes']}")
    if page.returncode != 0:
        problems.append(f"memviz exited {page.returncode}")
    for p in problems:
        print("FAIL " + p)
    print("snapshot_check: " + ("failed" if problems else f"ok: {want}"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
