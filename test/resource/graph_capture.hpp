// SPDX-License-Identifier: Apache-2.0
#pragma once

// Captures through a stack, shared by the SimDriver test (test_graph_pools.cpp) and the
// GPU one (test_graph_pools_gpu.cpp): the same program on the simulator's model of
// capture and on the driver. `sim` names the driver object, whichever it is.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/cached.hpp>
#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/resource/graph_pools.hpp>
#include <xlogrt/runtime.hpp>

namespace xlogrt::testing::graphs {

constexpr std::size_t TEMP = 64 << 10;  // a capture's temporary: a size the cache keeps
constexpr std::size_t OUT = 4 << 10;
constexpr std::uint8_t GRAPH_BYTE = 0xab;
constexpr std::uint8_t EAGER_BYTE = 0x11;

template <class D>
std::shared_ptr<StreamPool<D>> pool_of(D& drv) {
  auto pool = StreamPool<D>::open(drv, 0, 2);
  REQUIRE(pool.has_value());
  return *pool;
}

/// The default stack with its cache on and no budget, whatever the environment says.
template <class D>
DefaultStackOn<D> default_stack(const std::shared_ptr<StreamPool<D>>& streams) {
  REQUIRE(unsetenv("XLOGRT_CACHE") == 0);
  REQUIRE(unsetenv("XLOGRT_BUDGET_BYTES") == 0);
  auto s = StackBuilder<DefaultStackOn<D>>::build(streams);
  REQUIRE(s.has_value());
  return std::move(*s);
}

template <class D, class Stack>
std::vector<std::uint8_t> read_back(D& sim, Stack& stack, const DeviceBlock& b) {
  std::vector<std::uint8_t> host(b.bytes());
  auto h = stack.stream_handle(b.alloc_stream());
  REQUIRE(h.has_value());
  REQUIRE(sim.memcpy_dtoh_async(host.data(), b.ptr(), b.bytes(), *h).has_value());
  REQUIRE(sim.stream_synchronize(*h).has_value());
  return host;
}

/// What a capture leaves behind: the graph and the block its replays write.
template <class D>
struct Captured {
  typename D::graph_exec_t exec{};
  DeviceBlock out;
};

/// Captures on `cs`: a temporary written and copied into `out`, the temporary freed inside
/// the capture, as a model's forward frees its activations. With `Window`, inside a
/// GraphPools window of `pool`.
template <bool Window, class D, class Stack>
Captured<D> capture(D& sim, Stack& stack, StreamId cs, GraphPoolId pool = {}) {
  auto h = stack.stream_handle(cs);
  REQUIRE(h.has_value());
  if constexpr (Window) REQUIRE(find_layer<GraphPools>(stack)->begin_allocate_to_pool(pool).has_value());
  REQUIRE(sim.stream_begin_capture(*h, CaptureMode::global).has_value());
  auto temp = stack.allocate(TEMP, cs, AllocTag{});
  REQUIRE(temp.has_value());
  REQUIRE(sim.memset_d8_async(temp->ptr(), GRAPH_BYTE, TEMP, *h).has_value());
  auto out = stack.allocate(OUT, cs, AllocTag{});
  REQUIRE(out.has_value());
  REQUIRE(sim.memcpy_dtod_async(out->ptr(), temp->ptr(), OUT, *h).has_value());
  REQUIRE(stack.deallocate(std::move(*temp)).has_value());
  auto graph = sim.stream_end_capture(*h);
  REQUIRE(graph.has_value());  // nothing the stack did invalidated the capture
  if constexpr (Window) REQUIRE(find_layer<GraphPools>(stack)->end_allocate_to_pool(pool).has_value());
  auto exec = sim.graph_instantiate(*graph);
  REQUIRE(exec.has_value());
  REQUIRE(sim.graph_destroy(*graph).has_value());
  return Captured<D>{*exec, std::move(*out)};
}

/// Eager tensors allocated after the capture, filled, then the graph replayed `replays`
/// times: how many eager bytes the replays changed.
template <class D, class Stack>
std::size_t eager_bytes_changed(D& sim, Stack& stack, StreamId cs, Captured<D>& g, int replays) {
  auto h = stack.stream_handle(cs);
  REQUIRE(h.has_value());
  std::vector<DeviceBlock> eager;
  for (std::size_t bytes : {TEMP, TEMP, OUT, std::size_t{256}}) {
    auto b = stack.allocate(bytes, cs, AllocTag{});
    REQUIRE(b.has_value());
    REQUIRE(sim.memset_d8_async(b->ptr(), EAGER_BYTE, bytes, *h).has_value());
    eager.push_back(std::move(*b));
  }
  for (int i = 0; i < replays; ++i) REQUIRE(sim.graph_launch(g.exec, *h).has_value());
  REQUIRE(sim.stream_synchronize(*h).has_value());
  std::size_t changed = 0;
  for (const DeviceBlock& b : eager) {
    for (std::uint8_t x : read_back(sim, stack, b)) changed += x != EAGER_BYTE;
  }
  for (const std::uint8_t x : read_back(sim, stack, g.out)) CHECK(x == GRAPH_BYTE);  // the replay ran
  for (DeviceBlock& b : eager) REQUIRE(stack.deallocate(std::move(b)).has_value());
  return changed;
}

/// A cached block of the temporary's size on the capture stream, as a warm process has.
template <class Stack>
void warm(Stack& stack, StreamId cs) {
  auto b = stack.allocate(TEMP, cs, AllocTag{});
  REQUIRE(b.has_value());
  REQUIRE(stack.deallocate(std::move(*b)).has_value());
}

/// The stack below GraphPools (Cached<AsyncCuda>), captured through without a window: the
/// temporary comes from the cache, goes back to it at its free inside the capture, and the
/// next eager tensor of its size receives the memory each replay writes. Returns the eager
/// bytes one replay changed, which the tests require to be above 0: the check that passes
/// the default stack catches this stack.
template <class D>
std::size_t eager_bytes_changed_without_graph_pools(D& sim) {
  auto streams = pool_of(sim);
  auto base = AsyncCuda<D>::create(streams);
  REQUIRE(base.has_value());
  auto cached = Cached<AsyncCuda<D>>::create(std::move(*base));
  REQUIRE(cached.has_value());
  const StreamId cs{1};
  warm(*cached, cs);
  auto g = capture<false>(sim, *cached, cs);
  const std::size_t changed = eager_bytes_changed(sim, *cached, cs, g, 1);
  REQUIRE(sim.graph_exec_destroy(g.exec).has_value());
  REQUIRE(cached->deallocate(std::move(g.out)).has_value());
  REQUIRE(cached->reap_pending().has_value());
  return changed;
}

/// Two captures into one pool through the default stack, each replayed `replays` times with
/// eager tensors alive, then released: the second capture reuses the first's freed
/// temporary, no eager byte changes, and the pool's memory all comes back.
template <class D>
void share_one_pool(D& sim, int replays) {
  auto streams = pool_of(sim);
  DefaultStackOn<D> stack = default_stack(streams);
  auto& layer = *find_layer<GraphPools>(stack);
  const StreamId cs{1};
  warm(stack, cs);
  const GraphPoolId pool = layer.new_pool();
  auto first = capture<true>(sim, stack, cs, pool);
  const std::size_t held_one = layer.graph_stats().held_bytes;
  auto second = capture<true>(sim, stack, cs, pool);
  // The second capture's temporary is the first's; its output is new (the first's is live).
  CHECK(layer.graph_stats().held_bytes == held_one + OUT);
  CHECK(eager_bytes_changed(sim, stack, cs, first, replays) == 0);
  CHECK(eager_bytes_changed(sim, stack, cs, second, replays) == 0);
  for (auto* g : {&first, &second}) {
    REQUIRE(sim.graph_exec_destroy(g->exec).has_value());
    REQUIRE(layer.release_pool(pool).has_value());
    REQUIRE(stack.deallocate(std::move(g->out)).has_value());
  }
  CHECK(layer.graph_stats().held_bytes == 0);
  CHECK_FALSE(layer.release_pool(pool));  // no use left: a named error
  REQUIRE(stack.reap_pending().has_value());
}

}  // namespace xlogrt::testing::graphs
