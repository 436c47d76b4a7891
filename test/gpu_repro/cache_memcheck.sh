#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# usage: cache_memcheck.sh PROGRAM COMPUTE_SANITIZER
# memcheck must report the read of a cached block with XLOGRT_CACHE=nvtx, and must not
# without the marks (XLOGRT_CACHE=1): the marks are what makes the bug visible. Over the
# pool base (XLOGRT_BACKEND=pool), where the marks were verified.
prog=$1 san=$2
export XLOGRT_BACKEND=pool
XLOGRT_CACHE=1 "$prog" >/dev/null; rc=$?
[ $rc -eq 77 ] && { echo "SKIP: no GPU for the kernels"; exit 77; }
[ $rc -ne 0 ] && { echo "FAIL: $prog exited $rc"; exit 1; }
XLOGRT_CACHE=nvtx "$san" --tool memcheck --error-exitcode 9 "$prog" >marked.log 2>&1; marked=$?
XLOGRT_CACHE=1 "$san" --tool memcheck --error-exitcode 9 "$prog" >plain.log 2>&1; plain=$?
echo "memcheck with NVTX marks: exit $marked; without: exit $plain"
grep -m3 -E "Invalid|ERROR SUMMARY" marked.log
grep -m1 "ERROR SUMMARY" plain.log
[ $marked -eq 9 ] || { echo "FAIL: memcheck did not report the read of a cached block with the marks on"; cat marked.log; exit 1; }
[ $plain -eq 0 ] || { echo "FAIL: memcheck failed without the marks"; cat plain.log; exit 1; }
echo "PASS: the read of a cached block is caught with the marks and only with them"
