// SPDX-License-Identifier: Apache-2.0
#pragma once

// The memory orders and step orders of SlotTable's protocol, in one place.
//
// This is a test seam, not a tuning knob. SlotTable's last template parameter defaults
// to SlotProtocol, the only correct protocol. The model tests (test/model) derive a
// mutant from it that weakens exactly one member, build the very same SlotTable with it,
// and require the model checker to report the failure: that is what shows the models can
// fail. Production code never names this type.

#include <atomic>
#include <cstddef>

namespace xlogrt::detail {

struct SlotProtocol {
  /// publish: the active-bit fetch_or that hands the payload to the scanner.
  static constexpr std::memory_order publish = std::memory_order_release;
  /// scan_once: the load of an active word before its payloads are read.
  static constexpr std::memory_order scan = std::memory_order_acquire;
  /// claim: the free-word fetch_and that takes a slot from the scanner's recycle.
  static constexpr std::memory_order claim = std::memory_order_acquire;
  /// scan_once and release: the free-word fetch_or that hands a slot back.
  static constexpr std::memory_order recycle = std::memory_order_release;
  /// publish: the summary fetch_or of a publisher that turned a word non-empty.
  static constexpr std::memory_order summary_set = std::memory_order_release;
  /// scan_once: the summary fetch_and that drops groups the pass found empty.
  static constexpr std::memory_order summary_clear = std::memory_order_acq_rel;

  /// claim takes a bit with one read-modify-write (false: a load, then a store).
  static constexpr bool claim_by_rmw = true;
  /// publish sets the active bit first and the summary bit after (false: the other way).
  static constexpr bool summary_after_bit = true;
  /// scan_once re-reads the words of the groups it dropped from the summary.
  static constexpr bool recheck_after_clear = true;
  /// scan_once takes a retired payload before recycling its slot (false: after).
  static constexpr bool take_before_recycle = true;

  /// Summary bits in use (at most 64). Fewer bits put more words in a group; the model
  /// tests lower it to reach multi-word groups with a table small enough to model.
  static constexpr std::size_t summary_bits = 64;
};

}  // namespace xlogrt::detail
