#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds xlogrt in build/ and runs every test suite: host (SimDriver), model (Relacy) and
# gpu (CudaDriver; skipped, exit 77, when the machine has no GPU driver).
set -euo pipefail
cd "$(dirname "$0")/.."
. test/prereqs.sh
xlogrt_prereqs
# gpu_kernels=auto: the nvcc-built GPU programs are built wherever nvcc is found (CI has
# it), so that they keep compiling; without a GPU their tests SKIP like the others.
[ -f build/build.ninja ] || meson setup build -Dgpu_kernels=auto
meson compile -C build
meson test -C build --print-errorlogs --num-processes 2 "$@"
