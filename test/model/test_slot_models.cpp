// SPDX-License-Identifier: Apache-2.0
//
// Relacy models of SlotTable: the scenarios of test/reactor/slot_scenarios.hpp, run over
// every interleaving and weak-memory outcome Relacy can reach, on the shipped header.
//
// The protocol models must pass. Each mutant weakens one ordering or one step of the
// protocol (through SlotTable's Protocol seam) and must FAIL in the model checker with
// the failure it causes; a mutant the checker lets through fails its test, because then
// the model could not have caught that bug in the real protocol.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "../reactor/slot_scenarios.hpp"
#include "xlogrt/reactor/detail/slot_protocol.hpp"

#include "relacy_atomics.hpp"  // last: it brings <relacy/relacy.hpp> and its macros
#include "relacy_harness.hpp"


namespace {

using xlogrt_model::bounded;
using xlogrt_model::full;
using xlogrt_model::random;
using xlogrt_model::Search;
using xlogrt::detail::SlotProtocol;
using slot_scenarios::ClaimRace;
using slot_scenarios::ClaimRecycle;
using slot_scenarios::Handoff;
using slot_scenarios::TwoPublishers;
using slot_scenarios::TwoPublishersOn;

/// A scenario as a Relacy test suite: set-up in before(), the checks in after().
template <template <class, class, class> class Scenario, class Proto>
struct Model : rl::test_suite<Model<Scenario, Proto>,
                              Scenario<RelacyAtomics, Proto, RelacyEnv>::threads> {
  std::optional<Scenario<RelacyAtomics, Proto, RelacyEnv>> s;
  void before() { s.emplace(); }
  void thread(unsigned i) { s->thread(i); }
  void after() {
    s->check();
    s.reset();
  }
};

/// The harness's checks, for a scenario run with a protocol (the shipped one by default).
template <template <class, class, class> class Scenario, class Proto = SlotProtocol>
void require_pass(const Search& search) {
  xlogrt_model::require_pass<Model<Scenario, Proto>>(search);
}
template <template <class, class, class> class Scenario, class Mutant>
void require_caught(rl::test_result_e expected, const Search& search) {
  xlogrt_model::require_caught<Model<Scenario, Mutant>>(expected, search);
}

// ---- the mutants ------------------------------------------------------------------------

/// publish sets the active bit relaxed: the payload is not ordered before the bit.
struct PublishRelaxed : SlotProtocol {
  static constexpr std::memory_order publish = std::memory_order::relaxed;
};
/// The scanner loads the active word relaxed: it may read the payload before its write.
struct ScanRelaxed : SlotProtocol {
  static constexpr std::memory_order scan = std::memory_order::relaxed;
};
/// The idle accounting moved to the other side of the bit: the summary bit is set before
/// the active bit (the counterpart of counting a slot armed only after its bit is set).
struct SummaryBeforeBit : SlotProtocol {
  static constexpr bool summary_after_bit = false;
};
/// The scanner drops an emptied group from the summary without re-reading its words.
struct NoRecheck : SlotProtocol {
  static constexpr bool recheck_after_clear = false;
};
/// The publisher's summary set is relaxed: the scanner's clear no longer acquires it.
struct SummarySetRelaxed : SlotProtocol {
  static constexpr std::memory_order summary_set = std::memory_order::relaxed;
};
/// The scanner's summary clear does not acquire: its re-read may miss a new active bit.
struct SummaryClearNoAcquire : SlotProtocol {
  static constexpr std::memory_order summary_clear = std::memory_order::release;
};
/// claim takes its slot relaxed: the previous use's take() is not ordered before it.
struct ClaimRelaxed : SlotProtocol {
  static constexpr std::memory_order claim = std::memory_order::relaxed;
};
/// The scanner recycles relaxed: same hazard, seen from the other side.
struct RecycleRelaxed : SlotProtocol {
  static constexpr std::memory_order recycle = std::memory_order::relaxed;
};
/// The scanner recycles a slot before it takes the payload out of it.
struct TakeAfterRecycle : SlotProtocol {
  static constexpr bool take_before_recycle = false;
};
/// claim takes a bit with a load and a store instead of one read-modify-write.
struct ClaimNotAtomic : SlotProtocol {
  static constexpr bool claim_by_rmw = false;
};
/// Every word in one summary group, so a two-word table exercises a multi-word group.
struct OneSummaryBit : SlotProtocol {
  static constexpr std::size_t summary_bits = 1;
};

template <class A, class P, class Env>
using AcrossWords = typename TwoPublishersOn<65, 0, 64>::template type<A, P, Env>;

}  // namespace

// ---- (a) the single-slot hand-off -------------------------------------------------------

TEST_CASE("model: one slot handed off while the scanner races the flag and the publish",
          "[model][slot_table]") {
  require_pass<Handoff>(full());
}

// ---- summary bits: a publish racing the scanner's clear -----------------------------

TEST_CASE("model: two publishes into one word race the scanner's summary clear",
          "[model][slot_table]") {
  require_pass<TwoPublishers>(bounded(1));
}

TEST_CASE("model: two publishes into two words of one summary group", "[model][slot_table]") {
  require_pass<AcrossWords, OneSummaryBit>(random(300000));
}

TEST_CASE("model: two publishes into two summary groups", "[model][slot_table]") {
  require_pass<AcrossWords>(random(300000));
}

// ---- (b) registrants racing on the free list --------------------------------------------

TEST_CASE("model: three registrants claim two slots", "[model][slot_table]") {
  require_pass<ClaimRace>(full());
}

TEST_CASE("model: a registrant claims the slot the scanner is recycling",
          "[model][slot_table]") {
  require_pass<ClaimRecycle>(bounded(2));
}

// ---- (c) mutants: each weakened protocol must be caught --------------------------------

TEST_CASE("mutant: publish without release is caught", "[model][mutant]") {
  require_caught<TwoPublishers, PublishRelaxed>(rl::test_result_data_race, bounded(1));
}

TEST_CASE("mutant: scan without acquire is caught", "[model][mutant]") {
  require_caught<TwoPublishers, ScanRelaxed>(rl::test_result_data_race, bounded(1));
}

TEST_CASE("mutant: summary bit set before the active bit is caught", "[model][mutant]") {
  require_caught<Handoff, SummaryBeforeBit>(rl::test_result_livelock, full());
}

TEST_CASE("mutant: summary cleared without re-reading the words is caught",
          "[model][mutant]") {
  require_caught<TwoPublishers, NoRecheck>(rl::test_result_livelock, bounded(1));
}

TEST_CASE("mutant: relaxed summary set is caught", "[model][mutant]") {
  require_caught<TwoPublishers, SummarySetRelaxed>(rl::test_result_livelock, bounded(1));
}

TEST_CASE("mutant: summary clear without acquire is caught", "[model][mutant]") {
  require_caught<TwoPublishers, SummaryClearNoAcquire>(rl::test_result_livelock, bounded(1));
}

TEST_CASE("mutant: claim without acquire is caught", "[model][mutant]") {
  require_caught<ClaimRecycle, ClaimRelaxed>(rl::test_result_data_race, bounded(2));
}

TEST_CASE("mutant: recycle without release is caught", "[model][mutant]") {
  require_caught<ClaimRecycle, RecycleRelaxed>(rl::test_result_data_race, bounded(2));
}

TEST_CASE("mutant: payload taken after its slot is recycled is caught", "[model][mutant]") {
  require_caught<ClaimRecycle, TakeAfterRecycle>(rl::test_result_data_race, bounded(2));
}

TEST_CASE("mutant: claim by load and store is caught", "[model][mutant]") {
  require_caught<ClaimRace, ClaimNotAtomic>(rl::test_result_user_assert_failed, full());
}
