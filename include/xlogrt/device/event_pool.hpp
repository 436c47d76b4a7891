// SPDX-License-Identifier: Apache-2.0
#pragma once

// EventPool<D>: timing-disabled events of one device, created once and reused.

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "xlogrt/core/result.hpp"
#include "xlogrt/device/device.hpp"
#include "xlogrt/driver/lifetime.hpp"

namespace xlogrt {

/// A free list of timing-disabled events. acquire() hands out a pooled event (creating
/// one only when every shard is empty, so a warmed pool creates none on the hot path);
/// release() returns it. An event may be released as soon as every wait on it has been
/// enqueued: cuStreamWaitEvent captures the event's state when it is called.
///
/// Thread-safe. The free list is split into shards picked by the calling thread, each
/// under its own mutex, so threads on different streams rarely meet on one lock.
template <Driver D>
class EventPool {
 public:
  using event_t = typename D::event_t;

  explicit EventPool(std::shared_ptr<Device<D>> device) noexcept : device_(std::move(device)) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    if (detail::process_exiting() || !device_->make_current()) return;
    for (auto& s : shards_) {
      for (auto e : s.free) (void)device_->driver().event_destroy(e);
    }
  }

  /// A pooled event. Errors: the driver's, when a new event cannot be created (the
  /// device's context is made current first, only then).
  result<event_t> acquire() noexcept {
    const std::size_t home = home_shard();
    for (std::size_t i = 0; i < SHARDS; ++i) {  // the thread's shard first, then steal
      Shard& s = shards_[(home + i) % SHARDS];
      std::lock_guard lock(s.mu);
      if (!s.free.empty()) {
        event_t e = s.free.back();
        s.free.pop_back();
        return e;
      }
    }
    if (auto r = device_->make_current(); !r) return std::move(r).error();
    return device_->driver().event_create();
  }

  /// Returns `e` to the pool.
  void release(event_t e) noexcept {
    Shard& s = shard();
    std::lock_guard lock(s.mu);
    try {
      s.free.push_back(e);
    } catch (...) {  // out of host memory: destroying the event loses nothing
      (void)device_->driver().event_destroy(e);
    }
  }

  /// Creates events until the pool holds at least `n` (spread over the shards).
  result<void> reserve(std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      auto e = device_->driver().event_create();
      if (!e) return std::move(e).error();
      Shard& s = shards_[i % SHARDS];
      std::lock_guard lock(s.mu);
      try {
        s.free.push_back(*e);
      } catch (...) {
        (void)device_->driver().event_destroy(*e);
        return error{errc::out_of_memory, "host memory exhausted while reserving events"};
      }
    }
    return ok();
  }

 private:
  static constexpr std::size_t SHARDS = 8;
  struct alignas(64) Shard {
    std::mutex mu;
    std::vector<event_t> free;
  };
  static std::size_t home_shard() noexcept {
    static thread_local const std::size_t mine =
        std::hash<const void*>{}(&mine) / alignof(std::max_align_t) % SHARDS;
    return mine;
  }
  Shard& shard() noexcept { return shards_[home_shard()]; }

  std::shared_ptr<Device<D>> device_;
  std::array<Shard, SHARDS> shards_;
};

}  // namespace xlogrt
