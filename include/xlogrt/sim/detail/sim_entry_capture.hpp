// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's stream capture: the bookkeeping (recording nodes, invalidating a capture,
// refusing potentially unsafe calls, ending a capture, releasing and replaying graphs)
// and its entry points: capture info and mode, ctx_synchronize, and the CapturingDriver
// concept (begin and end capture, instantiate, launch and destroy graphs).
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- stream capture: bookkeeping ----------------------------------------------------------

// Records a validated operation on a capturing stream as a node of its capture.
inline result<void> SimDriver::capture_op_locked(Call c, Stream& st, Op op, Access a,
                                                 std::span<const SimAccess> checks,
                                                 std::uint32_t label) {
  if (st.capture->invalidated != 0) return invalidated_error(c, st);
  detail::sim::Node n;
  n.kind = op.kind;
  n.access = a;
  n.label = label;
  n.value = op.value;
  n.dst = op.dst;
  n.src = op.src;
  n.bytes = op.bytes;
  n.host = op.host;
  n.chost = op.chost;
  n.fn = op.fn;
  n.kernel = std::move(op.kernel);
  n.checks.assign(checks.begin(), checks.end());
  record_node_locked(st, std::move(n));
  return ok();
}

// Appends `n` to the capture of `st`, one more node of `st` on its capture clock.
inline void SimDriver::record_node_locked(Stream& st, detail::sim::Node n) {
  st.capture->data->nodes.push_back(std::move(n));
  st.capture_vc.set(st.id, st.capture_vc.get(st.id) + 1);
}

inline error SimDriver::invalidated_error(Call c, const Stream& st) const {
  return fail(c, status::stream_capture_invalidated,
              "using stream " + std::to_string(st.id) + ", whose capture " +
                  std::to_string(st.capture->id) + " was invalidated by an earlier " +
                  status_name(st.capture->invalidated) +
                  "; end it with stream_end_capture and capture again");
}

inline void SimDriver::invalidate_locked(Capture& cap, int s) {
  if (cap.invalidated != 0) return;  // the first reason stands
  cap.invalidated = s;
  ++capture_stats_.captures_invalidated;
}

// A potentially unsafe call (cuThreadExchangeStreamCaptureMode's term): refused, with
// every capture that forbids it invalidated, when the calling thread's mode is global
// and a global-mode capture is underway on any thread, or its mode is not relaxed and a
// capture not begun in relaxed mode is underway on this thread.
inline std::optional<error> SimDriver::unsafe_call_locked(Call c, std::string_view what) {
  if (captures_.empty()) [[likely]] return std::nullopt;
  const CaptureMode mine = detail::sim::thread_capture_mode(serial_);
  if (mine == CaptureMode::relaxed) return std::nullopt;
  const std::thread::id me = std::this_thread::get_id();
  std::string which;
  for (const auto& cp : captures_) {
    Capture& cap = *cp;
    const bool own = cap.thread == me && cap.mode != CaptureMode::relaxed;
    const bool global = mine == CaptureMode::global && cap.mode == CaptureMode::global;
    if (!own && !global) continue;
    invalidate_locked(cap, status::stream_capture_unsupported);
    if (!which.empty()) which += ", ";
    which += std::to_string(cap.id) + (own ? " (this thread's)" : " (another thread's, global)");
  }
  if (which.empty()) return std::nullopt;
  return fail(c, status::stream_capture_unsupported,
              std::string(what) + " during capture " + which + ", which the calling thread's " +
                  std::string(detail::sim::to_string(mine)) +
                  " capture mode forbids (the capture is invalidated); make the call before or "
                  "after the capture, or between exchange_capture_mode(CaptureMode::relaxed) and "
                  "the restoring exchange");
}

inline SimDriver::Capture* SimDriver::find_capture_locked(std::uint64_t id) const noexcept {
  for (const auto& cp : captures_) {
    if (cp->id == id) return cp.get();
  }
  return nullptr;
}

// Every member leaves the capture, which is forgotten (its events keep its id, so they
// stay unusable to the host until recorded again).
inline void SimDriver::end_capture_locked(Capture& cap) {
  for (Stream* m : cap.members) {
    m->capture = nullptr;
    m->capture_vc = VectorClock{};
  }
  for (auto it = captures_.begin(); it != captures_.end(); ++it) {
    if (it->get() == &cap) {
      captures_.erase(it);
      return;
    }
  }
}

// One holder of `g` is gone; with the last, its reservations go back. A graph
// allocation that is live from the last launch keeps its range as an ordinary block.
inline void SimDriver::release_graph_locked(detail::sim::GraphData& g) {
  if (g.holders > 0 && --g.holders > 0) return;
  for (detail::sim::GraphAlloc& a : g.allocs) {
    if (a.rounded == 0) continue;
    Device& dev = *a.device;
    if (dev.ctx.generation == a.generation) {  // else the reset freed everything already
      auto it = dev.mem.blocks.find(a.addr);
      if (it != dev.mem.blocks.end() && it->second.graph) {
        dev.mem.adopt_reserved(it);
      } else {
        dev.mem.release_reserved(a.addr - dev.mem.base, a.rounded);
      }
    }
    a.rounded = 0;
  }
}

// Enqueues the graph's nodes on `st`, in the order recorded, each checked there.
inline void SimDriver::replay_locked(Stream& st, const detail::sim::GraphData& g) {
  for (const detail::sim::Node& n : g.nodes) {
    if (n.kind == OpKind::mem_alloc_async) {
      const detail::sim::GraphAlloc& a = g.allocs[static_cast<std::size_t>(n.alloc)];
      const OpRef ref = begin_op_locked(st, OpKind::mem_alloc_async, Access::Write);
      if (cfg_.check_hazards) checker_.allocate(a.addr, a.requested, ref);
      if (!a.freed_in_graph) {
        a.device->mem.blocks.emplace(a.addr, detail::sim::Block{a.requested, a.rounded, true, true});
      }
      Op op;
      op.kind = OpKind::mem_alloc_async;
      op.seq = ref.seq;
      op.dst = a.addr;
      op.bytes = a.rounded;
      push_locked(st, std::move(op));
    } else if (n.kind == OpKind::mem_free_async && n.alloc >= 0) {
      const detail::sim::GraphAlloc& a = g.allocs[static_cast<std::size_t>(n.alloc)];
      const OpRef ref = begin_op_locked(st, OpKind::mem_free_async, Access::Write);
      if (cfg_.check_hazards) {
        checker_.free(a.addr, a.requested, ref, st.vc);
        record_locked();
      }
      Op op;
      op.kind = OpKind::mem_free_async;
      op.seq = ref.seq;
      op.dst = a.addr;
      op.bytes = a.rounded;
      push_locked(st, std::move(op));
    } else if (n.kind == OpKind::mem_free_async) {  // memory from outside, live (checked)
      Device& dev = *device_of(n.dst);
      free_async_locked(st, dev, dev.mem.blocks.find(n.dst));
      ++capture_stats_.replayed_frees_of_outside_memory;
    } else {
      Op op;
      op.kind = n.kind;
      op.dst = n.dst;
      op.src = n.src;
      op.bytes = n.bytes;
      op.value = n.value;
      op.host = n.host;
      op.chost = n.chost;
      op.fn = n.fn;
      if (n.kernel) op.kernel = std::make_unique<detail::sim::Kernel>(*n.kernel);
      enqueue_on_locked(st, std::move(op), n.access, n.checks, n.label);
    }
  }
}

// --- Driver concept: stream capture ----------------------------------------------------------

inline result<CaptureInfo> SimDriver::stream_capture_info(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_capture_info)) return *e;
  auto sr = stream_locked(Call::stream_capture_info, s);
  if (!sr) return std::move(sr).error();
  const Capture* cap = (*sr)->capture;
  if (cap == nullptr) return CaptureInfo{};
  return CaptureInfo{cap->invalidated != 0 ? CaptureStatus::invalidated : CaptureStatus::active,
                     cap->id};
}

inline result<CaptureMode> SimDriver::exchange_capture_mode(CaptureMode mode) noexcept {
  constexpr Call c = Call::exchange_capture_mode;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (mode != CaptureMode::global && mode != CaptureMode::per_thread &&
      mode != CaptureMode::relaxed) {
    return fail(c, status::invalid_value,
                "setting capture mode " + std::to_string(static_cast<int>(mode)) +
                    ": pass a named CaptureMode");
  }
  try {
    return detail::sim::exchange_thread_capture_mode(serial_, mode);
  } catch (...) {
    return fail(c, status::out_of_memory, "no host memory to keep the thread's capture mode");
  }
}

inline result<void> SimDriver::ctx_synchronize() noexcept {
  constexpr Call c = Call::ctx_synchronize;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "synchronising the context")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  return sync_device_locked(c, **d, lk);
}

// --- CapturingDriver concept ---------------------------------------------------------------------

inline result<void> SimDriver::stream_begin_capture(stream_t s, CaptureMode mode) noexcept {
  constexpr Call c = Call::stream_begin_capture;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.legacy) {
    return fail(c, status::stream_capture_unsupported,
                "beginning a capture on the legacy default stream; capture on a stream from "
                "stream_create");
  }
  if (mode != CaptureMode::global && mode != CaptureMode::per_thread &&
      mode != CaptureMode::relaxed) {
    return fail(c, status::invalid_value,
                "beginning a capture in mode " + std::to_string(static_cast<int>(mode)) +
                    ": pass a named CaptureMode");
  }
  if (st.capture != nullptr) {
    return fail(c, status::illegal_state,
                "beginning a capture on stream " + std::to_string(st.id) +
                    ", which is already capturing (capture " + std::to_string(st.capture->id) +
                    "); end that capture first");
  }
  if (st.fault != 0) return fault_error(c, st);
  auto cap = std::make_unique<Capture>();
  cap->id = detail::sim::next_capture_id();
  cap->mode = mode;
  cap->thread = std::this_thread::get_id();
  cap->origin = &st;
  cap->members.push_back(&st);
  st.capture = cap.get();
  st.capture_vc = VectorClock{};
  captures_.push_back(std::move(cap));
  ++capture_stats_.captures_begun;
  return ok();
}

inline result<SimDriver::graph_t> SimDriver::stream_end_capture(stream_t s) noexcept {
  constexpr Call c = Call::stream_end_capture;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture == nullptr) {
    return fail(c, status::illegal_state,
                "ending a capture on stream " + std::to_string(st.id) + ", which is not capturing");
  }
  Capture& cap = *st.capture;
  if (&st != cap.origin) {
    invalidate_locked(cap, status::stream_capture_unmatched);
    return fail(c, status::stream_capture_unmatched,
                "ending capture " + std::to_string(cap.id) + " on stream " + std::to_string(st.id) +
                    ", which joined it (it began on stream " + std::to_string(cap.origin->id) +
                    ", where it must end; it is now invalidated)");
  }
  if (cap.mode != CaptureMode::relaxed && cap.thread != std::this_thread::get_id()) {
    return fail(c, status::stream_capture_wrong_thread,
                "ending capture " + std::to_string(cap.id) + " on another thread than the one that "
                    "began it in " + std::string(detail::sim::to_string(cap.mode)) +
                    " mode; end it there, or begin it in relaxed mode");
  }
  int failed = cap.invalidated != 0 ? status::stream_capture_invalidated : 0;
  std::string why = failed != 0 ? "capture " + std::to_string(cap.id) + " was invalidated by " +
                                      status_name(cap.invalidated)
                                : std::string();
  if (failed == 0) {
    for (const Stream* m : cap.members) {
      if (cap.origin->capture_vc.get(m->id) >= m->capture_vc.get(m->id)) continue;
      failed = status::stream_capture_unjoined;
      why = "stream " + std::to_string(m->id) + " joined capture " + std::to_string(cap.id) +
            " and recorded work the origin stream " + std::to_string(cap.origin->id) +
            " never waited for; record an event on it after its work and make the origin wait "
            "on that event before the end";
      break;
    }
  }
  std::shared_ptr<detail::sim::GraphData> data = cap.data;
  end_capture_locked(cap);
  if (failed != 0) {
    release_graph_locked(*data);  // no holder: its reservations go back now
    ++capture_stats_.captures_failed;
    return fail(c, failed, why);
  }
  auto g = std::make_unique<detail::sim::Graph>();
  g->owner = this;
  g->data = std::move(data);
  g->data->holders = 1;
  graphs_.push_back(std::move(g));
  ++capture_stats_.captures_ended;
  return graphs_.back().get();
}

inline result<SimDriver::graph_exec_t> SimDriver::graph_instantiate(graph_t g) noexcept {
  constexpr Call c = Call::graph_instantiate;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (g == nullptr || g->owner != this || !g->alive) {
    return fail(c, status::invalid_value,
                "instantiating a graph that is not a live graph of this simulator");
  }
  auto x = std::make_unique<detail::sim::GraphExec>();
  x->owner = this;
  x->data = g->data;
  ++x->data->holders;
  graph_execs_.push_back(std::move(x));
  return graph_execs_.back().get();
}

inline result<void> SimDriver::graph_launch(graph_exec_t x, stream_t s) noexcept {
  constexpr Call c = Call::graph_launch;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (x == nullptr || x->owner != this || !x->alive) {
    return fail(c, status::invalid_value,
                "launching an executable graph that is not a live one of this simulator");
  }
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  if (st.capture != nullptr) {
    return fail(c, status::not_supported,
                "launching a graph into capturing stream " + std::to_string(st.id) +
                    ": child graphs are not modelled by the simulator");
  }
  const detail::sim::GraphData& g = *x->data;
  for (const detail::sim::GraphAlloc& a : g.allocs) {
    if (a.device->ctx.generation != a.generation) {
      return fail(c, status::invalid_context,
                  "launching a graph whose allocation at " + detail::sim::hex(a.addr) +
                      " belonged to device " + std::to_string(a.device->ordinal) +
                      "'s primary context, released since");
    }
    if (!a.freed_in_graph && a.device->mem.blocks.count(a.addr) != 0) {
      return fail(c, status::invalid_value,
                  "launching a graph whose allocation at " + detail::sim::hex(a.addr) +
                      ", made by its previous launch, is still live; free it with "
                      "mem_free_async before launching again");
    }
  }
  for (const detail::sim::Node& n : g.nodes) {
    if (n.kind != OpKind::mem_free_async || n.alloc >= 0) continue;
    const Device* dev = device_of(n.dst);
    bool live = false;
    if (dev != nullptr) {
      auto it = dev->mem.blocks.find(n.dst);
      live = it != dev->mem.blocks.end() && it->second.pooled;
    }
    if (!live) {
      return fail(c, status::invalid_value,
                  "launching a graph that frees " + detail::sim::hex(n.dst) +
                      ", memory allocated outside the graph that is no longer live: a captured "
                      "free of outside memory frees it at every launch, and an earlier launch "
                      "(or another free) has freed it");
    }
  }
  replay_locked(st, g);
  ++capture_stats_.graph_launches;
  return ok();
}

inline result<void> SimDriver::graph_destroy(graph_t g) noexcept {
  constexpr Call c = Call::graph_destroy;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (g == nullptr || g->owner != this || !g->alive) {
    return fail(c, status::invalid_value,
                "destroying a graph that is not a live graph of this simulator (destroyed "
                "already?)");
  }
  g->alive = false;
  release_graph_locked(*g->data);
  return ok();
}

inline result<void> SimDriver::graph_exec_destroy(graph_exec_t x) noexcept {
  constexpr Call c = Call::graph_exec_destroy;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (x == nullptr || x->owner != this || !x->alive) {
    return fail(c, status::invalid_value,
                "destroying an executable graph that is not a live one of this simulator "
                "(destroyed already?)");
  }
  x->alive = false;
  release_graph_locked(*x->data);
  return ok();
}

}  // namespace xlogrt
