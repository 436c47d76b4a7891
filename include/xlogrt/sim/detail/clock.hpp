// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: the vocabulary of the hazard checker. Operation kinds, the
// compact reference to one enqueued operation (its stream and position), and the
// vector clock that orders them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "xlogrt/core/ids.hpp"

namespace xlogrt::detail::sim {

/// What a simulated operation is. The host pseudo-stream (id 0) runs the synchronous
/// ones (mem_alloc, mem_free).
enum class OpKind : std::uint8_t {
  none,               ///< no operation (a hazard with one side only)
  mem_alloc_async,    ///< stream-ordered allocation
  mem_free_async,     ///< stream-ordered free
  memset,             ///< memset_d8_async
  memcpy_htod,        ///< memcpy_htod_async
  memcpy_dtoh,        ///< memcpy_dtoh_async
  memcpy_dtod,        ///< memcpy_dtod_async
  write_value32,      ///< stream_write_value32
  kernel,             ///< SimDriver::launch_kernel
  host_func,          ///< launch_host_func
  event_record,       ///< event_record
  stream_wait_event,  ///< stream_wait_event
  mem_alloc,          ///< synchronous mem_alloc (host pseudo-stream)
  mem_free,           ///< synchronous mem_free (host pseudo-stream)
  context_reset,      ///< the last primary_ctx_release freed the device's memory
  mem_set_access,     ///< mem_set_access made a mapping accessible (host pseudo-stream)
  mem_unmap,          ///< mem_unmap of an accessible mapping (host pseudo-stream)
};

constexpr std::string_view to_string(OpKind k) noexcept {
  switch (k) {
    case OpKind::none: return "none";
    case OpKind::mem_alloc_async: return "mem_alloc_async";
    case OpKind::mem_free_async: return "mem_free_async";
    case OpKind::memset: return "memset_d8_async";
    case OpKind::memcpy_htod: return "memcpy_htod_async";
    case OpKind::memcpy_dtoh: return "memcpy_dtoh_async";
    case OpKind::memcpy_dtod: return "memcpy_dtod_async";
    case OpKind::write_value32: return "stream_write_value32";
    case OpKind::kernel: return "kernel";
    case OpKind::host_func: return "host_func";
    case OpKind::event_record: return "event_record";
    case OpKind::stream_wait_event: return "stream_wait_event";
    case OpKind::mem_alloc: return "mem_alloc";
    case OpKind::mem_free: return "mem_free";
    case OpKind::context_reset: return "context_reset";
    case OpKind::mem_set_access: return "mem_set_access";
    case OpKind::mem_unmap: return "mem_unmap";
  }
  return "unknown";
}

/// What the checker found.
enum class HazardKind : std::uint8_t {
  race,             ///< two accesses on different streams, one a write, not ordered
  free_race,        ///< an access and a free of its memory on different streams, not ordered
  use_after_free,   ///< an access ordered after the free of its memory
  unallocated,      ///< an access to memory no allocation ever covered
  unordered_alloc,  ///< an access not ordered after the allocation of its memory
};

constexpr std::string_view to_string(HazardKind k) noexcept {
  switch (k) {
    case HazardKind::race: return "race";
    case HazardKind::free_race: return "free_race";
    case HazardKind::use_after_free: return "use_after_free";
    case HazardKind::unallocated: return "unallocated";
    case HazardKind::unordered_alloc: return "unordered_alloc";
  }
  return "unknown";
}

/// One enqueued operation, as the checker remembers it: `seq` is its 1-based position
/// in stream `stream` (0 is the host pseudo-stream), `label` an interned name.
struct OpRef {
  std::uint64_t seq = 0;
  std::uint32_t stream = 0;
  std::uint32_t label = 0;
  OpKind kind = OpKind::none;
  Access access = Access::Read;

  constexpr bool valid() const noexcept { return kind != OpKind::none; }
  friend constexpr bool operator==(const OpRef&, const OpRef&) = default;
};

/// A vector clock over stream ids: component i is the position of the last operation
/// of stream i known to happen before the owner. Missing components are 0.
///
/// Not thread-safe: a value, guarded by its SimDriver's mutex.
class VectorClock {
 public:
  std::uint64_t get(std::uint32_t i) const noexcept { return i < c_.size() ? c_[i] : 0; }

  void set(std::uint32_t i, std::uint64_t v) {
    if (i >= c_.size()) c_.resize(std::size_t{i} + 1, 0);
    c_[i] = v;
  }

  void join(const VectorClock& o) {
    if (o.c_.size() > c_.size()) c_.resize(o.c_.size(), 0);
    for (std::size_t i = 0; i < o.c_.size(); ++i) c_[i] = std::max(c_[i], o.c_[i]);
  }

  /// Whether operation `r` happens before the owner of this clock.
  bool covers(const OpRef& r) const noexcept { return get(r.stream) >= r.seq; }

 private:
  std::vector<std::uint64_t> c_;
};

}  // namespace xlogrt::detail::sim
