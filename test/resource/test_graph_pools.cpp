// SPDX-License-Identifier: Apache-2.0
// GraphPools and the stack under stream capture, on SimDriver's model of capture: what a
// capture allocates comes from a graph pool that eager code never receives while the graph
// lives, nothing the stack does invalidates the capture or puts a free into the graph, and
// the pool's memory comes back when it is released. The stack without GraphPools is run
// through the same capture to show that the check catches a cache handing a graph's block
// to eager code.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/cached.hpp>
#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/resource/graph_pools.hpp>
#include <xlogrt/runtime.hpp>
#include <xlogrt/sim/sim_driver.hpp>

#include "graph_capture.hpp"

using namespace xlogrt;

using namespace xlogrt::testing::graphs;
using Default = DefaultStackOn<SimDriver>;


TEST_CASE("a capture through the default stack allocates from a graph pool that eager code never receives",
          "[graph_pools]") {
  SimDriver sim;
  auto streams = pool_of(sim);
  Default stack = default_stack(streams);
  const StreamId cs{1};
  warm(stack, cs);
  auto& layer = *find_layer<GraphPools>(stack);
  const GraphPoolId pool = layer.new_pool();
  auto g = capture<true>(sim, stack, cs, pool);
  const GraphPoolStats during = layer.graph_stats();
  CHECK(during.pools == 1);
  CHECK(during.live_blocks == 1);  // the graph's output; its temporary is back in the pool
  CHECK(during.held_bytes >= TEMP + OUT);
  CHECK(eager_bytes_changed(sim, stack, cs, g, 20) == 0);
  const SimCaptureStats cap = sim.capture_stats();
  CHECK(cap.captures_invalidated == 0);
  CHECK(cap.graph_alloc_nodes == 0);  // nothing the stack did became part of the graph
  CHECK(cap.graph_free_nodes == 0);

  // The graph goes, and its pool's memory with it once the output is freed too.
  REQUIRE(sim.graph_exec_destroy(g.exec).has_value());
  REQUIRE(layer.release_pool(pool).has_value());
  CHECK(layer.graph_stats().held_bytes >= OUT);  // the output is still the caller's
  REQUIRE(stack.deallocate(std::move(g.out)).has_value());
  const GraphPoolStats after = layer.graph_stats();
  CHECK(after.held_bytes == 0);
  CHECK(after.pools == 0);
}

TEST_CASE("the check catches a cache handing a graph's block to eager code", "[graph_pools]") {
  SimDriver sim;
  CHECK(eager_bytes_changed_without_graph_pools(sim) > 0);
}

TEST_CASE("graphs sharing a pool reuse what an earlier capture freed", "[graph_pools]") {
  SimDriver sim;
  share_one_pool(sim, 3);
}

TEST_CASE("an eager free during a capture is deferred until the capture ends", "[graph_pools]") {
  SimDriver sim;
  auto streams = pool_of(sim);
  Default stack = default_stack(streams);
  auto& layer = *find_layer<GraphPools>(stack);
  const StreamId cs{1};
  auto h = stack.stream_handle(cs);
  REQUIRE(h.has_value());
  const std::size_t before = stack.bytes_outstanding();
  auto eager = stack.allocate(8 << 20, cs, AllocTag{});  // above the cache's largest block
  REQUIRE(eager.has_value());
  const GraphPoolId pool = layer.new_pool();
  REQUIRE(layer.begin_allocate_to_pool(pool).has_value());
  REQUIRE(sim.stream_begin_capture(*h, CaptureMode::global).has_value());
  const auto frees_before = sim.calls("cuMemFreeAsync");
  REQUIRE(stack.deallocate(std::move(*eager)).has_value());
  CHECK(layer.graph_stats().deferred_frees == 1);
  CHECK(sim.calls("cuMemFreeAsync") == frees_before);  // nothing went into the graph
  REQUIRE(stack.reap_pending().has_value());            // legal, and leaves the capture alone
  CHECK(sim.capture_stats().graph_free_nodes == 0);
  auto graph = sim.stream_end_capture(*h);
  REQUIRE(graph.has_value());
  REQUIRE(layer.end_allocate_to_pool(pool).has_value());
  CHECK(layer.graph_stats().deferred_frees == 0);
  REQUIRE(stack.reap_pending().has_value());
  CHECK(stack.bytes_outstanding() == before);
  REQUIRE(sim.graph_destroy(*graph).has_value());
  REQUIRE(layer.release_pool(pool).has_value());
}

TEST_CASE("an eager block a replay reads is reused only after the replay, when its use is recorded at launch",
          "[graph_pools][hazards]") {
  // Inside the capture, tracking orders nothing; at launch it is ordinary cross-stream
  // use: prepare before the launch orders the replay after the input's producer, and
  // record_block_use on the launch stream keeps the input from being handed out again on
  // its own stream before the replay has read it. Without the record the simulator's
  // hazard checker sees the next owner's write race the replay's read.
  for (const bool record : {true, false}) {
    INFO("record_block_use after the launch: " << record);
    SimDriver sim(SimConfig{.executor = SimExecutor::manual});
    auto streams = pool_of(sim);
    Default stack = default_stack(streams);
    auto& layer = *find_layer<GraphPools>(stack);
    const StreamId es{0}, cs{1};
    auto eh = stack.stream_handle(es);
    auto ch = stack.stream_handle(cs);
    REQUIRE((eh && ch));
    auto in = stack.allocate(TEMP, es, AllocTag{});  // the graph's static input, eager
    REQUIRE(in.has_value());
    REQUIRE(sim.launch_kernel(*eh, {SimAccess{in->ptr(), in->bytes(), Access::Write}}).has_value());

    const GraphPoolId pool = layer.new_pool();
    REQUIRE(layer.begin_allocate_to_pool(pool).has_value());
    REQUIRE(sim.stream_begin_capture(*ch, CaptureMode::global).has_value());
    auto out = stack.allocate(OUT, cs, AllocTag{});
    REQUIRE(out.has_value());
    REQUIRE(sim.launch_kernel(*ch, {SimAccess{in->ptr(), in->bytes(), Access::Read},
                                    SimAccess{out->ptr(), out->bytes(), Access::Write}})
                .has_value());
    auto graph = sim.stream_end_capture(*ch);
    REQUIRE(graph.has_value());
    REQUIRE(layer.end_allocate_to_pool(pool).has_value());
    auto exec = sim.graph_instantiate(*graph);
    REQUIRE(exec.has_value());

    // At launch: the launch stream waits for the input's producer, and the replay's read
    // is recorded (or, the bug, not).
    REQUIRE(stack.prepare_block_use(in->id(), cs, Access::Read).has_value());
    REQUIRE(sim.graph_launch(*exec, *ch).has_value());
    if (record) REQUIRE(stack.record_block_use(*in, cs).has_value());
    REQUIRE(stack.deallocate(std::move(*in)).has_value());  // freed on its own stream
    auto next = stack.allocate(TEMP, es, AllocTag{});     // the cache's block of that size
    REQUIRE(next.has_value());
    REQUIRE(sim.launch_kernel(*eh, {SimAccess{next->ptr(), next->bytes(), Access::Write}}).has_value());
    sim.run_until_idle();
    const auto hazards = sim.hazards();
    if (record) {
      for (const auto& h : hazards) UNSCOPED_INFO(to_string(h));
      CHECK(hazards.empty());
    } else {
      CHECK_FALSE(hazards.empty());
    }
    CHECK(sim.capture_stats().captures_invalidated == 0);
    REQUIRE(stack.deallocate(std::move(*next)).has_value());
    REQUIRE(stack.deallocate(std::move(*out)).has_value());
    REQUIRE(sim.graph_exec_destroy(*exec).has_value());
    REQUIRE(sim.graph_destroy(*graph).has_value());
    REQUIRE(layer.release_pool(pool).has_value());
    REQUIRE(stack.reap_pending().has_value());
  }
}

TEST_CASE("AsyncCuda's polls and reaps leave a capturing stream alone", "[graph_pools]") {
  SimDriver sim;
  auto streams = pool_of(sim);
  auto base = AsyncCuda<SimDriver>::create(streams);
  REQUIRE(base.has_value());
  const StreamId cs{1};
  auto h = base->stream_handle(cs);
  REQUIRE(h.has_value());
  auto b = base->allocate(1 << 20, cs, AllocTag{});
  REQUIRE(b.has_value());
  REQUIRE(base->deallocate(std::move(*b)).has_value());  // a free pending on the stream
  REQUIRE(sim.stream_begin_capture(*h, CaptureMode::global).has_value());
  REQUIRE(base->poll_pending().has_value());
  REQUIRE(base->reap_pending().has_value());
  CHECK(base->bytes_outstanding() == (1 << 20));  // still pending: the stream captures
  auto graph = sim.stream_end_capture(*h);
  REQUIRE(graph.has_value());
  REQUIRE(sim.graph_destroy(*graph).has_value());
  REQUIRE(base->reap_pending().has_value());
  CHECK(base->bytes_outstanding() == 0);
}

TEST_CASE("a free deferred by AsyncCuda during a capture window is queued after the capture", "[graph_pools]") {
  // A layer below GraphPools (a cache giving blocks back) may free a block of the
  // capturing stream; AsyncCuda keeps that free out of the graph.
  SimDriver sim;
  auto streams = pool_of(sim);
  auto base = AsyncCuda<SimDriver>::create(streams);
  REQUIRE(base.has_value());
  GraphPools<AsyncCuda<SimDriver>> layer(std::move(*base));
  const StreamId cs{1};
  auto h = layer.stream_handle(cs);
  REQUIRE(h.has_value());
  auto b = layer.allocate(4096, cs, AllocTag{});
  REQUIRE(b.has_value());
  const GraphPoolId pool = layer.new_pool();
  REQUIRE(layer.begin_allocate_to_pool(pool).has_value());
  REQUIRE(sim.stream_begin_capture(*h, CaptureMode::global).has_value());
  const auto frees_before = sim.calls("cuMemFreeAsync");
  REQUIRE(layer.upstream().deallocate(std::move(*b)).has_value());  // below GraphPools
  CHECK(layer.upstream().deferred_frees() == 1);
  CHECK(sim.calls("cuMemFreeAsync") == frees_before);
  auto graph = sim.stream_end_capture(*h);
  REQUIRE(graph.has_value());
  REQUIRE(layer.end_allocate_to_pool(pool).has_value());
  REQUIRE(layer.reap_pending().has_value());
  CHECK(layer.upstream().deferred_frees() == 0);
  CHECK(layer.bytes_outstanding() == 0);
  REQUIRE(sim.graph_destroy(*graph).has_value());
  REQUIRE(layer.release_pool(pool).has_value());
}

TEST_CASE("GraphPools refuses bad calls by name and loses nothing", "[graph_pools]") {
  SimDriver sim;
  auto streams = pool_of(sim);
  Default stack = default_stack(streams);
  auto& layer = *find_layer<GraphPools>(stack);
  const GraphPoolId pool = layer.new_pool();
  auto no_window = layer.end_allocate_to_pool(pool);
  REQUIRE_FALSE(no_window);
  CHECK(no_window.error().code() == errc::invalid_argument);
  auto no_use = layer.release_pool(pool);
  REQUIRE_FALSE(no_use);
  CHECK(no_use.error().code() == errc::invalid_argument);

  const StreamId cs{1};
  auto g = capture<true>(sim, stack, cs, pool);
  DeviceBlock forged{g.out.ptr(), g.out.bytes() + 1, g.out.alloc_stream(), g.out.device_ordinal(), g.out.tag(),
                     g.out.id()};
  auto wrong = stack.deallocate(std::move(forged));
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code() == errc::foreign_block);
  const BlockId id = g.out.id();
  REQUIRE(stack.deallocate(std::move(g.out)).has_value());
  auto twice = layer.prepare_block_use(id, cs, Access::Read);
  REQUIRE_FALSE(twice);
  CHECK(twice.error().code() == errc::double_free);
  REQUIRE(sim.graph_exec_destroy(g.exec).has_value());
  REQUIRE(layer.release_pool(pool).has_value());
  CHECK(layer.graph_stats().held_bytes == 0);
}

TEST_CASE("during a capture window a stream is known by its handle, and its id is never read", "[graph_pools]") {
  // The driver refuses cuStreamGetId on a capturing stream and invalidates the capture, so
  // a bridge that adopts its callers' streams on every allocation must not read it then.
  SimDriver sim;
  auto streams = pool_of(sim);
  Default stack = default_stack(streams);
  auto& layer = *find_layer<GraphPools>(stack);
  auto seen = sim.stream_create();
  auto unseen = sim.stream_create();
  REQUIRE((seen && unseen));
  auto id = streams->adopt(*seen);  // before the capture, as the torch bridge does
  REQUIRE(id.has_value());

  SECTION("inside a window: found by handle, an unseen capturing stream refused, no capture broken") {
    const GraphPoolId pool = layer.new_pool();
    REQUIRE(layer.begin_allocate_to_pool(pool).has_value());
    REQUIRE(sim.stream_begin_capture(*seen, CaptureMode::global).has_value());
    REQUIRE(sim.stream_begin_capture(*unseen, CaptureMode::global).has_value());
    auto again = streams->adopt(*seen);
    REQUIRE(again.has_value());
    CHECK(*again == *id);
    auto refused = streams->adopt(*unseen);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code() == errc::stream_misuse);
    auto g1 = sim.stream_end_capture(*seen);
    auto g2 = sim.stream_end_capture(*unseen);
    REQUIRE((g1 && g2));  // neither capture was invalidated
    REQUIRE(layer.end_allocate_to_pool(pool).has_value());
    REQUIRE(sim.graph_destroy(*g1).has_value());
    REQUIRE(sim.graph_destroy(*g2).has_value());
    REQUIRE(layer.release_pool(pool).has_value());
  }
  SECTION("without a window the id is read, and the capture breaks: what the window prevents") {
    REQUIRE(sim.stream_begin_capture(*seen, CaptureMode::global).has_value());
    auto again = streams->adopt(*seen);
    REQUIRE_FALSE(again);
    CHECK(again.error().driver_status() == status::stream_capture_unsupported);
    CHECK_FALSE(sim.stream_end_capture(*seen));
  }
  REQUIRE(sim.stream_destroy(*seen).has_value());
  REQUIRE(sim.stream_destroy(*unseen).has_value());
}
