// SPDX-License-Identifier: Apache-2.0
#pragma once

// Replaying an allocation log (the CSV Logging's FileSink writes, parsed by read_log_csv)
// against a stack: shared by bench/log_replay and bench/footprint.
//
// The log names blocks by pointer. An `allocate` record allocates its size on its stream
// under its tag and keeps the block under the logged pointer (a pointer the replay
// still holds is freed first: the program's free was not logged); a `free` record frees
// the block held under its pointer (a pointer not held is counted and skipped);
// `allocate failure` and `free failure` records are skipped. The replayer counts what
// the users hold: the bytes the log asked for (requested) and the bytes of the blocks
// the stack handed out (granted), now and at their peaks.

#include <xlogrt/core/block.hpp>
#include <xlogrt/core/result.hpp>
#include <xlogrt/resource/logging.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

namespace xlogrt::bench {

/// Not thread-safe: one thread at a time (the footprint replay hands it from thread to
/// thread in log order).
class LogReplayer {
 public:
  /// Runs record `r` on stream `s`: `allocate(bytes, stream, tag) -> result<DeviceBlock>`
  /// and `deallocate(DeviceBlock&&) -> result<void>`. Returns true when the record
  /// reached the stack (an allocation or a free of a held pointer).
  template <class Alloc, class Free>
  bool step(const LogRecord& r, StreamId s, Alloc&& allocate, Free&& deallocate) {
    if (r.action == LogAction::allocate) {
      auto b = allocate(r.bytes, s, r.tag);
      if (!b) {
        note_failure(b.error());
        return true;
      }
      if (auto old = live_.find(r.ptr); old != live_.end()) {  // the log reused a pointer still held
        release(old->second, deallocate);
        live_.erase(old);
      }
      requested_ += r.bytes;
      granted_ += b->bytes();
      if (requested_ > peak_requested_) peak_requested_ = requested_;
      if (granted_ > peak_granted_) peak_granted_ = granted_;
      live_.emplace(r.ptr, Held{std::move(*b), r.bytes});
      return true;
    }
    if (r.action == LogAction::free) {
      auto it = live_.find(r.ptr);
      if (it == live_.end()) {
        ++unknown_frees_;
        return false;
      }
      release(it->second, deallocate);
      live_.erase(it);
      return true;
    }
    return false;
  }

  /// Frees every block still held.
  template <class Free>
  void finish(Free&& deallocate) {
    for (auto& [p, h] : live_) release(h, deallocate);
    live_.clear();
  }

  struct Held {
    DeviceBlock block;
    std::size_t requested = 0;
  };
  /// The blocks held now, by logged pointer.
  const std::unordered_map<std::uint64_t, Held>& live() const noexcept { return live_; }
  std::size_t requested_bytes() const noexcept { return requested_; }
  std::size_t granted_bytes() const noexcept { return granted_; }
  std::size_t peak_requested_bytes() const noexcept { return peak_requested_; }
  std::size_t peak_granted_bytes() const noexcept { return peak_granted_; }
  std::uint64_t unknown_frees() const noexcept { return unknown_frees_; }
  std::uint64_t failures() const noexcept { return failed_; }
  const std::string& first_error() const noexcept { return first_error_; }

 private:
  template <class Free>
  void release(Held& h, Free&& deallocate) {
    requested_ -= h.requested;
    granted_ -= h.block.bytes();
    if (auto e = deallocate(std::move(h.block)); !e) note_failure(e.error());
  }
  void note_failure(const error& e) {
    if (failed_++ == 0) first_error_ = e.what();
  }

  std::unordered_map<std::uint64_t, Held> live_;
  std::size_t requested_ = 0, granted_ = 0, peak_requested_ = 0, peak_granted_ = 0;
  std::uint64_t unknown_frees_ = 0, failed_ = 0;
  std::string first_error_;
};

}  // namespace xlogrt::bench
