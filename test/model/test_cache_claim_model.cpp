// SPDX-License-Identifier: Apache-2.0
//
// Relacy models of the caching layer's owner / reclaimer hand-off: the shipped OwnerClaim
// (resource/detail/cache_claim.hpp) under Relacy's atomics. An owner uses its thread
// cache on every allocate and deallocate (announce, check for a claim, touch the bins,
// leave); a reclaimer (trim, memory pressure, the sweep of an exited thread) claims the
// cache, empties it and gives it back. The bins are an rl::var: if owner and reclaimer
// can ever touch them without one happening before the other, Relacy reports a data
// race.
//
// The protocol must pass. Each mutant weakens one order or step of the hand-off (through
// OwnerClaim's Protocol seam) and must FAIL with that data race; a mutant the checker
// lets through fails its test, because the model could then not have caught the bug.

#include <catch2/catch.hpp>

#include <atomic>
#include <optional>

#include "xlogrt/resource/detail/cache_claim.hpp"

#include "relacy_atomics.hpp"  // last: it brings <relacy/relacy.hpp> and its macros
#include "relacy_harness.hpp"

namespace {

using namespace xlogrt_model;
using xlogrt::detail::ClaimProtocol;

void expect(bool ok, const char* what) {
  if (!ok) rl::ctx().fail_test(what, rl::test_result_user_assert_failed, RL_INFO);
}

/// A thread cache: the claim, and the bins it guards (a count of cached blocks).
template <class Proto>
struct Cache {
  xlogrt::detail::OwnerClaim<RelacyAtomics, Proto> claim;
  rl::var<int> blocks;
  int given_back = 0;  // the reclaimer's, read after every thread
  int kept = 0;        // the owner's
};

/// The owner frees `rounds` blocks into its cache (or, when a claim is under way, to the
/// shared depot, which is not modelled); the reclaimer empties the cache `claims` times.
/// Every block ends exactly once in the reclaimer's hands or in the cache.
template <class Proto, int Rounds, int Claims>
struct OwnerAgainstReclaimer : rl::test_suite<OwnerAgainstReclaimer<Proto, Rounds, Claims>, 2> {
  std::optional<Cache<Proto>> c;
  int to_depot = 0;
  void before() {
    c.emplace();
    c->blocks($) = 0;
    to_depot = 0;
  }
  void thread(unsigned i) {
    if (i == 0) {
      for (int r = 0; r < Rounds; ++r) {
        if (c->claim.enter()) {
          c->blocks($) = c->blocks($) + 1;
          c->claim.leave();
        } else {
          ++to_depot;
        }
      }
    } else {
      for (int k = 0; k < Claims; ++k) {
        c->claim.claim();
        c->given_back += c->blocks($);
        c->blocks($) = 0;
        c->claim.release();
      }
    }
  }
  void after() {
    expect(c->given_back + c->blocks($) + to_depot == Rounds, "a block was lost or counted twice");
    c.reset();
  }
};

template <class Proto>
using OneClaim = OwnerAgainstReclaimer<Proto, 2, 1>;
template <class Proto>
using TwoClaims = OwnerAgainstReclaimer<Proto, 3, 2>;

// ---- the mutants ------------------------------------------------------------------------

/// The owner announces itself with a release store: its check of the claim can pass the
/// announcement, so both read "free" (the store-buffer pattern) and both touch the bins.
struct AnnounceByRelease : ClaimProtocol {
  static constexpr std::memory_order announce = std::memory_order::release;
};
/// The reclaimer claims with a release store: the same, from the other side.
struct ClaimByRelease : ClaimProtocol {
  static constexpr std::memory_order claim = std::memory_order::release;
};
/// The owner checks for a claim before announcing itself: a claim between the two sees
/// the owner outside.
struct CheckBeforeAnnounce : ClaimProtocol {
  static constexpr bool check_after_announce = false;
};
/// The owner leaves with a relaxed store: the reclaimer that sees it gone does not see
/// what it wrote into the bins.
struct LeaveRelaxed : ClaimProtocol {
  static constexpr std::memory_order leave = std::memory_order::relaxed;
};
/// The reclaimer gives the cache back with a relaxed store: the owner's next use does not
/// see the reclaimer's emptying.
struct ReleaseRelaxed : ClaimProtocol {
  static constexpr std::memory_order release = std::memory_order::relaxed;
};

template <class Suite>
void require_race(const Search& search) {
  require_caught<Suite>(rl::test_result_data_race, search);
}

}  // namespace

TEST_CASE("model: an owner's frees against one reclaim", "[model][cache]") {
  require_pass<OneClaim<ClaimProtocol>>(full());
}

TEST_CASE("model: an owner's frees against two reclaims", "[model][cache]") {
  require_pass<TwoClaims<ClaimProtocol>>(bounded(3));
}

TEST_CASE("mutant: owner announces with a release store: race caught", "[model][cache][mutant]") {
  require_race<OneClaim<AnnounceByRelease>>(full());
}

TEST_CASE("mutant: reclaimer claims with a release store: race caught", "[model][cache][mutant]") {
  require_race<OneClaim<ClaimByRelease>>(full());
}

TEST_CASE("mutant: owner checks for a claim before announcing: race caught", "[model][cache][mutant]") {
  require_race<OneClaim<CheckBeforeAnnounce>>(full());
}

TEST_CASE("mutant: owner leaves with a relaxed store: race caught", "[model][cache][mutant]") {
  require_race<OneClaim<LeaveRelaxed>>(full());
}

TEST_CASE("mutant: reclaimer gives back with a relaxed store: race caught", "[model][cache][mutant]") {
  require_race<TwoClaims<ReleaseRelaxed>>(bounded(3));
}
