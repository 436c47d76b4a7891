// SPDX-License-Identifier: Apache-2.0
#pragma once

// The process-wide count of open capture windows.
//
// A capture window is GraphPools::begin_allocate_to_pool .. end_allocate_to_pool: while
// one is open, some stream of the process may be capturing a CUDA graph, and the code
// whose hot paths would otherwise make a driver call that a capture forbids (AsyncCuda's
// free on the block's stream, StreamPool::adopt's cuStreamGetId) first asks whether the
// stream captures. The count is one relaxed load on those paths;
// zero (no window open: every program that never captures) keeps them as they were.

#include <atomic>
#include <cstdint>

#include "xlogrt/driver/concept.hpp"

namespace xlogrt::detail {

inline std::atomic<std::uint32_t>& capture_window_count() noexcept {
  static std::atomic<std::uint32_t> count{0};
  return count;
}

/// Whether a capture window is open anywhere in the process.
[[gnu::always_inline]] inline bool capture_windows_open() noexcept {
  return capture_window_count().load(std::memory_order_relaxed) != 0;
}

/// Sets the calling thread's capture mode to relaxed for its life (when the driver lets
/// it), so that the "potentially unsafe" calls it makes (a synchronisation of a stream that
/// does not capture, cuMemAlloc) are legal while another thread, or this one, captures in
/// global mode. Calls that conflict with a capture itself stay illegal.
template <class D>
class RelaxedCapture {
 public:
  explicit RelaxedCapture(D& d) noexcept : d_(d) {
    if (auto m = d.exchange_capture_mode(CaptureMode::relaxed)) {
      prev_ = *m;
      set_ = true;
    }
  }
  ~RelaxedCapture() {
    if (set_) (void)d_.exchange_capture_mode(prev_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  D& d_;
  CaptureMode prev_ = CaptureMode::global;
  bool set_ = false;  // the exchange succeeded: prev_ is the thread's mode to restore
};

}  // namespace xlogrt::detail
