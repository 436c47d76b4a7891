# SPDX-License-Identifier: Apache-2.0
"""check_changelog.py SRC: the version moves with what breaks (issue #32).

- CHANGELOG.md's newest released entry is meson.build's version (read with the regex
  that bridge/torch/setup.py uses, so its format stays readable there);
- every entry under a version's "### Breaking" names its migration ("Migration:");
- the CMake consumer asks find_package for the project's major.minor, which the version
  file (cmake/xlogrtConfigVersion.cmake.in) accepts before 1.0 only within one minor.
"""
import re
import sys

src = sys.argv[1]
failures = []

with open(f"{src}/meson.build") as f:
    m = re.search(r"version:\s*'([^']+)'", f.read())
version = m.group(1) if m else None
if version is None:
    failures.append("meson.build: no version: '...' (bridge/torch/setup.py reads it with this regex)")

try:
    with open(f"{src}/CHANGELOG.md") as f:
        log = f.read()
except FileNotFoundError:
    log = None
    failures.append("CHANGELOG.md is missing")

if log is not None:
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", log, re.M)
    if not released:
        failures.append("CHANGELOG.md has no released version (## [X.Y.Z] - date)")
    elif version is not None and released[0] != version:
        failures.append(f"CHANGELOG.md's newest version is {released[0]}, meson.build's is {version}")
    # Each "### Breaking" section: its top-level entries ("- ") up to the next heading.
    for section in re.findall(r"^### Breaking\n(.*?)(?=^##)", log, re.M | re.S):
        for entry in re.split(r"^- ", section, flags=re.M)[1:]:
            if "Migration:" not in entry:
                failures.append("a breaking change without its migration: " + " ".join(entry.split())[:100])

if version is not None:
    with open(f"{src}/test/consumer/cmake/CMakeLists.txt") as f:
        m = re.search(r"find_package\(xlogrt (\S+) ", f.read())
    wanted = m.group(1) if m else None
    if wanted is None or wanted.split(".")[:2] != version.split(".")[:2]:
        failures.append(f"test/consumer/cmake asks for xlogrt {wanted}, the project is {version}")

for f in failures:
    print("FAIL:", f)
if not failures:
    print(f"ok: CHANGELOG.md's newest version is {version}; every breaking change names its migration")
sys.exit(1 if failures else 0)
