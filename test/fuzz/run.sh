#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the fuzz targets with clang's libFuzzer (and ASan + UBSan) in build-fuzz/ and
# runs each over its corpus in the tree (test/fuzz/corpus/<target>, read only) plus
# new inputs for SECONDS seconds (default 30 for the stacks, a third of that for each
# parser). New inputs go to build-fuzz/new/<target>; a crash is saved as
# build-fuzz/crash-<target>-*, and replays with build-fuzz/fuzz_<target> FILE (or with
# the host suite's fuzz_<target>_replay FILE, set XLOGRT_FUZZ_TRACE=1 to print the ops).
#   test/fuzz/run.sh [SECONDS] [TARGET...]    TARGET: stacks, env_config, log_csv
# Extra libFuzzer flags: XLOGRT_FUZZ_FLAGS (e.g. "-jobs=16 -workers=16").
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(stacks env_config log_csv)
out=${XLOGRT_FUZZ_BUILD:-build-fuzz}

. test/prereqs.sh
xlogrt_fuzz_prereqs
cuda_inc=""
for d in "${CUDA_PATH:-}/include" /usr/local/cuda/include; do
  [ -f "$d/cuda.h" ] && { cuda_inc=$d; break; }
done
[ -n "$cuda_inc" ] || { echo "fuzz: cuda.h not found (/usr/local/cuda/include or \$CUDA_PATH/include)" >&2; exit 1; }

mkdir -p "$out"
for t in "${targets[@]}"; do
  bin="$out/fuzz_$t"
  src=test/fuzz/fuzz_$t.cpp
  if [ ! -x "$bin" ] || [ -n "$(find include test/fuzz test/resource/stack_registry.hpp -newer "$bin" -name '*.[hc]pp' -print -quit)" ]; then
    echo "fuzz: building $bin"
    clang++ -std=c++20 -O2 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      -Iinclude -isystem "$cuda_inc" "$src" -o "$bin" -lpthread -ldl
  fi
done

fail=0
for t in "${targets[@]}"; do
  s=$secs
  [ "$t" = stacks ] || s=$(( secs / 3 > 0 ? secs / 3 : 1 ))
  mkdir -p "$out/new/$t"
  echo "fuzz: $t for ${s}s"
  # shellcheck disable=SC2086
  # Entropic scheduling off: with tens of thousands of features its bookkeeping (libFuzzer
  # of clang 14) costs several times what running an input does.
  if ! ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$out/fuzz_$t" -max_total_time="$s" -timeout=20 -rss_limit_mb=4096 -entropic=0 \
       -print_final_stats=1 -artifact_prefix="$out/crash-$t-" ${XLOGRT_FUZZ_FLAGS:-} \
       "$out/new/$t" "test/fuzz/corpus/$t" 2>"$out/$t.log"; then
    echo "fuzz: $t FAILED:"; grep -v '^#' "$out/$t.log" | tail -40
    fail=1
  fi
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec)' "$out/$t.log" | sed "s/^/fuzz: $t /" || true
done
exit $fail
