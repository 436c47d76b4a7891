// SPDX-License-Identifier: Apache-2.0
#pragma once

// launch(rt, stream, enqueue, read(a), write(b), ...): enqueue work on a stream with the
// runtime told, before and after, which blocks it touches and how. The CUfunction form,
// launch(rt, stream, KernelLaunch{...}, ...), is in memory/launch_kernel.hpp.

#include <array>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"

namespace xlogrt {

/// A block argument of a launch and how the work touches it.
struct BufferUse {
  BlockId id;
  Access access;
};

namespace detail {
/// The driver stream a launch's enqueue callable receives: what `*rt.stream(id)` yields.
template <class Runtime>
using launch_stream_t = decltype(*std::declval<decltype(std::declval<Runtime&>().stream(StreamId{}))&>());

template <class B>
BlockId block_id_of(const B& b) noexcept {
  if constexpr (std::is_same_v<B, DeviceBlock>) {
    return b.id();
  } else if constexpr (std::is_same_v<B, BlockId>) {
    return b;
  } else {
    return b.id();  // device_buffer<T, R>, or anything that names its BlockId
  }
}
}  // namespace detail

template <class B>
BufferUse read(const B& b) noexcept { return {detail::block_id_of(b), Access::Read}; }
template <class B>
BufferUse write(const B& b) noexcept { return {detail::block_id_of(b), Access::Write}; }
template <class B>
BufferUse read_write(const B& b) noexcept { return {detail::block_id_of(b), Access::ReadWrite}; }

/// Enqueues work on `stream` of runtime `rt` between prepare_block_use and
/// finish_block_use for every buffer argument, so that callers cannot forget either.
///
/// `enqueue` is called once with the driver stream (a CUstream on CudaDriver), so a CUDA
/// C++ launch works from a user's nvcc translation unit:
///   launch(rt, s, [&](CUstream cs) { kernel<<<g, b, 0, cs>>>(x.data(), y.data()); },
///          read(x), write(y));
/// It may return void (success), result<void>, or a driver status int (0 = success;
/// a cudaError_t or CUresult converts to int).
///
/// Errors: the first prepare error (nothing is enqueued; the waits already queued only
/// add ordering); the enqueue's error (no use is recorded, since no work was queued);
/// the first finish error (the work is queued; the uses before it are recorded).
/// Thread-safe when the runtime is.
///
/// Only callables take part in overload resolution (the CUfunction form, with a
/// KernelLaunch in this place, is in memory/launch_kernel.hpp).
template <class Runtime, class Enqueue, class... Uses>
  requires(std::is_invocable_v<Enqueue, detail::launch_stream_t<Runtime>> &&
           (std::is_same_v<Uses, BufferUse> && ...))
result<void> launch(Runtime& rt, StreamId stream, Enqueue&& enqueue, Uses... uses) noexcept {
  const std::array<BufferUse, sizeof...(Uses)> args{uses...};
  for (const BufferUse& u : args) {
    if (auto r = rt.prepare_block_use(u.id, stream, u.access); !r) return r;
  }
  auto s = rt.stream(stream);
  if (!s) return std::move(s).error();
  using R = std::invoke_result_t<Enqueue, decltype(*s)>;
  if constexpr (std::is_void_v<R>) {
    std::forward<Enqueue>(enqueue)(*s);
  } else if constexpr (std::is_same_v<R, result<void>>) {
    if (auto r = std::forward<Enqueue>(enqueue)(*s); !r) return r;
  } else {
    const int status = static_cast<int>(std::forward<Enqueue>(enqueue)(*s));
    if (status != 0) {
      return error{errc::driver_error, "the enqueued launch failed with status " + std::to_string(status) +
                                           " on stream " + std::to_string(stream.value),
                   status};
    }
  }
  for (const BufferUse& u : args) {
    if (auto r = rt.finish_block_use(u.id, stream, u.access); !r) return r;
  }
  return ok();
}

}  // namespace xlogrt
