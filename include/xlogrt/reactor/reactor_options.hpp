// SPDX-License-Identifier: Apache-2.0
#pragma once

// ReactorOptions, how a Reactor is built, and ReactorCounters, what it reports. Plain
// values: they name the reactor's knobs (completion slots, the scanner's idle policy,
// the fault probe's period) and its counts without pulling in the reactor itself.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "xlogrt/core/result.hpp"

namespace xlogrt {

/// The most completion slots a reactor may have.
inline constexpr std::size_t REACTOR_MAX_SLOTS = std::size_t{1} << 20;

/// How a Reactor is built. The defaults suit an engine with a few hundred waits in flight.
///
/// Not thread-safe: a plain value, copied by Reactor::create.
struct ReactorOptions {
  /// Completion slots (flags): waits armed at once with a flag write; more fall back to
  /// host functions. 1 to REACTOR_MAX_SLOTS (1,048,576).
  std::size_t slots = 1024;
  /// After the last completion, poll without giving the core away for this long...
  std::chrono::nanoseconds spin_for = std::chrono::microseconds(50);
  /// ...then poll yielding the core between passes for this long...
  std::chrono::nanoseconds yield_for = std::chrono::microseconds(450);
  /// ...then, while a slot is armed, poll between naps of up to this long (0: keep
  /// yielding); with nothing armed, park.
  std::chrono::nanoseconds nap_max = std::chrono::microseconds(50);
  /// While waits are armed, how often their streams are queried for faults. > 0.
  std::chrono::nanoseconds probe_every = std::chrono::milliseconds(10);
  /// false: every wait takes the host-function path (for comparisons and tests).
  bool flag_writes = true;
};

/// ok() when `o` may build a reactor; invalid_argument, saying which option is out of
/// range, when it may not. Reactor::create checks this first.
inline result<void> check_reactor_options(const ReactorOptions& o) noexcept {
  if (o.slots == 0 || o.slots > REACTOR_MAX_SLOTS) {
    return error{errc::invalid_argument, "a reactor has 1 to " + std::to_string(REACTOR_MAX_SLOTS) +
                                             " completion slots, not " + std::to_string(o.slots)};
  }
  if (o.probe_every.count() <= 0 || o.spin_for.count() < 0 || o.yield_for.count() < 0 ||
      o.nap_max.count() < 0) {
    return error{errc::invalid_argument,
                 "reactor options: probe_every must be positive and spin_for, yield_for "
                 "and nap_max not negative"};
  }
  return ok();
}

/// A snapshot of a reactor's counters (each exact once the threads that bump it are done).
///
/// Not thread-safe: a plain value.
struct ReactorCounters {
  std::uint64_t armed = 0;      ///< waits armed, on either path
  std::uint64_t fallbacks = 0;  ///< of those, armed as host functions
  std::uint64_t completed = 0;  ///< waiters completed, whatever the outcome
  std::uint64_t faulted = 0;    ///< of those, with errc::stream_fault
  std::uint64_t cancelled = 0;  ///< of those, with errc::cancelled (reactor destroyed)
  std::uint64_t wakeups = 0;    ///< registrations (and host functions) that woke a
                                ///< scanner going to sleep or asleep
  std::uint64_t parks = 0;      ///< times the scanner slept
  std::uint64_t probes = 0;     ///< fault probes run
  std::uint64_t coalesced = 0;  ///< waiters served by a StreamPoint's one completion (not
                                ///< counted in `completed`, which counts the point once)
};

}  // namespace xlogrt
