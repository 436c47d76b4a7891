// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's enqueue path: an operation joins the host clock, takes its stream's next
// sequence number, has its accesses checked (at enqueue, so that in manual mode the
// reports do not depend on the scheduler) and is queued on its stream, or recorded as a
// node when the stream is capturing.
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- enqueue and the checker ---------------------------------------------------------------

inline void SimDriver::join_host_locked(Stream& s) {
  if (s.host_version != host_version_) {
    s.vc.join(host_vc_);
    s.host_version = host_version_;
  }
}

inline SimDriver::OpRef SimDriver::begin_op_locked(Stream& s, OpKind k, Access a,
                                                   std::uint32_t label) {
  join_host_locked(s);
  const std::uint64_t seq = ++s.enqueued;
  s.vc.set(s.id, seq);
  return OpRef{seq, s.id, label, k, a};
}

inline SimDriver::OpRef SimDriver::host_op_locked(OpKind k) {
  host_vc_.set(0, ++host_seq_);
  ++host_version_;
  return OpRef{host_seq_, 0, 0, k, Access::Write};
}

inline void SimDriver::publish_locked(const VectorClock& vc) {
  host_vc_.join(vc);
  ++host_version_;
}

inline void SimDriver::push_locked(Stream& s, Op op) {
  s.queue.push_back(std::move(op));
  sched_.activate(s);
  if (cfg_.executor == SimExecutor::threaded) work_cv_.notify_one();
}

inline void SimDriver::check_locked(const OpRef& op, const VectorClock& vc, std::uint64_t addr,
                                    std::uint64_t n) {
  if (!cfg_.check_hazards || n == 0) return;
  if (host_.contains(addr)) {
    if (translate_locked(addr, n) != nullptr) return;
    checker_.unallocated(op, addr, n);
  } else {
    checker_.check(op, vc, addr, n);
  }
  record_locked();
}

inline void SimDriver::record_locked() {
  checker_.record(streams_, [this](std::uint64_t addr) { return ordinal_of(addr); });
}

// Validates the stream, assigns the operation its place, checks `checks` (each with
// its own access mode) and queues it.
/// A memset or memcpy: as CUDA, one of 0 bytes only checks its stream and enqueues nothing.
inline result<void> SimDriver::enqueue_transfer_locked(Call c, stream_t s, Op op, Access a,
                                                       std::span<const SimAccess> checks) {
  if (op.bytes == 0) {
    auto sr = stream_locked(c, s);
    return sr ? ok() : result<void>(std::move(sr).error());
  }
  return enqueue_simple_locked(c, s, std::move(op), a, checks);
}

inline result<void> SimDriver::enqueue_simple_locked(Call c, stream_t s, Op op, Access a,
                                                     std::span<const SimAccess> checks) {
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  if (st.capture != nullptr) [[unlikely]] return capture_op_locked(c, st, std::move(op), a, checks);
  enqueue_on_locked(st, std::move(op), a, checks);
  return ok();
}

// Assigns a validated stream's operation its place, checks `checks` (each with its own
// access mode) and queues it.
inline void SimDriver::enqueue_on_locked(Stream& st, Op op, Access a,
                                         std::span<const SimAccess> checks, std::uint32_t label) {
  OpRef ref = begin_op_locked(st, op.kind, a, label);
  op.seq = ref.seq;
  for (const SimAccess& x : checks) {
    OpRef r = ref;
    r.access = x.access;
    check_locked(r, st.vc, x.ptr, x.bytes);
  }
  if (op.kind == OpKind::write_value32 || op.kind == OpKind::host_func) {
    op.release = std::make_unique<VectorClock>(st.vc);
  }
  push_locked(st, std::move(op));
}

}  // namespace xlogrt
