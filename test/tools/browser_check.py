#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The memory timeline page in a real browser: headless Chromium opens the page made from
a log this test generates, runs its script, and the rendered DOM must show the peak the
generator accounted, the number of tags, the blocks live at the peak (largest first), a
mark per failed allocation, a lane per stream, and what the stack held beside the live
bytes (the log has sample lines: the cached and queued areas, the pool reserve line,
their legend, the held peak). A page of a log without samples still draws and
says so. A screenshot is saved for people to look at.

usage: browser_check.py OUTDIR   (exit 77, Meson's SKIP, when Chromium is missing)
"""

import html.parser
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MEMVIZ = os.path.join(HERE, "..", "..", "tools", "memviz", "memviz.py")
sys.path.insert(0, HERE)

from synthetic_log import generate  # noqa: E402

SKIP = 77


class Dom(html.parser.HTMLParser):
    """The elements the checks read: attributes by id, live-block rows, marks, lanes."""

    def __init__(self):
        super().__init__()
        self.by_id, self.rows, self.failure_marks, self.lanes, self.tag_areas = {}, [], 0, [], 0
        self.held_paths, self.held_legend = [], []
        self.root = {}
        self._in_live = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.root = a
        if "id" in a:
            self.by_id[a["id"]] = a
        if tag == "table":
            self._in_live = a.get("id") == "live-blocks"
        if tag == "tr" and self._in_live and "data-ptr" in a:
            self.rows.append(a)
        cls = a.get("class", "")
        if tag == "path" and cls == "failure-mark":
            self.failure_marks += 1
        if tag == "path" and cls == "tag-area":
            self.tag_areas += 1
        if tag == "path" and cls in ("held-area", "held-line"):
            self.held_paths.append(a.get("data-layer"))
        if tag == "span" and cls == "held-legend":
            self.held_legend.append(a.get("data-layer"))
        if tag == "svg" and cls == "lane":
            self.lanes.append(a["data-stream"])

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_live = False


def live_after(lines, record):
    """The addresses live after record `record` (0-based, header excluded) of `lines`."""
    live = set()
    records = [text for text in lines[1:] if ",sample " not in text]
    for text in records[:record + 1]:
        f = text.split(",")
        if f[2] == "allocate":
            live.add(int(f[3], 16))
        elif f[2] == "free":
            live.discard(int(f[3], 16))
    return live


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_browser(browser, profile, *args):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--window-size=1400,1700", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def main(argv):
    outdir = os.path.abspath(argv[1] if len(argv) > 1 else ".")
    browser = chromium()
    if browser is None:
        print("browser_check: no chromium on PATH (Debian: apt-get install chromium); skipped")
        return SKIP
    os.makedirs(outdir, exist_ok=True)
    log_path = os.path.join(outdir, "memviz_check.csv")
    page_path = os.path.join(outdir, "memviz_check.html")
    shot = os.path.join(outdir, "memviz_check.png")
    lines, want = generate(6000, seed=7, threads=4, tags_per_thread=2, window=10, fail_every=211, sample_every=40,
                           cache_bytes=2 << 20)
    with open(log_path, "w") as f:
        f.write("\n".join(lines) + "\nthis line is malformed\n")
    plain_log, plain_page = os.path.join(outdir, "memviz_check_plain.csv"), os.path.join(outdir, "memviz_check_plain.html")
    plain, _ = generate(1500, seed=8, threads=2)
    with open(plain_log, "w") as f:
        f.write("\n".join(plain) + "\n")
    for src, dst in ((log_path, page_path), (plain_log, plain_page)):
        r = subprocess.run([sys.executable, MEMVIZ, src, "-o", dst], capture_output=True, text=True)
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            print(f"browser_check: memviz failed ({r.returncode})")
            return 1

    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as profile:
        url = "file://" + page_path
        r = run_browser(browser, profile, "--dump-dom", url)
        if r.returncode != 0 or "<html" not in r.stdout:
            print(r.stderr[-3000:])
            print(f"browser_check: chromium --dump-dom failed ({r.returncode})")
            return 1
        dom = Dom()
        dom.feed(r.stdout)
        r = run_browser(browser, profile, "--dump-dom", url + "#span=500")
        at = Dom()
        at.feed(r.stdout)
        r = run_browser(browser, profile, "--dump-dom", "file://" + plain_page)
        no_samples = Dom()
        no_samples.feed(r.stdout)
        r2 = run_browser(browser, profile, f"--screenshot={shot}", url)
        check(r2.returncode == 0 and os.path.getsize(shot) > 10_000 if os.path.exists(shot) else False,
              f"a screenshot is saved: {shot}")

    check(dom.root.get("data-memviz") == "ready", f"the page's script finished (data-memviz={dom.root.get('data-memviz')})")
    check("page-error" not in dom.by_id, "the page reports no error")
    peak = dom.by_id.get("peak-bytes", {}).get("data-bytes")
    check(peak == str(want["peak"]), f"the peak is {want['peak']} bytes (page: {peak})")
    tags = dom.by_id.get("tag-count", {}).get("data-count")
    check(tags == str(len(want["tags"])), f"{len(want['tags'])} tags (page: {tags})")
    check(dom.tag_areas == len(want["tags"]), f"one stacked area per tag (page: {dom.tag_areas})")
    shown = {int(row["data-ptr"], 16): int(row["data-bytes"]) for row in dom.rows}
    expected = {p: v[0] for p, v in want["peak_live"].items()}
    check(shown == expected, f"the {len(expected)} blocks live at the peak are listed (page: {len(shown)})")
    sizes = [int(row["data-bytes"]) for row in dom.rows]
    check(sizes == sorted(sizes, reverse=True), "largest first")
    tagged = all(row["data-tag"] == f"tag {want['peak_live'][int(row['data-ptr'], 16)][1]}" for row in dom.rows)
    check(tagged, "each listed block has its tag")
    check(dom.by_id.get("live-title", {}).get("data-record") is not None, "the list says which record it is at")
    check(dom.failure_marks == want["failures"], f"{want['failures']} failure marks (page: {dom.failure_marks})")
    check(sorted(dom.lanes) == sorted(f"stream {s}" for s in want["streams"]), f"a lane per stream (page: {dom.lanes})")
    check(dom.by_id.get("failure-total", {}).get("data-count") == str(want["failures"]), "the failures are counted")

    layers = ["cached", "queued", "reserved"]
    check(dom.held_paths == layers, f"the held layers are drawn: {layers} (page: {dom.held_paths})")
    check(dom.held_legend == layers, f"and named in the legend (page: {dom.held_legend})")
    held_peak = dom.by_id.get("held-peak", {}).get("data-bytes")
    check(held_peak == str(want["held_peak"]), f"the held peak is {want['held_peak']} bytes (page: {held_peak})")
    check(no_samples.root.get("data-memviz") == "ready" and "page-error" not in no_samples.by_id,
          "a log without samples draws its page")
    check(no_samples.held_paths == [] and "held-absent" in no_samples.by_id,
          "and says that what the stack held is not known")

    # Another moment, as a click on the timeline picks it: the page lists what the log
    # says was live after the record it names.
    record = int(at.by_id.get("live-title", {}).get("data-record", "-2"))
    check(record >= 0, f"#span=500 selects a record (page: {record})")
    listed = {int(row["data-ptr"], 16) for row in at.rows}
    live = live_after(lines, record)
    check(listed == live and len(live) > 0, f"the {len(live)} blocks live after record {record} are listed (page: {len(listed)})")
    if failures:
        print(f"browser_check: {len(failures)} checks failed")
        return 1
    print(f"browser_check: all checks passed; screenshot {shot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
