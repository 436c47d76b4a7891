// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <string>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/stream_pool.hpp"

namespace xlogrt::detail {

/// The error of a refused request (cold: kept out of the checks' inlined fast path).
template <class D>
[[gnu::cold, gnu::noinline]] error request_error(const StreamPool<D>& streams, std::size_t bytes,
                                                  StreamId stream) {
  const auto& dev = *streams.device();
  if (bytes == 0) {
    return error{errc::zero_bytes, "allocation of 0 bytes on ordinal " + std::to_string(dev.ordinal()) +
                                       ", stream " + std::to_string(stream.value)};
  }
  return error{errc::too_large, "allocation of " + std::to_string(bytes) + " bytes on ordinal " +
                                    std::to_string(dev.ordinal()) + " exceeds the device's " +
                                    std::to_string(dev.info().total_bytes) + " bytes"};
}

/// Checks an allocation request against the device (`device_bytes`: its total memory)
/// and the pool; returns the driver stream.
/// Errors: zero_bytes, too_large (more than the device has in all), unknown_stream.
template <class D>
[[gnu::always_inline]] inline result<typename D::stream_t> check_request(const StreamPool<D>& streams,
                                                                          std::size_t device_bytes,
                                                                          std::size_t bytes,
                                                                          StreamId stream) noexcept {
  if (bytes == 0 || bytes > device_bytes) [[unlikely]] {
    return request_error(streams, bytes, stream);
  }
  return streams.get(stream);
}

[[gnu::cold, gnu::noinline]] inline error block_error(const DeviceBlock& b, std::uint32_t ordinal) {
  if (b.empty()) return error{errc::empty_block, "the block is empty (moved-from or never allocated)"};
  return error{errc::foreign_block, "block " + b.id().to_string() + " belongs to ordinal " +
                                        std::to_string(b.device_ordinal()) +
                                        ", not to this resource's ordinal " + std::to_string(ordinal)};
}

/// Checks that `b` may be handed back to a resource of `ordinal`.
/// Errors: empty_block (moved-from or default), foreign_block (another ordinal).
[[gnu::always_inline]] inline result<void> check_block(const DeviceBlock& b, std::uint32_t ordinal) noexcept {
  if (b.empty() || b.device_ordinal() != ordinal) [[unlikely]] return block_error(b, ordinal);
  return ok();
}

}  // namespace xlogrt::detail
