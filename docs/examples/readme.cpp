// SPDX-License-Identifier: Apache-2.0
// The README's example, a complete program: README.md quotes the region between the
// markers verbatim (test: docs/examples/check_quotes.py). It runs on the GPU when there
// is one and on SimDriver otherwise; the host suite runs it with no GPU.
// [readme]
#include <xlogrt/sim/sim_driver.hpp>  // the simulated GPU, for machines without one
#include <xlogrt/runtime.hpp>

#include <cstdio>
#include <vector>

using namespace xlogrt;

// Stream 1 fills a block, stream 2 copies it to the host, and the block is freed at once:
// the runtime orders the copy after the fill and the free after the copy.
template <class Runtime>
int demo(Runtime& rt) {
  auto block = rt.allocate(1 << 20, StreamId{1}, AllocTag{7});  // 1 MiB, for stream 1
  if (!block) return std::puts(block.error().what().c_str()), 1;
  auto& drv = rt.driver();
  std::vector<unsigned char> host(block->bytes());
  const auto fill = [&](auto s) { return drv.memset_d8_async(block->ptr(), 42, host.size(), s); };
  const auto copy = [&](auto s) { return drv.memcpy_dtoh_async(host.data(), block->ptr(), host.size(), s); };
  auto filled = launch(rt, StreamId{1}, fill, write(*block));
  auto copied = launch(rt, StreamId{2}, copy, read(*block));  // stream 2 waits for the fill
  auto freed = rt.deallocate(std::move(*block));              // queued on stream 1, after the copy
  auto synced = drv.stream_synchronize(*rt.stream(StreamId{2}));
  for (const auto& r : {filled, copied, freed, synced}) {
    if (!r) return std::puts(r.error().what().c_str()), 1;
  }
  std::printf("read back %d on stream 2; %zu bytes outstanding\n", host.back(), rt.bytes_outstanding());
  return host.back() == 42 ? 0 : 1;
}

int main() {
  if (auto rt = DeviceRuntime<DefaultStack>::try_get(0)) return demo(**rt);  // the GPU's ordinal 0
  auto rt = DeviceRuntime<DefaultStackOn<SimDriver>>::try_get(0);            // no GPU: the simulator
  if (!rt) return std::puts(rt.error().what().c_str()), 1;                   // no_driver, no_device, ...
  return demo(**rt);
}
// [/readme]
