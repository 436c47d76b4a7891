#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds test/consumer/project with this xlogrt tree as its subproject.
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work/subprojects/xlogrt"
cp -r "$src/test/consumer/project/." "$work/"
# The library's own tree, without build folders.
(cd "$src" && tar --exclude='./build*' --exclude='./.git' --exclude='./.deps' -cf - .) |
  tar -xf - -C "$work/subprojects/xlogrt"
cd "$work"
meson setup build --wrap-mode=nodownload >setup.log 2>&1 || { cat setup.log; exit 1; }
meson compile -C build >compile.log 2>&1 || { cat compile.log; exit 1; }
meson test -C build --print-errorlogs
