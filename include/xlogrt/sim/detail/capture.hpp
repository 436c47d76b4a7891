// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: stream capture. The objects behind a capture sequence and behind
// the graph handles, and what a captured operation keeps so that it can run again.
//
// A capture (Capture) begins on its origin stream; a stream that waits on an event
// recorded inside it joins it. While a stream belongs to a capture, the operations
// enqueued on it are recorded as nodes (Node) in the capture's GraphData instead of
// being queued; stream_end_capture hands the GraphData to a Graph, graph_instantiate to
// a GraphExec, and graph_launch replays its nodes on a stream as if they had been
// enqueued there at that moment, so the hazard checker sees every replayed access.
//
// Fork and join are tracked with capture clocks: each member stream counts the nodes it
// recorded (component `id` of its capture clock); an event recorded inside the capture
// copies the recording stream's capture clock, and a member waiting on it joins that
// clock into its own. A forked stream is joined when the origin's clock covers its last
// node. Graph replay runs the nodes one after another in the order they were recorded,
// which is a legal order of the graph (a node is recorded after everything it depends
// on), though a real launch may run independent branches concurrently.
//
// Graph memory. mem_alloc_async on a capturing stream makes an allocation node whose
// address is fixed when it is captured, as CUDA fixes a graph allocation's virtual
// address: the range is reserved for as long as the graph or an executable graph made
// from it lives (GraphData::holders), and every launch makes it live (and its free node,
// if any, dead again) for the checker.
//
// Not thread-safe, every type here: guarded by the SimDriver's mutex.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "xlogrt/driver/concept.hpp"
#include "xlogrt/sim/detail/clock.hpp"
#include "xlogrt/sim/detail/objects.hpp"
#include "xlogrt/sim/report.hpp"

namespace xlogrt::detail::sim {

/// One recorded operation: what replaying it needs. Which fields matter depends on kind,
/// as for Op.
struct Node {
  OpKind kind = OpKind::none;
  Access access = Access::Read;
  std::uint32_t label = 0;
  std::uint32_t value = 0;
  std::uint64_t dst = 0;
  std::uint64_t src = 0;
  std::uint64_t bytes = 0;
  void* host = nullptr;
  const void* chost = nullptr;
  HostFn fn = nullptr;
  std::shared_ptr<const Kernel> kernel;
  std::vector<SimAccess> checks;  // what the checker checks when the node is replayed
  // mem_alloc_async and mem_free_async: the graph allocation (index in GraphData::allocs),
  // or -1 for a free of memory allocated outside the capture.
  int alloc = -1;
};

/// A graph allocation: a range reserved for the graph's life, at a fixed address.
struct GraphAlloc {
  Device* device = nullptr;
  std::uint64_t generation = 0;  // of the device's context when reserved
  std::uint64_t addr = 0;
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  bool freed_in_graph = false;  // a free node of this capture frees it
};

/// The nodes of a capture, in the order recorded, and its graph allocations. Shared by
/// the capture while it records, then by its Graph and every GraphExec made from it.
struct GraphData {
  std::vector<Node> nodes;
  std::vector<GraphAlloc> allocs;
  int holders = 0;  // live Graph and GraphExec handles; at 0 the reservations go back
};

/// A capture sequence, from stream_begin_capture until stream_end_capture.
struct Capture {
  std::uint64_t id = 0;  // process-unique, never 0
  CaptureMode mode = CaptureMode::global;
  std::thread::id thread;     // that began it
  Stream* origin = nullptr;   // where it began, and must end
  std::vector<Stream*> members;  // streams recording into it, the origin first
  int invalidated = 0;           // the status that invalidated it; 0 while valid
  std::shared_ptr<GraphData> data = std::make_shared<GraphData>();
};

/// A graph handle (CUgraph).
struct Graph {
  const void* owner = nullptr;
  bool alive = true;
  std::shared_ptr<GraphData> data;
};

/// An executable graph handle (CUgraphExec).
struct GraphExec {
  const void* owner = nullptr;
  bool alive = true;
  std::shared_ptr<GraphData> data;
};

/// "global", "per_thread", "relaxed".
constexpr std::string_view to_string(CaptureMode m) noexcept {
  switch (m) {
    case CaptureMode::global: return "global";
    case CaptureMode::per_thread: return "per_thread";
    case CaptureMode::relaxed: return "relaxed";
  }
  return "unknown";
}

/// Process-unique capture ids, as cuStreamGetCaptureInfo's (0 is never handed out).
inline std::uint64_t next_capture_id() noexcept {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace xlogrt::detail::sim
