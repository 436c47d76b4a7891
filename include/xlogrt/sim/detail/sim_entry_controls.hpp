// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's simulator controls: stepping and draining the executor, the hazard
// reports, fault injection and call counts, faulting a stream, and the statistics and
// views tests read.
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- simulator controls ----------------------------------------------------------------------

inline bool SimDriver::step() noexcept {
  if (cfg_.executor != SimExecutor::manual) return false;
  Lock lk(mu_);
  for (;;) {
    bool changed = false;
    if (Stream* s = pick_locked(nullptr, changed)) {
      run_head_locked(*s, lk);
      return true;
    }
    if (!changed) return false;
  }
}

inline std::size_t SimDriver::run_until_idle() noexcept {
  if (cfg_.executor == SimExecutor::manual) {
    std::size_t n = 0;
    while (step()) ++n;
    return n;
  }
  Lock lk(mu_);
  const std::uint64_t before = executed_;
  work_cv_.notify_all();
  done_cv_.wait(lk, [&] {
    bool changed = propagate_faults_locked();
    (void)changed;
    return idle_locked();
  });
  return static_cast<std::size_t>(executed_ - before);
}

inline std::size_t SimDriver::pending_ops() const noexcept {
  Lock lk(mu_);
  return sched_.queued();
}

inline std::vector<SimHazard> SimDriver::hazards() const {
  Lock lk(mu_);
  return checker_.hazards();
}

inline void SimDriver::clear_hazards() noexcept {
  Lock lk(mu_);
  checker_.clear();
}

inline std::uint64_t SimDriver::hazards_dropped() const noexcept {
  Lock lk(mu_);
  return checker_.dropped();
}

inline SimInjection SimDriver::fail_nth(std::string_view call, int n, int status) noexcept {
  Lock lk(mu_);
  return faults_.fail_nth(call, n, status);
}

inline SimInjection SimDriver::fail_always(std::string_view call, int status) noexcept {
  Lock lk(mu_);
  return faults_.fail_always(call, status);
}

inline void SimDriver::clear_failures() noexcept {
  Lock lk(mu_);
  faults_.clear();
}

inline std::int64_t SimDriver::calls(std::string_view call) const noexcept {
  Call c{};
  if (!detail::sim::find_call(call, c)) return -1;
  Lock lk(mu_);
  return static_cast<std::int64_t>(faults_.calls(c));
}

inline result<void> SimDriver::fault_stream(stream_t s, int status) noexcept {
  if (status == 0) return error{errc::invalid_argument, "fault_stream: status must be non-zero"};
  Lock lk(mu_);
  auto sr = stream_locked(Call::stream_query, s);
  if (!sr) return std::move(sr).error();
  (*sr)->fault = status;
  propagate_faults_locked();
  done_cv_.notify_all();
  work_cv_.notify_all();
  return ok();
}

inline result<SimMemoryStats> SimDriver::memory_stats(device_t dev) const noexcept {
  Lock lk(mu_);
  auto d = device_locked(Call::device_get, dev);
  if (!d) return std::move(d).error();
  const Device& x = **d;
  return SimMemoryStats{
      static_cast<std::size_t>(memory_bytes_), static_cast<std::size_t>(x.mem.allocated),
      static_cast<std::size_t>(x.mem.pending), static_cast<std::size_t>(x.mem.quarantined),
      static_cast<std::size_t>(x.mem.peak),    x.mem.blocks.size(),
      static_cast<std::size_t>(x.mem.graph_reserved), static_cast<std::size_t>(x.mem.physical)};
}

inline SimCaptureStats SimDriver::capture_stats() const noexcept {
  Lock lk(mu_);
  return capture_stats_;
}

inline result<std::size_t> SimDriver::bytes_reserved(device_t dev) const noexcept {
  auto st = memory_stats(dev);
  if (!st) return std::move(st).error();
  return st->allocated + st->free_pending + st->graph_reserved + st->physical;
}

inline result<std::uint64_t> SimDriver::release_threshold(mempool_t pool) const noexcept {
  Lock lk(mu_);
  if (!owns_pool(pool)) {
    return error{errc::invalid_argument, "release_threshold: not a pool of this simulator"};
  }
  return pool->release_threshold;
}

inline result<std::uint32_t> SimDriver::stream_id(stream_t s) const noexcept {
  Lock lk(mu_);
  auto sr = stream_locked(Call::stream_query, s);
  if (!sr) return std::move(sr).error();
  return (*sr)->id;
}

inline result<std::span<std::byte>> SimDriver::host_view(std::uint64_t ptr,
                                                         std::size_t bytes) noexcept {
  Lock lk(mu_);
  std::byte* p = translate_locked(ptr, bytes);
  if (p == nullptr) {
    return error{errc::invalid_argument,
                 "host_view: [" + detail::sim::hex(ptr) + ", +" + std::to_string(bytes) +
                     ") is not inside simulated device or mapped host memory, nor mapped "
                     "virtual memory"};
  }
  return std::span<std::byte>(p, bytes);
}

}  // namespace xlogrt
