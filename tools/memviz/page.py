# SPDX-License-Identifier: Apache-2.0
"""The memory timeline page: one self-contained HTML file (page.html with page.js
inlined, the data embedded), drawn by its script with inline SVG; no network.

Data. The figures (summary, downsampled series, groups, histogram, failures) are plain
JSON. The blocks, needed to list what is live at any moment the reader picks, are the
bulk of a large log, so they go as gzip-compressed JSON in base64, decompressed by the
page with the browser's DecompressionStream, in compact columns: each block's start
record and its allocation time as differences from the previous block's, its life in
records (0: never freed), one index into a table of the distinct
(size, tag, stream, thread) kinds, and its address in hexadecimal.
"""

import base64
import gzip
import json
import os
import re

from timeline import OPEN

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_FAILURES = 5000  # failures embedded (all are counted)
MAX_PROBLEMS = 100   # skipped lines embedded (all are counted)


def _deltas(values):
    out, prev = [], 0
    for v in values:
        out.append(v - prev)
        prev = v
    return out


def blocks_payload(tl):
    """The blocks as the page's compact columns (see the module comment)."""
    b = tl.blocks
    kinds, kind_of, kind = [], {}, []
    for key in zip(b.size, b.tag, b.stream, b.thread):
        k = kind_of.get(key)
        if k is None:
            k = kind_of[key] = len(kinds)
            kinds.append(key)
        kind.append(k)
    life = [0 if e == OPEN else e - s for s, e in zip(b.start, b.end)]
    return {"start": _deltas(b.start), "time": _deltas(b.time_us), "life": life, "kind": kind,
            "kinds": kinds, "ptr": [format(p, "x") for p in b.ptr]}


def figures(tl, log, source):
    """The page's plain-JSON figures."""
    s = tl.series
    group = lambda g: {"label": g.label, "allocations": g.allocations, "bytes": g.bytes, "live": g.live,
                       "peak": g.peak, "at_peak": g.at_peak, "failures": g.failures,
                       "failed_bytes": g.failed_bytes}
    return {
        "source": source, "records": tl.records, "skipped": len(log.problems),
        "problems": [{"line": p.line, "message": p.message} for p in log.problems[:MAX_PROBLEMS]],
        "t0_us": tl.t0_us, "span_us": tl.span_us, "threads": tl.threads,
        "tags": [group(g) for g in tl.tags], "streams": [group(g) for g in tl.streams],
        "peak": {"bytes": tl.peak_bytes, "record": tl.peak_record, "time_us": tl.peak_time_us,
                 "line": log.line[tl.peak_record] if tl.peak_record >= 0 else 0,
                 "blocks": len(tl.peak_blocks)},
        "end": {"bytes": tl.end_bytes, "blocks": tl.end_blocks},
        "blocks": len(tl.blocks.start),
        "odd": {"unmatched_frees": tl.unmatched_frees, "reused_live": tl.reused_live,
                "refused_frees": tl.refused_frees},
        "series": {"count": s.count, "tags": s.display_tags, "high": s.high, "record": s.record,
                   "time_us": s.time_us, "stacks": s.stacks, "lane_streams": s.lane_streams,
                   "lanes": s.lanes},
        "histogram": [list(h) for h in tl.histogram],
        "failures": {"count": len(tl.failures), "shown": [list(f) for f in tl.failures[:MAX_FAILURES]]},
        "held": held_figures(tl),
    }


def held_figures(tl):
    """What the stack held, from the log's samples (None without any): the peak and the
    per-span series the timeline draws above the live bytes."""
    h = tl.held
    if h is None:
        return None
    return {"points": h.points, "kinds": h.kinds, "peak": h.peak, "peak_time_us": h.peak_time_us,
            "peak_line": h.peak_line, "peak_live": h.peak_live, "peak_cached": h.peak_cached,
            "peak_queued": h.peak_queued, "peak_reserved": h.peak_reserved, "reserved_peak": h.reserved_peak,
            "ratio": h.peak / tl.peak_bytes if tl.peak_bytes and "held" in h.kinds else None,
            "held": h.held, "cached": h.cached, "queued": h.queued, "reserved": h.reserved, "used": h.used}


def _script_json(obj):
    """JSON safe inside a <script> element."""
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def render(tl, log, source, title=None):
    """The page's HTML text."""
    with open(os.path.join(HERE, "page.html"), encoding="utf-8") as f:
        html = f.read()
    with open(os.path.join(HERE, "page.js"), encoding="utf-8") as f:
        script = f.read()
    blob = gzip.compress(json.dumps(blocks_payload(tl), separators=(",", ":")).encode(), compresslevel=6)
    title = title or f"xlogrt memory: {os.path.basename(source)}"
    parts = {
        "@TITLE@": title.replace("&", "&amp;").replace("<", "&lt;"),
        "@FIGURES@": _script_json(figures(tl, log, source)),
        "@BLOCKS@": base64.b64encode(blob).decode("ascii"),
        "@SCRIPT@": script.replace("</script", "<\\/script"),
    }
    missing = [k for k in parts if k not in html]
    if missing:
        raise RuntimeError(f"page.html lacks {', '.join(missing)}")
    return re.sub("@(TITLE|FIGURES|BLOCKS|SCRIPT)@", lambda m: parts[m.group(0)], html)
