// SPDX-License-Identifier: Apache-2.0
// docs/architecture.md, "The reactor": learning on the host that a stream reached a
// point, as a callback and as a future, on SimDriver.
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/reactor/reactor.hpp>
#include <xlogrt/runtime.hpp>

#include <atomic>
#include <cstdio>
#include <thread>

using namespace xlogrt;

int main() {
  SimDriver sim(SimConfig{.devices = 1});
  auto streams = StreamPool<SimDriver>::open(sim, 0, 2);
  if (!streams) return std::puts(streams.error().what().c_str()), 1;
  // [reactor]
  auto reactor = Reactor<SimDriver>::create(*streams);  // one scanner thread
  if (!reactor) return std::puts(reactor.error().what().c_str()), 1;
  std::atomic<int> called{0};  // 1: reached, -1: an error (stream_fault, cancelled)
  // Work already enqueued on stream 1 ends before the point; the callback runs on the
  // scanner thread once the stream's flag write lands.
  auto armed = (*reactor)->on_done(StreamId{1}, [&](result<void> r) { called = r ? 1 : -1; });
  auto future = (*reactor)->when_done_future(StreamId{1});  // the same, as a std::future
  if (!armed || !future) return 1;
  future->get();  // returns once stream 1 reached the point (throws FutureError on a fault)
  // [/reactor]
  while (called.load() == 0) std::this_thread::yield();  // the callback's turn on the scanner
  std::printf("stream 1 reached the point; the callback saw %s\n", called == 1 ? "success" : "an error");
  return called == 1 ? 0 : 1;
}
