// SPDX-License-Identifier: Apache-2.0
#pragma once

// ScannerIdle: what the reactor's scanner does between passes that completed nothing.
//
// After its last completion the scanner polls for spin_for (pause between passes), then
// for yield_for (yielding the core between passes). Then, if a slot is still armed, it
// keeps polling with naps that grow with the time waited, up to nap_max (so a long kernel
// costs little CPU and at most ~1/8 of its run time in extra latency); if nothing is
// armed it parks on a condition variable and burns no CPU until a registration takes the
// reactor from idle to active, which wakes it. Only that transition wakes it: a
// registration while the scanner is awake costs no wake-up at all (reactor_parker.hpp has
// the hand-off and its orders; the reactor decides what "nothing armed" means, since it
// owns the slot table and the host-function queue).
//
// Polling is done in passes of one pause and a scan, with the clock read once per
// SPIN_PASSES passes: on some hosts a clock read is a good part of a pass's cost
// (bench/HISTORY.md, the reactor), and a flag is noticed only between passes anyway.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "xlogrt/core/atomics.hpp"
#include "xlogrt/reactor/reactor_options.hpp"

namespace xlogrt::detail {

/// Which idle phase the scanner is in, by the time since its last completion.
enum class IdlePhase : std::uint8_t {
  spin,   ///< poll in passes of a pause and a scan
  yield,  ///< poll, yielding the core between passes
  wait,   ///< nap while a slot is armed, else park
};

/// The scanner's idle policy over a reactor's options.
///
/// Not thread-safe: the scanner's own, a local of its loop.
class ScannerIdle {
 public:
  /// Passes of a pause and a scan between two clock reads while spinning.
  static constexpr int SPIN_PASSES = 16;

  explicit ScannerIdle(const ReactorOptions& o) noexcept
      : spin_for_(o.spin_for), poll_for_(o.spin_for + o.yield_for), nap_max_(o.nap_max) {}

  /// The phase after `idle` without a completion.
  IdlePhase phase(std::chrono::nanoseconds idle) const noexcept {
    if (idle < spin_for_) return IdlePhase::spin;
    if (idle < poll_for_) return IdlePhase::yield;
    return IdlePhase::wait;
  }

  /// Spin phase: up to SPIN_PASSES passes of one pause and `scan()`; true as soon as a
  /// scan completed something.
  template <class Scan>
  static bool spin(Scan&& scan) noexcept {
    for (int i = 0; i < SPIN_PASSES; ++i) {
      StdAtomics::pause();
      if (scan()) return true;
    }
    return false;
  }

  /// Yield phase: gives the core away once.
  static void yield() noexcept { StdAtomics::yield(); }

  /// Wait phase with a slot armed, `idle` after the last completion: sleeps 1/8 of the
  /// time waited beyond the polling phases, from 1 us to nap_max (or yields once when
  /// nap_max is 0).
  void nap(std::chrono::nanoseconds idle) const noexcept {
    if (nap_max_.count() == 0) {
      StdAtomics::yield();
      return;
    }
    const auto step = std::clamp<std::chrono::nanoseconds>(
        (idle - poll_for_) / 8, std::chrono::microseconds(1), nap_max_);
    std::this_thread::sleep_for(step);
  }

 private:
  std::chrono::nanoseconds spin_for_;
  std::chrono::nanoseconds poll_for_;  // spin_for + yield_for
  std::chrono::nanoseconds nap_max_;
};

}  // namespace xlogrt::detail
