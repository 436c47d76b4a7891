// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a decorator with a member that cannot move (std::atomic) inside a
// DeviceRuntime, which holds its stack by value and moves it in. test/runtime/meson.build
// checks that compiling this fails with the static_assert's one sentence, which says
// what to do (issue #32), rather than pages of template errors.
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include <atomic>

template <class Up>
struct CountAllocations : xlogrt::Adaptor<Up> {
  using xlogrt::Adaptor<Up>::Adaptor;
  std::atomic<std::size_t> calls{0};
  xlogrt::result<xlogrt::DeviceBlock> allocate(std::size_t n, xlogrt::StreamId s, xlogrt::AllocTag t) noexcept {
    calls.fetch_add(1, std::memory_order_relaxed);
    return this->upstream().allocate(n, s, t);
  }
};

using Stack = CountAllocations<xlogrt::AsyncCuda<xlogrt::SimDriver>>;

xlogrt::result<xlogrt::DeviceRuntime<Stack>> misuse(const std::shared_ptr<xlogrt::StreamPool<xlogrt::SimDriver>>& streams,
                                                    Stack&& stack) {
  return xlogrt::DeviceRuntime<Stack>::create(streams, std::move(stack));
}
