// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::FreeRanges: the free ranges of one address space, kept best-fit and coalesced,
// each carrying a sequence number. VirtualCuda keeps one set of ranges known free on
// every stream (sequence 0) and one per stream for the ranges freed on it whose free is
// not yet known complete; there the sequence is the stream's free count at the latest
// free that produced the range, and a range retires once the device is seen past it.
//
// Invariants: the ranges are disjoint; an insert merges the new range with each
// neighbour whose sequence is at least the insert's `merge_from`, the merged range
// taking the larger sequence (a stream that is past the later free is past the earlier
// one too), so in the set of free ranges (every sequence 0) no two are adjacent. VirtualCuda
// passes a stream's first sequence after its poll's latest mark: a range the mark covers
// never takes a later free's sequence, and retires when the mark is reached, however
// long the stream goes on freeing next to it. `by_size` holds exactly the pairs (bytes,
// offset) of `by_addr`, each in its region's set; `bytes()` is the sum of the ranges'
// sizes. Offsets and sizes are whatever the caller gives (VirtualCuda keeps
// both multiples of its alignment); the set does not align them.
//
// Regions. set_boundary(b) cuts the space in two regions, [0, b) and [b, ...): no range
// crosses b (an insert never merges across it, and callers insert no range that
// crosses it), and best_fit searches one region. VirtualCuda keeps the blocks a cache
// above may hold in a region of their own this way, so that they share pages with one
// another and not with the large blocks (region 0 below the boundary, 1 from it).
// Without a boundary (0) everything is region 1.
//
// Not thread-safe: VirtualCuda guards it with its arena mutex. Its members allocate
// (std::map nodes) and may throw std::bad_alloc; callers catch it.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace xlogrt::detail {

class FreeRanges {
 public:
  struct Range {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
    std::uint64_t seq = 0;
  };

  /// The region below `boundary` is 0, the rest 1. Set on an empty set only.
  void set_boundary(std::uint64_t boundary) noexcept { boundary_ = boundary; }
  std::uint64_t boundary() const noexcept { return boundary_; }
  std::size_t region_of(std::uint64_t offset) const noexcept { return offset < boundary_ ? 0 : 1; }

  /// Adds [offset, offset + bytes), which overlaps no range of the set and does not cross
  /// the boundary, merging it with the ranges that touch it in its region and carry a
  /// sequence of at least `merge_from`.
  void insert(std::uint64_t offset, std::uint64_t bytes, std::uint64_t seq, std::uint64_t merge_from = 0) {
    std::uint64_t start = offset;
    std::uint64_t end = offset + bytes;
    auto next = by_addr_.lower_bound(offset);
    if (next != by_addr_.begin() && start != boundary_) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.bytes == start && prev->second.seq >= merge_from) {
        start = prev->first;
        seq = std::max(seq, prev->second.seq);
        erase(prev);
      }
    }
    next = by_addr_.lower_bound(end);
    if (next != by_addr_.end() && next->first == end && end != boundary_ && next->second.seq >= merge_from) {
      end += next->second.bytes;
      seq = std::max(seq, next->second.seq);
      erase(next);
    }
    by_addr_.emplace(start, Value{end - start, seq});
    sizes(start).emplace(end - start, start);
    total_ += end - start;
  }

  /// The smallest range of at least `bytes` in `region` (the lowest address among equals).
  std::optional<Range> best_fit(std::uint64_t bytes, std::size_t region = 1) const {
    const auto& by_size = by_size_[region];
    auto it = by_size.lower_bound({bytes, 0});
    if (it == by_size.end()) return std::nullopt;
    const Value& v = by_addr_.at(it->second);
    return Range{it->second, v.bytes, v.seq};
  }

  /// Removes the first `bytes` of the range that starts at `offset` (best_fit's); the
  /// rest stays, with the same sequence.
  void take_front(std::uint64_t offset, std::uint64_t bytes) {
    auto it = by_addr_.find(offset);
    const Value v = it->second;
    erase(it);
    if (v.bytes > bytes) {
      by_addr_.emplace(offset + bytes, Value{v.bytes - bytes, v.seq});
      sizes(offset + bytes).emplace(v.bytes - bytes, offset + bytes);
      total_ += v.bytes - bytes;
    }
  }

  /// Moves every range whose sequence is at most `seq` into `to` (as sequence 0), and
  /// returns how many bytes moved.
  std::uint64_t retire_into(FreeRanges& to, std::uint64_t seq) {
    std::uint64_t moved = 0;
    for (auto it = by_addr_.begin(); it != by_addr_.end();) {
      if (it->second.seq > seq) {
        ++it;
        continue;
      }
      const std::uint64_t off = it->first;
      const std::uint64_t n = it->second.bytes;
      it = erase(it);
      to.insert(off, n, 0);
      moved += n;
    }
    return moved;
  }

  /// Calls f(offset, bytes) for every range, in address order.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [off, v] : by_addr_) f(off, v.bytes);
  }

  /// Calls f(offset, bytes) for every range in address order while f returns true.
  template <class F>
  void for_each_until(F&& f) const {
    for (const auto& [off, v] : by_addr_) {
      if (!f(off, v.bytes)) return;
    }
  }

  std::uint64_t bytes() const noexcept { return total_; }
  std::size_t count() const noexcept { return by_addr_.size(); }
  bool empty() const noexcept { return by_addr_.empty(); }

 private:
  struct Value {
    std::uint64_t bytes = 0;
    std::uint64_t seq = 0;
  };
  using Map = std::map<std::uint64_t, Value>;
  using Sizes = std::set<std::pair<std::uint64_t, std::uint64_t>>;  // (size, offset)

  Sizes& sizes(std::uint64_t offset) noexcept { return by_size_[region_of(offset)]; }

  Map::iterator erase(Map::iterator it) {
    sizes(it->first).erase({it->second.bytes, it->first});
    total_ -= it->second.bytes;
    return by_addr_.erase(it);
  }

  Map by_addr_;                   // offset -> size, sequence
  std::array<Sizes, 2> by_size_;  // per region
  std::uint64_t total_ = 0;
  std::uint64_t boundary_ = 0;    // 0: everything in region 1
};

}  // namespace xlogrt::detail
