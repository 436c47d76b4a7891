// SPDX-License-Identifier: Apache-2.0
// The benchmark's plain stream-ordered pluggable allocator: what cudaMallocAsync /
// cudaFreeAsync do (the device's default pool, its release threshold as the driver sets
// it), called through the driver API that torch's process has loaded, so that this
// library brings no CUDA runtime of its own. Not part of the bridge.

#include <cuda.h>
#include <dlfcn.h>
#include <sys/types.h>

#include <cstdio>

namespace {

using AllocFn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using FreeFn = CUresult (*)(CUdeviceptr, CUstream);

struct Api {
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
  Api() {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    alloc = reinterpret_cast<AllocFn>(::dlsym(lib, "cuMemAllocAsync"));
    free = reinterpret_cast<FreeFn>(::dlsym(lib, "cuMemFreeAsync"));
  }
};

const Api& api() {
  static const Api a;
  return a;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* xlogrt_baseline_malloc(ssize_t size, int /*device*/, CUstream stream) {
  if (size <= 0 || api().alloc == nullptr) return nullptr;
  CUdeviceptr p = 0;
  if (api().alloc(&p, static_cast<size_t>(size), stream) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<void*>(p);
}

__attribute__((visibility("default"))) void xlogrt_baseline_free(void* ptr, ssize_t /*size*/, int /*device*/, CUstream stream) {
  if (ptr == nullptr || api().free == nullptr) return;
  if (api().free(reinterpret_cast<CUdeviceptr>(ptr), stream) != CUDA_SUCCESS) {
    std::fprintf(stderr, "baseline: cuMemFreeAsync(%p) failed\n", ptr);
  }
}

}  // extern "C"
