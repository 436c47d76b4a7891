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
//   torch.cuda.set_per_process_memory_fraction() calls, to the device's budget.

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/util/Exception.h>

#include <memory>
#include <string>

#include "xlogrt_torch.h"

namespace {

void throw_out_of_memory(const char* message, size_t /*bytes*/, int /*device*/) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
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
