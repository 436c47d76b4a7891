// SPDX-License-Identifier: Apache-2.0
//
// Relacy models of a StreamPoint's attach/fire race: the shipped PointCore
// (reactor/detail/point_core.hpp) under Relacy's atomics. Threads attach waiters while
// one thread closes the point, as the reactor's scanner does when the point's flag is
// found written; an attach that finds the point closed delivers its waiter itself from
// the stored outcome, as StreamPoint does.
//
// What is checked: every waiter is delivered exactly once, either by the closer or by its
// own attacher (a waiter lost or delivered twice fails the model); the closer reads each
// waiter's contents (an instrumented payload, standing for the callable or coroutine
// handle a real waiter carries) without a data race; an attacher that finds the point
// closed reads the outcome (instrumented too) without a data race.
//
// The protocol must pass. Each mutant weakens one step or order of the protocol (through
// PointCore's Protocol seam) and must FAIL with the failure it causes; a mutant the
// checker lets through fails its test, because the model could then not have caught it.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "xlogrt/core/result.hpp"
#include "xlogrt/reactor/detail/point_core.hpp"
#include "xlogrt/reactor/detail/reactor_waiter.hpp"

#include "relacy_atomics.hpp"  // last: it brings <relacy/relacy.hpp> and its macros
#include "relacy_harness.hpp"

namespace {

using namespace xlogrt_model;
using xlogrt::detail::PointProtocol;
using xlogrt::detail::ReactorWaiter;

void expect(bool ok, const char* what) {
  if (!ok) rl::ctx().fail_test(what, rl::test_result_user_assert_failed, RL_INFO);
}

/// The outcome as an instrumented value: close()'s write and a late attacher's read are
/// a data race unless the protocol orders them.
struct ModelOutcome {
  ModelOutcome() = default;
  ModelOutcome& operator=(int x) {
    v($) = x;
    return *this;
  }
  int get() const { return v($); }
  mutable rl::var<int> v{0};
};

constexpr int OUTCOME = 7;

/// A waiter whose contents the closer reads when it delivers it.
struct Node : ReactorWaiter {
  Node() : ReactorWaiter(&never) {}
  static void never(ReactorWaiter*, xlogrt::result<void>) noexcept {}  // the model delivers
  rl::var<int> payload{0};
  RelacyAtomics::atomic<int> deliveries{0};
};

template <class Proto>
using Core = xlogrt::detail::PointCore<RelacyAtomics, Proto, ModelOutcome>;

/// Threads 0 .. ATTACHERS-1 attach PER_THREAD waiters each; the last thread closes the
/// point and delivers what it took.
template <class Proto, unsigned ATTACHERS, unsigned PER_THREAD>
struct AttachWhileFiring
    : rl::test_suite<AttachWhileFiring<Proto, ATTACHERS, PER_THREAD>, ATTACHERS + 1> {
  static constexpr unsigned N = ATTACHERS * PER_THREAD;
  std::optional<Core<Proto>> core;
  std::optional<Node> nodes[N];

  void before() {
    core.emplace();
    for (auto& n : nodes) n.emplace();
  }

  void thread(unsigned t) {
    if (t < ATTACHERS) {
      for (unsigned i = 0; i < PER_THREAD; ++i) {
        const unsigned id = t * PER_THREAD + i;
        Node& n = *nodes[id];
        n.payload($) = static_cast<int>(id) + 1;  // what the node carries, set before attach
        if (!core->attach(n)) {
          // Closed: deliver it here, from the stored outcome.
          expect(core->outcome().get() == OUTCOME, "a late attacher must read the outcome");
          n.deliveries.fetch_add(1, std::memory_order::relaxed);
        }
      }
    } else {
      ReactorWaiter* w = core->close(OUTCOME);
      while (w != nullptr) {
        ReactorWaiter* next = w->next_;
        auto* n = static_cast<Node*>(w);
        const int id = n->payload($);
        expect(id >= 1 && id <= static_cast<int>(N), "a delivered waiter carries its payload");
        n->deliveries.fetch_add(1, std::memory_order::relaxed);
        w = next;
      }
      expect(core->closed(), "closed after close()");
    }
  }

  void after() {
    for (auto& n : nodes) {
      expect(n->deliveries.load(std::memory_order::relaxed) == 1,
             "every waiter must be delivered exactly once");
    }
    for (auto& n : nodes) n.reset();
    core.reset();
  }
};

/// One attacher that also polls closed() before attaching, as StreamPoint::on_done does.
template <class Proto>
struct PollThenAttach : rl::test_suite<PollThenAttach<Proto>, 2> {
  std::optional<Core<Proto>> core;
  std::optional<Node> node;
  void before() {
    core.emplace();
    node.emplace();
  }
  void thread(unsigned t) {
    if (t == 0) {
      node->payload($) = 1;
      if (core->closed() || !core->attach(*node)) {
        expect(core->outcome().get() == OUTCOME, "a late attacher must read the outcome");
        node->deliveries.fetch_add(1, std::memory_order::relaxed);
      }
    } else {
      for (ReactorWaiter* w = core->close(OUTCOME); w != nullptr; w = w->next_) {
        auto* n = static_cast<Node*>(w);
        expect(n->payload($) == 1, "a delivered waiter carries its payload");
        n->deliveries.fetch_add(1, std::memory_order::relaxed);
      }
    }
  }
  void after() {
    expect(node->deliveries.load(std::memory_order::relaxed) == 1,
           "the waiter must be delivered exactly once");
    node.reset();
    core.reset();
  }
};

// ---- the mutants ------------------------------------------------------------------------

/// attach loads head_, checks it, then stores: a close() between the load and the store
/// is overwritten (the waiter is lost, and the point reopens), and so is another
/// attacher's push.
struct AttachWithoutRecheck : PointProtocol {
  static constexpr bool attach_by_cas = false;
};
/// attach's compare-exchange does not release: the closer takes the node without
/// acquiring what the attacher stored in it.
struct AttachNoRelease : PointProtocol {
  static constexpr std::memory_order attach = std::memory_order::acquire;
};
/// close()'s exchange does not release: an attacher that reads CLOSED reads the outcome
/// unordered with its write.
struct CloseNoRelease : PointProtocol {
  static constexpr std::memory_order close = std::memory_order::acquire;
};
/// The loads of head_ are relaxed: reading CLOSED orders nothing, so the outcome read
/// races its write.
struct ObserveRelaxed : PointProtocol {
  static constexpr std::memory_order observe = std::memory_order::relaxed;
};

}  // namespace

TEST_CASE("model: two attachers race the point's one completion", "[model][point]") {
  require_pass<AttachWhileFiring<PointProtocol, 2, 2>>(full());
}

TEST_CASE("model: three attachers race the point's one completion", "[model][point]") {
  require_pass<AttachWhileFiring<PointProtocol, 3, 1>>(random(500000));
}

TEST_CASE("model: an attacher that polls done() first races the completion", "[model][point]") {
  require_pass<PollThenAttach<PointProtocol>>(full());
}

TEST_CASE("mutant: attach without re-checking for the closed sentinel: lost waiter caught",
          "[model][point][mutant]") {
  require_caught<AttachWhileFiring<AttachWithoutRecheck, 2, 1>>(
      rl::test_result_user_assert_failed, full());
}

TEST_CASE("mutant: attach's compare-exchange without release: data race caught",
          "[model][point][mutant]") {
  require_caught<AttachWhileFiring<AttachNoRelease, 1, 1>>(rl::test_result_data_race, full());
}

TEST_CASE("mutant: close's exchange without release: data race caught",
          "[model][point][mutant]") {
  require_caught<AttachWhileFiring<CloseNoRelease, 1, 1>>(rl::test_result_data_race, full());
}

TEST_CASE("mutant: relaxed loads of the head: data race caught", "[model][point][mutant]") {
  require_caught<PollThenAttach<ObserveRelaxed>>(rl::test_result_data_race, full());
}
