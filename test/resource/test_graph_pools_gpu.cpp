// SPDX-License-Identifier: Apache-2.0
// CUDA graph capture through the default stack on the real driver: the program of
// test_graph_pools.cpp (graph_capture.hpp) with CudaDriver's cuStreamBeginCapture, graph
// instantiation and launches. Run it under compute-sanitizer memcheck and racecheck on a
// GPU machine. Exits 77 (Meson's SKIP) without a CUDA driver or device.

#define CATCH_CONFIG_RUNNER
#include "../gpu_main.hpp"
#include "graph_capture.hpp"

using namespace xlogrt;
using namespace xlogrt::testing::graphs;

namespace {
CudaDriver* gpu = nullptr;
using Default = DefaultStackOn<CudaDriver>;
}  // namespace

TEST_CASE("a capture through the default stack: replays leave eager tensors alone, the pool comes back",
          "[gpu][graph_pools]") {
  share_one_pool(*gpu, 20);
}

TEST_CASE("an eager free during a capture stays out of the graph", "[gpu][graph_pools]") {
  auto streams = pool_of(*gpu);
  Default stack = default_stack(streams);
  auto& layer = *find_layer<GraphPools>(stack);
  const StreamId cs{1};
  auto h = stack.stream_handle(cs);
  REQUIRE(h.has_value());
  const std::size_t before = stack.bytes_outstanding();
  auto eager = stack.allocate(8 << 20, cs, AllocTag{});
  REQUIRE(eager.has_value());
  const GraphPoolId pool = layer.new_pool();
  REQUIRE(layer.begin_allocate_to_pool(pool).has_value());
  REQUIRE(gpu->stream_begin_capture(*h, CaptureMode::global).has_value());
  REQUIRE(stack.deallocate(std::move(*eager)).has_value());
  REQUIRE(stack.reap_pending().has_value());
  auto graph = gpu->stream_end_capture(*h);
  REQUIRE(graph.has_value());
  REQUIRE(layer.end_allocate_to_pool(pool).has_value());
  REQUIRE(stack.reap_pending().has_value());
  CHECK(stack.bytes_outstanding() == before);
  REQUIRE(gpu->graph_destroy(*graph).has_value());
  REQUIRE(layer.release_pool(pool).has_value());
}

TEST_CASE("on the GPU too, the check catches a cache handing a graph's block to eager code", "[gpu][graph_pools]") {
  CHECK(eager_bytes_changed_without_graph_pools(*gpu) > 0);
}

int main(int argc, char** argv) { return xlogrt::testing::run_gpu_tests(argc, argv, gpu); }
