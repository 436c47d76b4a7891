// SPDX-License-Identifier: Apache-2.0
// libxlogrt_torch_hooks: the part of the PyTorch bridge that needs torch's C++ API,
// compiled against the torch that will load it (meson.build takes its include paths,
// libraries and _GLIBCXX_USE_CXX11_ABI from that torch).
//
// xlogrt_torch_install_hooks(record_stream), called once after
// torch.cuda.memory.change_current_allocator() installed the xlogrt pluggable allocator:
// - sets the allocator's record-stream hook (CUDAPluggableAllocator::set_record_stream_fn)
//   to xlogrt_torch_record_stream, so Tensor.record_stream(s) reaches xlogrt's
//   record_block_use and the block's free waits for `s` (a plain pluggable allocator drops
//   record_stream, and the memory can be reused while `s` still reads it). record_stream
//   = 0 leaves the hook unset, for the test that shows what goes wrong without it;
// - sets the bridge's failure handler to throw c10::OutOfMemoryError with xlogrt's
//   message, which Python sees as torch.OutOfMemoryError (a pluggable allocator that
//   returns NULL gives a tensor with no memory instead);
// - sets the reset hook, which torch.cuda.empty_cache() calls, to xlogrt_torch_empty_cache
//   of every device, and the memory-fraction hook, which
//   torch.cuda.set_per_process_memory_fraction() calls, to the device's budget;
// - sets the capture hooks (begin/end allocate to pool, release pool), which
//   torch.cuda.graph calls around cudaStreamBeginCapture/EndCapture and when a graph is
//   reset, to the device's GraphPools layer: without them a pluggable allocator's
//   beginAllocateToPool does nothing, and a capture allocates from the eager cache.

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/util/Exception.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "xlogrt_torch.h"

namespace {

void throw_out_of_memory(const char* message, size_t /*bytes*/, int /*device*/) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
}

/// torch's stream filters of the open capture windows, by device and pool: each lives
/// from begin_allocate_to_pool until its end_allocate_to_pool returns.
using StreamFilter = std::function<bool(cudaStream_t)>;
using WindowKey = std::pair<int, c10::cuda::MempoolId_t>;
std::mutex g_filters_mu;
std::multimap<WindowKey, std::unique_ptr<StreamFilter>> g_filters;

int call_filter(void* ctx, xlogrt_torch_stream stream) {
  return (*static_cast<StreamFilter*>(ctx))(reinterpret_cast<cudaStream_t>(stream)) ? 1 : 0;
}

}  // namespace

extern "C" {

/// Returns 0; 1 when the current CUDA allocator is not a pluggable one (call
/// change_current_allocator first).
XLOGRT_TORCH_API int xlogrt_torch_install_hooks(int record_stream) {
  namespace pluggable = torch::cuda::CUDAPluggableAllocator;
  auto current = std::dynamic_pointer_cast<pluggable::CUDAPluggableAllocator>(pluggable::getCurrentAllocator());
  if (!current) return 1;
  xlogrt_torch_set_failure_handler(&throw_out_of_memory);
  current->set_reset_fn([] {
    TORCH_CHECK(xlogrt_torch_empty_cache(-1) == 0, "xlogrt: empty_cache failed: ", xlogrt_torch_last_error());
  });
  current->set_memory_fraction_fn([](double fraction, int device) {
    TORCH_CHECK(xlogrt_torch_set_memory_fraction(fraction, device) == 0,
                "xlogrt: set_per_process_memory_fraction failed: ", xlogrt_torch_last_error());
  });
  current->set_begin_allocate_to_pool(
      [](int device, c10::cuda::MempoolId_t pool, std::function<bool(cudaStream_t)> filter) {
        auto held = std::make_unique<StreamFilter>(std::move(filter));
        void* ctx = held.get();
        {
          std::lock_guard lock(g_filters_mu);
          g_filters.emplace(WindowKey{device, pool}, std::move(held));
        }
        // torch has made the capture stream current and has not begun capturing on it yet.
        const cudaStream_t capture_stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
        TORCH_CHECK(xlogrt_torch_begin_allocate_to_pool(device, pool.first, pool.second, capture_stream, &call_filter,
                                                        ctx) == 0,
                    "xlogrt: beginning a graph pool's capture window failed: ", xlogrt_torch_last_error());
      });
  current->set_end_allocate_to_pool_fn([](int device, c10::cuda::MempoolId_t pool) {
    const int done = xlogrt_torch_end_allocate_to_pool(device, pool.first, pool.second);
    {
      std::lock_guard lock(g_filters_mu);
      auto it = g_filters.find(WindowKey{device, pool});  // the oldest window of the pool, as xlogrt ends
      if (it != g_filters.end()) g_filters.erase(it);
    }
    TORCH_CHECK(done == 0, "xlogrt: ending a graph pool's capture window failed: ", xlogrt_torch_last_error());
  });
  current->set_release_pool([](int device, c10::cuda::MempoolId_t pool) {
    TORCH_CHECK(xlogrt_torch_release_pool(device, pool.first, pool.second) == 0,
                "xlogrt: releasing a graph pool failed: ", xlogrt_torch_last_error());
  });
  if (record_stream != 0) {
    current->set_record_stream_fn([](void* ptr, cudaStream_t stream) {
      if (xlogrt_torch_record_stream(ptr, stream) != 0) {
        TORCH_CHECK(false, "xlogrt: record_stream failed: ", xlogrt_torch_last_error());
      }
    });
  }
  return 0;
}

}  // extern "C"
