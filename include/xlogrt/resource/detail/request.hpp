// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <string>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/stream_pool.hpp"

namespace xlogrt::detail {

/// Checks an allocation request against the device and pool; returns the driver stream.
/// Errors: zero_bytes, too_large (more than the device has in all), unknown_stream.
template <class D>
result<typename D::stream_t> check_request(const StreamPool<D>& streams, std::size_t bytes,
                                           StreamId stream) noexcept {
  const auto& dev = *streams.device();
  if (bytes == 0) {
    return error{errc::zero_bytes, "allocation of 0 bytes on ordinal " + std::to_string(dev.ordinal()) +
                                       ", stream " + std::to_string(stream.value)};
  }
  if (bytes > dev.info().total_bytes) {
    return error{errc::too_large, "allocation of " + std::to_string(bytes) + " bytes on ordinal " +
                                      std::to_string(dev.ordinal()) + " exceeds the device's " +
                                      std::to_string(dev.info().total_bytes) + " bytes"};
  }
  return streams.get(stream);
}

/// Checks that `b` may be handed back to a resource of `ordinal`.
/// Errors: empty_block (moved-from or default), foreign_block (another ordinal).
inline result<void> check_block(const DeviceBlock& b, std::uint32_t ordinal) noexcept {
  if (b.empty()) return error{errc::empty_block, "the block is empty (moved-from or never allocated)"};
  if (b.device_ordinal() != ordinal) {
    return error{errc::foreign_block, "block " + b.id().to_string() + " belongs to ordinal " +
                                          std::to_string(b.device_ordinal()) +
                                          ", not to this resource's ordinal " + std::to_string(ordinal)};
  }
  return ok();
}

}  // namespace xlogrt::detail
