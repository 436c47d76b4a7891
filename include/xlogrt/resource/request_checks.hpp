// SPDX-License-Identifier: Apache-2.0
#pragma once

// The checks of an allocation request that come before any refusal of a layer's own.
//
// Every stack names bad input the same way, in one order: zero_bytes, then too_large
// (more than the device has in all), then unknown_stream; the base resource (AsyncCuda,
// DirectCuda) checks them on every request. A decorator that refuses requests for a
// reason of its own (a budget, a quota, a size limit) must not hide them: a request of 0
// bytes, or on a stream the device does not have, is bad input before it is over a
// limit. check_request(upstream(), bytes, stream) on the decorator's refusal path gives
// the base's answer without allocating; the conformance suite holds every shipped stack
// to the order.

#include <cstddef>
#include <memory>
#include <type_traits>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/resource/find_layer.hpp"
#include "xlogrt/resource/detail/request.hpp"

namespace xlogrt {

/// The base resource's checks of a request, in its order, without allocating: zero_bytes,
/// too_large (more than the device has in all), unknown_stream. Over a stack whose base
/// exposes no stream pool, zero_bytes alone (the rest is the upstream's allocate's to
/// say). For a decorator's refusal path: `XLOGRT_TRY(check_request(this->upstream(),
/// bytes, stream));` before its own error.
template <class R>
result<void> check_request(R& upstream, std::size_t bytes, StreamId stream) noexcept {
  const auto* streams = find_streams(upstream);
  if constexpr (std::is_same_v<decltype(streams), const void*>) {
    if (bytes == 0) return error{errc::zero_bytes, "allocation of 0 bytes"};
    return ok();
  } else {
    const auto& pool = **streams;
    if (!detail::valid_request(pool, pool.device()->info().total_bytes, bytes, stream)) {
      return detail::request_error(pool, bytes, stream);
    }
    return ok();
  }
}

}  // namespace xlogrt
