// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: one device's memory bookkeeping (its arena, live blocks, pending
// frees and quarantine).
//
// The arena is [base, base + capacity) of device addresses, backed by `storage`; offsets
// come from a first-fit RangeAllocator. A freed range does not go back to it at once: it
// is kept in `recycled`, first while its free is enqueued and not run (counted in
// `pending`), then once the free has run, in quarantine (counted in `quarantined` and
// `quarantined_blocks`). A recycled range can be taken by an allocation whose clock is
// ordered after the free, even before the free has run (newest first), which is the
// least forgiving choice CUDA's stream-ordered allocator allows. The quarantine returns
// its oldest executed ranges to the free list when it holds more than its limits, and
// all of them when an allocation would otherwise fail.
//
// Graph allocations (sim/detail/capture.hpp) hold ranges of their own, taken with
// reserve() and counted in `graph_reserved` until release_reserved(); a launch makes such
// a range a live block marked `graph`, which is not counted in `allocated` (its range is
// still the graph's), unless adopt_reserved() hands it over for good.
//
// Physical allocations of the virtual memory calls (mem_create, sim/detail/virtual_memory.hpp)
// hold ranges of the arena too, taken with take_physical() aligned to the granularity and
// counted in `physical` until release_physical(); their bytes live in the device's backing
// file at the same offset, not in `storage`. A context reset keeps them: physical memory
// belongs to the device, not to its primary context.
//
// Invariants: allocated = sum of live non-graph blocks' rounded sizes; pending + quarantined =
// sum of recycled ranges' sizes, split by `executed`; quarantined_blocks = the number of
// executed recycled ranges; physical = sum of physical_ranges' sizes; peak >= allocated. The byte fills (uninitialised and
// poison) are the driver's, which knows the configuration; this is bookkeeping only.
//
// Not thread-safe: guarded by its SimDriver's mutex (every caller is a *_locked
// function of the driver, or an entry point holding the lock).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "xlogrt/sim/detail/clock.hpp"
#include "xlogrt/sim/detail/memory.hpp"

namespace xlogrt::detail::sim {

/// A live allocation, keyed by device address in DeviceMemory::blocks.
struct Block {
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  bool pooled = false;  // from mem_alloc_async (true) or mem_alloc
  bool graph = false;   // a graph allocation made live by a launch: its range stays the graph's
};

/// A freed range not yet returned to the free list: its free is pending (`executed`
/// false) or it sits in quarantine. An allocation ordered after `free` may take it.
struct Recycled {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  OpRef free;
  std::uint64_t free_id = 0;
  bool executed = false;
};

struct DeviceMemory {
  using Blocks = std::map<std::uint64_t, Block>;

  std::uint64_t base = 0;  // device address of offset 0
  Mapping storage;
  RangeAllocator space;
  Blocks blocks;
  std::vector<Recycled> recycled;  // in order of free
  std::uint64_t allocated = 0;
  std::uint64_t pending = 0;
  std::uint64_t quarantined = 0;
  std::uint64_t quarantined_blocks = 0;
  std::uint64_t peak = 0;
  std::uint64_t graph_reserved = 0;  // ranges held by graph allocations
  std::uint64_t physical = 0;        // ranges held by physical allocations
  std::map<std::uint64_t, std::uint64_t> physical_ranges;  // offset -> bytes

  /// The offset for a new block of `need` bytes, for an allocation whose clock is `vc`:
  /// first a recycled range whose free is ordered before it (newest first), then the
  /// free list, then the free list after the quarantine has been emptied.
  std::optional<std::uint64_t> allocate(std::uint64_t need, const VectorClock& vc) {
    for (std::size_t i = recycled.size(); i-- > 0;) {
      Recycled& r = recycled[i];
      if (r.bytes < need || !vc.covers(r.free)) continue;
      const std::uint64_t off = r.offset;
      r.offset += need;
      r.bytes -= need;
      (r.executed ? quarantined : pending) -= need;
      if (r.bytes == 0) {
        if (r.executed) --quarantined_blocks;
        recycled.erase(recycled.begin() + static_cast<std::ptrdiff_t>(i));
      }
      return off;
    }
    if (auto off = space.allocate(need)) return off;
    trim_quarantine(0, 0);
    return space.allocate(need);
  }

  /// A range of `need` bytes for a graph allocation, kept out of reuse until
  /// release_reserved(). From the free list only: a recycled range is ordered after its
  /// free for the capturing stream, not for every stream the graph may be launched on.
  std::optional<std::uint64_t> reserve(std::uint64_t need) {
    auto off = space.allocate(need);
    if (!off) {
      trim_quarantine(0, 0);
      off = space.allocate(need);
    }
    if (off) graph_reserved += need;
    return off;
  }

  /// A range of `need` bytes, at an offset that is a multiple of `align`, for a physical
  /// allocation; from the free list (after emptying the quarantine if it must), as
  /// reserve().
  std::optional<std::uint64_t> take_physical(std::uint64_t need, std::uint64_t align) {
    auto off = space.allocate_aligned(need, align);
    if (!off) {
      trim_quarantine(0, 0);
      off = space.allocate_aligned(need, align);
    }
    if (off) {
      physical += need;
      physical_ranges.emplace(*off, need);
    }
    return off;
  }

  /// The physical allocation at `offset` is freed: its range is free again.
  void release_physical(std::uint64_t offset) {
    auto it = physical_ranges.find(offset);
    space.release(it->first, it->second);
    physical -= it->second;
    physical_ranges.erase(it);
  }

  /// The graph holding [offset, offset + bytes) is gone: the range is free again.
  void release_reserved(std::uint64_t offset, std::uint64_t bytes) {
    space.release(offset, bytes);
    graph_reserved -= bytes;
  }

  /// The graph holding a range is gone while the range is live (a block marked graph):
  /// the block keeps it, as an ordinary allocation from now on.
  void adopt_reserved(Blocks::iterator it) {
    it->second.graph = false;
    graph_reserved -= it->second.rounded;
    allocated += it->second.rounded;
    peak = std::max(peak, allocated);
  }

  /// Records the block at `addr`, taken by allocate().
  void add_block(std::uint64_t addr, std::uint64_t requested, std::uint64_t rounded, bool pooled) {
    blocks.emplace(addr, Block{requested, rounded, pooled});
    allocated += rounded;
    peak = std::max(peak, allocated);
  }

  /// The block `it` is freed by an enqueued free `free`, named `free_id`; it is pending
  /// until free_ran(free_id).
  void free_enqueued(Blocks::iterator it, const OpRef& free, std::uint64_t free_id) {
    const std::uint64_t rounded = it->second.rounded;
    recycled.push_back(Recycled{it->first - base, rounded, free, free_id, false});
    pending += rounded;
    allocated -= rounded;
    blocks.erase(it);
  }

  /// The enqueued free named `free_id` has run: its ranges go into quarantine.
  void free_ran(std::uint64_t free_id) {
    for (auto& r : recycled) {
      if (r.free_id == free_id && !r.executed) {
        r.executed = true;
        pending -= r.bytes;
        quarantined += r.bytes;
        ++quarantined_blocks;
      }
    }
  }

  /// The block `it` is freed at once (mem_free), by `free`: straight into quarantine.
  void free_now(Blocks::iterator it, const OpRef& free, std::uint64_t free_id) {
    const std::uint64_t rounded = it->second.rounded;
    recycled.push_back(Recycled{it->first - base, rounded, free, free_id, true});
    allocated -= rounded;
    quarantined += rounded;
    ++quarantined_blocks;
    blocks.erase(it);
  }

  /// Returns executed ranges to the free list, oldest first, until the quarantine holds
  /// at most `bytes_limit` bytes and `blocks_limit` ranges.
  void trim_quarantine(std::uint64_t bytes_limit, std::uint64_t blocks_limit) {
    auto it = recycled.begin();
    while (it != recycled.end() &&
           (quarantined > bytes_limit || quarantined_blocks > blocks_limit)) {
      if (!it->executed) {
        ++it;
        continue;
      }
      space.release(it->offset, it->bytes);
      quarantined -= it->bytes;
      --quarantined_blocks;
      it = recycled.erase(it);
    }
  }

  /// Everything free again (the context was destroyed) but the physical allocations,
  /// which the device keeps; the peak stays.
  void reset() {
    blocks.clear();
    recycled.clear();
    space.reset();
    for (const auto& [offset, bytes] : physical_ranges) space.take(offset, bytes);
    allocated = pending = quarantined = quarantined_blocks = graph_reserved = 0;
  }
};

}  // namespace xlogrt::detail::sim
