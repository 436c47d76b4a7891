#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs alloc_pair's stream-ordered tables (--async-only --no-threads) in N processes and
# prints AsyncCuda's paired ratio per process and size, then the median and range over
# all of them. One process's address layout moves that ratio by about a point, and the
# raw pair by up to 2x (bench/HISTORY.md, 2026-11-30), so a single run says little about a
# build, and two builds compare well only over several runs each.
# It builds alloc_pair optimised, without assertions, in build-release/ (build/ is the
# README's build, whose benchmarks keep assertions and -O2, which add to the wrapper's side).
# usage: bench/pair_runs.sh [processes=8] [rounds=1000]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8}
rounds=${2:-1000}
[ -f build-release/build.ninja ] || meson setup build-release -Dbuildtype=release -Db_ndebug=true
meson compile -C build-release alloc_pair | tail -1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for i in $(seq "$n"); do
  ./build-release/bench/alloc_pair "$rounds" 32 --async-only --no-threads
done | awk -F'|' -v all="$out" '
  /^# allocate/ && !shown { print; shown = 1 }
  /^## / { size = $0; sub(/^## /, "", size); if (!(size in line)) order[++sizes] = size }
  /^\| raw cuMemAllocFromPoolAsync/ { raw = $3 + 0 }
  /^\| AsyncCuda \|/ {
    line[size] = line[size] sprintf(" %.3f", $6 + 0)
    raws[size] = raws[size] sprintf(" %.0f", raw)
    print $6 + 0 > all
  }
  END { for (i = 1; i <= sizes; ++i) printf "%s: paired ratios%s (raw ns/pair%s)\n", order[i], line[order[i]], raws[order[i]] }'
sort -n "$out" | awk '{ v[NR] = $1 } END {
  if (NR == 0) { print "no AsyncCuda rows: did alloc_pair fail?"; exit 1 }
  printf "all %d: median %.3f, lowest %.3f, highest %.3f\n", NR, (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1], v[NR] }'
