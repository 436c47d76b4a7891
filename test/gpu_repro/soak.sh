#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The soak of issue 16 (gpu_soak, soak.cpp) and its short runs under compute-sanitizer.
#
# usage: soak.sh [all|soak|check|sanitizers|start|wait [S]] [PROGRAM]
#   soak        the soak: gpu_soak --seconds $SOAK_SECONDS (600) --threads 16 --streams 8
#               --sample-seconds 10
#   check       the check of the checks: $CHECK_SECONDS (15) s with a corruption injected
#               every 50 rounds of thread 0; gpu_soak must exit 1, having caught every
#               corruption and reported nothing else
#   sanitizers  short soaks ($SHORT_SECONDS (30) s, 4 threads, 8 streams unless said) under
#               compute-sanitizer: memcheck --leak-check full with the caching layer off
#               (XLOGRT_CACHE=0: every free is a stream-ordered cuMemFreeAsync, which
#               memcheck follows) and on; memcheck --track-stream-ordered-races all with
#               the layer off (a use of a block before its stream-ordered allocation or
#               after its free), on 1 thread and 2 streams (with 4 threads and 8 streams the
#               tool's tracking can take the run's whole time before the first round ends:
#               every thread busy inside the tool, see bench/HISTORY.md); racecheck (the
#               check kernel's shared-memory reduction, on 1 thread and 2 streams: with 4
#               threads launching at once the tool fails with "Detected a failure to track
#               a kernel launch" before the first round, and a race in shared memory lies
#               within one kernel, whatever the host threads do) and synccheck (its
#               barriers); initcheck with the layer off, on 1 thread and 2 streams (with
#               more, initcheck reports reads of blocks whose checks come out right and
#               breaks the driver's stream order: see bench/HISTORY.md);
#               and, not counted in the exit status, memcheck with the layer's NVTX marks
#               (XLOGRT_CACHE=nvtx): the marks are host calls, so a block may be marked
#               cached while the kernel enqueued before its free still runs, and whether
#               memcheck then reports depends on when it applies the mark (nvtx_probe.sh
#               tells apart the situations in which the tool refuses the marks' heaps)
#   all         check, soak, sanitizers (the default)
#   start       the soak in the background (its own session, so that it outlives the
#               calling shell), for machines whose commands are capped below its length
#   wait [S]    waits up to S seconds (default 600) for the background soak; prints its
#               log's last lines; exits with its status, or 124 while it still runs
# PROGRAM defaults to build/test/gpu_repro/gpu_soak. Logs go to $SOAK_LOG_DIR (./soak-logs).
# compute-sanitizer is $COMPUTE_SANITIZER, else found on PATH or in /usr/local/cuda/bin;
# each run under it is killed after $SHORT_SECONDS + $SANITIZER_GRACE (240) s. The soak
# and the check see the caller's environment: XLOGRT_CACHE=0 soak.sh soak soaks the stack
# without its caching layer.
#
# Exit status: 0 when every run passed, 77 when there is no GPU to run on (gpu_soak
# --probe), 1 otherwise.

mode=${1:-all}
case $mode in
  all|soak|check|sanitizers|start) prog=${2:-build/test/gpu_repro/gpu_soak} ;;
  wait) limit=${2:-600} ;;
  *) echo "usage: soak.sh [all|soak|check|sanitizers|start|wait [S]] [PROGRAM]" >&2; exit 2 ;;
esac
logs=${SOAK_LOG_DIR:-soak-logs}
seconds=${SOAK_SECONDS:-600}
short=${SHORT_SECONDS:-30}
check_seconds=${CHECK_SECONDS:-15}
soak_args="--seconds $seconds --threads 16 --streams 8 --sample-seconds 10"
failed=0

note() { echo "soak.sh: $*"; echo "soak.sh: $*" >>"$logs/summary.txt"; }

if [ "$mode" = wait ]; then
  [ -f "$logs/soak.pid" ] || { echo "soak.sh: no background soak (no $logs/soak.pid)"; exit 1; }
  waited=0
  while [ ! -f "$logs/soak.rc" ] && [ "$waited" -lt "$limit" ]; do sleep 5; waited=$((waited + 5)); done
  tail -n 20 "$logs/soak.log"
  [ -f "$logs/soak.rc" ] || { echo "soak.sh: the soak still runs (pid $(cat "$logs/soak.pid"))"; exit 124; }
  rc=$(cat "$logs/soak.rc")
  note "soak (background): exit $rc"
  [ "$rc" -eq 0 ] && exit 0
  [ "$rc" -eq 77 ] && exit 77
  exit 1
fi

[ -x "$prog" ] || { echo "soak.sh: $prog is not an executable (build it: meson compile -C BUILD gpu_soak)"; exit 1; }
"$prog" --probe
rc=$?
[ $rc -eq 77 ] && { echo "soak.sh: SKIP: no GPU to run the kernels on"; exit 77; }
[ $rc -ne 0 ] && { echo "soak.sh: FAIL: $prog --probe exited $rc"; exit 1; }
mkdir -p "$logs" || exit 1
echo "--- soak.sh $* ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))" >>"$logs/summary.txt"

if [ "$mode" = start ]; then
  rm -f "$logs/soak.rc"
  # shellcheck disable=SC2016 # $1..$3 are the inner shell's
  setsid nohup sh -c '"$1" $2 >"$3/soak.log" 2>&1; echo $? >"$3/soak.rc"' sh "$prog" "$soak_args" "$logs" \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$logs/soak.pid"
  echo "soak.sh: the soak runs in the background ($soak_args), log $logs/soak.log; soak.sh wait [S] collects it"
  exit 0
fi

run_check() {
  "$prog" --seconds "$check_seconds" --sample-seconds 5 --inject-corruption 50 >"$logs/check.log" 2>&1
  rc=$?
  grep -E "^corruptions injected" "$logs/check.log"
  if [ $rc -eq 1 ] && grep -q "each one caught, and nothing else" "$logs/check.log"; then
    note "check: PASS (every injected corruption caught, nothing else reported wrong)"
  else
    note "check: FAIL (exit $rc; see $logs/check.log)"
    tail -n 20 "$logs/check.log"
    failed=1
  fi
}

run_soak() {
  # shellcheck disable=SC2086
  { "$prog" $soak_args 2>&1; echo $? >"$logs/soak.rc"; } | tee "$logs/soak.log"
  rc=$(cat "$logs/soak.rc")
  if [ "$rc" -eq 0 ]; then
    note "soak: PASS ($soak_args)"
  else
    note "soak: FAIL, exit $rc ($soak_args; see $logs/soak.log)"
    failed=1
  fi
}

sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}

# One short soak under one tool: NAME COUNTS(yes|no) CACHE THREADS STREAMS TOOL-ARGS...
run_sanitized() {
  name=$1 counts=$2 cache=$3 threads=$4 streams=$5
  shift 5
  # The growth bounds are waived: the tools' own host and device memory grows. A run
  # that hangs (a wait the tool keeps from completing) ends by the watchdog. Over the pool
  # base (XLOGRT_BACKEND=pool), whose frees are the stream-ordered cuMemFreeAsync the
  # tools follow, and where these runs and the NVTX marks were verified.
  XLOGRT_BACKEND=pool XLOGRT_CACHE=$cache timeout "$((short + ${SANITIZER_GRACE:-240}))" "$sanitizer" "$@" --error-exitcode 9 "$prog" \
    --seconds "$short" --threads "$threads" --streams "$streams" --sample-seconds 10 --wait-timeout 120 \
    --max-rss-growth-mib 1000000 --max-device-growth-mib 1000000 >"$logs/$name.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && echo "soak.sh: $name: killed by the watchdog after $((short + ${SANITIZER_GRACE:-240})) s" >>"$logs/$name.log"
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY" "$logs/$name.log" | tr '\n' ' ')
  # The tool's own failures count in its summary as errors; name them apart from findings.
  internal=$(grep -c "Internal Sanitizer Error" "$logs/$name.log")
  [ "$internal" -gt 0 ] && summary="$summary(of them, $internal the tool's own internal errors, not findings) "
  if [ $rc -eq 0 ]; then
    note "$name (XLOGRT_CACHE=$cache): PASS $summary"
  elif [ "$counts" = yes ]; then
    note "$name (XLOGRT_CACHE=$cache): FAIL, exit $rc $summary (see $logs/$name.log)"
    grep -m 10 -E "^=========.*(Invalid|Error|Race|hazard|Barrier|Uninitialized|Leaked)" "$logs/$name.log"
    failed=1
  else
    note "$name (XLOGRT_CACHE=$cache): exit $rc, not counted $summary (see $logs/$name.log)"
    grep -m 5 -E "^=========.*(Invalid|Error)" "$logs/$name.log"
  fi
}

run_sanitizers() {
  if [ ! -x "$sanitizer" ]; then
    note "sanitizers: FAIL: compute-sanitizer not found (set COMPUTE_SANITIZER)"
    failed=1
    return
  fi
  "$sanitizer" --version | tail -n 1
  run_sanitized memcheck_nocache yes 0 4 8 --tool memcheck --leak-check full
  run_sanitized memcheck_cache yes 1 4 8 --tool memcheck --leak-check full
  run_sanitized memcheck_races_nocache yes 0 1 2 --tool memcheck --track-stream-ordered-races all
  run_sanitized racecheck yes 1 1 2 --tool racecheck
  run_sanitized synccheck yes 1 4 8 --tool synccheck
  run_sanitized initcheck_nocache yes 0 1 2 --tool initcheck
  run_sanitized memcheck_nvtx no nvtx 4 8 --tool memcheck
}

case $mode in
  check) run_check ;;
  soak) run_soak ;;
  sanitizers) run_sanitizers ;;
  all) run_check; run_soak; run_sanitizers ;;
esac
echo "soak.sh: $([ $failed -eq 0 ] && echo PASS || echo FAIL); logs in $logs"
exit $failed
