# SPDX-License-Identifier: Apache-2.0
"""What a log says about device memory: the blocks and their lives, the live bytes
after every record and their peak (exact), the blocks live at any record, a timeline
downsampled for drawing, per-tag and per-stream figures, an allocation-size histogram
and the failed allocations.

Order. Records are taken in file order, the order Logging saw the operations (an
allocate is logged after the upstream returned, a free before it reaches the upstream,
so an address is never live twice). A block lives over the records [start, end) between
its allocate and its free, and every figure — the live bytes, the peak, the blocks live
at a record — is computed from those lives, so they agree with one another exactly.
Times are made monotone (a record stamped before the previous one, by another thread,
is placed at the previous one's time); they place records on the time axis only.

What the stack held. A log with samples (memlog's module comment) also gives, beside the
live bytes, what the stack below Logging held: the base's held bytes, the cache's idle
blocks, the queued frees and the pool's reserve. Consecutive sample lines make one sample
point (a `sample held` line, or a figure the point already has, starts the next). Each
point is placed after the records read before it, at its own time (made no earlier than
theirs). The peak held is the highest held over the points, with the log's live bytes
just before it; per span of the Series, the point with the most held in the span, or,
where the span has none, the last point before it (figures are levels: they hold until
the next sample).

Odd records are counted, never fatal: a free of an address not live in the log (a log
started mid-run), an allocate of an address still live (its free was not logged: the
old block ends there), a `free failure` (the upstream refused the free: the block stays
live, as if the free had not happened).
"""

from dataclasses import dataclass, field

from memlog import ALLOCATE, ALLOCATE_FAILURE, FREE, FREE_FAILURE, NO_TAG

OPEN = -1  # the end of a block still live when the log ends


def tag_label(tag):
    return "untagged" if tag in (0, NO_TAG) else f"tag {tag}"


@dataclass
class Group:
    """The figures of one tag or one stream."""
    label: str
    allocations: int = 0
    bytes: int = 0        # allocated in all
    live: int = 0         # live bytes at the end of the log
    peak: int = 0         # its own largest live bytes
    at_peak: int = 0      # its live bytes at the overall peak
    failures: int = 0
    failed_bytes: int = 0


@dataclass
class Blocks:
    """Every successful allocation, in log order, as parallel lists. `start` and `end`
    are record numbers (0-based, in file order); end is OPEN for a block never freed."""
    start: list = field(default_factory=list)
    end: list = field(default_factory=list)
    time_us: list = field(default_factory=list)  # of the allocate, relative to the first record
    size: list = field(default_factory=list)
    tag: list = field(default_factory=list)      # index into Timeline.tags
    stream: list = field(default_factory=list)   # index into Timeline.streams
    thread: list = field(default_factory=list)   # index into Timeline.threads
    ptr: list = field(default_factory=list)

    def live_at(self, record):
        """Indices of the blocks live just after `record`, largest first (-1: none)."""
        out = [i for i in range(len(self.start))
               if self.start[i] <= record and (self.end[i] == OPEN or self.end[i] > record)]
        out.sort(key=lambda i: (-self.size[i], self.start[i]))
        return out


@dataclass
class Series:
    """The live bytes downsampled to `count` equal spans of time, each span keeping the
    moment of its highest live bytes (so the peak's span shows the exact peak): `high`
    the bytes then, `record` the record (-1: before the first), `time_us` its time, and
    `stacks[k]` the bytes of display tag k then (the last entry is all other tags).
    `lanes[j]` is the highest live bytes of stream lane_streams[j] in each span."""
    count: int
    display_tags: list
    high: list
    record: list
    time_us: list
    stacks: list
    lane_streams: list
    lanes: list


@dataclass
class Held:
    """What the stack held, from the log's samples (see the module comment). Figures the
    log does not carry are None; per span lists hold None before the first sample."""
    points: int                # sample points in the log
    kinds: list                # the figures the log carries: of held, cached, queued, reserved, used
    peak: int                  # the highest held (0 without a held figure)
    peak_time_us: int          # relative to the first record
    peak_line: int             # the log line of the peak's `sample held`
    peak_live: int             # the log's live bytes when the peak was sampled
    peak_cached: object        # the peak point's figures (None where absent)
    peak_queued: object
    peak_reserved: object
    reserved_peak: object      # the highest pool reserve over the points
    held: list                 # per span
    cached: list
    queued: list
    reserved: list
    used: list


@dataclass
class Timeline:
    records: int
    t0_us: int                 # time of the first record (microseconds since its midnight)
    span_us: int
    tags: list                 # Group per tag, in first-seen order
    streams: list              # Group per stream
    threads: list              # thread ids as written
    blocks: Blocks
    peak_bytes: int
    peak_record: int           # the first record after which peak_bytes were live (-1: none)
    peak_time_us: int          # relative to the first record
    peak_blocks: list          # block indices live at the peak, largest first
    end_bytes: int
    end_blocks: int
    failures: list             # (record, time_us, size, tag idx, stream idx, thread idx)
    histogram: list            # (low, high, count, bytes): allocation sizes in [low, high)
    unmatched_frees: int
    reused_live: int
    refused_frees: int
    series: Series
    held: object = None        # Held, or None for a log without samples


def build(log, spans=1000, display_tags=10, lanes=16):
    """Everything above, from `log` (memlog.Log): three passes over the records."""
    n = len(log)
    b, groups, times, failures, hist, odd = _blocks(log)
    tags, streams, threads = groups
    opens, closes = [-1] * n, [-1] * n
    for i, (s, e) in enumerate(zip(b.start, b.end)):
        opens[s] = i
        if e != OPEN:
            closes[e] = i

    # The live bytes after each record, and the first record at the highest.
    total = peak = 0
    peak_record = -1
    live_after = [0] * n
    for r in range(n):
        if closes[r] >= 0:
            total -= b.size[closes[r]]
        if opens[r] >= 0:
            total += b.size[opens[r]]
            if total > peak:
                peak, peak_record = total, r
        live_after[r] = total
    peak_blocks = b.live_at(peak_record) if peak_record >= 0 else []
    for i in peak_blocks:
        tags[b.tag[i]].at_peak += b.size[i]
        streams[b.stream[i]].at_peak += b.size[i]

    def ranked(gs, k):
        order = sorted(range(len(gs)), key=lambda i: (-gs[i].at_peak, -gs[i].bytes, i))
        return order[:k]

    series = _downsample(b, tags, streams, times, opens, closes, spans,
                         ranked(tags, display_tags if len(tags) > display_tags + 1 else len(tags)),
                         ranked(streams, lanes))
    histogram = [(1 << (k - 1) if k else 0, 1 << k, c, s) for k, (c, s) in sorted(hist.items())]
    live_end = [i for i in range(len(b.start)) if b.end[i] == OPEN]
    return Timeline(
        records=n, t0_us=log.time_us[0] if n else 0, span_us=times[-1] if n else 0,
        tags=tags, streams=streams, threads=threads, blocks=b,
        peak_bytes=peak, peak_record=peak_record,
        peak_time_us=times[peak_record] if peak_record >= 0 else 0, peak_blocks=peak_blocks,
        end_bytes=sum(b.size[i] for i in live_end), end_blocks=len(live_end),
        failures=failures, histogram=histogram,
        unmatched_frees=odd[0], reused_live=odd[1], refused_frees=odd[2], series=series,
        held=_held(log, times, live_after, spans) if log.samples else None)


def _blocks(log):
    """Pass 1: the blocks with their lives, the groups' counts, the monotone times
    (relative to the first record), the failures, the size histogram, the odd records."""
    n = len(log)
    tag_ix, stream_ix, thread_ix = {}, {}, {}
    tags, streams, threads = [], [], []
    b = Blocks()
    live = {}     # pointer -> live block
    freed = {}    # pointer -> the block its last free ended (for `free failure`)
    failures, hist, times = [], {}, [0] * n
    unmatched = reused = refused = 0
    t0 = t_prev = log.time_us[0] if n else 0

    def index(table, groups, key, make):
        i = table.get(key)
        if i is None:
            i = table[key] = len(groups)
            groups.append(make(key))
        return i

    for r in range(n):
        t = log.time_us[r]
        if t < t_prev:
            t = t_prev
        t_prev = t
        times[r] = t - t0
        a, p = log.action[r], log.ptr[r]
        if a == ALLOCATE or a == ALLOCATE_FAILURE:
            size = log.size[r]
            ti = index(tag_ix, tags, log.tag[r], lambda k: Group(tag_label(k)))
            si = index(stream_ix, streams, log.stream[r], lambda k: Group(f"stream {k}"))
            hi = index(thread_ix, threads, log.thread[r], lambda k: k)
            if a == ALLOCATE_FAILURE:
                for g in (tags[ti], streams[si]):
                    g.failures += 1
                    g.failed_bytes += size
                failures.append((r, t - t0, size, ti, si, hi))
                continue
            if p in live:
                reused += 1
                b.end[live[p]] = r
            live[p] = len(b.start)
            b.start.append(r)
            b.end.append(OPEN)
            b.time_us.append(t - t0)
            b.size.append(size)
            b.tag.append(ti)
            b.stream.append(si)
            b.thread.append(hi)
            b.ptr.append(p)
            for g in (tags[ti], streams[si]):
                g.allocations += 1
                g.bytes += size
            k = size.bit_length()
            c = hist.get(k)
            hist[k] = (c[0] + 1, c[1] + size) if c else (1, size)
        elif a == FREE:
            k = live.pop(p, None)
            if k is None:
                unmatched += 1
            else:
                b.end[k] = r
                freed[p] = k
        elif a == FREE_FAILURE:
            k = freed.pop(p, None)
            if k is not None and p not in live:
                refused += 1
                b.end[k] = OPEN
                live[p] = k
    return b, (tags, streams, threads), times, failures, hist, (unmatched, reused, refused)


def _downsample(b, tags, streams, times, opens, closes, spans, shown_tags, lane_streams):
    """Pass 3: the Series, and each group's own peak and final live bytes."""
    n = len(times)
    spans = max(1, spans)
    width = max(1, times[-1] + 1 if n else 1)
    slot_of = [len(shown_tags)] * len(tags)
    for k, t in enumerate(shown_tags):
        slot_of[t] = k
    lane_of = {s: j for j, s in enumerate(lane_streams)}
    vec = [0] * (len(shown_tags) + 1)
    high, rec, when = [0] * spans, [-1] * spans, [0] * spans
    stacks = [None] * spans
    lanes = [[0] * spans for _ in lane_streams]
    tag_live, stream_live = [0] * len(tags), [0] * len(streams)
    total, cur = 0, -1
    for r in range(n):
        span = times[r] * spans // width
        if span != cur:  # spans entered (and skipped) start at the level before r
            for k in range(cur + 1, span + 1):
                high[k], rec[k], when[k], stacks[k] = total, r - 1, times[r - 1] if r else 0, vec[:]
                for j, s in enumerate(lane_streams):
                    lanes[j][k] = stream_live[s]
            cur = span
        for i, sign in ((closes[r], -1), (opens[r], 1)):
            if i < 0:
                continue
            d = sign * b.size[i]
            t, s = b.tag[i], b.stream[i]
            total += d
            vec[slot_of[t]] += d
            tag_live[t] += d
            stream_live[s] += d
            if tag_live[t] > tags[t].peak:
                tags[t].peak = tag_live[t]
            if stream_live[s] > streams[s].peak:
                streams[s].peak = stream_live[s]
            j = lane_of.get(s)
            if j is not None and stream_live[s] > lanes[j][span]:
                lanes[j][span] = stream_live[s]
        if total > high[span]:
            high[span], rec[span], when[span], stacks[span] = total, r, times[r], vec[:]
    for k in range(cur + 1, spans):  # after the last record
        high[k], rec[k], when[k], stacks[k] = total, n - 1, times[-1] if n else 0, vec[:]
        for j, s in enumerate(lane_streams):
            lanes[j][k] = stream_live[s]
    for g, v in zip(tags + streams, tag_live + stream_live):
        g.live = v
    return Series(spans, shown_tags, high, rec, when,
                  [[st[k] for st in stacks] for k in range(len(vec))], lane_streams, lanes)



HELD_KINDS = ("held", "cached", "queued", "reserved", "used")


def _held(log, times, live_after, spans):
    """The Held figures from the log's samples (see the module comment)."""
    n = len(times)
    t0 = log.time_us[0] if n else 0
    points = []  # (after, time_us, figures, line of its first figure)
    for smp in log.samples:
        if not points or smp.kind == "held" or smp.kind in points[-1][2]:
            floor = times[smp.after - 1] if 0 < smp.after <= n else 0
            points.append((smp.after, max(floor, smp.time_us - t0), {}, smp.line))
        points[-1][2][smp.kind] = smp.value
    kinds = [k for k in HELD_KINDS if any(k in p[2] for p in points)]

    spans = max(1, spans)
    width = max(1, times[-1] + 1 if n else 1)
    best, last = [None] * spans, [None] * spans
    peak = None
    reserved_peak = None
    for p in points:
        f = p[2]
        k = min(spans - 1, p[1] * spans // width)
        if best[k] is None or f.get("held", -1) > best[k][2].get("held", -1):
            best[k] = p
        last[k] = p
        if "held" in f and (peak is None or f["held"] > peak[2]["held"]):
            peak = p
        if "reserved" in f and (reserved_peak is None or f["reserved"] > reserved_peak):
            reserved_peak = f["reserved"]
    per = {kind: [None] * spans for kind in HELD_KINDS}
    carry = None
    for k in range(spans):
        p = best[k] or carry
        if p is not None:
            for kind in HELD_KINDS:
                per[kind][k] = p[2].get(kind)
        if last[k] is not None:
            carry = last[k]
    pf = peak[2] if peak else {}
    return Held(points=len(points), kinds=kinds,
                peak=pf.get("held", 0), peak_time_us=peak[1] if peak else 0, peak_line=peak[3] if peak else 0,
                peak_live=live_after[peak[0] - 1] if peak and 0 < peak[0] <= n else 0,
                peak_cached=pf.get("cached"), peak_queued=pf.get("queued"), peak_reserved=pf.get("reserved"),
                reserved_peak=reserved_peak,
                held=per["held"], cached=per["cached"], queued=per["queued"], reserved=per["reserved"],
                used=per["used"])
