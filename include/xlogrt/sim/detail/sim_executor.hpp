// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's executor: running a stream's head operation (the bytes it moves, the host
// function or kernel body it calls with the lock released, the faults it raises), waiting
// for points in streams (in manual mode by running only what the wait depends on),
// draining and resetting a device, and the worker threads of threaded mode.
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- the executor ----------------------------------------------------------------------------

// A stream whose head waits for a point its source stream will never reach (the source
// faulted) faults too, with the same status: a faulted context stops everything.
inline bool SimDriver::propagate_faults_locked() {
  const bool any = sched_.propagate_faults();
  if (any) done_cv_.notify_all();
  return any;
}

// The next stream to advance, after propagating faults (`changed`: some stream faulted).
inline SimDriver::Stream* SimDriver::pick_locked(const Needed* needed, bool& changed) {
  changed = propagate_faults_locked();
  return sched_.choose(needed);
}

inline void SimDriver::run_head_locked(Stream& s, Lock& lk) {
  Op op = std::move(s.queue.front());
  s.queue.pop_front();
  s.busy = true;
  ++busy_;
  const int fault = execute_locked(s, op, lk);
  s.busy = false;
  --busy_;
  if (fault != 0) {
    s.fault = fault;
  } else {
    s.completed = op.seq;
  }
  if (s.queue.empty()) sched_.retire(s);
  ++executed_;
  done_cv_.notify_all();
  if (cfg_.executor == SimExecutor::threaded) work_cv_.notify_all();
}

// Runs one operation; returns 0 or the status that faults the stream. Host functions
// and kernel bodies run with the lock released.
inline int SimDriver::execute_locked(Stream& s, Op& op, Lock& lk) {
  const int dev = s.device->ordinal;  // virtual memory must grant this device access
  switch (op.kind) {
    case OpKind::mem_alloc_async: {
      if (std::byte* p = translate_locked(op.dst, op.bytes); p != nullptr && cfg_.fill_memory)
        std::memset(p, cfg_.uninit_byte, op.bytes);
      return 0;
    }
    case OpKind::mem_free_async: {
      if (std::byte* p = translate_locked(op.dst, op.bytes); p != nullptr && cfg_.fill_memory)
        std::memset(p, cfg_.poison_byte, op.bytes);
      if (Device* dev = device_of(op.dst)) {
        dev->mem.free_ran(op.free_id);
        dev->mem.trim_quarantine(cfg_.quarantine_bytes, cfg_.quarantine_blocks);
      }
      return 0;
    }
    case OpKind::memset: {
      std::byte* p = translate_locked(op.dst, op.bytes, dev);
      if (p == nullptr) return status::illegal_address;
      std::memset(p, static_cast<int>(op.value), op.bytes);
      return 0;
    }
    case OpKind::memcpy_htod: {
      std::byte* p = translate_locked(op.dst, op.bytes, dev);
      if (p == nullptr) return status::illegal_address;
      std::memcpy(p, op.chost, op.bytes);
      return 0;
    }
    case OpKind::memcpy_dtoh: {
      std::byte* p = translate_locked(op.src, op.bytes, dev);
      if (p == nullptr) return status::illegal_address;
      std::memcpy(op.host, p, op.bytes);
      return 0;
    }
    case OpKind::memcpy_dtod: {
      std::byte* d = translate_locked(op.dst, op.bytes, dev);
      std::byte* p = translate_locked(op.src, op.bytes, dev);
      if (d == nullptr || p == nullptr) return status::illegal_address;
      std::memmove(d, p, op.bytes);
      return 0;
    }
    case OpKind::write_value32: {
      publish_locked(*op.release);
      std::byte* p = translate_locked(op.dst, 4, dev);
      if (p == nullptr) return status::illegal_address;
      std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(p))
          .store(op.value, std::memory_order_release);
      return 0;
    }
    case OpKind::kernel: {
      const detail::sim::Kernel& k = *op.kernel;
      std::vector<std::byte*> ptrs(k.ptrs.size(), nullptr);
      for (std::size_t i = 0; i < ptrs.size(); ++i) {
        if (k.bytes[i] == 0) continue;
        ptrs[i] = translate_locked(k.ptrs[i], k.bytes[i], dev);
        if (ptrs[i] == nullptr) return status::illegal_address;
      }
      if (!k.body) return 0;
      bool threw = false;
      lk.unlock();
      try {
        k.body(std::span<std::byte* const>(ptrs));
      } catch (...) {
        threw = true;
      }
      lk.lock();
      return threw ? status::launch_failed : 0;
    }
    case OpKind::host_func: {
      publish_locked(*op.release);
      lk.unlock();
      op.fn(op.host);
      lk.lock();
      return 0;
    }
    default: return 0;
  }
}

// Waits until every target point is reached. In manual mode it runs the operations the
// targets depend on (and only those), picked by the scheduler.
inline result<void> SimDriver::wait_locked(Call c, std::span<const Target> targets, Lock& lk) {
  Needed needed;
  const bool manual = cfg_.executor == SimExecutor::manual;
  if (manual) {
    std::vector<Target> work(targets.begin(), targets.end());
    while (!work.empty()) {
      const Target t = work.back();
      work.pop_back();
      auto [it, inserted] = needed.try_emplace(t.stream, 0);
      const std::uint64_t old = it->second;
      if (t.seq <= old) continue;
      it->second = t.seq;
      for (const Op& op : t.stream->queue) {
        if (op.seq > t.seq) break;
        if (op.seq <= old) continue;
        if (op.kind == OpKind::stream_wait_event && op.wait_stream->completed < op.wait_seq) {
          work.push_back(Target{op.wait_stream, op.wait_seq});
        }
      }
    }
  }
  for (;;) {
    bool done = true;
    for (const Target& t : targets) {
      if (t.stream->completed >= t.seq) continue;
      if (t.stream->fault != 0) return fault_error(c, *t.stream);
      done = false;
    }
    if (done) return ok();
    if (manual) {
      bool changed = false;
      if (Stream* s = pick_locked(&needed, changed)) {
        run_head_locked(*s, lk);
        continue;
      }
      if (changed) continue;
      if (busy_ == 0) {
        return fail(c, status::unknown,
                    "waiting in manual mode: no operation the wait depends on can run "
                    "(a simulator bug: please report it)");
      }
    }
    done_cv_.wait(lk);
  }
}

// Waits for every stream of `dev` that has not faulted, and orders the host after them.
inline result<void> SimDriver::sync_device_locked(Call c, Device& dev, Lock& lk) {
  std::vector<Target> targets;
  VectorClock seen;
  for (const auto& sp : streams_) {
    if (!sp || sp->device != &dev || sp->fault != 0) continue;
    seen.join(sp->vc);
    if (sp->completed < sp->enqueued) targets.push_back(Target{sp.get(), sp->enqueued});
  }
  auto r = wait_locked(c, targets, lk);
  if (!r) return r;
  publish_locked(seen);
  return ok();
}

// The primary context's last release: drain the device, free all its memory, and
// invalidate its streams and events.
inline void SimDriver::reset_device_locked(Device& dev, Lock& lk) {
  (void)sync_device_locked(Call::primary_ctx_release, dev, lk);
  if (dev.ctx.retains != 0) return;  // retained again while draining
  const OpRef ref = host_op_locked(OpKind::context_reset);
  for (const auto& [addr, b] : dev.mem.blocks) {
    if (std::byte* p = translate_locked(addr, b.rounded); p != nullptr && cfg_.fill_memory)
      std::memset(p, cfg_.poison_byte, b.rounded);
    if (cfg_.check_hazards) checker_.free(addr, b.requested, ref, host_vc_);
  }
  record_locked();
  dev.mem.reset();
  ++dev.ctx.generation;
  Stream& legacy = *dev.legacy;
  legacy.generation = dev.ctx.generation;
  legacy.queue.clear();
  legacy.fault = 0;
  legacy.completed = legacy.enqueued;
  if (legacy.active && !legacy.busy) sched_.retire(legacy);
}

inline bool SimDriver::idle_locked() const noexcept {
  return busy_ == 0 && sched_.drained();
}

inline void SimDriver::worker() noexcept {
  Lock lk(mu_);
  while (!stop_) {
    bool changed = false;
    Stream* s = pick_locked(nullptr, changed);
    if (s != nullptr) {
      run_head_locked(*s, lk);
    } else if (!changed) {
      if (busy_ == 0 && idle_locked()) done_cv_.notify_all();
      work_cv_.wait(lk);
    }
  }
}

}  // namespace xlogrt
