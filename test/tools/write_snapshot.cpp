// SPDX-License-Identifier: Apache-2.0
// Writes a LiveBlocks snapshot taken on SimDriver when an allocation fails, for
// snapshot_check.py to open with tools/memviz: a few blocks of three tags on four
// streams, some freed, then a request larger than the simulated device. Prints what the
// snapshot must show as one line of JSON, with what the stack held then (the blocks and
// the frees queued: the snapshot's sample).
//
// usage: write_snapshot OUT.csv

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/live_blocks.hpp>

#include <cstdio>
#include <set>
#include <vector>

using namespace xlogrt;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_snapshot OUT.csv\n");
    return 2;
  }
  SimDriver sim{SimConfig{.devices = 1, .memory_bytes = std::size_t{64} << 20}};
  auto dev = Device<SimDriver>::open(sim, 0);
  auto pool = dev ? StreamPool<SimDriver>::create(*dev, 4) : result<std::shared_ptr<StreamPool<SimDriver>>>(dev.error());
  auto base = pool ? AsyncCuda<SimDriver>::create(*pool) : result<AsyncCuda<SimDriver>>(pool.error());
  if (!base) {
    std::fprintf(stderr, "write_snapshot: %s\n", base.error().what().c_str());
    return 1;
  }
  LiveBlocks<AsyncCuda<SimDriver>> stack{std::move(*base)};
  std::vector<DeviceBlock> held;
  for (std::uint32_t i = 0; i < 24; ++i) {
    auto b = stack.allocate((std::size_t{1} << (10 + i % 8)) + 256 * i, StreamId{i % 4}, AllocTag{1 + i % 3});
    if (!b) {
      std::fprintf(stderr, "write_snapshot: %s\n", b.error().what().c_str());
      return 1;
    }
    held.push_back(std::move(*b));
  }
  for (std::size_t i = 0; i < held.size(); i += 5) (void)stack.deallocate(std::move(held[i]));
  const std::size_t too_much = std::size_t{1} << 30;
  if (stack.allocate(too_much, StreamId{2}, AllocTag{4})) {
    std::fprintf(stderr, "write_snapshot: a request larger than the device succeeded\n");
    return 1;
  }
  const auto snap = stack.snapshot();
  const std::size_t held_then = stack.bytes_outstanding(), queued_then = stack.upstream().queued_free_bytes();
  if (auto w = snap.save(argv[1]); !w) {
    std::fprintf(stderr, "write_snapshot: %s\n", w.error().what().c_str());
    return 1;
  }
  std::size_t bytes = 0, blocks = 0;
  std::set<std::uint32_t> tags{4}, streams{2};  // the failure's tag and stream are in the log too
  for (const auto& b : held) {
    if (b.empty()) continue;
    bytes += b.bytes();
    ++blocks;
    tags.insert(b.tag().value);
    streams.insert(b.alloc_stream().value);
  }
  std::printf("{\"bytes\": %zu, \"blocks\": %zu, \"failure_bytes\": %zu, \"tags\": %zu, \"streams\": %zu, "
              "\"held\": %zu, \"queued\": %zu}\n",
              bytes, blocks, too_much, tags.size(), streams.size(), held_then, queued_then);
  for (auto& b : held) {
    if (!b.empty()) (void)stack.deallocate(std::move(b));
  }
  (void)stack.reap_pending();
  return 0;
}
