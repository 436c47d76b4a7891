// SPDX-License-Identifier: Apache-2.0
//
// Relacy model of a budget stripe's charge against the ledger's trim: the shipped
// BasicBudgetStripe (resource/detail/budget_stripe.hpp) under Relacy's atomics.
//
// A device with a limit of LIMIT bytes has given all of it to one stripe (held = LIMIT).
// Its thread charges and credits without a lock; meanwhile the ledger's lock holder
// trims the stripe to what it has charged and hands the released credit to another
// stripe, which uses all of it (the worst case for the limit). When every thread is done:
//   - the stripe's `charged` is the charges that passed minus the credits (a failed
//     charge gives its bytes back: none lost, none counted twice);
//   - what the stripe still holds plus what the trim released is LIMIT (no credit lost
//     or made);
//   - the stripe's passed charges are within what it holds, so the charges of both
//     stripes are within the limit.
// The protocol must pass; each mutant weakens one order or step (through the stripe's
// Protocol seam) and must be caught breaking the limit.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <optional>

#include "xlogrt/resource/detail/budget_stripe.hpp"

#include "relacy_atomics.hpp"  // last: it brings <relacy/relacy.hpp> and its macros
#include "relacy_harness.hpp"

namespace {

using namespace xlogrt_model;
using xlogrt::detail::StripeProtocol;

void expect(bool ok, const char* what) {
  if (!ok) rl::ctx().fail_test(what, rl::test_result_user_assert_failed, RL_INFO);
}

constexpr std::int64_t LIMIT = 2;

/// Thread 0 runs `Steps` on its stripe: +1 charges 1 byte (when it fits), -1 credits one
/// byte it charged (when it has one). Thread 1 trims the stripe once, keeping `Keep`.
template <class Proto, std::int64_t Keep, int... Steps>
struct ChargeAgainstTrim : rl::test_suite<ChargeAgainstTrim<Proto, Keep, Steps...>, 2> {
  std::optional<xlogrt::detail::BasicBudgetStripe<RelacyAtomics, Proto>> st;
  std::int64_t passed = 0, credited = 0;  // thread 0's
  std::int64_t released = 0;              // thread 1's: the credit another stripe took
  void before() {
    st.emplace();
    st->held.store(LIMIT, std::memory_order::seq_cst);  // a refill gave the stripe the whole limit
    passed = credited = released = 0;
  }
  void thread(unsigned i) {
    if (i == 0) {
      for (int step : {Steps...}) {
        if (step > 0) {
          if (st->try_charge(1)) ++passed;
        } else if (passed > credited) {
          (void)st->credit(1);
          ++credited;
        }
      }
    } else {
      released = st->trim(Keep);  // under the ledger's lock (one trimmer: not modelled)
    }
  }
  void after() {
    const std::int64_t charged = st->charged.load(std::memory_order::seq_cst);
    const std::int64_t held = st->held.load(std::memory_order::seq_cst);
    expect(charged == passed - credited, "the stripe's charge is not its passed charges minus its credits");
    expect(held + released == LIMIT, "the trim lost or made credit");
    expect(charged <= held, "a passed charge is not covered by the stripe's credit: the limit can be exceeded");
    st.reset();
  }
};

template <class Proto>
using OneCharge = ChargeAgainstTrim<Proto, 0, +1>;
template <class Proto>
using ChargesAndCredit = ChargeAgainstTrim<Proto, 0, +1, -1, +1, +1>;
template <class Proto>
using TrimKeepingOne = ChargeAgainstTrim<Proto, 1, +1, +1>;

// ---- the mutants ------------------------------------------------------------------------

/// The trimmer lowers `held` with a release store: its recount can pass the store, so it
/// misses a charge whose check still read the old credit (the store-buffer pattern).
struct LowerByRelease : StripeProtocol {
  static constexpr std::memory_order lower = std::memory_order::release;
};
/// The charger reads `held` with an acquire load: the same, from the other side.
struct CheckByAcquire : StripeProtocol {
  static constexpr std::memory_order check = std::memory_order::acquire;
};
/// The trimmer trusts its first read of `charged`.
struct NoRecount : StripeProtocol {
  static constexpr bool recount_after_lower = false;
};

template <class Suite>
void require_over_limit(const Search& search) {
  require_caught<Suite>(rl::test_result_user_assert_failed, search);
}

}  // namespace

TEST_CASE("model: a charge against a trim", "[model][budget]") {
  require_pass<OneCharge<StripeProtocol>>(full());
}

TEST_CASE("model: charges and a credit against a trim", "[model][budget]") {
  require_pass<ChargesAndCredit<StripeProtocol>>(full());
}

TEST_CASE("model: charges against a trim that keeps a byte", "[model][budget]") {
  require_pass<TrimKeepingOne<StripeProtocol>>(full());
}

TEST_CASE("mutant: the trimmer lowers held with a release store: limit breach caught",
          "[model][budget][mutant]") {
  require_over_limit<OneCharge<LowerByRelease>>(full());
}

TEST_CASE("mutant: the charger checks held with an acquire load: limit breach caught",
          "[model][budget][mutant]") {
  require_over_limit<OneCharge<CheckByAcquire>>(full());
}

TEST_CASE("mutant: the trimmer skips the recount: limit breach caught", "[model][budget][mutant]") {
  require_over_limit<OneCharge<NoRecount>>(full());
}
