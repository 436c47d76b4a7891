// SPDX-License-Identifier: Apache-2.0
#pragma once

// Concurrent scenarios of SlotTable, each written once and run two ways: on std::threads
// with StdAtomics (test/reactor, also under TSan), and under the Relacy model checker with
// its atomics policy (test/model), where every interleaving and weak-memory outcome of the
// few steps is explored.
//
// A scenario is a class template over <Atomics, Protocol, Env>:
//   - `threads` participants; thread(i) is participant i's whole body;
//   - the constructor is the set-up that happens-before every thread;
//   - check() runs after every thread has finished.
// Env supplies expect(ok, what), which records a failure (the host) or fails the model
// (Relacy), and Deadline, which bounds a wait on the host and never expires in the model
// (Relacy reports a wait that never ends as a livelock).
//
// The scanner in these scenarios parks the way the reactor's does: when a pass delivers
// nothing and the table is idle it waits for the wake-up token that a publish reporting
// the idle-to-active transition leaves. A slot stranded by the protocol therefore shows up
// as a scanner that waits forever, which the host turns into a failure after its deadline
// and the model checker reports as a livelock.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "xlogrt/reactor/flags.hpp"
#include "xlogrt/reactor/slot_table.hpp"

namespace slot_scenarios {

/// A wake-up token: unpark() before park() makes park() return at once, as with the
/// reactor's parker. park() returns false when Env's deadline passed first.
///
/// unpark() is a read-modify-write, as in every real parker: when two registrants wake
/// the scanner, the second one's exchange continues the release sequence of the first,
/// so the scanner's acquire synchronises with both. A plain store would cut the first
/// registrant's sequence, and the scanner could wake without seeing its summary bit
/// (the model checker finds that schedule).
template <class A, class Env>
class WakeToken {
 public:
  void unpark() noexcept { token_.exchange(1, std::memory_order_release); }
  bool park() noexcept {
    typename Env::Deadline deadline;
    while (token_.exchange(0, std::memory_order_acquire) == 0) {
      if (deadline.passed()) return false;
      A::yield();
    }
    return true;
  }

 private:
  typename A::template atomic<std::uint32_t> token_{0};
};

/// What every scenario shares: a table of int payloads over host flags, the scanner's
/// wake-up token, and the steps of registrants, device and scanner.
template <class A, class P, class Env>
class Base {
 public:
  using Flags = xlogrt::BasicHostFlags<typename A::flag_word>;
  using Table = xlogrt::SlotTable<int, Flags, A, P>;

  explicit Base(std::size_t capacity) : table_(capacity, Flags(capacity)) {}

 protected:
  std::size_t must_claim() {
    const auto slot = table_.claim();
    Env::expect(slot.has_value(), "a table with free slots must hand one out");
    return slot.value_or(0);
  }

  /// A registrant's steps after its claim: clear the flag, publish, wake if idle.
  void arm(std::size_t slot, int payload) {
    table_.reset_flag(slot);
    publish(slot, payload);
  }
  void publish(std::size_t slot, int payload) {
    if (table_.publish(slot, payload)) wake_.unpark();
  }

  /// The device's step: the stream reached the point.
  void complete(std::size_t slot) {
    A::store_flag(table_.flags().word(slot), 1, std::memory_order_release);
  }

  /// The scanner: passes until `n` payloads were delivered, parking when idle.
  void scan_until(std::size_t n) {
    while (delivered_.size() < n) {
      table_.scan_once(delivered_);
      if (delivered_.size() >= n) break;
      if (table_.is_idle()) {
        if (!wake_.park()) {
          Env::expect(false, "scanner parked on an idle table and no publish woke it");
          return;
        }
      } else {
        A::yield();
      }
    }
  }

  /// After every thread: nothing more to deliver, the table idle, and every slot free
  /// exactly once (claimable, each index once, then none).
  void expect_quiescent() {
    std::vector<int> more;
    Env::expect(!table_.scan_once(more), "a finished table must have no slot left armed");
    Env::expect(more.empty(), "a payload was delivered twice");
    Env::expect(table_.is_idle(), "a finished table must be idle");
    std::vector<std::size_t> slots;
    while (auto s = table_.claim()) {
      slots.push_back(*s);
      if (slots.size() > table_.capacity()) break;
    }
    std::sort(slots.begin(), slots.end());
    Env::expect(slots.size() == table_.capacity(), "a slot leaked (or was freed twice)");
    Env::expect(std::adjacent_find(slots.begin(), slots.end()) == slots.end(),
                "a slot was free twice");
  }

  Table table_;
  WakeToken<A, Env> wake_;
  std::vector<int> delivered_;  // the scanner's, until check()
};

/// (a) One slot. The registrant publishes while the device writes the flag and the
/// scanner, already running, races both.
template <class A, class P, class Env>
class Handoff : Base<A, P, Env> {
  using B = Base<A, P, Env>;

 public:
  static constexpr unsigned threads = 3;

  Handoff() : B(1) {
    slot_ = this->must_claim();
    this->table_.reset_flag(slot_);
  }

  void thread(unsigned i) {
    if (i == 0) {
      const bool was_idle = this->table_.publish(slot_, 7);
      Env::expect(was_idle, "the first publish on an idle table must report idle-to-active");
      if (was_idle) this->wake_.unpark();
    } else if (i == 1) {
      this->complete(slot_);
    } else {
      this->scan_until(1);
    }
  }

  void check() {
    Env::expect(this->delivered_.size() == 1, "the payload must be delivered once");
    Env::expect(!this->delivered_.empty() && this->delivered_[0] == 7,
                "the payload must arrive intact");
    this->expect_quiescent();
  }

 private:
  std::size_t slot_ = 0;
};

/// Two registrants publish concurrently while the device completes both slots and the
/// scanner retires and drops summary bits: the second publish can land just after the
/// scanner emptied the word (or the group), or on a word that is already non-empty, where
/// the active bit alone carries its payload to the scanner. The device is a thread of its
/// own, unordered with the publishes, as the GPU is. SlotA and SlotB pick the words: one
/// word, two words of one summary group (with a Protocol of one summary bit), or two groups.
template <std::size_t Capacity, std::size_t SlotA, std::size_t SlotB>
struct TwoPublishersOn {
  template <class A, class P, class Env>
  class type : Base<A, P, Env> {
    using B = Base<A, P, Env>;
    static_assert(SlotA < Capacity && SlotB < Capacity && SlotA != SlotB);

   public:
    static constexpr unsigned threads = 4;

    type() : B(Capacity) {
      // Claim every slot, keep the two the scenario is about, give the others back.
      std::vector<std::size_t> all;
      for (std::size_t i = 0; i < Capacity; ++i) all.push_back(this->must_claim());
      for (std::size_t s : all) {
        if (s != SlotA && s != SlotB) Env::expect(this->table_.release(s).has_value(), "release");
      }
      this->table_.reset_flag(SlotA);
      this->table_.reset_flag(SlotB);
    }

    void thread(unsigned i) {
      if (i == 0) {
        this->publish(SlotA, 1);
      } else if (i == 1) {
        this->publish(SlotB, 2);
      } else if (i == 2) {
        this->complete(SlotA);
        this->complete(SlotB);
      } else {
        this->scan_until(2);
      }
    }

    void check() {
      auto got = this->delivered_;
      std::sort(got.begin(), got.end());
      Env::expect(got == std::vector<int>{1, 2}, "both payloads must be delivered, once each");
      this->expect_quiescent();
    }
  };
};

template <class A, class P, class Env>
using TwoPublishers = typename TwoPublishersOn<2, 0, 1>::template type<A, P, Env>;

/// (b) Three registrants race to claim from a table of two slots: two get distinct slots,
/// one gets none.
template <class A, class P, class Env>
class ClaimRace : Base<A, P, Env> {
  using B = Base<A, P, Env>;

 public:
  static constexpr unsigned threads = 3;

  ClaimRace() : B(2) {}

  void thread(unsigned i) { got_[i] = this->table_.claim(); }

  void check() {
    std::vector<std::size_t> slots;
    for (const auto& g : got_) {
      if (g) slots.push_back(*g);
    }
    std::sort(slots.begin(), slots.end());
    Env::expect(slots.size() == 2, "two of three claims on two free slots must succeed");
    Env::expect(std::adjacent_find(slots.begin(), slots.end()) == slots.end(),
                "one slot was handed to two registrants");
    Env::expect(!this->table_.claim().has_value(), "no slot may be left after two claims");
  }

 private:
  std::array<std::optional<std::size_t>, threads> got_{};
};

/// (b) One slot, claimed and published by a first registrant; a second registrant claims
/// it as soon as the scanner recycles it and publishes its own payload on it. The second
/// owner's writes must not race the scanner's take of the first payload.
template <class A, class P, class Env>
class ClaimRecycle : Base<A, P, Env> {
  using B = Base<A, P, Env>;

 public:
  static constexpr unsigned threads = 3;

  ClaimRecycle() : B(1) {
    first_ = this->must_claim();
    this->table_.reset_flag(first_);
  }

  void thread(unsigned i) {
    if (i == 0) {
      this->publish(first_, 1);
      this->complete(first_);
    } else if (i == 1) {
      std::optional<std::size_t> slot;
      while (!(slot = this->table_.claim())) A::yield();
      this->arm(*slot, 2);
      this->complete(*slot);
    } else {
      this->scan_until(2);
    }
  }

  void check() {
    Env::expect(this->delivered_ == std::vector<int>{1, 2},
                "both uses of the one slot must be delivered, in order, once each");
    this->expect_quiescent();
  }

 private:
  std::size_t first_ = 0;
};

}  // namespace slot_scenarios
