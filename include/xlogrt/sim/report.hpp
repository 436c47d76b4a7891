// SPDX-License-Identifier: Apache-2.0
#pragma once

// The vocabulary SimDriver hands to tests: the accesses a simulated kernel declares
// (SimAccess) and its host body (SimKernelBody), what a failure injection answers
// (SimInjection), the hazard reports (SimOp, SimHazard, each with a to_string that reads
// as a sentence), the per-device memory accounting (SimMemoryStats) and the stream
// capture counters (SimCaptureStats).
//
// Every type here is a value: a report or a snapshot copied out of the driver under its
// lock, so a test may keep and compare them after the driver has moved on. A SimOp names
// its stream by handle and by id; the handle stays a valid pointer for the driver's life
// (sim/detail/objects.hpp), but may name a destroyed stream.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/sim/detail/clock.hpp"

namespace xlogrt {

namespace detail::sim {
struct Stream;
}  // namespace detail::sim

/// A byte range a simulated kernel declares it touches, and how.
///
/// Not thread-safe: a value.
struct SimAccess {
  std::uint64_t ptr = 0;
  std::size_t bytes = 0;
  Access access = Access::Read;
};

/// The host body of a simulated kernel: receives one host pointer per declared access,
/// in declaration order, through which it reads and writes the simulated bytes. It runs
/// with no driver lock held and must not throw (a throwing body faults its stream with
/// status::launch_failed).
using SimKernelBody = std::function<void(std::span<std::byte* const>)>;

/// Kinds of simulated operations and of hazards (see sim/detail/clock.hpp for the
/// list); `to_string` names them.
using SimOpKind = detail::sim::OpKind;
using SimHazardKind = detail::sim::HazardKind;
using detail::sim::to_string;

/// What SimDriver::fail_nth / fail_always return: whether the injection is armed, and
/// if not, why. Deliberately not [[nodiscard]]: misuse also makes every later driver
/// call fail, so a test that ignores this still cannot miss a misspelt name.
///
/// Not thread-safe: a value.
struct SimInjection {
  bool armed = false;
  std::string problem;
  bool has_value() const noexcept { return armed; }
  explicit operator bool() const noexcept { return armed; }
};

/// One simulated operation, as a hazard report names it.
///
/// Not thread-safe: a value.
struct SimOp {
  SimOpKind kind = SimOpKind::none;
  detail::sim::Stream* stream = nullptr;  ///< its SimDriver::stream_t; null for the host
  std::uint32_t stream_id = 0;            ///< SimDriver::stream_id; 0 is the host
  int device = -1;                        ///< the stream's device; -1 for the host
  std::uint64_t seq = 0;                  ///< 1-based position in its stream
  Access access = Access::Read;
  std::string label;  ///< a kernel's label
};

/// One hazard the checker found. `second` is the operation whose enqueue revealed it;
/// `first` the earlier operation it conflicts with (kind none for unallocated memory).
///
/// Not thread-safe: a value (SimDriver::hazards() hands out copies).
struct SimHazard {
  SimHazardKind kind = SimHazardKind::race;
  int device = -1;  ///< owner of `address`; -1 for mapped host memory or no device
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  SimOp first;
  SimOp second;
};

/// Per-device memory accounting, in bytes rounded to SimDriver::alloc_granularity.
///
/// Not thread-safe: a value (a snapshot).
struct SimMemoryStats {
  std::size_t total = 0;
  std::size_t allocated = 0;     ///< handed out and not freed (free not yet enqueued)
  std::size_t free_pending = 0;  ///< freed by an enqueued free that has not run
  std::size_t quarantined = 0;   ///< freed, run, and not yet back in general reuse
  std::size_t peak_allocated = 0;
  std::size_t live_blocks = 0;
  std::size_t graph_reserved = 0;  ///< held by graph allocation nodes while their graph lives
  /// held by physical allocations (mem_create) until released and unmapped, in bytes
  /// (multiples of SimConfig::vmm_granularity)
  std::size_t physical = 0;
};

/// What SimDriver has seen of stream capture since it was built (capture_stats()). The
/// graph memory counters let a test assert that a stack captured into a graph never
/// makes graph allocation nodes, nor frees memory from outside the graph in it (such a
/// free runs at every launch of the graph).
///
/// Not thread-safe: a value (a snapshot).
struct SimCaptureStats {
  std::uint64_t captures_begun = 0;
  std::uint64_t captures_ended = 0;        ///< ended with a graph
  std::uint64_t captures_failed = 0;       ///< ended without one (invalidated, unjoined)
  std::uint64_t captures_invalidated = 0;  ///< by a call that broke a capture rule
  std::uint64_t graph_alloc_nodes = 0;     ///< mem_alloc_async on a capturing stream
  std::uint64_t graph_free_nodes = 0;      ///< mem_free_async on a capturing stream
  std::uint64_t graph_frees_of_outside_memory = 0;  ///< of those, of memory allocated outside
  std::uint64_t graph_launches = 0;
  std::uint64_t replayed_frees_of_outside_memory = 0;  ///< such frees run by launches
};

namespace detail::sim {
inline std::string hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), digits[v & 0xF]);
    v >>= 4;
  } while (v != 0);
  return "0x" + s;
}
}  // namespace detail::sim

/// "kernel 'scale' (stream 3 of device 0, op #5, read)", "mem_free (host, op #2, write)".
inline std::string to_string(const SimOp& op) {
  std::string s(to_string(op.kind));
  if (!op.label.empty()) s += " '" + op.label + "'";
  if (op.kind == SimOpKind::none) return s;
  if (op.stream_id == 0) {
    s += " (host";
  } else {
    s += " (stream " + std::to_string(op.stream_id) + " of device " + std::to_string(op.device);
  }
  s += ", op #" + std::to_string(op.seq) + ", ";
  s += op.access == Access::Read ? "read" : op.access == Access::Write ? "write" : "read-write";
  s += ")";
  return s;
}

/// One sentence naming the hazard, the memory and both operations.
inline std::string to_string(const SimHazard& h) {
  std::string s(to_string(h.kind));
  s += " on ";
  s += h.device < 0 ? std::string("host-mapped or unmapped memory")
                    : "device " + std::to_string(h.device);
  s += ", " + std::to_string(h.bytes) + " bytes at " + detail::sim::hex(h.address) + ": ";
  switch (h.kind) {
    case SimHazardKind::race:
      s += to_string(h.second) + " and " + to_string(h.first) +
           " touch the same bytes, at least one writes, and no event wait or "
           "synchronisation orders them";
      break;
    case SimHazardKind::free_race:
      s += to_string(h.second) + " and " + to_string(h.first) +
           " are not ordered, so the memory can be freed and reused while it is still "
           "accessed; make the freeing stream wait on an event recorded after the access";
      break;
    case SimHazardKind::use_after_free:
      s += to_string(h.second) + " accesses memory already freed by " + to_string(h.first);
      break;
    case SimHazardKind::unallocated:
      s += to_string(h.second) + " accesses memory that no allocation covers";
      break;
    case SimHazardKind::unordered_alloc:
      s += to_string(h.second) + " is not ordered after " + to_string(h.first) +
           ", which allocates the memory";
      break;
  }
  return s;
}

}  // namespace xlogrt
