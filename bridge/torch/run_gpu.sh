#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The bridges' GPU runs, for a machine with a GPU, torch, nvcc and no network:
#   bridge/torch/run_gpu.sh prepare            (here, where ../shared and Catch2 are)
#   bridge/torch/run_gpu.sh build|tests|real|bench  (on the GPU machine, with .deps/ carried)
#   bridge/torch/run_gpu.sh frameworks|graphs       (on the GPU machine; need no build or .deps/)
# prepare: copies ../shared/third_party and /usr/include/catch2 into .deps/ (ignored by
#        git, about 7 MB), which the GPU machine needs and cannot reach;
# build: configures build-gpu/ with the GPU programs, the torch bridge and the benchmarks,
#        and compiles only what the runs below need;
# tests: RMM over xlogrt (gpu_rmm_interop), thrust::sort through ThrustAllocator
#        (gpu_thrust_sort), and the torch bridge's cases (test_torch_bridge.py);
# bench: bench_allocators.py (native / xlogrt / plain async, alternating processes);
# real: pip installs the package (as a user does) into build-gpu/site, then the bridge's
#       cases (test_torch_bridge.py), real models (test_real_models.py) and, over the
#       virtual memory base (the default), empty_cache giving pages back (test_vmm_trim.py)
#       through it.
# frameworks: pip installs the package into build-gpu/site, then CuPy, Numba and the three
#       frameworks in one process through it (test_frameworks.py).
# graphs: pip installs the package into build-gpu/site, then CUDA graphs (torch.cuda.graph,
#       a shared pool, make_graphed_callables, torch.compile reduce-overhead) through torch's
#       allocator and through xlogrt, alternating processes (test_cuda_graphs.py --compare).
# The runs see the caller's environment: XLOGRT_BACKEND=pool run_gpu.sh graphs (or frameworks)
# runs them over the pool base.
# Outputs go to $OUT (default: build-gpu/out); JOBS=N limits the build's parallel jobs.
# Third-party trees are looked up in .deps/: .deps/third_party (a copy of
# ../shared/third_party: CCCL 3.4, RMM 26.06) and .deps/catch2/catch2/catch.hpp (Catch2
# v2, which test/ needs to configure).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
if command -v meson >/dev/null; then meson=(meson); else meson=(python3 -m mesonbuild.mesonmain); fi

# The package as a user installs it, into build-gpu/site ($site), which the runs put on
# PYTHONPATH.
site=$root/build-gpu/site
pip_install_site() {
  rm -rf "$site"; mkdir -p "$site"
  local start; start=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps --no-index --target "$site" ./bridge/torch >"$out/pip.log" 2>&1 ||
    { tail -40 "$out/pip.log"; exit 1; }
  echo "pip install --target build-gpu/site ./bridge/torch: $(( $(date +%s) - start )) s"
}

case ${1:-} in
  prepare)
    [ -d ../shared/third_party ] || { echo "run_gpu.sh: ../shared/third_party is absent"; exit 1; }
    [ -f /usr/include/catch2/catch.hpp ] || { echo "run_gpu.sh: /usr/include/catch2/catch.hpp is absent (apt-get install catch2)"; exit 1; }
    rm -rf .deps/third_party .deps/catch2
    mkdir -p .deps/catch2
    cp -r ../shared/third_party .deps/third_party
    cp -r /usr/include/catch2 .deps/catch2/catch2
    du -sh .deps
    ;;
  build)
    [ -f .deps/catch2/catch2/catch.hpp ] || { echo "run_gpu.sh: .deps/catch2/catch2/catch.hpp is missing"; exit 1; }
    [ -d .deps/third_party/rmm ] || echo "run_gpu.sh: .deps/third_party is missing: gpu_rmm_interop is not built"
    wipe=(); [ -f build-gpu/build.ninja ] && wipe=(--wipe)
    "${meson[@]}" setup build-gpu "${wipe[@]}" -Dbuildtype=release -Dgpu_kernels=enabled -Dtorch_bridge=enabled \
      -Dbenchmarks=true -Dmodel_checks=disabled -Dthird_party_dir="$root/.deps/third_party" \
      -Dcpp_args="-I$root/.deps/catch2" >"$out/setup.log" 2>&1 || { tail -40 "$out/setup.log"; exit 1; }
    grep -E "torch bridge|Library cudart" "$out/setup.log"
    targets=(bridge/torch/libxlogrt_torch.so bridge/torch/libxlogrt_torch_async_baseline.so bench/log_replay
             test/interop/gpu_thrust_sort)
    grep -q "libxlogrt_torch_hooks.so:" build-gpu/build.ninja && targets+=(bridge/torch/libxlogrt_torch_hooks.so)
    grep -q "gpu_rmm_interop:" build-gpu/build.ninja && targets+=(test/interop/gpu_rmm_interop)
    ninja -C build-gpu ${JOBS:+-j"$JOBS"} "${targets[@]}" >"$out/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$out/build.log"; tail -5 "$out/build.log"; exit 1; }
    echo "built: ${targets[*]}"
    ;;
  tests)
    fail=0
    if [ -x build-gpu/test/interop/gpu_rmm_interop ]; then
      build-gpu/test/interop/gpu_rmm_interop 2>&1 | tee "$out/gpu_rmm_interop.log"; [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    else
      echo "gpu_rmm_interop: not built"; fail=1
    fi
    XLOGRT_LOG_FILE="$out/thrust_sort_log.csv" build-gpu/test/interop/gpu_thrust_sort 2>&1 | tee "$out/gpu_thrust_sort.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    python3 bridge/torch/test_torch_bridge.py --build build-gpu --out "$out" 2>&1 | tee "$out/test_torch_bridge.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    echo "run_gpu.sh tests: $([ $fail = 0 ] && echo PASSED || echo FAILED)"
    exit $fail
    ;;
  real)
    pip_install_site
    fail=0
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 bridge/torch/test_torch_bridge.py --out "$out" 2>&1 |
      tee "$out/test_torch_bridge.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    python3 bridge/torch/test_real_models.py --target "$site" --out "$out" 2>&1 | tee "$out/test_real_models.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 bridge/torch/test_vmm_trim.py 2>&1 | tee "$out/test_vmm_trim.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    echo "run_gpu.sh real: $([ $fail = 0 ] && echo PASSED || echo FAILED)"
    exit $fail
    ;;
  frameworks)
    pip_install_site
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 bridge/torch/test_frameworks.py --out "$out" 2>&1 |
      tee "$out/test_frameworks.log"
    exit "${PIPESTATUS[0]}"
    ;;
  graphs)
    pip_install_site
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 bridge/torch/test_cuda_graphs.py --compare --rounds 2 \
      --out "$out" 2>&1 | tee "$out/test_cuda_graphs.log"
    exit "${PIPESTATUS[0]}"
    ;;
  bench)
    python3 bridge/torch/bench_allocators.py --build build-gpu --rounds "${ROUNDS:-5}" --out "$out" 2>&1 |
      tee "$out/bench_allocators.log"
    exit "${PIPESTATUS[0]}"
    ;;
  *)
    echo "usage: bridge/torch/run_gpu.sh prepare|build|tests|real|frameworks|graphs|bench"; exit 2 ;;
esac
