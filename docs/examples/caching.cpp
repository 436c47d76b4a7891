// SPDX-License-Identifier: Apache-2.0
// docs/architecture.md, "The caching layer": Cached over Budget<AsyncCuda> on SimDriver.
// A freed block comes back to the next allocation of its size class on its stream
// without a driver call; trim() gives every cached block back.
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include <cstdio>

using namespace xlogrt;

int main() {
  SimDriver sim(SimConfig{.devices = 1});
  auto streams = StreamPool<SimDriver>::open(sim, 0, 2);
  if (!streams) return std::puts(streams.error().what().c_str()), 1;
  auto base = AsyncCuda<SimDriver>::create(*streams);
  if (!base) return std::puts(base.error().what().c_str()), 1;
  // [cache]
  using Stack = Cached<Budget<AsyncCuda<SimDriver>>>;
  auto stack = Stack::create(Budget<AsyncCuda<SimDriver>>(std::move(*base)), CachedOptions{.bin_blocks = 8});
  if (!stack) return std::puts(stack.error().what().c_str()), 1;  // options out of range
  const auto alloc_calls = sim.calls("cuMemAllocFromPoolAsync");
  for (int i = 0; i < 1000; ++i) {  // 1,000 pairs of 10 KB: the size class of 10 KiB
    auto b = stack->allocate(10'000, StreamId{0}, AllocTag{1});
    if (!b || !stack->deallocate(std::move(*b))) return 1;
  }
  const CacheStats s = stack->stats();
  std::printf("%llu hits, %llu from the pool (driver calls: %lld); %zu bytes cached\n",
              static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.misses),
              static_cast<long long>(sim.calls("cuMemAllocFromPoolAsync") - alloc_calls), s.cached_bytes);
  const std::size_t given_back = stack->trim();  // memory pressure: every cached block back
  if (!stack->reap_pending()) return 1;
  std::printf("trim gave back %zu bytes; %zu bytes outstanding\n", given_back, stack->bytes_outstanding());
  // [/cache]
  return s.misses == 1 && s.hits == 999 && stack->bytes_outstanding() == 0 ? 0 : 1;
}
