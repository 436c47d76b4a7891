// SPDX-License-Identifier: Apache-2.0
//
// Relacy model of BlockTable's lock-free peek (resource/detail/slot_tag.hpp): the shipped
// SlotTag under Relacy's atomics, read by a thread that holds a block's id while the
// block's owner frees it and an insert reuses its slot.
//
// The entry is one atomic, as AsyncCuda's quiet_stream is, and each life of the slot
// stores its own generation there. The property: a peek with the freed block's id that
// passes read the value of that block's life, never the next one's (a reused slot is
// never mistaken for the freed block). The protocol must pass; each mutant weakens one
// order or step (through SlotTag's Protocol seam) and must be caught with that failure.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <optional>

#include "xlogrt/resource/detail/slot_tag.hpp"

#include "relacy_atomics.hpp"  // last: it brings <relacy/relacy.hpp> and its macros
#include "relacy_harness.hpp"

namespace {

using namespace xlogrt_model;
using xlogrt::detail::PeekProtocol;

void expect(bool ok, const char* what) {
  if (!ok) rl::ctx().fail_test(what, rl::test_result_user_assert_failed, RL_INFO);
}

/// A slot's tag as BlockTable writes it: generation << 1 | live.
constexpr std::uint64_t tag_of(std::uint32_t gen, bool live) { return std::uint64_t{gen} << 1 | (live ? 1u : 0u); }

template <class Proto>
struct Slot {
  xlogrt::detail::SlotTag<RelacyAtomics, Proto> tag;
  RelacyAtomics::atomic<std::uint32_t> entry{0};  // the generation of the life that set it up
};

/// Thread 0 owns the block of generation 1: it frees it (the dead tag of generation 2)
/// and inserts a new block into the slot (entry, then the live tag of generation 2),
/// `Lives` times over. Thread 1 peeks with the id of generation 1 `Peeks` times.
template <class Proto, int Lives, int Peeks>
struct PeekAgainstReuse : rl::test_suite<PeekAgainstReuse<Proto, Lives, Peeks>, 2> {
  std::optional<Slot<Proto>> s;
  void before() {
    s.emplace();
    // The first life, set up before the reader learns its id (as an allocation returns it).
    s->entry.store(1, Proto::entry_write);
    s->tag.publish(tag_of(1, true));
  }
  void thread(unsigned i) {
    if (i == 0) {
      for (std::uint32_t gen = 1; gen <= Lives; ++gen) {
        s->tag.end(tag_of(gen + 1, false));        // the free
        s->entry.store(gen + 1, Proto::entry_write);  // the next insert sets the entry up
        s->tag.publish(tag_of(gen + 1, true));     // and publishes it
      }
    } else {
      for (int k = 0; k < Peeks; ++k) {
        std::uint32_t seen = 0;
        const bool passed = s->tag.peek(tag_of(1, true), [&] {
          seen = s->entry.load(Proto::entry_read);
          return true;
        });
        if (passed) expect(seen == 1, "a peek with a freed block's id passed, reading the next block's entry");
      }
    }
  }
  void after() { s.reset(); }
};

template <class Proto>
using OneReuse = PeekAgainstReuse<Proto, 1, 1>;
template <class Proto>
using TwoReuses = PeekAgainstReuse<Proto, 2, 2>;

// ---- the mutants ------------------------------------------------------------------------

/// The next life sets its entry up with a relaxed store (as AsyncCuda's Track::start did):
/// the reader that loads it need not see the free that came before.
struct EntryWriteRelaxed : PeekProtocol {
  static constexpr std::memory_order entry_write = std::memory_order::relaxed;
};
/// The reader loads the entry relaxed: its recheck can be satisfied before that load.
struct EntryReadRelaxed : PeekProtocol {
  static constexpr std::memory_order entry_read = std::memory_order::relaxed;
};
/// The reader trusts its first read of the tag.
struct NoRecheck : PeekProtocol {
  static constexpr bool recheck_after_read = false;
};

template <class Suite>
void require_stale_read(const Search& search) {
  require_caught<Suite>(rl::test_result_user_assert_failed, search);
}

}  // namespace

TEST_CASE("model: a peek against a free and a reuse", "[model][peek]") {
  require_pass<OneReuse<PeekProtocol>>(full());
}

TEST_CASE("model: peeks against two frees and reuses", "[model][peek]") {
  require_pass<TwoReuses<PeekProtocol>>(full());
}

TEST_CASE("mutant: the next life's entry stored relaxed: stale peek caught", "[model][peek][mutant]") {
  require_stale_read<OneReuse<EntryWriteRelaxed>>(full());
}

TEST_CASE("mutant: the reader loads the entry relaxed: stale peek caught", "[model][peek][mutant]") {
  require_stale_read<OneReuse<EntryReadRelaxed>>(full());
}

TEST_CASE("mutant: the reader skips the recheck: stale peek caught", "[model][peek][mutant]") {
  require_stale_read<OneReuse<NoRecheck>>(full());
}
