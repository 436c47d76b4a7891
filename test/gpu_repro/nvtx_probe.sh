#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The NVTX probe of issue 28, finding 7 (gpu_nvtx_probe, nvtx_probe.cpp) under
# compute-sanitizer's memcheck: each case in a process of its own (NVTX initialises once
# per process, and the runtime-late case must make the first calls), then one row per case:
#   heaps         heap registrations the probe made
#   refused       the tool's "nvtxMemHeapRegister failed" messages
#   other nvtx    the tool's other "nvtx... failed" messages (regions)
#   reads         reads of a heap where no region is (each should be reported) / reads
#                 inside a region (none should be)
#   reported      memcheck's "Invalid __global__ read" errors
#   verdict       works (every heap taken, every read of a heap without a region reported,
#                 no other), refused, not reported, or extra reports
#
# usage: nvtx_probe.sh [PROGRAM [CASE...]]
#   PROGRAM defaults to build/test/gpu_repro/gpu_nvtx_probe, the cases to all of them
#   (PROGRAM --list). NVTX_PROBE_ARGS is passed to each run (e.g. --created-pool: the
#   cases that do not name their pool take a cuMemPoolCreate pool). Logs go to
#   $NVTX_PROBE_LOG_DIR (./nvtx-probe-logs), one per case. compute-sanitizer is
#   $COMPUTE_SANITIZER, else found on PATH or in /usr/local/cuda/bin.
#
# Exit status: 0 when every case ran to its end under the tool (whatever the verdicts),
# 77 when there is no GPU to run on, 1 otherwise.

prog=${1:-build/test/gpu_repro/gpu_nvtx_probe}
[ $# -gt 0 ] && shift
logs=${NVTX_PROBE_LOG_DIR:-nvtx-probe-logs}
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}

[ -x "$prog" ] || {
  echo "nvtx_probe.sh: $prog is not an executable (build it: ninja -C BUILD test/gpu_repro/gpu_nvtx_probe)"
  exit 1
}
"$prog" --probe
rc=$?
[ $rc -eq 77 ] && { echo "nvtx_probe.sh: SKIP: no GPU to run the kernels on"; exit 77; }
[ $rc -ne 0 ] && { echo "nvtx_probe.sh: FAIL: $prog --probe exited $rc"; exit 1; }
[ -x "$sanitizer" ] || { echo "nvtx_probe.sh: FAIL: compute-sanitizer not found (set COMPUTE_SANITIZER)"; exit 1; }
cases=${*:-$("$prog" --list)}
mkdir -p "$logs" || exit 1
"$sanitizer" --version | tail -n 1
echo "program arguments: ${NVTX_PROBE_ARGS:-(none)}; logs in $logs"

count() { grep -c -- "$1" "$2"; }

failed=0
first=
printf '%-24s %5s %7s %10s %9s %8s  %s\n' case heaps refused "other nvtx" reads reported verdict
for c in $cases; do
  log="$logs/$c.log"
  # --destroy-on-device-error kernel: a reported read ends its kernel, not the context,
  # so the case goes on to its control read and its clean-up.
  # shellcheck disable=SC2086 # NVTX_PROBE_ARGS is a list of words
  timeout 300 "$sanitizer" --tool memcheck --nvtx yes --destroy-on-device-error kernel \
    "$prog" $NVTX_PROBE_ARGS "$c" >"$log" 2>&1
  rc=$?
  heaps=$(count '^  heap \[' "$log")
  refused=$(grep -ci 'nvtxMemHeapRegister failed' "$log")
  other=$(grep -Ei 'nvtx[A-Za-z]* failed' "$log" | grep -vci 'nvtxMemHeapRegister failed')
  want=$(count 'memcheck should report it' "$log")
  clean=$(count 'memcheck should not report' "$log")
  reported=$(count 'Invalid __global__ read' "$log")
  if [ "$refused" -gt 0 ]; then
    verdict="refused ($refused of $heaps heaps)"
  elif [ "$reported" -eq "$want" ]; then
    verdict=works
  elif [ "$reported" -lt "$want" ]; then
    verdict="not reported ($((want - reported)) of $want reads)"
  else
    verdict="extra reports ($((reported - want)) beyond $want)"
  fi
  if [ $rc -ne 0 ] || ! grep -q "^nvtx_probe: case=$c " "$log"; then
    verdict="$verdict; the run did not finish (exit $rc; see $log)"
    failed=1
  fi
  [ -z "$first" ] && [ "$refused$other" != 00 ] && first="$c: $(grep -Ei -m 1 'nvtx[A-Za-z]* failed' "$log")"
  printf '%-24s %5s %7s %10s %9s %8s  %s\n' "$c" "$heaps" "$refused" "$other" "$want/$clean" "$reported" "$verdict"
done
# The tool's own words for the first refusal, where there was one.
[ -n "$first" ] && echo "first refusal, $first"
exit $failed
