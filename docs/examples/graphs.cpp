// SPDX-License-Identifier: Apache-2.0
// docs/architecture.md, "CUDA graphs": a capture through the default stack, replayed while
// eager code allocates, then released. The same program runs on the GPU (CudaDriver) and,
// as here in the host suite, on SimDriver's model of stream capture.
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include <cstdio>
#include <vector>

using namespace xlogrt;

int main() {
  auto rt = DeviceRuntime<DefaultStackOn<SimDriver>>::try_get(0);
  if (!rt) return std::puts(rt.error().what().c_str()), 1;
  auto& drv = (*rt)->driver();
  // [graphs]
  auto& graphs = *find_layer<GraphPools>((*rt)->stack());
  const StreamId s{1};
  auto stream = (*rt)->stream(s);
  if (!stream) return std::puts(stream.error().what().c_str()), 1;
  const GraphPoolId pool = graphs.new_pool();  // several graphs may share one
  if (auto r = graphs.begin_allocate_to_pool(pool); !r) return std::puts(r.error().what().c_str()), 1;
  if (!drv.stream_begin_capture(*stream, CaptureMode::global)) return 1;
  auto out = (*rt)->allocate(4096, s);   // from the graph pool: the graph's output
  auto temp = (*rt)->allocate(4096, s);  // a temporary of the graph
  if (!out || !temp) return 1;
  (void)drv.memset_d8_async(temp->ptr(), 7, 4096, *stream);                      // captured
  (void)drv.memcpy_dtod_async(out->ptr(), temp->ptr(), 4096, *stream);           // captured
  if (!(*rt)->deallocate(std::move(*temp))) return 1;  // back to the pool, not to the cache
  auto graph = drv.stream_end_capture(*stream);
  if (!graph) return std::puts(graph.error().what().c_str()), 1;
  if (auto r = graphs.end_allocate_to_pool(pool); !r) return std::puts(r.error().what().c_str()), 1;
  auto exec = drv.graph_instantiate(*graph);
  if (!exec) return 1;

  auto eager = (*rt)->allocate(4096, s);  // never the temporary's memory, which replays write
  if (!eager) return 1;
  (void)drv.memset_d8_async(eager->ptr(), 1, 4096, *stream);
  for (int i = 0; i < 3; ++i) (void)drv.graph_launch(*exec, *stream);
  std::vector<unsigned char> host(4096);
  (void)drv.memcpy_dtoh_async(host.data(), eager->ptr(), host.size(), *stream);
  (void)drv.stream_synchronize(*stream);
  std::printf("eager tensor after 3 replays: %d; graph pool holds %zu bytes\n", host[0],
              graphs.graph_stats().held_bytes);

  (void)drv.graph_exec_destroy(*exec);
  (void)drv.graph_destroy(*graph);
  if (auto r = graphs.release_pool(pool); !r) return 1;  // one per begin: the graph is gone
  if (!(*rt)->deallocate(std::move(*out))) return 1;       // the pool's memory goes back now
  // [/graphs]
  (void)(*rt)->deallocate(std::move(*eager));
  std::printf("after release: %zu bytes\n", graphs.graph_stats().held_bytes);
  return host[0] == 1 && graphs.graph_stats().held_bytes == 0 ? 0 : 1;
}
