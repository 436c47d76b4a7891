#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compile_check.sh DIR COMPILER ARGS...: exits 77 (SKIP) when DIR (a third-party tree
# the check compiles against) is absent, and otherwise passes only when the compile does.
dir=$1; shift
[ -d "$dir" ] || { echo "SKIP: $dir is absent"; exit 77; }
"$@" || { echo "failed: $*"; exit 1; }
echo "compiled: $*"
