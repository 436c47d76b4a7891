#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that every code block the docs quote from an example is that example's text.

In README.md and docs/*.md, a line `<!-- quote: docs/examples/NAME.cpp#REGION -->` right
before a fenced block says the block is the region between `// [REGION]` and
`// [/REGION]` in that file (without `#REGION`: the whole file), character for character
once the region's common indentation is removed. Fails, naming the place, on a block that
differs, a missing file or region, a marker with no block after it, and an example under
docs/examples/ that no page quotes.

usage: check_quotes.py SOURCE_ROOT
"""
import pathlib
import re
import sys
import textwrap

MARK = re.compile(r"^<!-- quote: (\S+?)(?:#(\S+))? -->\s*$")


def region(path, name):
    lines = path.read_text().splitlines()
    if name is None:
        return "\n".join(lines)
    begin = [i for i, l in enumerate(lines) if l.strip() == f"// [{name}]"]
    end = [i for i, l in enumerate(lines) if l.strip() == f"// [/{name}]"]
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        return None
    return textwrap.dedent("\n".join(lines[begin[0] + 1:end[0]]))


def check(root):
    pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    quoted, failures, count = set(), [], 0
    for page in pages:
        if not page.exists():
            continue
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = MARK.match(line)
            if not m:
                continue
            where = f"{page.relative_to(root)}:{i + 1}"
            src = root / m.group(1)
            quoted.add(src.resolve())
            if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
                failures.append(f"{where}: the quote marker is not followed by a code fence")
                continue
            try:
                end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            except StopIteration:
                failures.append(f"{where}: the code block is never closed")
                continue
            block = "\n".join(lines[i + 2:end])
            if not src.exists():
                failures.append(f"{where}: {m.group(1)} does not exist")
                continue
            want = region(src, m.group(2))
            if want is None:
                failures.append(f"{where}: {m.group(1)} has no region [{m.group(2)}]")
            elif block.strip("\n") != want.strip("\n"):
                got, exp = block.strip("\n").splitlines(), want.strip("\n").splitlines()
                k = next((k for k in range(min(len(got), len(exp))) if got[k] != exp[k]), min(len(got), len(exp)))
                failures.append(f"{where}: the block differs from {m.group(1)}"
                                f"{'#' + m.group(2) if m.group(2) else ''} at its line {k + 1}:\n"
                                f"    page:    {got[k] if k < len(got) else '(ends)'}\n"
                                f"    example: {exp[k] if k < len(exp) else '(ends)'}")
            count += 1
    for ex in sorted((root / "docs" / "examples").glob("*.cpp")):
        if ex.resolve() not in quoted:
            failures.append(f"docs/examples/{ex.name}: no page quotes it")
    for f in failures:
        print(f"FAIL {f}")
    print(f"{count} quoted blocks checked, {len(failures)} failures")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(check(pathlib.Path(sys.argv[1])))
