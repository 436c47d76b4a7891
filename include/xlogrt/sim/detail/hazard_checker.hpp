// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: the hazard checker, from an access to a report.
//
// The driver calls it while it enqueues an operation, with the operation's place
// (OpRef) and the vector clock of its stream at that point: check() for an access to
// device memory, allocate() and free() for the lifetime of a block, unallocated() for an
// access to the mapped host window that no mapping covers. Each call leaves its
// findings in a scratch list (empty between calls); record() turns them into SimHazard
// reports, naming streams through the driver's stream table and addresses through the
// driver's address layout, which it is handed because both belong to the driver.
//
// Invariants: the shadow (sim/detail/shadow.hpp) holds the history of every byte range
// the checker has seen; at most `max_hazards` reports are kept and every later one is
// counted in dropped(), so a run with many hazards stays bounded; label 0 is the empty
// label and interned labels are never forgotten (an OpRef names its label by index).
//
// Not thread-safe: guarded by its SimDriver's mutex, like everything the driver owns;
// the driver's *_locked functions are the only callers.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xlogrt/sim/detail/clock.hpp"
#include "xlogrt/sim/detail/objects.hpp"
#include "xlogrt/sim/detail/shadow.hpp"
#include "xlogrt/sim/report.hpp"

namespace xlogrt::detail::sim {

class HazardChecker {
 public:
  explicit HazardChecker(std::size_t max_hazards) : max_hazards_(max_hazards) {
    labels_.emplace_back();
    label_ids_.emplace(std::string(), 0);
  }

  /// The index of `label`, interned on first use.
  std::uint32_t intern(std::string_view label) {
    std::string key(label);
    auto it = label_ids_.find(key);
    if (it != label_ids_.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(labels_.size());
    labels_.push_back(key);
    label_ids_.emplace(std::move(key), id);
    return id;
  }

  /// [a, a + n) becomes live, allocated by `op`. Finds nothing.
  void allocate(std::uint64_t a, std::uint64_t n, const OpRef& op) { shadow_.allocate(a, n, op); }

  /// `op` (clock `vc`) accesses [a, a + n) of device memory.
  void check(const OpRef& op, const VectorClock& vc, std::uint64_t a, std::uint64_t n) {
    findings_.clear();
    shadow_.access(a, n, op, vc, findings_);
  }

  /// `op` accesses [a, a + n) of the mapped host window, which no mapping covers.
  void unallocated(const OpRef& op, std::uint64_t a, std::uint64_t n) {
    findings_.clear();
    findings_.push_back(Finding{HazardKind::unallocated, a, n, OpRef{}, op});
  }

  /// `op` (clock `vc`) frees [a, a + n); findings accumulate until record().
  void free(std::uint64_t a, std::uint64_t n, const OpRef& op, const VectorClock& vc) {
    shadow_.free(a, n, op, vc, findings_);
  }

  /// Turns the findings into reports (or counts them once max_hazards are kept) and
  /// empties the scratch list. `streams` is the driver's stream table (index = id);
  /// `device_ordinal(address)` is the ordinal of the device that owns an address, -1 for
  /// none.
  template <class DeviceOrdinal>
  void record(std::span<const std::unique_ptr<Stream>> streams, DeviceOrdinal&& device_ordinal) {
    for (const auto& f : findings_) {
      if (hazards_.size() >= max_hazards_) {
        ++dropped_;
        continue;
      }
      SimHazard h;
      h.kind = f.kind;
      h.device = device_ordinal(f.address);
      h.address = f.address;
      h.bytes = f.bytes;
      h.first = describe(f.first, streams);
      h.second = describe(f.second, streams);
      hazards_.push_back(std::move(h));
    }
    findings_.clear();
  }

  const std::vector<SimHazard>& hazards() const noexcept { return hazards_; }
  std::uint64_t dropped() const noexcept { return dropped_; }
  /// Forgets the reports and the dropped count (not the shadow: the history stays).
  void clear() noexcept {
    hazards_.clear();
    dropped_ = 0;
  }

 private:
  SimOp describe(const OpRef& r, std::span<const std::unique_ptr<Stream>> streams) const {
    SimOp o;
    o.kind = r.kind;
    o.seq = r.seq;
    o.access = r.access;
    o.stream_id = r.stream;
    if (r.stream != 0 && r.stream < streams.size()) {
      o.stream = streams[r.stream].get();
      o.device = o.stream->device->ordinal;
    }
    if (r.label < labels_.size()) o.label = labels_[r.label];
    return o;
  }

  std::size_t max_hazards_;
  Shadow shadow_;
  std::vector<Finding> findings_;
  std::vector<SimHazard> hazards_;
  std::uint64_t dropped_ = 0;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, std::uint32_t> label_ids_;
};

}  // namespace xlogrt::detail::sim
