#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds xlogrt in build/ and runs every test suite: host (SimDriver), model (Relacy) and
# gpu (CudaDriver; skipped, exit 77, when the machine has no GPU driver).
set -euo pipefail
cd "$(dirname "$0")/.."
. test/prereqs.sh
xlogrt_prereqs
[ -f build/build.ninja ] || meson setup build
meson compile -C build
meson test -C build --print-errorlogs --num-processes 2 "$@"
