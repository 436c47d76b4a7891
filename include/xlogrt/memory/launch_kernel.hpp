// SPDX-License-Identifier: Apache-2.0
#pragma once

// launch(rt, stream, KernelLaunch{function, grid, block, shared_bytes, params}, read(a),
// write(b), ...): the CUfunction form of launch(), for runtimes on CudaDriver. The kernel
// is enqueued with cuLaunchKernel through the runtime's driver, between the same
// prepare_block_use and finish_block_use calls as the callable form.
//
// It lives apart from memory/launch.hpp because it needs cuda.h (for CUfunction and
// CUstream), which the callable form, usable on any driver, does not.

#include <cuda.h>

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/cuda_driver.hpp"
#include "xlogrt/driver/lifetime.hpp"
#include "xlogrt/driver/status.hpp"
#include "xlogrt/memory/launch.hpp"

namespace xlogrt {

/// The extent of a launch's grid or block; a dimension left out is 1.
struct Dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
};

/// A kernel launch by handle: what cuLaunchKernel takes, less the stream.
///   KernelLaunch{f, {blocks}, {256}, 0, params}
struct KernelLaunch {
  /// A function of the runtime's context (the device's primary context): from
  /// cuModuleGetFunction, cuKernelGetFunction, or cudaGetFuncBySymbol in an nvcc
  /// translation unit.
  CUfunction function = nullptr;
  Dim3 grid{};
  Dim3 block{};
  /// Dynamic shared memory per block, in bytes.
  unsigned shared_bytes = 0;
  /// cuLaunchKernel's kernelParams: one pointer per kernel parameter, to its value. May
  /// be null for a kernel without parameters. Read during this call only.
  void** params = nullptr;
};

namespace detail {

/// A runtime whose driver is CudaDriver (it exposes the raw entry points through api()),
/// with the members the CUfunction form of launch uses.
template <class Runtime>
concept KernelLaunchRuntime = requires(Runtime& rt) {
  rt.driver().api().cuLaunchKernel_;
  { rt.device()->make_current() } -> std::same_as<result<void>>;
  { rt.device_ordinal() } -> std::convertible_to<std::uint32_t>;
  requires std::same_as<std::remove_cvref_t<launch_stream_t<Runtime>>, CUstream>;
};

inline std::string describe_kernel_launch(const KernelLaunch& k, StreamId stream,
                                          std::uint32_t ordinal) {
  auto dims = [](const Dim3& d) {
    return std::to_string(d.x) + "x" + std::to_string(d.y) + "x" + std::to_string(d.z);
  };
  return "a kernel launch (grid " + dims(k.grid) + ", block " + dims(k.block) + ", " +
         std::to_string(k.shared_bytes) + " B dynamic shared memory) on stream " +
         std::to_string(stream.value) + " of ordinal " + std::to_string(ordinal);
}

/// invalid_argument for what cuLaunchKernel would refuse and xlogrt can tell without
/// asking it: a null function, an empty grid or block.
inline result<void> check_kernel_launch(const KernelLaunch& k, StreamId stream,
                                        std::uint32_t ordinal) noexcept {
  if (k.function == nullptr) [[unlikely]] {
    return error{errc::invalid_argument,
                 "KernelLaunch::function is null in " + describe_kernel_launch(k, stream, ordinal) +
                     ": pass a CUfunction from cuModuleGetFunction, cuKernelGetFunction or "
                     "cudaGetFuncBySymbol"};
  }
  const auto empty = [](const Dim3& d) { return d.x == 0 || d.y == 0 || d.z == 0; };
  if (empty(k.grid) || empty(k.block)) [[unlikely]] {
    return error{errc::invalid_argument,
                 "a grid or block dimension is 0 in " + describe_kernel_launch(k, stream, ordinal) +
                     ": every dimension must be at least 1 (a Dim3 member left out is 1)"};
  }
  return ok();
}

}  // namespace detail

/// Enqueues kernel `k` on `stream` of runtime `rt` with cuLaunchKernel, between
/// prepare_block_use and finish_block_use for every buffer argument, exactly as the
/// callable form of launch() does (memory/launch.hpp); the runtime's context is made
/// current on the calling thread first.
///
/// Errors: invalid_argument for a null function or a 0 dimension, before anything is
/// enqueued; then the callable form's: the first prepare error, cuLaunchKernel's status
/// as status::driver_failure (no use is recorded), the first finish error;
/// shutting_down once the process has begun to exit (no driver call is made).
/// Thread-safe when the runtime is.
template <class Runtime, class... Uses>
  requires(detail::KernelLaunchRuntime<Runtime> && (std::is_same_v<Uses, BufferUse> && ...))
result<void> launch(Runtime& rt, StreamId stream, const KernelLaunch& k, Uses... uses) noexcept {
  if (auto r = detail::check_kernel_launch(k, stream, rt.device_ordinal()); !r) return r;
  return launch(
      rt, stream,
      [&](CUstream s) -> result<void> {
        if (auto r = rt.device()->make_current(); !r) return r;
        if (detail::process_exiting()) [[unlikely]] {
          return error{errc::shutting_down,
                       "cuLaunchKernel was not called: the process is exiting and libcuda may "
                       "already be torn down"};
        }
        const CUresult st = rt.driver().api().cuLaunchKernel_(
            k.function, k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z, k.shared_bytes, s,
            k.params, nullptr);
        if (st != CUDA_SUCCESS) [[unlikely]] {
          const int code = static_cast<int>(st);
          const std::string context =
              "enqueuing " + detail::describe_kernel_launch(k, stream, rt.device_ordinal());
          return status::driver_failure(code, "cuLaunchKernel", rt.driver().status_name(code), context);
        }
        return ok();
      },
      uses...);
}

}  // namespace xlogrt
