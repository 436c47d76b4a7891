#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/memviz without a browser: reading logs (xlogrt's columns, RMM's, headers in any
order, malformed lines reported with their line numbers and skipped), the peak and the
blocks live at it on logs whose answer is known, the downsampled series keeping the peak
exact, what the stack held from the log's sample lines (and a log without them as
before), and the command line's exit status, summary and page."""

import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "memviz"))
sys.path.insert(0, HERE)

import memlog      # noqa: E402
import memviz      # noqa: E402
import page        # noqa: E402
import timeline    # noqa: E402
from synthetic_log import generate, tod  # noqa: E402

HEADER = "Thread,Time,Action,Pointer,Size,Stream,Tag"


def log_of(*lines):
    return memlog.read_lines(io.StringIO("\n".join(lines) + "\n"))


def line(thread, us, action, ptr, size, stream, tag=None):
    cols = [str(thread), tod(36_000_000_000 + us), action, hex(ptr), str(size), str(stream)]
    return ",".join(cols + ([str(tag)] if tag is not None else []))


class Parsing(unittest.TestCase):
    def test_xlogrt_columns(self):
        log = log_of(HEADER, "140573312345856,10:30:45.123456,allocate,0x7f8a40000000,1024,2,5",
                     "140573312345856,10:30:45.123999,free,0x7f8a40000000,1024,2,5")
        self.assertEqual(len(log), 2)
        self.assertEqual(log.problems, [])
        self.assertEqual(log.thread[0], "140573312345856")
        self.assertEqual(log.time_us[0], ((10 * 60 + 30) * 60 + 45) * 1_000_000 + 123456)
        self.assertEqual(log.action, [memlog.ALLOCATE, memlog.FREE])
        self.assertEqual(log.ptr[0], 0x7f8a40000000)
        self.assertEqual(log.size[0], 1024)
        self.assertEqual(log.stream[0], "2")
        self.assertEqual(log.tag[0], 5)
        self.assertEqual(log.line, [2, 3])

    def test_rmm_columns_without_tag_and_a_pointer_stream(self):
        log = log_of("Thread,Time,Action,Pointer,Size,Stream",
                     "7,01:02:03.5,allocate,0x10,64,0x55d0c0a0",
                     "7,01:02:03.6,allocate failure,0x0,1099511627776,0x55d0c0a0")
        self.assertEqual(log.problems, [])
        self.assertEqual(log.tag, [memlog.NO_TAG, memlog.NO_TAG])
        self.assertEqual(log.stream[0], "0x55d0c0a0")
        self.assertEqual(log.time_us[0], ((1 * 60 + 2) * 60 + 3) * 1_000_000 + 500_000)
        self.assertEqual(log.action[1], memlog.ALLOCATE_FAILURE)
        self.assertEqual(timeline.tag_label(log.tag[0]), "untagged")

    def test_columns_are_found_by_name(self):
        log = log_of("Tag,Extra,Size,Stream,Pointer,Action,Time,Thread",
                     "9,whatever,128,3,0xabc,allocate,00:00:01.000001,42")
        self.assertEqual(log.problems, [])
        self.assertEqual((log.tag[0], log.size[0], log.stream[0], log.ptr[0], log.thread[0]),
                         (9, 128, "3", 0xabc, "42"))
        self.assertEqual(log.time_us[0], 1_000_001)

    def test_no_header_and_crlf(self):
        log = log_of("1,00:00:00.000010,allocate,0x100,8,0,3\r", "1,00:00:00.000020,free,0x100,8,0,3\r")
        self.assertEqual(log.problems, [])
        self.assertEqual(log.tag, [3, 3])
        self.assertEqual(log.time_us, [10, 20])

    def test_a_repeated_header_is_skipped(self):
        log = log_of(HEADER, line(1, 0, "allocate", 0x100, 8, 0, 1), HEADER, line(1, 5, "free", 0x100, 8, 0, 1))
        self.assertEqual(len(log), 2)
        self.assertEqual(log.problems, [])

    def test_malformed_lines_are_reported_with_their_line_number_and_skipped(self):
        log = log_of(HEADER,
                     line(1, 0, "allocate", 0x100, 8, 0, 1),       # 2
                     "1,10:00:00.000001,allocate,0x200,8,0",        # 3: a field short
                     "1,10:00:00.000002,allocate,0x200,eight,0,1",  # 4: Size
                     "1,10:00:00.000003,reallocate,0x200,8,0,1",    # 5: Action
                     "1,25:00:00.000004,allocate,0x200,8,0,1",      # 6: Time out of range
                     "1,10:00,allocate,0x200,8,0,1",                # 7: Time
                     "1,10:00:00.000005,allocate,0xzz,8,0,1",       # 8: Pointer
                     "1,10:00:00.000006,allocate,0x200,8,0,-1",     # 9: Tag
                     ",10:00:00.000007,allocate,0x200,8,0,1",       # 10: Thread
                     "\x00\xff garbage \x01",                       # 11
                     line(1, 9, "free", 0x100, 8, 0, 1))            # 12
        self.assertEqual([p.line for p in log.problems], list(range(3, 12)))
        self.assertEqual(log.line, [2, 12])
        messages = [p.message for p in log.problems]
        self.assertIn("6 fields, expected 7", messages[0])
        self.assertIn("Size", messages[1])
        self.assertIn("Action", messages[2])
        self.assertIn("Time", messages[3])
        self.assertIn("Time", messages[4])
        self.assertIn("Pointer", messages[5])
        self.assertIn("Tag", messages[6])
        self.assertIn("Thread", messages[7])

    def test_a_second_header_with_other_columns_is_reported(self):
        log = log_of(HEADER, line(1, 0, "allocate", 0x100, 8, 0, 1), "Thread,Time,Action,Pointer,Size,Stream",
                     line(1, 5, "free", 0x100, 8, 0, 1))
        self.assertEqual([p.line for p in log.problems], [3])
        self.assertEqual(len(log), 2)

    def test_a_header_without_a_column_is_a_named_error(self):
        with self.assertRaises(memlog.LogError) as e:
            log_of("Thread,Time,Action,Pointer,Stream", "1,00:00:00.0,allocate,0x1,0")
        self.assertIn("Size", str(e.exception))
        self.assertIn("line 1", str(e.exception))

    def test_an_unreadable_file_is_a_named_error(self):
        with self.assertRaises(memlog.LogError) as e:
            memlog.read_log("/nonexistent-dir/log.csv")
        self.assertIn("/nonexistent-dir/log.csv", str(e.exception))

    def test_a_log_past_midnight_keeps_counting(self):
        log = log_of(HEADER, "1,23:59:59.999000,allocate,0x100,8,0,1", "1,00:00:00.001000,free,0x100,8,0,1")
        self.assertEqual(log.time_us[1] - log.time_us[0], 2000)


class Garbage(unittest.TestCase):
    def test_mutated_lines_are_skipped_or_read_never_a_crash(self):
        import random
        rng = random.Random(11)
        lines, _ = generate(1500, 9, threads=3, fail_every=13)
        alphabet = ",:.x0123456789abcdefz- \t\x00\xff"
        mutated = [lines[0]]
        for text in lines[1:]:
            chars = list(text)
            for _ in range(rng.randrange(3)):
                op, at = rng.randrange(3), rng.randrange(len(chars))
                if op == 0:
                    chars[at] = rng.choice(alphabet)
                elif op == 1:
                    del chars[at]
                else:
                    chars.insert(at, rng.choice(alphabet))
            mutated.append("".join(chars))
        log = memlog.read_lines(io.StringIO("\n".join(mutated)))
        counted = sum(1 for t in mutated[1:] if t.strip())
        self.assertEqual(len(log) + len(log.problems), counted)
        self.assertGreater(len(log.problems), 100)
        self.assertTrue(all(2 <= p.line <= len(mutated) for p in log.problems))
        tl = timeline.build(log)
        self.assertIn("memviz-figures", page.render(tl, log, "mutated.csv"))


class Peak(unittest.TestCase):
    # Sizes chosen so that every partial sum differs: the peak names one moment.
    A, B, C, D, E = 1000, 30000, 500, 200000, 7

    def known(self):
        A, B, C, D, E = self.A, self.B, self.C, self.D, self.E
        return log_of(HEADER,
                      line(11, 0, "allocate", 0x1000, A, 0, 1),
                      line(11, 10, "allocate", 0x2000, B, 0, 1),
                      line(12, 20, "allocate", 0x3000, C, 1, 2),
                      line(12, 30, "free", 0x1000, A, 0, 1),
                      line(12, 40, "allocate failure", 0, 10 ** 12, 1, 2),
                      line(13, 50, "allocate", 0x4000, D, 2, 3),     # the peak: B + C + D
                      line(11, 60, "free", 0x2000, B, 0, 1),
                      line(13, 70, "allocate", 0x5000, E, 2, 3),
                      line(13, 80, "free", 0x4000, D, 2, 3))

    def test_the_peak_and_the_blocks_live_at_it(self):
        tl = timeline.build(self.known())
        self.assertEqual(tl.peak_bytes, self.B + self.C + self.D)
        self.assertEqual(tl.peak_record, 5)
        self.assertEqual(tl.peak_time_us, 50)
        b = tl.blocks
        self.assertEqual([b.ptr[i] for i in tl.peak_blocks], [0x4000, 0x2000, 0x3000])  # largest first
        self.assertEqual(tl.end_bytes, self.C + self.E)
        self.assertEqual(tl.end_blocks, 2)
        self.assertEqual(len(tl.failures), 1)
        self.assertEqual(tl.failures[0][2], 10 ** 12)
        tags = {g.label: g for g in tl.tags}
        self.assertEqual(set(tags), {"tag 1", "tag 2", "tag 3"})
        self.assertEqual(tags["tag 1"].at_peak, self.B)
        self.assertEqual(tags["tag 1"].peak, self.A + self.B)
        self.assertEqual(tags["tag 1"].allocations, 2)
        self.assertEqual(tags["tag 2"].failures, 1)
        self.assertEqual(tags["tag 3"].bytes, self.D + self.E)
        self.assertEqual(tags["tag 3"].live, self.E)
        streams = {g.label: g for g in tl.streams}
        self.assertEqual(streams["stream 2"].at_peak, self.D)
        self.assertEqual(sorted(tl.threads), ["11", "12", "13"])

    def test_the_blocks_live_at_any_record(self):
        tl = timeline.build(self.known())
        at = lambda r: sorted(tl.blocks.ptr[i] for i in tl.blocks.live_at(r))
        self.assertEqual(at(-1), [])
        self.assertEqual(at(2), [0x1000, 0x2000, 0x3000])
        self.assertEqual(at(3), [0x2000, 0x3000])
        self.assertEqual(at(8), [0x3000, 0x5000])

    def test_the_histogram_counts_sizes_in_powers_of_two(self):
        tl = timeline.build(self.known())
        counted = {}
        for size in (self.A, self.B, self.C, self.D, self.E):
            lo = 1 << (size.bit_length() - 1)
            counted[lo] = counted.get(lo, 0) + 1
        self.assertEqual({lo: c for lo, hi, c, _ in tl.histogram}, counted)
        for lo, hi, _, _ in tl.histogram:
            self.assertEqual(hi, 2 * lo)

    def test_odd_records_are_counted_and_kept_consistent(self):
        log = log_of(HEADER,
                     line(1, 0, "free", 0x9000, 64, 0, 1),                # never allocated in the log
                     line(1, 1, "allocate", 0x1000, 100, 0, 1),
                     line(1, 2, "allocate", 0x1000, 300, 0, 1),           # its free was not logged
                     line(1, 3, "free", 0x1000, 300, 0, 1),
                     line(1, 4, "free failure", 0x1000, 300, 0, 1),       # refused: still live
                     line(1, 5, "allocate", 0x2000, 50, 0, 1))
        tl = timeline.build(log)
        self.assertEqual((tl.unmatched_frees, tl.reused_live, tl.refused_frees), (1, 1, 1))
        self.assertEqual(tl.peak_bytes, 350)
        self.assertEqual(tl.end_bytes, 350)
        self.assertEqual(sorted(tl.blocks.size[i] for i in tl.peak_blocks), [50, 300])

    def test_an_empty_log_has_no_peak(self):
        tl = timeline.build(log_of(HEADER))
        self.assertEqual((tl.peak_bytes, tl.peak_record, tl.peak_blocks), (0, -1, []))


class Synthetic(unittest.TestCase):
    """Against the generator's own account, on logs of several shapes."""

    def test_peak_tags_failures_and_series_agree_with_the_generator(self):
        for seed, records, threads, fail_every in ((1, 3000, 4, 0), (2, 5000, 6, 37), (3, 800, 1, 5)):
            with self.subTest(seed=seed):
                lines, want = generate(records, seed, threads=threads, fail_every=fail_every)
                log = memlog.read_lines(io.StringIO("\n".join(lines)))
                tl = timeline.build(log, spans=300)
                self.assertEqual(tl.peak_bytes, want["peak"])
                self.assertEqual({tl.blocks.ptr[i] for i in tl.peak_blocks}, set(want["peak_live"]))
                self.assertEqual(len(tl.tags), len(want["tags"]))
                self.assertEqual(len(tl.streams), len(want["streams"]))
                self.assertEqual(len(tl.failures), want["failures"])
                self.assertEqual(tl.end_bytes, want["end"])
                s = tl.series
                self.assertEqual(max(s.high), want["peak"])  # downsampled, the peak stays exact
                for k in range(s.count):
                    self.assertEqual(sum(stack[k] for stack in s.stacks), s.high[k])
                    self.assertLessEqual(s.high[k], want["peak"])
                self.assertEqual(sum(g.at_peak for g in tl.tags), want["peak"])

    def test_tags_beyond_the_display_count_fold_into_one_stack(self):
        lines, want = generate(2000, 4, threads=4, tags_per_thread=5)
        tl = timeline.build(memlog.read_lines(io.StringIO("\n".join(lines))), display_tags=6)
        self.assertEqual(len(tl.tags), 20)
        self.assertEqual(len(tl.series.display_tags), 6)
        self.assertEqual(len(tl.series.stacks), 7)
        self.assertEqual(max(tl.series.high), want["peak"])


def sample_lines(thread, us, held, cached=None, queued=None, reserved=None, used=None):
    out = [line(thread, us, "sample held", 0, held, 0, 0)]
    for kind, v in (("cached", cached), ("queued", queued), ("pool reserved", reserved), ("pool used", used)):
        if v is not None:
            out.append(line(thread, us, f"sample {kind}", 0, v, 0, 0))
    return out


class Held(unittest.TestCase):
    """What the stack held, from the sample lines Logging writes."""

    def known(self):
        return log_of(HEADER,
                      line(1, 0, "allocate", 0x1000, 1000, 0, 1),                            # record 0
                      *sample_lines(1, 0, 1000 + 4096, cached=4096, queued=0, reserved=1 << 21, used=5096),
                      line(1, 100, "allocate", 0x2000, 3000, 0, 1),                          # record 1
                      line(1, 200, "free", 0x1000, 1000, 0, 1),                              # record 2
                      *sample_lines(1, 200, 3000 + 1000 + 500 + 8192, cached=1000, queued=8192 + 500,
                                    reserved=1 << 21, used=12692),                           # the held peak
                      line(1, 300, "free", 0x2000, 3000, 0, 1),                              # record 3
                      line(1, 999, "allocate", 0x3000, 10, 0, 1),                            # record 4
                      *sample_lines(1, 999, 10 + 4000, cached=4000, queued=0, reserved=1 << 22, used=4010))

    def test_sample_lines_are_kept_apart_from_the_records(self):
        log = self.known()
        self.assertEqual(log.problems, [])
        self.assertEqual(len(log), 5)  # the allocations and frees alone
        self.assertEqual(log.action, [memlog.ALLOCATE, memlog.ALLOCATE, memlog.FREE, memlog.FREE, memlog.ALLOCATE])
        self.assertEqual(len(log.samples), 15)
        first = log.samples[0]
        self.assertEqual((first.after, first.kind, first.value, first.line), (1, "held", 5096, 3))
        self.assertEqual([x.kind for x in log.samples[:5]], ["held", "cached", "queued", "reserved", "used"])
        self.assertEqual(log.samples[5].after, 3)
        self.assertEqual(log.samples[-1].after, 5)

    def test_the_held_peak_and_what_it_is_made_of(self):
        tl = timeline.build(self.known(), spans=10)
        h = tl.held
        self.assertIsNotNone(h)
        self.assertEqual(h.points, 3)
        self.assertEqual(h.kinds, ["held", "cached", "queued", "reserved", "used"])
        self.assertEqual(h.peak, 12692)
        self.assertEqual(h.peak_time_us, 200)
        self.assertEqual(h.peak_line, 10)
        self.assertEqual(h.peak_live, 3000)  # after record 2: the log's own live bytes
        self.assertEqual((h.peak_cached, h.peak_queued, h.peak_reserved), (1000, 8692, 1 << 21))
        self.assertEqual(h.reserved_peak, 1 << 22)
        self.assertEqual(tl.peak_bytes, 4000)  # the live peak is as without samples
        # Per span (100 us each): the sample in the span, else the last one before it.
        self.assertEqual(h.held, [5096, 5096, 12692, 12692, 12692, 12692, 12692, 12692, 12692, 4010])
        self.assertEqual(h.cached, [4096, 4096, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 4000])
        self.assertEqual(h.reserved[-1], 1 << 22)

    def test_before_the_first_sample_the_figures_are_unknown_and_a_missing_figure_is_absent(self):
        log = log_of(HEADER, line(1, 0, "allocate", 0x1000, 64, 0, 1), line(1, 500, "allocate", 0x2000, 64, 0, 1),
                     *sample_lines(1, 500, 128), line(1, 999, "free", 0x2000, 64, 0, 1))
        h = timeline.build(log, spans=4).held
        self.assertEqual(h.kinds, ["held"])  # a stack without a cache, on a driver without pool counters
        self.assertEqual(h.held, [None, None, 128, 128])
        self.assertEqual(h.cached, [None] * 4)
        self.assertIsNone(h.peak_cached)
        self.assertIsNone(h.reserved_peak)
        self.assertIn("peak held 128 B (128 B), held/live 1.000", memviz.held_line(timeline.build(log)))

    def test_a_log_without_samples_has_no_held_figures(self):
        tl = timeline.build(Peak().known())
        self.assertIsNone(tl.held)
        self.assertIn("not in the log", memviz.held_line(tl))
        self.assertIsNone(page.figures(tl, Peak().known(), "x.csv")["held"])

    def test_a_bad_sample_line_is_reported_and_skipped(self):
        log = log_of(HEADER, line(1, 0, "allocate", 0x1000, 64, 0, 1), "1,10:00:00.000001,sample held,0x0,lots,0,0",
                     "1,10:00:00.000002,sample heap,0x0,1,0,0")
        self.assertEqual([p.line for p in log.problems], [3, 4])
        self.assertIn("Size", log.problems[0].message)
        self.assertIn("sample held", log.problems[1].message)  # the message lists the known actions
        self.assertEqual(log.samples, [])

    def test_against_the_generator_with_samples(self):
        for seed, records, every in ((1, 3000, 50), (2, 5000, 7), (3, 800, 1)):
            with self.subTest(seed=seed):
                lines, want = generate(records, seed, threads=4, fail_every=31, sample_every=every)
                plain, _ = generate(records, seed, threads=4, fail_every=31)
                log = memlog.read_lines(io.StringIO("\n".join(lines)))
                self.assertEqual(log.problems, [])
                tl = timeline.build(log, spans=300)
                ref = timeline.build(memlog.read_lines(io.StringIO("\n".join(plain))), spans=300)
                # The records and every figure of them are as in the same log without samples.
                self.assertEqual((tl.peak_bytes, tl.peak_record, tl.end_bytes), (ref.peak_bytes, ref.peak_record,
                                                                                ref.end_bytes))
                self.assertEqual(tl.series.high, ref.series.high)
                h = tl.held
                self.assertEqual(h.points, want["samples"])
                self.assertEqual(h.peak, want["held_peak"])
                at = want["at_held_peak"]
                self.assertEqual((h.peak_live, h.peak_cached, h.peak_queued, h.peak_reserved),
                                 (at["live"], at["cached"], at["queued"], at["reserved"]))
                if every == 1:  # sampled after every record: held = live + cached + queued >= live, always
                    self.assertGreaterEqual(h.peak, tl.peak_bytes)
                self.assertEqual(max(v for v in h.held if v is not None), h.peak)  # no span loses the peak
                for k in range(300):  # the generator writes every figure: all known, or none yet
                    self.assertEqual(h.held[k] is None, h.cached[k] is None)

    def test_the_page_carries_the_held_series_and_the_summary_says_it(self):
        lines, want = generate(2000, 9, threads=3, sample_every=25)
        log = memlog.read_lines(io.StringIO("\n".join(lines)))
        tl = timeline.build(log, spans=200)
        f = page.figures(tl, log, "s.csv")["held"]
        self.assertEqual(f["peak"], want["held_peak"])
        self.assertEqual(len(f["held"]), 200)
        self.assertEqual(len(f["cached"]), 200)
        self.assertAlmostEqual(f["ratio"], want["held_peak"] / want["peak"])
        text = memviz.summary(tl, log, "s.csv")
        self.assertIn(f"peak live {memviz.fmt_bytes(want['peak'])} ({want['peak']} B)", text)
        self.assertIn(f"peak held {memviz.fmt_bytes(want['held_peak'])} ({want['held_peak']} B)", text)
        self.assertIn(f"held/live {want['held_peak'] / want['peak']:.3f}", text)
        self.assertIn(f"{want['samples']} samples", text)


class CommandLine(unittest.TestCase):
    def run_main(self, text, *extra):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "log.csv")
            with open(path, "w") as f:
                f.write(text)
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                rc = memviz.main([path, "-o", os.path.join(d, "page.html"), *extra])
            html = None
            if os.path.exists(os.path.join(d, "page.html")):
                with open(os.path.join(d, "page.html")) as f:
                    html = f.read()
            return rc, out.getvalue(), err.getvalue(), html

    def test_a_log_with_bad_lines_gives_a_page_a_summary_and_the_line_numbers(self):
        text = "\n".join([HEADER, line(1, 0, "allocate", 0x100, 4096, 0, 3), "oops",
                          line(1, 10, "allocate failure", 0, 1 << 30, 1, 4), line(1, 20, "free", 0x100, 4096, 0, 3)])
        rc, out, err, html = self.run_main(text + "\n")
        self.assertEqual(rc, 0)
        self.assertIn("log.csv:3: skipped", err)
        self.assertIn("peak: 4.00 KiB (4096 bytes) in 1 blocks", out)
        self.assertIn("failed allocations: 1", out)
        self.assertIn("malformed lines skipped: 1", out)
        self.assertIn('"peak":{"bytes":4096', html)
        self.assertNotIn("@FIGURES@", html)
        self.assertNotIn("http://", html.replace("http://www.w3.org/2000/svg", ""))  # nothing fetched

    def test_a_log_with_samples_and_one_without_both_give_a_page(self):
        lines, want = generate(600, 3, threads=2, sample_every=20)
        rc, out, err, html = self.run_main("\n".join(lines) + "\n")
        self.assertEqual((rc, err), (0, ""))
        self.assertIn(f"peak held {memviz.fmt_bytes(want['held_peak'])}", out)
        self.assertIn('"held":{"points":', html)
        plain, _ = generate(600, 3, threads=2)
        rc, out, err, html = self.run_main("\n".join(plain) + "\n")
        self.assertEqual((rc, err), (0, ""))
        self.assertIn("held by the stack: not in the log", out)
        self.assertIn('"held":null', html)

    def test_a_file_without_records_is_an_error(self):
        rc, out, err, html = self.run_main("not a log\nat all\n")
        self.assertEqual(rc, 1)
        self.assertIn("no record", err)
        self.assertIn(":1: skipped", err)
        self.assertIsNone(html)

    def test_a_missing_file_is_an_error(self):
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(memviz.main(["/nonexistent-dir/log.csv", "--quiet"]), 1)
        self.assertIn("cannot read", err.getvalue())

    def test_the_page_embeds_the_blocks_compactly(self):
        lines, want = generate(400, 5, threads=3)
        log = memlog.read_lines(io.StringIO("\n".join(lines)))
        tl = timeline.build(log)
        p = page.blocks_payload(tl)
        starts, t = [], 0
        for d in p["start"]:
            t += d
            starts.append(t)
        self.assertEqual(starts, tl.blocks.start)
        for i, k in enumerate(p["kind"]):
            self.assertEqual(p["kinds"][k], (tl.blocks.size[i], tl.blocks.tag[i], tl.blocks.stream[i],
                                             tl.blocks.thread[i]))


if __name__ == "__main__":
    unittest.main()
