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

#include <array>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <optional>
#include <streambuf>
#include <string>

#include "../reactor/slot_scenarios.hpp"
#include "xlogrt/reactor/detail/slot_protocol.hpp"

#include "relacy_atomics.hpp"  // last: it brings <relacy/relacy.hpp> and its macros

// Relacy replaces the global operator new (inline, in its header) with one that allocates
// from the model's heap while a model runs and from malloc otherwise, but it defines
// neither the sized deletes that C++14 code calls nor a delete that code outside this
// translation unit reaches. Without the definitions below, libstdc++ would hand a block
// from the model's heap to glibc's free. With them, every delete of the process goes to
// Relacy's, which knows which heap a block came from. (This is the only translation unit
// of the executable that includes Relacy.)
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete[](p); }
[[gnu::used]] static void (*const keep_relacy_delete)(void*) noexcept = &::operator delete;
[[gnu::used]] static void (*const keep_relacy_delete_array)(void*) noexcept =
    &::operator delete[];

namespace {

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

/// Relacy's report goes to a fixed buffer, never to a growing string: Relacy's heap serves
/// every allocation made while a model runs, and a buffer allocated before the run and
/// regrown inside it would be freed by the wrong heap.
class FixedLog : public std::streambuf {
 public:
  FixedLog() { clear(); }
  void clear() { setp(buf_.data(), buf_.data() + buf_.size()); }
  std::string text() const { return std::string(pbase(), pptr()); }

 protected:
  int_type overflow(int_type c) override { return traits_type::not_eof(c); }  // full: drop

 private:
  std::array<char, 1 << 20> buf_{};
};

struct Outcome {
  rl::test_result_e result;
  rl::iteration_t iterations;
  std::string log;
};

/// How a model is explored: every schedule (full), every schedule with at most `bound`
/// preemptions (context-bound), or `iterations` random schedules.
struct Search {
  rl::scheduler_type_e type;
  unsigned bound = 0;
  rl::iteration_t iterations = 0;
  std::string what() const {
    if (type == rl::fair_full_search_scheduler_type) return "every schedule";
    if (type == rl::fair_context_bound_scheduler_type) {
      return "every schedule with at most " + std::to_string(bound) + " preemption" +
             (bound == 1 ? "" : "s");
    }
    return "random schedules";
  }
};
constexpr Search full() { return {rl::fair_full_search_scheduler_type}; }
constexpr Search bounded(unsigned preemptions) {
  return {rl::fair_context_bound_scheduler_type, preemptions};
}
constexpr Search random(rl::iteration_t n) { return {rl::random_scheduler_type, 0, n}; }

template <template <class, class, class> class Scenario, class Proto>
Outcome explore(const Search& search) {
  static FixedLog buffer;  // 1 MiB: kept off the stack
  buffer.clear();
  std::ostream log(&buffer);
  rl::test_params p;
  p.output_stream = &log;
  p.progress_stream = &log;
  p.search_type = search.type;
  p.context_bound = search.bound;
  if (search.iterations != 0) p.iteration_count = search.iterations;
  rl::simulate<Model<Scenario, Proto>>(p);
  return {p.test_result, p.stop_iteration, buffer.text()};
}

/// The protocol as shipped must pass; on failure, Relacy's history is the report.
template <template <class, class, class> class Scenario, class Proto = SlotProtocol>
void require_pass(const Search& search) {
  const Outcome o = explore<Scenario, Proto>(search);
  INFO(o.log);
  REQUIRE(std::string(rl::test_result_str(o.result)) == "SUCCESS");
  std::cout << "  " << Catch::getResultCapture().getCurrentTestName() << ": passed, "
            << o.iterations << " schedules (" << search.what() << ")\n";
}

/// A mutant must be caught, with the failure it is expected to cause.
template <template <class, class, class> class Scenario, class Mutant>
void require_caught(rl::test_result_e expected, const Search& search) {
  const Outcome o = explore<Scenario, Mutant>(search);
  INFO("Relacy's report of the mutant run:\n" << o.log);
  REQUIRE(std::string(rl::test_result_str(o.result)) ==
          std::string(rl::test_result_str(expected)));
  std::cout << "  " << Catch::getResultCapture().getCurrentTestName() << ": "
            << rl::test_result_str(o.result) << " found at schedule " << o.iterations << " ("
            << search.what() << ")\n";
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
