// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's Driver-concept entry points for streams and events: creating, destroying,
// querying and synchronising them, stream ids and contexts, event records and waits
// (which carry happens-before as vector clocks), and the capture rules those calls obey.
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- Driver concept: streams and events -----------------------------------------------------

inline result<SimDriver::stream_t> SimDriver::stream_create() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_create)) return *e;
  auto d = current_device_locked(Call::stream_create);
  if (!d) return std::move(d).error();
  if (cfg_.reuse_stream_handles) {
    for (auto it = streams_.rbegin(); it != streams_.rend(); ++it) {
      if (*it == nullptr) continue;  // the host's entry
      Stream& old = **it;
      if (old.alive || old.legacy || old.device != *d || old.busy || old.fault != 0 || !old.queue.empty() ||
          old.completed < old.enqueued) {
        continue;
      }
      old.alive = true;
      old.api_id = next_reused_id_++;
      old.generation = (*d)->ctx.generation;
      return &old;
    }
  }
  auto s = std::make_unique<Stream>();
  s->owner = this;
  s->device = *d;
  s->id = static_cast<std::uint32_t>(streams_.size());
  s->api_id = s->id;
  s->generation = (*d)->ctx.generation;
  Stream* raw = s.get();
  streams_.push_back(std::move(s));
  return raw;
}

inline result<void> SimDriver::stream_destroy(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_destroy)) return *e;
  if (s == nullptr) {
    return fail(Call::stream_destroy, status::invalid_handle,
                "destroying the legacy default stream");
  }
  auto sr = stream_locked(Call::stream_destroy, s);
  if (!sr) return std::move(sr).error();
  (*sr)->alive = false;  // queued work still runs, as in CUDA
  return ok();
}

inline result<void> SimDriver::stream_synchronize(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_synchronize)) return *e;
  auto sr = stream_locked(Call::stream_synchronize, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture != nullptr) [[unlikely]] {
    invalidate_locked(*st.capture, status::stream_capture_unsupported);
    return fail(Call::stream_synchronize, status::stream_capture_unsupported,
                "synchronising stream " + std::to_string(st.id) + ", which is capturing (capture " +
                    std::to_string(st.capture->id) + ", now invalidated); synchronise after stream_end_capture");
  }
  if (st.legacy && !captures_.empty()) [[unlikely]] {
    if (auto e = unsafe_call_locked(Call::stream_synchronize, "synchronising the legacy default stream"))
      return *e;
  }
  if (st.fault != 0) return fault_error(Call::stream_synchronize, st);
  const VectorClock seen = st.vc;
  const Target t{&st, st.enqueued};
  auto r = wait_locked(Call::stream_synchronize, std::span<const Target>(&t, 1), lk);
  if (!r) return r;
  publish_locked(seen);
  return ok();
}

inline result<bool> SimDriver::stream_query(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_query)) return *e;
  auto sr = stream_locked(Call::stream_query, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture != nullptr) [[unlikely]] {
    invalidate_locked(*st.capture, status::stream_capture_unsupported);
    return fail(Call::stream_query, status::stream_capture_unsupported,
                "querying stream " + std::to_string(st.id) + ", which is capturing (capture " +
                    std::to_string(st.capture->id) + ", now invalidated); query after stream_end_capture");
  }
  if (st.legacy && !captures_.empty()) [[unlikely]] {
    if (auto e = unsafe_call_locked(Call::stream_query, "querying the legacy default stream")) return *e;
  }
  if (st.fault != 0) return fault_error(Call::stream_query, st);
  if (st.completed < st.enqueued) return false;
  publish_locked(st.vc);
  return true;
}

inline result<std::uint64_t> SimDriver::stream_get_id(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_get_id)) return *e;
  auto sr = stream_locked(Call::stream_get_id, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture != nullptr) [[unlikely]] {  // as CUDA 13's driver does (seen on an H200)
    invalidate_locked(*st.capture, status::stream_capture_unsupported);
    return fail(Call::stream_get_id, status::stream_capture_unsupported,
                "reading the id of stream " + std::to_string(st.id) + ", which is capturing (capture " +
                    std::to_string(st.capture->id) + ", now invalidated); read it before the capture begins");
  }
  return st.api_id;
}

inline result<SimDriver::context_t> SimDriver::stream_context(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_get_id)) return *e;
  auto sr = stream_locked(Call::stream_get_id, s);
  if (!sr) return std::move(sr).error();
  return &(*sr)->device->ctx;
}

inline result<void> SimDriver::stream_wait_event(stream_t s, event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::stream_wait_event)) return *x;
  auto sr = stream_locked(Call::stream_wait_event, s);
  if (!sr) return std::move(sr).error();
  auto er = event_locked(Call::stream_wait_event, e);
  if (!er) return std::move(er).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(Call::stream_wait_event, st);
  const Event& ev = **er;
  if (ev.capture_id != 0 || st.capture != nullptr) [[unlikely]] {
    constexpr Call c = Call::stream_wait_event;
    Capture* from = ev.capture_id != 0 ? find_capture_locked(ev.capture_id) : nullptr;
    const std::string who = "stream " + std::to_string(st.id) + " waiting on an event ";
    if (st.capture != nullptr && st.capture->invalidated != 0) return invalidated_error(c, st);
    if (ev.capture_id == 0) {  // a capturing stream, an event recorded outside any capture
      if (ev.stream == nullptr) return ok();  // never recorded: nothing to wait for
      invalidate_locked(*st.capture, status::stream_capture_isolation);
      return fail(c, status::stream_capture_isolation,
                  who + "recorded outside its capture " + std::to_string(st.capture->id) +
                      " (now invalidated); record the event before the capture begins and wait "
                      "on it then, or record it inside the capture");
    }
    if (from == nullptr) {
      return fail(c, status::captured_event,
                  who + "last recorded in capture " + std::to_string(ev.capture_id) +
                      ", which has ended; record it again outside a capture");
    }
    if (st.capture == nullptr) {  // fork: the stream joins the capture
      if (from->invalidated != 0) {
        return fail(c, status::invalid_value,
                    who + "recorded in capture " + std::to_string(from->id) +
                        ", which was invalidated; end that capture");
      }
      st.capture = from;
      st.capture_vc = ev.capture_vc;
      from->members.push_back(&st);
      return ok();
    }
    if (st.capture != from) {
      invalidate_locked(*st.capture, status::stream_capture_merge);
      invalidate_locked(*from, status::stream_capture_merge);
      return fail(c, status::stream_capture_merge,
                  who + "recorded in capture " + std::to_string(from->id) + " while in capture " +
                      std::to_string(st.capture->id) + ": the two are now invalidated");
    }
    st.capture_vc.join(ev.capture_vc);  // a dependency inside the capture
    return ok();
  }
  if (ev.stream == nullptr) return ok();  // never recorded: nothing to wait for
  st.vc.join(ev.vc);
  if (ev.stream->completed >= ev.seq) return ok();
  OpRef ref = begin_op_locked(st, OpKind::stream_wait_event, Access::Read);
  Op op;
  op.kind = OpKind::stream_wait_event;
  op.seq = ref.seq;
  op.wait_stream = ev.stream;
  op.wait_seq = ev.seq;
  push_locked(st, std::move(op));
  return ok();
}

inline result<SimDriver::event_t> SimDriver::event_create() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::event_create)) return *e;
  auto d = current_device_locked(Call::event_create);
  if (!d) return std::move(d).error();
  auto ev = std::make_unique<Event>();
  ev->owner = this;
  ev->device = *d;
  ev->generation = (*d)->ctx.generation;
  Event* raw = ev.get();
  events_.push_back(std::move(ev));
  return raw;
}

inline result<void> SimDriver::event_destroy(event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_destroy)) return *x;
  auto er = event_locked(Call::event_destroy, e);
  if (!er) return std::move(er).error();
  (*er)->alive = false;  // a queued record still runs, and waits on it still hold
  return ok();
}

inline result<void> SimDriver::event_record(event_t e, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_record)) return *x;
  auto er = event_locked(Call::event_record, e);
  if (!er) return std::move(er).error();
  auto sr = stream_locked(Call::event_record, s);
  if (!sr) return std::move(sr).error();
  Event& ev = **er;
  Stream& st = **sr;
  if (ev.device != st.device) {
    return fail(Call::event_record, status::invalid_handle,
                "recording an event of device " + std::to_string(ev.device->ordinal) +
                    " on a stream of device " + std::to_string(st.device->ordinal));
  }
  if (st.fault != 0) return fault_error(Call::event_record, st);
  if (st.capture != nullptr) [[unlikely]] {  // marks a point of the capture, not of the stream
    if (st.capture->invalidated != 0) return invalidated_error(Call::event_record, st);
    ev.stream = nullptr;
    ev.seq = 0;
    ev.vc = VectorClock{};
    ev.capture_id = st.capture->id;
    ev.capture_vc = st.capture_vc;
    return ok();
  }
  ev.capture_id = 0;
  OpRef ref = begin_op_locked(st, OpKind::event_record, Access::Read);
  ev.stream = &st;
  ev.seq = ref.seq;
  ev.vc = st.vc;
  Op op;
  op.kind = OpKind::event_record;
  op.seq = ref.seq;
  push_locked(st, std::move(op));
  return ok();
}

inline result<bool> SimDriver::event_query(event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_query)) return *x;
  auto er = event_locked(Call::event_query, e);
  if (!er) return std::move(er).error();
  const Event& ev = **er;
  if (ev.capture_id != 0) [[unlikely]] {
    if (Capture* cap = find_capture_locked(ev.capture_id)) {
      invalidate_locked(*cap, status::captured_event);
    }
    return fail(Call::event_query, status::captured_event,
                "querying an event last recorded in capture " + std::to_string(ev.capture_id) +
                    "; the host cannot wait for a point of a graph: record the event on a stream "
                    "outside the capture");
  }
  if (ev.stream == nullptr) return true;
  if (ev.stream->completed >= ev.seq) {
    publish_locked(ev.vc);
    return true;
  }
  if (ev.stream->fault != 0) return fault_error(Call::event_query, *ev.stream);
  return false;
}

inline result<void> SimDriver::event_synchronize(event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_synchronize)) return *x;
  auto er = event_locked(Call::event_synchronize, e);
  if (!er) return std::move(er).error();
  const Event& ev = **er;
  if (ev.capture_id != 0) [[unlikely]] {
    if (Capture* cap = find_capture_locked(ev.capture_id)) {
      invalidate_locked(*cap, status::captured_event);
    }
    return fail(Call::event_synchronize, status::captured_event,
                "synchronising an event last recorded in capture " +
                    std::to_string(ev.capture_id) +
                    "; the host cannot wait for a point of a graph: record the event on a stream "
                    "outside the capture");
  }
  if (ev.stream == nullptr) return ok();
  const VectorClock seen = ev.vc;
  const Target t{ev.stream, ev.seq};
  auto r = wait_locked(Call::event_synchronize, std::span<const Target>(&t, 1), lk);
  if (!r) return r;
  publish_locked(seen);
  return ok();
}

}  // namespace xlogrt
