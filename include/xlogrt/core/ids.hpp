// SPDX-License-Identifier: Apache-2.0
#pragma once

// Small value types of the public vocabulary: StreamId, AllocTag, BlockId, Access.

#include <atomic>
#include <compare>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

namespace xlogrt {

/// Names a stream of a runtime's StreamPool. DEFAULT is the pool's first stream.
struct StreamId {
  std::uint32_t value = 0;
  static const StreamId DEFAULT;
  friend constexpr bool operator==(StreamId, StreamId) = default;  // spelt out for nvcc
  friend constexpr auto operator<=>(StreamId, StreamId) = default;
};
inline constexpr StreamId StreamId::DEFAULT{0};

/// A small label on every allocation (operator, query, phase). Logging and
/// statistics report by tag. UNTAGGED is 0.
struct AllocTag {
  std::uint32_t value = 0;
  static const AllocTag UNTAGGED;
  friend constexpr bool operator==(AllocTag, AllocTag) = default;  // spelt out for nvcc
  friend constexpr auto operator<=>(AllocTag, AllocTag) = default;
};
inline constexpr AllocTag AllocTag::UNTAGGED{0};

/// Copyable handle of a live block. `owner` names the resource instance that made it
/// (a process-unique serial), `index` its slot in that resource's block table, and
/// `generation` the slot's use count, so the id of a freed block is recognised as
/// stale and never confused with a newer block in the same slot.
struct BlockId {
  static constexpr std::uint32_t NO_INDEX = std::numeric_limits<std::uint32_t>::max();
  std::uint32_t owner = 0;
  std::uint32_t index = NO_INDEX;
  std::uint32_t generation = 0;

  constexpr bool valid() const noexcept { return index != NO_INDEX; }
  friend constexpr bool operator==(BlockId, BlockId) = default;

  /// "owner#index.generation", for messages.
  std::string to_string() const {
    return std::to_string(owner) + "#" + std::to_string(index) + "." + std::to_string(generation);
  }
};

namespace detail {
/// A new process-unique owner serial for the ids of a resource's blocks (BlockId::owner):
/// one sequence for every kind of block table, so that no two tables, of whatever entry
/// type, name their blocks with the same owner.
inline std::uint32_t next_block_owner() noexcept {
  static std::atomic<std::uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

/// How enqueued work touches a block.
enum class Access : std::uint8_t { Read = 1, Write = 2, ReadWrite = 3 };

constexpr bool reads(Access a) noexcept { return (static_cast<unsigned>(a) & 1u) != 0; }
constexpr bool writes(Access a) noexcept { return (static_cast<unsigned>(a) & 2u) != 0; }

}  // namespace xlogrt

template <>
struct std::hash<xlogrt::StreamId> {
  std::size_t operator()(xlogrt::StreamId s) const noexcept { return s.value; }
};
