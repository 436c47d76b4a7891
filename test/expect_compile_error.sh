#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# expect_compile_error.sh PATTERN COMPILER ARGS...: passes only when the compile fails AND
# its diagnostics contain PATTERN (so an unrelated error cannot pass for the right one).
pattern=$1; shift
if out=$("$@" 2>&1); then
  echo "compiled, but must not: $*"; exit 1
fi
if ! grep -q -- "$pattern" <<<"$out"; then
  echo "failed to compile for another reason than \"$pattern\":"; echo "$out" | head -40; exit 1
fi
echo "refused as expected: $(grep -m1 -- "$pattern" <<<"$out")"
