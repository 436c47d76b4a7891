// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::recycle_alone: the common case of a base resource's recycle_block (AsyncCuda's
// and VirtualCuda's, whose block tables keep the same Track members): a valid block used
// on its alloc stream only, as a cached block always is, renewed for stream `to` under its
// slot's lock alone, with no driver call and no result to build. Anything else (bad
// input, uses on other streams, a slot in its last generation) is left to the caller's
// general path, which checks in full and says why. Inline, so that a caching layer's free
// stays one piece of code.

#include <cstdint>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/resource/block_table.hpp"
#include "xlogrt/resource/detail/request.hpp"

namespace xlogrt::detail {

/// The renewed block, `b` moved from; or an empty block, `b` untouched.
template <class Table, class Streams>
[[gnu::always_inline]] inline DeviceBlock recycle_alone(Table& table, const Streams& streams, std::uint32_t ordinal,
                                                        DeviceBlock& b, StreamId to, Park park) noexcept {
  if (!valid_block(b, ordinal) || !streams.contains(b.alloc_stream()) || !streams.contains(to)) [[unlikely]] {
    return DeviceBlock{};
  }
  const BlockId id = table.try_renew(
      b.id(), &b,
      [&](auto& t) noexcept {
        if (t.alloc_stream != b.alloc_stream() || !t.alone()) [[unlikely]] return false;
        t.start(to);
        return true;
      },
      park);
  if (!id.valid()) [[unlikely]] return DeviceBlock{};
  DeviceBlock next{b.ptr(), b.bytes(), to, ordinal, b.tag(), id};
  DeviceBlock gone = std::move(b);
  return next;
}

}  // namespace xlogrt::detail
