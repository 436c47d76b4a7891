#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds xlogrt in build/ and runs the tour: DeviceRuntime<DefaultStack> on the GPU when
# this machine has one, DeviceRuntime on SimDriver otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
. test/prereqs.sh
xlogrt_prereqs
[ -f build/build.ninja ] || meson setup build
meson compile -C build tour
./build/bench/tour "$@"
