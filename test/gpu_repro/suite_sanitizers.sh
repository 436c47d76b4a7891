#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The GPU suite (meson test --suite gpu) under compute-sanitizer, one tool at a time, each
# test of the suite wrapped in the tool. The two tests that run compute-sanitizer
# themselves (gpu_uaf_repro_memcheck, gpu_cache_memcheck) are left out: the tool does not
# nest.
#
# usage: suite_sanitizers.sh BUILD [TOOL...]    TOOL: memcheck (default: memcheck racecheck
#                                                synccheck), racecheck, synccheck, initcheck
# memcheck runs with --report-api-errors no: the driver tests pass bad input on purpose and
# check the named error that comes back, and memcheck would count each such return as an
# error. Its memory-access and hardware-exception checks stay on.
# initcheck is not among the defaults: under it the driver conformance suite finds work
# behind a blocked host function running early (stream_order, events_order_streams), so its
# reports on programs that rely on stream order are not evidence.
# BUILD is a build directory configured with -Dgpu_kernels=enabled (or auto, nvcc found).
# Logs go to $SAN_LOG_DIR (./suite-sanitizer-logs): one meson log per tool. Each test's
# time limit is multiplied by $TIMEOUT_MULTIPLIER (20): racecheck runs the use-after-free
# reproduction about 40 times slower than it runs alone. $SAN_JOBS (1) tests run at once.
#
# Exit status: 0 when every test passed (or skipped) under every tool, 77 when there is no
# GPU to run on, 1 otherwise.

build=${1:?usage: suite_sanitizers.sh BUILD [TOOL...]}
shift
tools=${*:-memcheck racecheck synccheck}
logs=${SAN_LOG_DIR:-suite-sanitizer-logs}
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
probe=$build/test/gpu_repro/gpu_uaf_repro

[ -x "$probe" ] || {
  echo "suite_sanitizers.sh: $probe not built (configure BUILD with -Dgpu_kernels=enabled)"
  exit 1
}
"$probe" --probe >/dev/null 2>&1
rc=$?
[ $rc -eq 77 ] && { echo "suite_sanitizers.sh: SKIP: no GPU to run on"; exit 77; }
[ $rc -ne 0 ] && { echo "suite_sanitizers.sh: FAIL: $probe --probe exited $rc"; exit 1; }
[ -x "$sanitizer" ] || {
  echo "suite_sanitizers.sh: FAIL: compute-sanitizer not found (set COMPUTE_SANITIZER)"
  exit 1
}
mkdir -p "$logs" || exit 1

# --list prints 'project:suite / name' (Meson 1.0) or 'suite - project:name' (Meson 1.12):
# the name is the last word, after its last ':'.
meson test -C "$build" --no-rebuild --list --suite gpu >"$logs/list.txt" 2>&1
tests=$(awk '{n = $NF; sub(/.*:/, "", n); print n}' "$logs/list.txt" | grep -x -E '[A-Za-z0-9_.-]+' |
        grep -v -x -e gpu_uaf_repro_memcheck -e gpu_cache_memcheck)
[ -n "$tests" ] || {
  echo "suite_sanitizers.sh: FAIL: no tests in suite gpu of $build ($logs/list.txt:)"
  cat "$logs/list.txt"
  exit 1
}

failed=0
for tool in $tools; do
  case $tool in
    memcheck) tool_args="--tool memcheck --report-api-errors no" ;;
    *) tool_args="--tool $tool" ;;
  esac
  # shellcheck disable=SC2086 # $tests: one name per word
  meson test -C "$build" --no-rebuild --suite gpu --num-processes "${SAN_JOBS:-1}" \
    --timeout-multiplier "${TIMEOUT_MULTIPLIER:-20}" \
    --wrapper "$sanitizer $tool_args --error-exitcode 9" $tests >"$logs/$tool.log" 2>&1
  rc=$?
  # meson names the full log after the wrapper: testlog-compute-sanitizer.txt
  cp "$build/meson-logs/testlog-$(basename "$sanitizer").txt" "$logs/$tool.testlog.txt" 2>/dev/null
  summary=$(grep -E "^(Ok|Fail|Skipped|Timeout):" "$logs/$tool.log" | tr -s ' \n' ' ')
  if [ $rc -eq 0 ]; then
    echo "suite_sanitizers.sh: $tool: PASS ($summary)"
  else
    echo "suite_sanitizers.sh: $tool: FAIL, exit $rc ($summary; see $logs/$tool.log)"
    grep -E "^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|INTERRUPT)" "$logs/$tool.log"
    failed=1
  fi
done
exit $failed
