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
  if (bytes > dev.info().total_bytes) {
    return error{errc::too_large, "allocation of " + std::to_string(bytes) + " bytes on ordinal " +
                                      std::to_string(dev.ordinal()) + " exceeds the device's " +
                                      std::to_string(dev.info().total_bytes) + " bytes"};
  }
  return streams.unknown(stream);
}

/// Whether an allocation request may go to the driver: 1 to `device_bytes` (the
/// device's total memory) bytes, on a stream of the pool. request_error says why not.
template <class D>
[[gnu::always_inline]] inline bool valid_request(const StreamPool<D>& streams, std::size_t device_bytes,
                                                 std::size_t bytes, StreamId stream) noexcept {
  return bytes - 1 < device_bytes && streams.contains(stream);  // bytes == 0 wraps around
}

/// Checks an allocation request against the device and the pool; returns the driver
/// stream. Errors: zero_bytes, too_large (more than the device has in all), unknown_stream.
template <class D>
[[gnu::always_inline]] inline result<typename D::stream_t> check_request(const StreamPool<D>& streams,
                                                                          std::size_t device_bytes,
                                                                          std::size_t bytes,
                                                                          StreamId stream) noexcept {
  if (!valid_request(streams, device_bytes, bytes, stream)) [[unlikely]] {
    return request_error(streams, bytes, stream);
  }
  return streams.at(stream);
}

[[gnu::cold, gnu::noinline]] inline error block_error(const DeviceBlock& b, std::uint32_t ordinal) {
  if (b.empty()) return error{errc::empty_block, "the block is empty (moved-from or never allocated)"};
  return error{errc::foreign_block, "block " + b.id().to_string() + " belongs to ordinal " +
                                        std::to_string(b.device_ordinal()) +
                                        ", not to this resource's ordinal " + std::to_string(ordinal)};
}

/// Whether `b` may be handed back to a resource of `ordinal`; block_error says why not.
[[gnu::always_inline]] inline bool valid_block(const DeviceBlock& b, std::uint32_t ordinal) noexcept {
  return !b.empty() && b.device_ordinal() == ordinal;
}

/// Checks that `b` may be handed back to a resource of `ordinal`.
/// Errors: empty_block (moved-from or default), foreign_block (another ordinal).
[[gnu::always_inline]] inline result<void> check_block(const DeviceBlock& b, std::uint32_t ordinal) noexcept {
  if (!valid_block(b, ordinal)) [[unlikely]] return block_error(b, ordinal);
  return ok();
}

}  // namespace xlogrt::detail
