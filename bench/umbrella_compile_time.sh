#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What including the umbrella header costs a translation unit: the g++ -O2 time of a TU
# that includes only <xlogrt/runtime.hpp>, against one that includes only the non-xlogrt
# headers the umbrella's own headers include (the standard library, cuda.h, dlfcn.h...:
# the floor no header-only library on them can go below). Prints the median of N
# compiles of each, their ratio, and the preprocessed size of each TU.
# A measurement, not a test: the figure depends on the machine and its load.
# usage: bench/umbrella_compile_time.sh [runs=5]   (CXX, CUDA_PATH are honoured)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
cxx=${CXX:-g++}
cuda_inc=""
for d in "${CUDA_PATH:-}/include" /usr/local/cuda/include; do
  [ -f "$d/cuda.h" ] && { cuda_inc=$d; break; }
done
[ -n "$cuda_inc" ] || { echo "umbrella_compile_time: cuda.h not found (set CUDA_PATH)" >&2; exit 1; }
flags=(-std=c++20 -O2 -Iinclude -isystem "$cuda_inc")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '#include <xlogrt/runtime.hpp>\n' > "$tmp/umbrella.cpp"
# The baseline: every header outside xlogrt that an xlogrt header opens directly, from
# g++ -H's include tree (one dot per level: a line's parent is the nearest line above
# with one dot fewer).
"$cxx" "${flags[@]}" -E -H "$tmp/umbrella.cpp" 2>&1 >/dev/null |
  awk '/^\.+ / { n = length($1); stack[n] = $2
                 if (n > 1 && stack[n - 1] ~ /xlogrt\// && $2 !~ /xlogrt\//) print $2 }' |
  sort -u | sed 's/.*/#include "&"/' > "$tmp/baseline.cpp"

median_s() {  # the median wall time of $runs compiles of $1, in seconds
  local i t0 t1
  for i in $(seq "$runs"); do
    t0=$(date +%s%N)
    "$cxx" "${flags[@]}" -c "$1" -o "$tmp/out.o"
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000000 ))
  done | sort -n | awk '{ a[NR] = $1 } END { printf "%.2f", a[int((NR + 1) / 2)] / 1000 }'
}
lines() { "$cxx" "${flags[@]}" -E -P "$1" | wc -l; }

u=$(median_s "$tmp/umbrella.cpp")
b=$(median_s "$tmp/baseline.cpp")
echo "# $cxx -O2, median of $runs compiles ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
printf '| TU | seconds | preprocessed lines |\n| --- | --- | --- |\n'
printf '| #include <xlogrt/runtime.hpp> | %s | %s |\n' "$u" "$(lines "$tmp/umbrella.cpp")"
printf '| the %s outside headers it includes | %s | %s |\n' "$(wc -l < "$tmp/baseline.cpp")" "$b" "$(lines "$tmp/baseline.cpp")"
awk -v u="$u" -v b="$b" 'BEGIN { printf "umbrella / baseline: %.2f\n", u / b }'
