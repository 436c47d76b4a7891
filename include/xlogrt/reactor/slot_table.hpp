// SPDX-License-Identifier: Apache-2.0
#pragma once

// SlotTable: the reactor's completion slots, as a lock-free protocol with no CUDA in it.
//
// A registrant claims a slot, clears its completion flag, has the device write the flag
// when the stream reaches the point (cuStreamWriteValue32), and publishes a payload (a
// waker) on the slot. One scanner thread polls the flags of published slots, hands the
// payloads of completed ones back, and recycles the slots. The protocol is generic over
// the payload, over where the flags live (Flags) and over the atomics (Atomics), so the
// model checker runs this very header (test/model).
//
// ---- How it works ----------------------------------------------------------------------
//
// State. Slots are grouped 64 to a word; each word is one cache line holding two bitmaps:
//   free   bit set: the slot is idle and may be claimed;
//   active bit set: the slot is published and not yet retired (it is "armed").
// A claimed slot that is not yet published has neither bit. Every slot has one payload
// cell. Above the words sits one summary word: bit g set means "some word of group g
// may be non-empty" (a group is 1 word up to 4096 slots, then 2, 4, ... words). The
// table is idle when the summary is 0: no slot is armed then, except one whose publisher
// is between its two read-modify-writes and will report the idle transition itself.
//
// Claim and recycle. claim() starts at the calling thread's home word (a per-thread hint
// spread over the words) and takes the lowest free bit with fetch_and(acquire); the bit
// it wanted may be gone, in which case the returned old value is the fresh state to try
// again. The scanner gives retired slots back with one fetch_or(release) per word for the
// whole batch. That release/acquire pair orders the scanner's take() of the old payload
// and its clearing of the active bit before the next owner's reset_flag and put(), so a
// cell never has two writers and a re-published bit is never cleared by a stale retire.
// A bit has no identity to recycle, so there is no ABA and no tag.
//
// Publish and scan. publish() puts the payload, then sets the active bit with
// fetch_or(release). The scanner loads the word with acquire: if it sees the bit, it sees
// the payload. For each armed slot it reads the flag with acquire (pairing with the
// writer's release on host flags) and, for the completed ones, takes the payloads,
// clears their active bits in one fetch_and and recycles them in one fetch_or. The
// fetch_and is relaxed: it is sequenced before the recycle, whose release carries it to
// the slot's next owner. The scanner is the only consumer, and a slot cannot be claimed
// again until recycled, so take() races nothing.
//
// Idle accounting (the summary). A publisher whose active fetch_or returned 0 turned the
// word non-empty, and it alone then sets the group's summary bit with fetch_or(release).
// If that fetch_or returned 0 the whole table was idle: publish() returns true, and the
// caller wakes the scanner. Everyone else returns false without touching the summary. A
// scan pass loads the summary (acquire, pairing with the publishers' release) and visits
// only the groups set in it; for each group whose words it leaves empty, it clears the
// bit with fetch_and(acq_rel), then re-reads the group's words (relaxed: the clear's
// acquire already ordered what matters) and sets the bit back (relaxed: only the scanner
// reads it for work) if one is non-empty. The re-read is what keeps a publish from being
// stranded: a publisher that turned a word non-empty either set its summary bit before
// the clear, and then the clear's acquire (reading that release, or a later value in its
// release sequence) makes the publisher's active bit visible to the re-read, or set it
// after the clear, and then its bit stands. A scanner that finds the summary 0 may
// therefore park: any slot armed later comes with a publisher that reports the idle
// transition and wakes it. That wake must synchronise with the scanner (a release its
// wait acquires, as every mutex, condition variable or futex parker provides), or the
// woken scanner could still read the summary from before the publish.
//
// Why not the simpler ways.
// - A mutex-guarded vector as the free list serialises every claim and every recycle on
//   one lock, and a registrant preempted while holding it stalls all the others.
// - A Treiber stack of indices (with a tag against ABA) is lock-free but still puts one
//   hot line, the head, under every claim, and hands consecutive claims of one thread
//   slots scattered over the table, so threads share flag and payload lines. Free
//   bitmaps with a home word per thread keep each thread's slots, flags and payloads in
//   lines of its own, shared with the scanner only.
// - A global count of armed slots, incremented by every publish, is one more line that
//   every registration writes. The summary word is written only when a word turns
//   non-empty, and it doubles as the scanner's map of words worth reading.
//
// Limits. claim() may report "none" while a slot is being recycled into a word its search
// has already passed; the caller then takes its fallback path (the reactor uses a host
// callback), which is correct, only slower. Without concurrent recycling, claim() finds
// every free slot.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xlogrt/core/atomics.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/reactor/detail/prefetch.hpp"
#include "xlogrt/reactor/detail/slot_protocol.hpp"
#include "xlogrt/reactor/flags.hpp"

namespace xlogrt {

/// The completion slots of a reactor: claim, arm, publish a payload, and have one scanner
/// hand back the payloads of completed slots. Every published payload is delivered exactly
/// once, every slot returns to the free pool, and publish() reports the idle-to-active
/// transition so that a parked scanner is woken once per idle period, not on every publish.
///
/// Thread-safe; lock-free. Per member: claim(), is_idle() and capacity() from any thread;
/// reset_flag(), publish() and release() by the thread that claimed the slot, each
/// at most once per claim (reset_flag() before publish()); scan_once() by one scanner
/// thread at a time. Not thread-safe: construction and destruction happen-before and
/// after every other use.
///
/// @tparam Payload  what a completion hands back (a waker); nothrow move-constructible.
/// @tparam Flags    where the completion flags live (HostFlags, or the reactor's pinned
///                  flags); SlotFlags<Flags, Atomics>.
/// @tparam Atomics  the atomics policy (StdAtomics; the model tests' Relacy policy).
/// @tparam Protocol test seam for the model checker; leave it defaulted.
template <class Payload, class Flags = HostFlags, class Atomics = StdAtomics,
          class Protocol = detail::SlotProtocol>
  requires SlotFlags<Flags, Atomics>
class SlotTable {
  static_assert(std::is_nothrow_move_constructible_v<Payload>,
                "a payload is moved on noexcept paths: it must be nothrow move-constructible");
  static_assert(Protocol::summary_bits >= 1 && Protocol::summary_bits <= 64);

 public:
  /// scan_once's default `fresh`: nothing to warm.
  struct NoFresh {
    void operator()(std::size_t) const noexcept {}
  };
  using payload_type = Payload;
  using flags_type = Flags;
  using atomics_type = Atomics;

  /// A table of min(slots, flags.size()) slots, all free, none armed.
  SlotTable(std::size_t slots, Flags flags)
      : flags_(std::move(flags)),
        capacity_(std::min(slots, static_cast<std::size_t>(flags_.size()))),
        n_words_((capacity_ + BITS - 1) / BITS),
        group_shift_(group_shift_for(n_words_)),
        words_(n_words_ == 0 ? nullptr : new Word[n_words_]),
        cells_(capacity_ == 0 ? nullptr : new cell_t[capacity_]),
        seen_(n_words_ == 0 ? nullptr : new word_t[n_words_]()) {
    for (std::size_t w = 0; w < n_words_; ++w) {
      const std::size_t in_word = std::min(BITS, capacity_ - w * BITS);
      words_[w].free.store(in_word == BITS ? ~word_t{0} : (word_t{1} << in_word) - 1,
                           std::memory_order_relaxed);
    }
  }

  SlotTable(const SlotTable&) = delete;
  SlotTable& operator=(const SlotTable&) = delete;

  /// Destroys the payloads still published (armed and never delivered).
  ~SlotTable() {
    for (std::size_t w = 0; w < n_words_; ++w) {
      for (word_t b = words_[w].active.load(std::memory_order_relaxed); b != 0; b &= b - 1) {
        cells_[w * BITS + static_cast<std::size_t>(std::countr_zero(b))].destroy();
      }
    }
  }

  /// The number of slots: min(slots, flags.size()) as constructed.
  std::size_t capacity() const noexcept { return capacity_; }

  /// Reserves a free slot for the caller, or returns nullopt when the search found none
  /// (the pool is exhausted, or the only free slots were being recycled behind the
  /// search: see "Limits" above). Lock-free.
  std::optional<std::size_t> claim() noexcept {
    if (n_words_ == 0) return std::nullopt;
    std::size_t w = static_cast<std::size_t>(
        (static_cast<std::uint64_t>(Atomics::thread_hint()) * n_words_) >> 32);
    for (std::size_t tried = 0; tried < n_words_; ++tried) {
      auto& free = words_[w].free;
      if constexpr (Protocol::claim_by_rmw) {
        // The load only picks a bit to try; the fetch_and decides, and its old value is
        // the fresh state to try again with.
        word_t seen = free.load(std::memory_order_relaxed);
        while (seen != 0) {
          const word_t bit = seen & (~seen + 1);  // lowest set bit
          const word_t before = free.fetch_and(~bit, Protocol::claim);
          if ((before & bit) != 0) return slot_of(w, bit);
          seen = before & ~bit;
        }
      } else {  // mutant for the model tests: the take is not atomic
        const word_t seen = free.load(Protocol::claim);
        if (seen != 0) {
          const word_t bit = seen & (~seen + 1);
          free.store(seen & ~bit, std::memory_order_relaxed);
          return slot_of(w, bit);
        }
      }
      if (++w == n_words_) w = 0;
    }
    return std::nullopt;
  }

  /// Gives back a claimed slot that was never published (the arm-failure path).
  /// Errors (the table is unchanged): invalid_argument when the slot is out of range,
  /// already free, or published (a published slot comes back through scan_once()).
  result<void> release(std::size_t slot) {
    if (slot >= capacity_) {
      return error{errc::invalid_argument,
                   "SlotTable::release: slot " + std::to_string(slot) +
                       " is out of range; the table has " + std::to_string(capacity_) +
                       " slots"};
    }
    Word& word = words_[slot / BITS];
    const word_t bit = word_t{1} << (slot % BITS);
    if ((word.active.load(std::memory_order_relaxed) & bit) != 0) {
      return error{errc::invalid_argument,
                   "SlotTable::release: slot " + std::to_string(slot) +
                       " is published; the scanner recycles it once its flag is set"};
    }
    if ((word.free.fetch_or(bit, Protocol::recycle) & bit) != 0) {
      return error{errc::invalid_argument,
                   "SlotTable::release: slot " + std::to_string(slot) +
                       " is already free (released twice, or never claimed)"};
    }
    return ok();
  }

  /// Clears the slot's completion flag (0: pending). Call it after claim() and before
  /// the device is told to write the flag, so that this store cannot land on top of the
  /// device's. @pre the caller claimed `slot` and has not published it.
  void reset_flag(std::size_t slot) noexcept {
    Atomics::store_flag(flags_.word(slot), 0, std::memory_order_release);
  }

  /// Hands `payload` to the scanner: it is delivered once the slot's flag reads non-zero.
  /// Returns true when this publish took the table from idle to active: the caller must
  /// then wake a scanner that may be parked on is_idle(); on false it need not. The wake
  /// must synchronise with the scanner's return from its wait (a release the wait
  /// acquires: any mutex, condition variable or futex parker does), so that the scanner's
  /// next pass sees the summary bit this publish set.
  /// @pre the caller claimed `slot`, reset its flag, and has not published it since.
  bool publish(std::size_t slot, Payload payload) noexcept {
    cells_[slot].put(std::move(payload));
    const std::size_t w = slot / BITS;
    const word_t bit = word_t{1} << (slot % BITS);
    const word_t group = word_t{1} << (w >> group_shift_);
    if constexpr (Protocol::summary_after_bit) {
      if (words_[w].active.fetch_or(bit, Protocol::publish) != 0) return false;
      return summary_.value.fetch_or(group, Protocol::summary_set) == 0;
    } else {
      const bool was_idle = summary_.value.fetch_or(group, Protocol::summary_set) == 0;
      words_[w].active.fetch_or(bit, Protocol::publish);
      return was_idle;
    }
  }

  /// One scan pass: every armed slot whose flag reads non-zero is retired, its payload
  /// appended to `woken` and the slot recycled. Returns whether the pass left any slot
  /// armed (seen armed with its flag still 0, or published while the pass ran).
  ///
  /// Warming. The first time the scans find a slot armed and not yet done, the scanner
  /// pulls into its cache, for writing, the lines that retiring the slot will touch (its
  /// payload cell, its word and the summary), and calls `fresh(slot)`, which
  /// may warm the caller's own (the payload's target, say). A completion then waits on no
  /// line the registrant wrote but its flag. Prefetches only: no protocol order changes.
  ///
  /// Throws only std::bad_alloc when `woken` cannot grow; slots retired before that are
  /// in `woken`, and the others stay armed for the next pass.
  /// @pre no other thread is in scan_once().
  template <class Fresh = NoFresh>
  bool scan_once(std::vector<Payload>& woken, Fresh&& fresh = {}) {
    word_t groups = summary_.value.load(std::memory_order_acquire);
    word_t emptied = 0;
    bool left_armed = false;
    while (groups != 0) {
      const std::size_t g = static_cast<std::size_t>(std::countr_zero(groups));
      groups &= groups - 1;
      bool group_empty = true;
      const std::size_t end = std::min(n_words_, (g + 1) << group_shift_);
      for (std::size_t w = g << group_shift_; w < end; ++w) {
        if (retire_word(w, woken, fresh) != 0) group_empty = false;
      }
      if (group_empty) {
        emptied |= word_t{1} << g;
      } else {
        left_armed = true;
      }
    }
    if (emptied != 0) {
      summary_.value.fetch_and(~emptied, Protocol::summary_clear);
      if constexpr (Protocol::recheck_after_clear) {
        word_t back = 0;
        for (word_t e = emptied; e != 0; e &= e - 1) {
          const std::size_t g = static_cast<std::size_t>(std::countr_zero(e));
          const std::size_t end = std::min(n_words_, (g + 1) << group_shift_);
          for (std::size_t w = g << group_shift_; w < end; ++w) {
            if (words_[w].active.load(std::memory_order_relaxed) != 0) {
              back |= word_t{1} << g;
              break;
            }
          }
        }
        if (back != 0) {
          summary_.value.fetch_or(back, std::memory_order_relaxed);
          left_armed = true;
        }
      }
    }
    return left_armed;
  }

  /// True when no slot is armed: the scanner may park. Lock-free.
  bool is_idle() const noexcept { return summary_.value.load(std::memory_order_acquire) == 0; }

  /// The completion flags (for the code that has them written: the device, or a test).
  Flags& flags() noexcept { return flags_; }
  const Flags& flags() const noexcept { return flags_; }

 private:
  using word_t = std::uint64_t;
  using cell_t = typename Atomics::template cell<Payload>;
  static constexpr std::size_t BITS = 64;
  static constexpr std::size_t LINE = 64;

  struct alignas(LINE) Word {
    typename Atomics::template atomic<word_t> active{0};
    typename Atomics::template atomic<word_t> free{0};
  };
  struct alignas(LINE) Summary {
    typename Atomics::template atomic<word_t> value{0};
  };

  /// log2 of the words per summary group: the smallest power of two that covers the
  /// words with Protocol::summary_bits groups.
  static unsigned group_shift_for(std::size_t n_words) noexcept {
    const std::size_t per_group =
        (n_words + Protocol::summary_bits - 1) / Protocol::summary_bits;
    return per_group <= 1 ? 0u : static_cast<unsigned>(std::bit_width(per_group - 1));
  }

  static std::size_t slot_of(std::size_t w, word_t bit) noexcept {
    return w * BITS + static_cast<std::size_t>(std::countr_zero(bit));
  }

  /// Makes room for `n` more payloads without giving up geometric growth.
  static void reserve_more(std::vector<Payload>& v, std::size_t n) {
    if (v.capacity() - v.size() < n) v.reserve(std::max(v.size() + n, 2 * v.capacity()));
  }

  /// Retires the completed slots of word `w`; returns the bits it leaves armed.
  template <class Fresh>
  word_t retire_word(std::size_t w, std::vector<Payload>& woken, Fresh& fresh) {
    Word& word = words_[w];
    const word_t armed = word.active.load(Protocol::scan);
    word_t done = 0;
    for (word_t b = armed; b != 0; b &= b - 1) {
      const word_t bit = b & (~b + 1);
      if (Atomics::load_flag(flags_.word(slot_of(w, bit)), std::memory_order_acquire) != 0) {
        done |= bit;
      }
    }
    if (const word_t pending = armed & ~done; (pending & ~seen_[w]) != 0) {
      for (word_t b = pending & ~seen_[w]; b != 0; b &= b - 1) {
        const std::size_t slot = slot_of(w, b & (~b + 1));
        detail::prefetch_write(&cells_[slot]);  // take() moves the payload out
        fresh(slot);
      }
      detail::prefetch_write(&word);
      detail::prefetch_write(&summary_);
    }
    seen_[w] = armed & ~done;  // a slot retired and armed again is fresh again
    if (done == 0) return armed;
    reserve_more(woken, static_cast<std::size_t>(std::popcount(done)));
    if constexpr (Protocol::take_before_recycle) take_all(w, done, woken);
    const word_t left = word.active.fetch_and(~done, std::memory_order_relaxed) & ~done;
    word.free.fetch_or(done, Protocol::recycle);
    if constexpr (!Protocol::take_before_recycle) take_all(w, done, woken);
    return left;
  }

  void take_all(std::size_t w, word_t done, std::vector<Payload>& woken) noexcept {
    for (word_t b = done; b != 0; b &= b - 1) {
      woken.push_back(cells_[slot_of(w, b & (~b + 1))].take());
    }
  }

  Flags flags_;
  std::size_t capacity_;
  std::size_t n_words_;
  unsigned group_shift_;
  std::unique_ptr<Word[]> words_;
  std::unique_ptr<cell_t[]> cells_;
  std::unique_ptr<word_t[]> seen_;  // the scanner's: armed slots already given to `fresh`
  Summary summary_;
};

}  // namespace xlogrt
