#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""memviz: where device memory went. Reads an xlogrt allocation log (Logging's CSV, a
LiveBlocks snapshot, or RAPIDS RMM's logging_resource_adaptor CSV), prints a short
summary (peak, top tags, failures; peak live, peak held and held/live where the log has
samples) and writes one self-contained HTML page: live bytes over time stacked by tag
with the peak marked, above them what the stack held beside them (the cache's idle
blocks and the queued frees stacked on them, and the pool's reserve, from the log's sample
lines), per-stream lanes, failed allocations on the time axis, the blocks live at the
peak or at any moment clicked, the totals per tag and an allocation-size histogram.

usage: memviz.py LOG.csv [-o PAGE.html] [--title TEXT] [--quiet]

Exit status: 0 with a page written; 1 when the log cannot be read or holds no record;
malformed lines are reported on stderr with their line numbers and skipped.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import memlog    # noqa: E402
import page      # noqa: E402
import timeline  # noqa: E402

SHOWN_PROBLEMS = 20


def fmt_bytes(n):
    """1536 -> '1.50 KiB' (as the page writes sizes)."""
    v, unit = float(n), "B"
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024:
            break
        v, unit = v / 1024, u
    return f"{n} B" if unit == "B" else f"{v:.{0 if v >= 100 else 1 if v >= 10 else 2}f} {unit}"


def summary(tl, log, source):
    """The text summary: a few lines for terminals and CI logs."""
    out = [f"memviz: {source}: {tl.records} records over {tl.span_us / 1e6:.3f} s, "
           f"{len(tl.tags)} tags, {len(tl.streams)} streams, {len(tl.threads)} threads"]
    if tl.peak_record >= 0:
        out.append(f"  peak: {fmt_bytes(tl.peak_bytes)} ({tl.peak_bytes} bytes) in {len(tl.peak_blocks)} blocks, "
                   f"+{tl.peak_time_us / 1e6:.6f} s, log line {log.line[tl.peak_record]}")
        top = sorted((g for g in tl.tags if g.at_peak), key=lambda g: -g.at_peak)[:5]
        out.append("  top tags at the peak: " + ", ".join(
            f"{g.label} {fmt_bytes(g.at_peak)} ({100 * g.at_peak / tl.peak_bytes:.1f}%)" for g in top))
    else:
        out.append("  no successful allocation in the log")
    out.append(f"  live at the end: {fmt_bytes(tl.end_bytes)} in {tl.end_blocks} blocks")
    out.append(held_line(tl))
    if tl.failures:
        r, t, size, ti, si, hi = tl.failures[0]
        out.append(f"  failed allocations: {len(tl.failures)}; the first: {fmt_bytes(size)} ({size} bytes), "
                   f"{tl.tags[ti].label}, {tl.streams[si].label}, +{t / 1e6:.6f} s, log line {log.line[r]}")
    else:
        out.append("  failed allocations: none")
    odd = [(tl.unmatched_frees, "frees of addresses not live in the log"),
           (tl.reused_live, "allocations of an address still live"), (tl.refused_frees, "refused frees")]
    odd = [f"{n} {what}" for n, what in odd if n]
    if odd:
        out.append("  also: " + "; ".join(odd))
    if log.problems:
        out.append(f"  malformed lines skipped: {len(log.problems)}")
    return "\n".join(out)


def held_line(tl):
    """The summary's line on what the stack held beside the live bytes."""
    h = tl.held
    if h is None or "held" not in h.kinds:
        return ("  held by the stack: not in the log (no sample lines: an RMM log, an older one, "
                "or LogSinkOptions::sample_every = 0)")
    ratio = f"{h.peak / tl.peak_bytes:.3f}" if tl.peak_bytes else "-"
    parts = [f"live {fmt_bytes(h.peak_live)}"]
    for name, v in (("cached", h.peak_cached), ("queued", h.peak_queued)):
        if v is not None:
            parts.append(f"{name} {fmt_bytes(v)}")
    rest = h.peak - h.peak_live - (h.peak_cached or 0) - (h.peak_queued or 0)
    if rest:
        parts.append(f"other {fmt_bytes(rest)}")
    line = (f"  held by the stack: peak live {fmt_bytes(tl.peak_bytes)} ({tl.peak_bytes} B), "
            f"peak held {fmt_bytes(h.peak)} ({h.peak} B), held/live {ratio}; at the held peak "
            f"(+{h.peak_time_us / 1e6:.6f} s, log line {h.peak_line}): {' + '.join(parts)}")
    if h.reserved_peak is not None:
        line += f"; pool reserved peak {fmt_bytes(h.reserved_peak)} ({h.reserved_peak} B)"
    return line + f"; {h.points} sample{'' if h.points == 1 else 's'}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="memviz", description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="the CSV log")
    ap.add_argument("-o", "--output", help="the page to write (default: LOG with .html)")
    ap.add_argument("--title", help="the page's title")
    ap.add_argument("--quiet", action="store_true", help="print no summary")
    args = ap.parse_args(argv)
    out = args.output or os.path.splitext(args.log)[0] + ".html"
    t_start = time.monotonic()
    try:
        log = memlog.read_log(args.log)
    except memlog.LogError as e:
        print(f"memviz: error: {args.log}: {e}", file=sys.stderr)
        return 1
    for p in log.problems[:SHOWN_PROBLEMS]:
        print(f"memviz: {args.log}:{p.line}: skipped: {p.message}", file=sys.stderr)
    if len(log.problems) > SHOWN_PROBLEMS:
        print(f"memviz: {args.log}: ... and {len(log.problems) - SHOWN_PROBLEMS} more malformed lines",
              file=sys.stderr)
    if len(log) == 0:
        print(f"memviz: error: {args.log}: no record to show", file=sys.stderr)
        return 1
    tl = timeline.build(log)
    html = page.render(tl, log, args.log, args.title)
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(html)
    except OSError as e:
        print(f"memviz: error: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(summary(tl, log, args.log))
        print(f"  page: {out} ({len(html.encode()) / 1e6:.1f} MB, {time.monotonic() - t_start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
