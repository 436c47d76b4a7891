// SPDX-License-Identifier: Apache-2.0
#pragma once

// StreamFaults: what the reactor's fault probe knows about each stream of its pool.
//
// A stream whose context faults never writes its flags nor runs its host functions.
// While waits are armed the scanner queries their streams every probe_every; when a
// query fails with one of CUDA's sticky statuses (status::sticky: the context is gone),
// or fails QUERY_FAILURES_TO_FAULT probes in a row with any other (a stream that cannot
// be queried at all), the stream counts as faulted: its waiters complete with
// errc::stream_fault, and later waits on it fail at once with the same error. Any other
// failed query is taken as transient: the waits stay armed and the next probe asks
// again. (The host functions of a faulted stream stay in the driver's queue for ever;
// the reactor frees their tickets when it is destroyed, where the fault was sticky: see
// reactor_fallback.hpp.)
//
// Orders. A stream's error is written once, by the scanner, before its flag is stored
// with release; arm() loads the flag with acquire before reading the error. The scanner,
// the only writer, reads the flag relaxed. The query-failure counts are the scanner's
// alone.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/status.hpp"

namespace xlogrt::detail {

/// The fault state of streams 0 to N-1; no stream faulted until allocate() and a fault.
///
/// Thread-safe: faulted() and error() may be called from any thread; every other member
/// is the scanner's (or the destructor's, after the scanner stopped).
template <std::size_t N>
class StreamFaults {
 public:
  /// Probes in a row whose query of a stream fails with a status that is not sticky
  /// before the stream counts as faulted.
  static constexpr std::uint8_t QUERY_FAILURES_TO_FAULT = 16;

  /// Allocates the error slots. Throws std::bad_alloc.
  void allocate() { error_ = std::make_unique<std::optional<error>[]>(N); }

  /// Whether stream `s` has faulted; if so, error(s) may be read.
  bool faulted(std::uint32_t s) const noexcept { return faulted_[s].load(std::memory_order_acquire); }

  /// Scanner: faulted() without the acquire (the scanner wrote it).
  bool unsynchronized_faulted(std::uint32_t s) const noexcept {
    return faulted_[s].load(std::memory_order_relaxed);
  }

  /// The stream_fault every wait on `s` fails with. @pre faulted(s).
  const error& error_of(std::uint32_t s) const noexcept { return *error_[s]; }

  /// Scanner: a query of `s` succeeded; its count of failures in a row starts again.
  void query_ok(std::uint32_t s) noexcept { query_failures_[s] = 0; }

  /// Scanner: a query of `s` (of the device of `ordinal`) failed with `cause`. Returns
  /// true when the stream now counts as faulted, its fault recorded.
  bool query_failed(std::uint32_t s, const error& cause, std::uint32_t ordinal) noexcept {
    // Once the process exits the driver answers shutting_down to everything: that says
    // nothing about the stream.
    if (cause.code() == errc::shutting_down) return false;
    if (!status::sticky(cause.driver_status()) && ++query_failures_[s] < QUERY_FAILURES_TO_FAULT) return false;
    record(s, cause, ordinal);
    return true;
  }

 private:
  void record(std::uint32_t s, const error& cause, std::uint32_t ordinal) noexcept {
    if (faulted_[s].load(std::memory_order_relaxed)) return;  // the first cause stays
    error_[s].emplace(
        errc::stream_fault,
        "stream " + std::to_string(s) + " of ordinal " + std::to_string(ordinal) +
            " faulted before the awaited point was reached (" + cause.message() +
            "); waits on it fail from now on: recreate the context and its streams",
        cause.driver_status());
    // Release: faulted() reads error_[s] after an acquire load of this.
    faulted_[s].store(true, std::memory_order_release);
  }

  std::array<std::atomic<bool>, N> faulted_{};
  std::array<std::uint8_t, N> query_failures_{};
  std::unique_ptr<std::optional<error>[]> error_;
};

}  // namespace xlogrt::detail
