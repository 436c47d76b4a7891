// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: the scheduler, which chooses the stream whose head operation
// runs next.
//
// It keeps the active list: the streams with queued operations, in the order they
// became active. A stream is ready when its head is not running, it has not faulted,
// and, if its head waits on an event, the recorded point has run. Among ready streams
// (restricted to those a synchronising call needs, and only up to the point it needs)
// it prefers those whose head is a free, so frees run as early as ordering allows (the
// least forgiving legal order: freed memory becomes reusable soonest), and otherwise
// picks one at random from a generator seeded by SimConfig::seed. With one thread
// stepping (manual mode) the order of execution is a function of the seed.
//
// Faults propagate here too: a stream whose head waits on a point that its source
// stream, having faulted, will never reach, faults with the same status.
//
// What the scheduler does not do: run operations, or wait. The executor (running a
// head, which may release the lock; waiting for targets; the worker threads) stays in
// SimDriver, since it needs the driver's lock, condition variables, memory and host
// clock; the scheduler only reads and marks streams.
//
// Invariants: a stream is in the active list if and only if its `active` flag is set;
// a stream with queued operations is active (a running stream stays active until its
// head has run, even if its queue is empty meanwhile).
//
// Not thread-safe: guarded by its SimDriver's mutex (every caller is a *_locked function
// of the driver or holds the lock).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "xlogrt/sim/detail/objects.hpp"

namespace xlogrt::detail::sim {

class Scheduler {
 public:
  /// For a synchronising call: each stream it needs, and up to which operation.
  using Needed = std::unordered_map<Stream*, std::uint64_t>;

  explicit Scheduler(std::uint64_t seed) : rng_(seed) {}

  /// Lists `s`, which has just had an operation queued, if it is not listed yet.
  void activate(Stream& s) {
    if (!s.active) {
      s.active = true;
      active_.push_back(&s);
    }
  }

  /// Unlists `s`. @pre s is listed.
  void retire(Stream& s) {
    s.active = false;
    active_.erase(std::find(active_.begin(), active_.end(), &s));
  }

  /// Faults every stream that waits on a point a faulted stream will never reach;
  /// whether any was.
  bool propagate_faults() {
    bool any = false;
    for (bool changed = true; changed;) {
      changed = false;
      for (Stream* s : active_) {
        if (s->fault != 0 || s->busy || s->queue.empty()) continue;
        const Op& h = s->queue.front();
        if (h.kind == OpKind::stream_wait_event && h.wait_stream->fault != 0 &&
            h.wait_stream->completed < h.wait_seq) {
          s->fault = h.wait_stream->fault;
          changed = any = true;
        }
      }
    }
    return any;
  }

  /// The ready stream to advance (restricted to `needed` when given), or null. Faults
  /// are not propagated here: the driver does that first.
  Stream* choose(const Needed* needed) {
    candidates_.clear();
    bool frees = false;
    for (Stream* s : active_) {
      if (s->busy || s->fault != 0 || s->queue.empty()) continue;
      const Op& h = s->queue.front();
      if (needed != nullptr) {
        auto it = needed->find(s);
        if (it == needed->end() || h.seq > it->second) continue;
      }
      if (h.kind == OpKind::stream_wait_event && h.wait_stream->completed < h.wait_seq) continue;
      const bool is_free = h.kind == OpKind::mem_free_async;
      if (is_free && !frees) {
        candidates_.clear();
        frees = true;
      }
      if (is_free == frees) candidates_.push_back(s);
    }
    if (candidates_.empty()) return nullptr;
    if (candidates_.size() == 1) return candidates_.front();
    return candidates_[static_cast<std::size_t>(rng_() % candidates_.size())];
  }

  /// Whether no listed stream that has not faulted has queued operations.
  bool drained() const noexcept {
    for (const Stream* s : active_) {
      if (s->fault == 0 && !s->queue.empty()) return false;
    }
    return true;
  }

  /// Operations queued on listed streams (faulted streams' included).
  std::size_t queued() const noexcept {
    std::size_t n = 0;
    for (const Stream* s : active_) n += s->queue.size();
    return n;
  }

 private:
  std::vector<Stream*> active_;  // streams with queued operations, in activation order
  std::vector<Stream*> candidates_;
  std::mt19937_64 rng_;
};

}  // namespace xlogrt::detail::sim
