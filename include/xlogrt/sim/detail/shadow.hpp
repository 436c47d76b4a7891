// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: the shadow memory of the stream hazard checker.
//
// The checker runs when an operation is enqueued, not when it executes: every ordering
// edge between stream operations (stream order, event record / wait, host
// synchronisation) is known at enqueue time, so the verdict does not depend on which
// order the executor happens to pick. Each byte range of device memory remembers its
// allocation, its free, its last write and its latest read per stream (as OpRefs); an
// operation whose vector clock does not cover one of them is reported. Keeping one read
// per stream and dropping reads that the newest access is ordered after loses no race:
// if a later write is not ordered after a dropped read R1, it is not ordered after the
// read R2 that R1 was ordered before either, and that pair is reported.
//
// Ranges are kept in an ordered map of disjoint segments; an allocation or a free
// replaces its range with one segment, so the map stays about as large as the number
// of blocks.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/sim/detail/clock.hpp"

namespace xlogrt::detail::sim {

/// One hazard, before the driver turns it into a public report. `first` is the earlier
/// operation (none for unallocated memory), `second` the one being enqueued.
struct Finding {
  HazardKind kind = HazardKind::race;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  OpRef first;
  OpRef second;
};

/// Not thread-safe: guarded by its SimDriver's mutex.
class Shadow {
 public:
  /// [a, a + n) becomes live, allocated by `op`; its history is forgotten.
  void allocate(std::uint64_t a, std::uint64_t n, const OpRef& op) {
    Seg s;
    s.end = a + n;
    s.life = Life::live;
    s.alloc = op;
    replace(a, n, std::move(s));
  }

  /// Frees [a, a + n) by `op` (whose clock is `vc`): every access of the range not
  /// ordered before the free is a free_race.
  void free(std::uint64_t a, std::uint64_t n, const OpRef& op, const VectorClock& vc,
            std::vector<Finding>& out) {
    split(a);
    split(a + n);
    const std::size_t mark = out.size();
    for (auto it = segs_.lower_bound(a); it != segs_.end() && it->first < a + n; ++it) {
      const Seg& s = it->second;
      const std::uint64_t len = s.end - it->first;
      if (s.life != Life::live) continue;
      if (!vc.covers(s.alloc))
        note(out, mark, HazardKind::unordered_alloc, it->first, len, s.alloc, op);
      if (s.write.valid() && !vc.covers(s.write))
        note(out, mark, HazardKind::free_race, it->first, len, s.write, op);
      for (const OpRef& r : s.reads) {
        if (!vc.covers(r)) note(out, mark, HazardKind::free_race, it->first, len, r, op);
      }
    }
    Seg f;
    f.end = a + n;
    f.life = Life::freed;
    f.freed = op;
    replace(a, n, std::move(f));
  }

  /// Checks and records an access of [a, a + n) by `op` (its access mode says read,
  /// write or both).
  void access(std::uint64_t a, std::uint64_t n, const OpRef& op, const VectorClock& vc,
              std::vector<Finding>& out) {
    if (n == 0) return;
    split(a);
    split(a + n);
    const std::size_t mark = out.size();
    const bool is_write = writes(op.access);
    std::uint64_t cur = a;
    const std::uint64_t end = a + n;
    auto it = segs_.lower_bound(a);
    while (cur < end) {
      if (it == segs_.end() || it->first >= end) {
        note(out, mark, HazardKind::unallocated, cur, end - cur, OpRef{}, op);
        break;
      }
      if (it->first > cur) {
        note(out, mark, HazardKind::unallocated, cur, it->first - cur, OpRef{}, op);
        cur = it->first;
      }
      Seg& s = it->second;
      const std::uint64_t len = s.end - it->first;
      if (s.life == Life::freed) {
        note(out, mark, vc.covers(s.freed) ? HazardKind::use_after_free : HazardKind::free_race,
             it->first, len, s.freed, op);
      } else {
        if (!vc.covers(s.alloc)) {
          note(out, mark, HazardKind::unordered_alloc, it->first, len, s.alloc, op);
        }
        if (s.write.valid() && !vc.covers(s.write)) {
          note(out, mark, HazardKind::race, it->first, len, s.write, op);
        }
        if (is_write) {
          for (const OpRef& r : s.reads) {
            if (!vc.covers(r)) note(out, mark, HazardKind::race, it->first, len, r, op);
          }
          s.write = op;
          s.reads.clear();
        } else {
          std::erase_if(s.reads, [&](const OpRef& r) { return vc.covers(r); });
          s.reads.push_back(op);
        }
      }
      cur = s.end;
      ++it;
    }
  }

  void clear() noexcept { segs_.clear(); }
  std::size_t segments() const noexcept { return segs_.size(); }

 private:
  enum class Life : std::uint8_t { live, freed };

  struct Seg {
    std::uint64_t end = 0;
    Life life = Life::live;
    OpRef alloc;
    OpRef freed;
    OpRef write;
    std::vector<OpRef> reads;  // at most one per stream, none ordered before another
  };

  // Cuts the segment that strictly contains `at` in two.
  void split(std::uint64_t at) {
    auto it = segs_.upper_bound(at);
    if (it == segs_.begin()) return;
    --it;
    if (it->first < at && it->second.end > at) {
      Seg tail = it->second;
      it->second.end = at;
      segs_.emplace_hint(std::next(it), at, std::move(tail));
    }
  }

  void replace(std::uint64_t a, std::uint64_t n, Seg s) {
    split(a);
    split(a + n);
    auto first = segs_.lower_bound(a);
    auto last = segs_.lower_bound(a + n);
    segs_.erase(first, last);
    segs_.emplace(a, std::move(s));
  }

  // One finding per (kind, earlier operation) for the operation being checked: a
  // kernel over a fragmented range reports its conflict once, with the bytes summed.
  static void note(std::vector<Finding>& out, std::size_t mark, HazardKind kind, std::uint64_t addr,
                   std::uint64_t bytes, const OpRef& first, const OpRef& second) {
    for (std::size_t i = mark; i < out.size(); ++i) {
      if (out[i].kind == kind && out[i].first == first) {
        out[i].bytes += bytes;
        return;
      }
    }
    out.push_back(Finding{kind, addr, bytes, first, second});
  }

  std::map<std::uint64_t, Seg> segs_;  // start -> segment; gaps were never allocated
};

}  // namespace xlogrt::detail::sim
