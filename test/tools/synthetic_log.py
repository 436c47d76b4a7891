#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A synthetic xlogrt allocation log, and what a reader must find in it.

Threads (one stream each, a few tags) allocate blocks of power-of-two-ish sizes, hold a
window of them and free them out of order; every `fail_every`-th request fails. The
generator keeps its own account (a dict of live blocks, updated per line), independent of
tools/memviz, and reports the peak, the blocks live at its first moment, the tags and
streams and the failures.

With `sample_every` it also writes, every that many records, the sample lines Logging
writes (held, cached, queued, pool reserved and used) of a simulated stack: a cache that
keeps freed bytes up to `cache_bytes` and serves allocations from them, the frees beyond
it queued until the next sample, a pool that reserves in 2 MiB steps and keeps what it
reserved. Its account adds the peak held, the figures at it and the number of samples.

usage: synthetic_log.py OUT.csv [records=1000000] [seed=1]   (the account is skipped)
"""

import random
import sys

HEADER = "Thread,Time,Action,Pointer,Size,Stream,Tag"


def tod(us):
    us %= 86_400_000_000
    return f"{us // 3_600_000_000:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}.{us % 1_000_000:06d}"


def generate(records, seed=1, threads=4, tags_per_thread=2, window=24, fail_every=0, start_us=36_000_000_000,
             account=True, sample_every=0, cache_bytes=4 << 20):
    """Returns (lines, expected); expected is None without `account`."""
    rng = random.Random(seed)
    lines = [HEADER]
    live = {}                 # ptr -> (size, tag, stream, thread)
    held = [[] for _ in range(threads)]
    next_ptr = 0x7f0000000000
    total = peak = 0
    peak_live = {}
    failures = 0
    tags, streams = set(), set()
    t = start_us
    n = 0
    cached = queued = reserved = 0
    samples, held_peak, at_held_peak = 0, -1, None

    def sample(thread_id):
        nonlocal queued, reserved, samples, held_peak, at_held_peak
        held = total + cached + queued
        reserved = max(reserved, (held + (2 << 20) - 1) // (2 << 20) * (2 << 20))
        for kind, v in (("held", held), ("cached", cached), ("queued", queued),
                        ("pool reserved", reserved), ("pool used", held)):
            lines.append(f"{thread_id},{tod(t)},sample {kind},0x0,{v},0,0")
        samples += 1
        if held > held_peak:
            held_peak, at_held_peak = held, {"live": total, "cached": cached, "queued": queued, "reserved": reserved}
        queued = 0  # the frees queued before this sample are complete by the next

    while n < records:
        th = rng.randrange(threads)
        thread_id = 4000 + th
        stream = th
        t += rng.randrange(0, 40)
        mine = held[th]
        if mine and (len(mine) >= window or rng.random() < 0.45):
            ptr = mine.pop(rng.randrange(len(mine)))
            size, tag, st, _ = live.pop(ptr)
            total -= size
            lines.append(f"{thread_id},{tod(t)},free,{ptr:#x},{size},{st},{tag}")
            kept = min(size, cache_bytes - cached)
            cached += kept
            queued += size - kept
        else:
            size = 256 << rng.randrange(14)
            size += rng.randrange(4) * 256
            tag = 1 + th * tags_per_thread + rng.randrange(tags_per_thread)
            tags.add(tag)
            streams.add(stream)
            if fail_every and n % fail_every == fail_every - 1:
                failures += 1
                lines.append(f"{thread_id},{tod(t)},allocate failure,0x0,{size},{stream},{tag}")
            else:
                ptr = next_ptr
                next_ptr += (size + 0xfff) & ~0xfff
                live[ptr] = (size, tag, stream, thread_id)
                mine.append(ptr)
                total += size
                cached -= min(cached, size)
                lines.append(f"{thread_id},{tod(t)},allocate,{ptr:#x},{size},{stream},{tag}")
                if account and total > peak:
                    peak, peak_live = total, dict(live)
        n += 1
        if sample_every and n % sample_every == 1 % sample_every:  # after the first record, then every sample_every
            sample(thread_id)
    if not account:
        return lines, None
    return lines, {"peak": peak, "peak_live": peak_live, "tags": tags, "streams": streams, "failures": failures,
                   "end": sum(v[0] for v in live.values()), "samples": samples, "held_peak": held_peak,
                   "at_held_peak": at_held_peak}


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    records = int(argv[2]) if len(argv) > 2 else 1_000_000
    seed = int(argv[3]) if len(argv) > 3 else 1
    lines, _ = generate(records, seed, threads=8, tags_per_thread=3, window=64, fail_every=997, account=False)
    with open(argv[1], "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
