# SPDX-License-Identifier: Apache-2.0
"""Reading an xlogrt allocation log: the CSV that Logging writes (and LiveBlocks'
snapshots), or the one RAPIDS RMM's logging_resource_adaptor writes.

Columns are found by name from the header line (Thread, Time, Action, Pointer, Size,
Stream, and xlogrt's optional Tag; others are ignored); a file without a header is read
in xlogrt's order. The format is the one include/xlogrt/resource/detail/log_record.hpp
writes:

    Thread,Time,Action,Pointer,Size,Stream,Tag
    140573312345856,10:30:45.123456,allocate,0x7f8a40000000,1024,2,5

Samples. xlogrt's Logging also writes, on a clock, what the stack below it holds: a run
of lines at one moment, one per figure, the figure in Size (Pointer, Stream and Tag 0):

    140573312345856,10:30:45.130001,sample held,0x0,7340032,0,0
    140573312345856,10:30:45.130001,sample cached,0x0,2097152,0,0

`sample held` (the base resource's bytes from the device: live, cached and queued),
`sample cached` (a caching layer's idle blocks), `sample queued` (frees queued on
streams, not yet known complete), `sample pool reserved` and `sample pool used` (the
driver pool's counters). They are kept apart from the records (Log.samples), each with
the number of records read before it, so that the records stay allocations and frees
and a log without samples (an older one, RMM's) reads exactly as before.

A malformed line is reported with its line number and skipped; it never stops the
reading. Only an unreadable file or a first header that lacks a column is an error
(LogError).
"""

from dataclasses import dataclass

ALLOCATE, ALLOCATE_FAILURE, FREE, FREE_FAILURE = range(4)
ACTIONS = {"allocate": ALLOCATE, "allocate failure": ALLOCATE_FAILURE,
           "free": FREE, "free failure": FREE_FAILURE}
# A sample's figures, by their Action text (the names Sample's fields take).
SAMPLE_KINDS = {"sample held": "held", "sample cached": "cached", "sample queued": "queued",
                "sample pool reserved": "reserved", "sample pool used": "used"}
REQUIRED = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
XLOGRT_COLUMNS = REQUIRED + ("Tag",)
NO_TAG = -1  # an RMM log: the Tag column is absent
DAY_US = 86_400_000_000


class LogError(Exception):
    """The log cannot be read at all (the file, or its header)."""


@dataclass(frozen=True)
class Problem:
    line: int      # 1-based line number in the file
    message: str


@dataclass
class Sample:
    """One figure of a sample: `after` the number of records read before its line (it
    belongs between record after-1 and record after), `time_us` as the records' times,
    `kind` one of SAMPLE_KINDS' values, `value` the bytes, `line` the line number."""
    after: int
    time_us: int
    kind: str
    value: int
    line: int


@dataclass
class Log:
    """The records of a log in file order, as parallel lists (a million records stay
    cheap): thread and stream as written, time in microseconds since the local midnight
    of the first record (a log that runs past midnight keeps counting), action one of
    ALLOCATE..FREE_FAILURE, pointer and size as integers, tag an integer or NO_TAG, line
    the 1-based line number."""
    thread: list
    time_us: list
    action: list
    ptr: list
    size: list
    stream: list
    tag: list
    line: list
    problems: list  # Problem, one per skipped line
    samples: list = None  # Sample, one per sample line, in file order

    def __post_init__(self):
        if self.samples is None:
            self.samples = []

    def __len__(self):
        return len(self.action)


def parse_time_us(text):
    """HH:MM:SS with an optional fraction of 1 to 9 digits, as microseconds since
    midnight. Raises ValueError naming what is wrong."""
    if len(text) == 15 and text[2] == ":" and text[5] == ":" and text[8] == "." and \
            (text[0:2] + text[3:5] + text[6:8] + text[9:]).isdigit():  # the usual HH:MM:SS.ffffff
        h, m, s = int(text[0:2]), int(text[3:5]), int(text[6:8])
        if h <= 23 and m <= 59 and s <= 60:
            return ((h * 60 + m) * 60 + s) * 1_000_000 + int(text[9:])
    hms, dot, frac = text.partition(".")
    parts = hms.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"bad Time {text!r}: expected HH:MM:SS.ffffff")
    h, m, s = (int(p) for p in parts)
    if h > 23 or m > 59 or s > 60:
        raise ValueError(f"bad Time {text!r}: out of range")
    us = 0
    if dot:
        if not frac.isdigit() or len(frac) > 9:
            raise ValueError(f"bad Time {text!r}: the fraction must be 1 to 9 digits")
        us = int((frac + "00000")[:6])
    return ((h * 60 + m) * 60 + s) * 1_000_000 + us


def parse_number(text, field):
    """A decimal or 0x-hexadecimal unsigned integer."""
    try:
        v = int(text, 16) if text[:2] in ("0x", "0X") else int(text, 10)
    except ValueError:
        raise ValueError(f"bad {field} {text!r}: expected a number") from None
    if v < 0:
        raise ValueError(f"bad {field} {text!r}: negative")
    return v


def _columns(header, line_no):
    names = [n.strip() for n in header.split(",")]
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise LogError(f"line {line_no}: the header lacks the column(s) {', '.join(missing)} "
                       f"(expected {','.join(XLOGRT_COLUMNS)}; Tag may be absent)")
    return names, [names.index(c) for c in REQUIRED], (names.index("Tag") if "Tag" in names else None)


def read_lines(lines):
    """Reads a log from an iterable of text lines (see the module comment)."""
    log = Log([], [], [], [], [], [], [], [], [])
    names = None          # the columns, once a header (or the first record) fixed them
    width = idx = tag_at = None
    day = 0               # days added: a time earlier than the previous by > 12 h crossed midnight
    last_tod = None
    for line_no, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        f = line.split(",")
        if "Action" in f and "Thread" in f:  # a header: no record has these two fields
            if names is None:
                names, idx, tag_at = _columns(line, line_no)
                width = len(names)
            elif [n.strip() for n in f] != names:  # logs appended to one another may repeat theirs
                log.problems.append(Problem(line_no, "a second header with other columns (the first one's are kept)"))
            continue
        if names is None:  # no header: xlogrt's order, with or without Tag
            if len(f) not in (6, 7):
                log.problems.append(Problem(line_no, f"{len(f)} fields, expected 6 or 7 "
                                                     f"({','.join(XLOGRT_COLUMNS)})"))
                continue
            names = list(XLOGRT_COLUMNS[:len(f)])
            width, idx, tag_at = len(f), list(range(6)), (6 if len(f) == 7 else None)
        if len(f) != width:
            log.problems.append(Problem(line_no, f"{len(f)} fields, expected {width} ({','.join(names)})"))
            continue
        try:
            thread = f[idx[0]].strip()
            if not thread:
                raise ValueError("empty Thread")
            tod = parse_time_us(f[idx[1]].strip())
            action_text = f[idx[2]].strip()
            action = ACTIONS.get(action_text)
            kind = SAMPLE_KINDS.get(action_text)
            if action is None and kind is None:
                raise ValueError(f"bad Action {f[idx[2]]!r}: expected one of "
                                 f"{', '.join(list(ACTIONS) + list(SAMPLE_KINDS))}")
            ptr = parse_number(f[idx[3]].strip(), "Pointer")
            size = parse_number(f[idx[4]].strip(), "Size")
            stream = f[idx[5]].strip()
            parse_number(stream, "Stream")
            tag = parse_number(f[tag_at].strip(), "Tag") if tag_at is not None else NO_TAG
        except ValueError as e:
            log.problems.append(Problem(line_no, str(e)))
            continue
        if last_tod is not None and tod < last_tod - DAY_US // 2:
            day += 1
        last_tod = tod
        if kind is not None:
            log.samples.append(Sample(len(log.action), tod + day * DAY_US, kind, size, line_no))
            continue
        log.thread.append(thread)
        log.time_us.append(tod + day * DAY_US)
        log.action.append(action)
        log.ptr.append(ptr)
        log.size.append(size)
        log.stream.append(stream)
        log.tag.append(tag)
        log.line.append(line_no)
    return log


def read_log(path):
    """Reads the log at `path`. Raises LogError when the file cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return read_lines(f)
    except OSError as e:
        raise LogError(f"cannot read {path}: {e.strerror}") from None
