#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cudart_lookup.sh SRC WORK CXX: Meson's lookup of libcudart (test/interop/meson.build) on
# fake toolkits shaped as NVIDIA installs them, configured against this source tree:
#  - include and lib64 are links into targets/x86_64-linux (the .run and .deb layout, the
#    H200 machine's): <include>/../lib64 resolves to targets/x86_64-linux/lib64, which is
#    not there, so the lookup must go through the toolkit's own lib64 and targets/*/lib;
#  - no libcudart at all: the configure succeeds and the test that needs it SKIPs (a
#    missing optional library never breaks the build).
# Only `meson setup` runs (seconds); the libcudart here is an empty shared library.
set -euo pipefail
src=$1 work=$2 cxx=$3
rm -rf "$work"; mkdir -p "$work"
real_cuda_h=$(printf '#include <cuda.h>\n' | "$cxx" -E -M -x c++ - -I"${CUDA_PATH:-/usr/local/cuda}/include" \
  ${TOOLKIT_INCLUDE_DIR:+-I"$TOOLKIT_INCLUDE_DIR"} | tr ' \\' '\n\n' | grep '/cuda\.h$' | head -1)
[[ -n $real_cuda_h ]] || { echo "cuda.h not found for the fake toolkits"; exit 1; }
# have_third_party needs only the two folders; the test is configured, never compiled here.
mkdir -p "$work/third_party/cccl/include" "$work/third_party/rmm/include"

make_toolkit() {  # make_toolkit DIR WITH_CUDART
  local t=$1/targets/x86_64-linux
  mkdir -p "$t/include" "$t/lib"
  ln -s "$real_cuda_h" "$t/include/cuda.h"
  ln -s targets/x86_64-linux/include "$1/include"
  ln -s targets/x86_64-linux/lib "$1/lib64"
  if [[ $2 == yes ]]; then "$cxx" -shared -fPIC -o "$t/lib/libcudart.so" -x c++ /dev/null; fi
}
configure() {  # configure TOOLKIT BUILD: the log of meson setup
  meson setup "$2" "$src" -Dtoolkit_include_dir="$1/include" -Dthird_party_dir="$work/third_party" \
    -Dgpu_tests=false -Dmodel_checks=disabled -Dbenchmarks=false -Dtorch_bench=disabled \
    --wrap-mode=nodownload >"$2.log" 2>&1 || { cat "$2.log"; echo "meson setup failed on $1"; exit 1; }
}
cccl_test_command() {  # what the test interop_cuda_mr_cccl_3_4 runs in BUILD
  meson introspect --tests "$1" | python3 -c '
import json, sys
print(next(" ".join(t["cmd"]) for t in json.load(sys.stdin) if t["name"] == "interop_cuda_mr_cccl_3_4"))'
}

make_toolkit "$work/nvidia" yes
configure "$work/nvidia" "$work/build-nvidia"
grep -q 'Library cudart found: YES' "$work/build-nvidia.log" ||
  { grep 'Library cudart' "$work/build-nvidia.log"; echo "FAIL: libcudart in <toolkit>/lib64 -> targets/x86_64-linux/lib not found"; exit 1; }
[[ $(cccl_test_command "$work/build-nvidia") == *test_cuda_mr_cccl_3_4* ]] ||
  { echo "FAIL: with libcudart found, interop_cuda_mr_cccl_3_4 is not built"; exit 1; }
echo "ok: libcudart found in the NVIDIA layout"

make_toolkit "$work/bare" no
configure "$work/bare" "$work/build-bare"
cmd=$(cccl_test_command "$work/build-bare")
[[ $cmd != *test_cuda_mr_cccl_3_4* && $cmd == *SKIP* ]] ||
  { echo "FAIL: without libcudart, interop_cuda_mr_cccl_3_4 runs: $cmd"; exit 1; }
echo "ok: without libcudart the test SKIPs and the configure succeeds"
