// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::PollCadence: when a base resource's deallocate polls its queued frees (its
// poll naming the freed block's stream): once every EVERY_FREES frees of the calling
// thread, and as soon as the bytes that thread freed since its last poll reach
// EVERY_BYTES. The count keeps the poll's driver calls (a stream query, an event record)
// off the path of small frees; the bytes bound what a run of large frees leaves counted,
// and pending, between two polls. The poll inside a free is the one place a free on an
// adopted stream (torch's streams, through the bridge) is marked: no other call may touch
// that stream's handle, so counted by frees alone, a run of large frees there would stay
// counted as held, and pending for other streams, until a reap. The cost: a thread
// freeing blocks of EVERY_BYTES or more polls at each free (a stream query).
//
// One count per resource type and thread (Resource: the type whose frees are counted),
// kept in one thread_local, so a free reads one thread-local address.

#include <cstddef>
#include <cstdint>

namespace xlogrt::detail {

// A thread's frees and bytes since its last poll. At namespace scope: a nested class
// with default member initializers is incomplete inside its enclosing class, which
// nvcc's front end rejects for the static thread_local below.
struct PollCount {
  std::uint32_t frees = 0;
  std::size_t bytes = 0;
};

template <class Resource>
struct PollCadence {
  static constexpr std::uint32_t EVERY_FREES = 256;
  static constexpr std::size_t EVERY_BYTES = std::size_t{32} << 20;

  /// Counts a free of `bytes` on the calling thread; true when it should poll.
  [[gnu::always_inline]] static bool due(std::size_t bytes) noexcept {
    PollCount& c = count;
    c.bytes += bytes;
    if (++c.frees < EVERY_FREES && c.bytes < EVERY_BYTES) [[likely]] return false;
    c = PollCount{};
    return true;
  }

 private:
  static inline thread_local PollCount count{};
};

}  // namespace xlogrt::detail
