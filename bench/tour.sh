#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds xlogrt in build/ and runs the tour: DeviceRuntime<DefaultStack> on the GPU when
# this machine has one, DeviceRuntime on SimDriver otherwise. The run logs every
# allocation (to XLOGRT_LOG_FILE, by default build/tour-log.csv) and writes a snapshot of
# the blocks live when an allocation failed (build/tour-snapshot.csv); tools/memviz draws
# each as a page (build/tour-memory.html, build/tour-snapshot.html).
set -euo pipefail
cd "$(dirname "$0")/.."
. test/prereqs.sh
xlogrt_prereqs
[ -f build/build.ninja ] || meson setup build
meson compile -C build tour
export XLOGRT_LOG_FILE="${XLOGRT_LOG_FILE:-$PWD/build/tour-log.csv}"
snapshot="$PWD/build/tour-snapshot.csv"
./build/bench/tour "$snapshot" "$@"
if ! command -v python3 >/dev/null; then
  echo "xlogrt: python3 is missing: no memory pages (the log is $XLOGRT_LOG_FILE)"
  exit 0
fi
python3 tools/memviz/memviz.py "$XLOGRT_LOG_FILE" -o build/tour-memory.html
python3 tools/memviz/memviz.py "$snapshot" -o build/tour-snapshot.html
echo "xlogrt: open build/tour-memory.html (the run's log) and build/tour-snapshot.html (live at the failure) in a browser"
