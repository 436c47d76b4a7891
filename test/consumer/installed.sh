#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# installed.sh cmake|pkgconfig SRC WORK: installs this xlogrt tree into WORK/prefix with
# meson install, then builds and runs test/consumer/project/main.cpp against the installed
# tree only, through CMake's find_package (cmake) or through pkg-config (pkgconfig).
# Exits 77 (SKIP) when the tool the consumer needs is not installed.
set -euo pipefail
kind=$1 src=$2 work=$3
case $kind in
  cmake) command -v cmake >/dev/null || { echo "SKIP: cmake is not installed"; exit 77; } ;;
  pkgconfig) command -v pkg-config >/dev/null || { echo "SKIP: pkg-config is not installed"; exit 77; } ;;
  *) echo "installed.sh: unknown consumer kind '$kind' (cmake or pkgconfig)"; exit 2 ;;
esac
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
meson setup "$work/xlogrt-build" "$src" --prefix="$prefix" -Dtests=false >"$work/setup.log" 2>&1 ||
  { cat "$work/setup.log"; exit 1; }
meson install -C "$work/xlogrt-build" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
# The source tree must not be reachable: the consumer sees the installed copy only.
mv "$prefix" "$work/moved-prefix" && prefix=$work/moved-prefix
case $kind in
  cmake)
    cmake -S "$src/test/consumer/cmake" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
    cmake --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
    exe=$work/consumer/consumer ;;
  pkgconfig)
    # The .pc file's paths are absolute: point them at the moved prefix.
    pcdir=$(dirname "$(find "$prefix" -name xlogrt.pc)")
    export PKG_CONFIG_PATH=$pcdir
    flags=$(pkg-config --define-variable=prefix="$prefix" --cflags --libs xlogrt)
    echo "pkg-config: $flags"
    # shellcheck disable=SC2086
    ${CXX:-c++} -Wall -Wextra -Wpedantic -Werror "$src/test/consumer/project/main.cpp" $flags \
      -o "$work/consumer" || exit 1
    exe=$work/consumer ;;
esac
"$exe"
