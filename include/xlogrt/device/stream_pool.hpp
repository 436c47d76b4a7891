// SPDX-License-Identifier: Apache-2.0
#pragma once

// StreamPool<D>: the streams of one device, named by StreamId.

#include <array>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/capture_windows.hpp"
#include "xlogrt/device/device.hpp"
#include "xlogrt/driver/lifetime.hpp"

namespace xlogrt {

/// The non-blocking streams of one device. StreamId{0} (StreamId::DEFAULT) is the pool's
/// first stream, StreamId{i} the i-th; a caller's own stream can be adopted and gets the
/// next id (the pool never destroys an adopted stream). At most MAX_STREAMS ids.
///
/// Streams are known by the driver's stream id (D::stream_get_id, cuStreamGetId), not
/// by handle: the driver may hand a destroyed stream's handle to a new stream, and the
/// new stream must not inherit the old one's StreamId (its blocks, its tracked uses).
/// Such a handle is adopted again under a new StreamId; the old StreamId keeps naming
/// the handle, so blocks allocated on a stream must be freed before it is destroyed.
///
/// Thread-safe. get() is lock-free (a bounds check and an array read). adopt() of a
/// stream already in the pool is lock-free too (one stream_get_id call and a scan of
/// the ids); a new stream takes a mutex and is published with a release store of the
/// count, after its handle and id are written (entries never change afterwards).
template <Driver D>
class alignas(64) StreamPool {
 public:
  using driver_type = D;
  using stream_t = typename D::stream_t;
  static constexpr std::size_t MAX_STREAMS = 256;

  /// Opens `ordinal` on `driver` (Device::open) and creates `count` streams on it: a
  /// device and its streams in one call. Errors: Device::open's, then create's.
  static result<std::shared_ptr<StreamPool>> open(D& driver, std::uint32_t ordinal, std::size_t count = 8) noexcept {
    XLOGRT_TRY_ASSIGN(auto device, Device<D>::open(driver, ordinal));
    return create(std::move(device), count);
  }

  /// Creates `count` (>= 1) non-blocking streams on `device`.
  static result<std::shared_ptr<StreamPool>> create(std::shared_ptr<Device<D>> device,
                                                    std::size_t count = 8) noexcept {
    if (count == 0 || count > MAX_STREAMS) {
      return error{errc::invalid_argument, "a stream pool holds 1 to " +
                                               std::to_string(MAX_STREAMS) + " streams, not " +
                                               std::to_string(count)};
    }
    std::shared_ptr<StreamPool> p(new (std::nothrow) StreamPool(std::move(device)));
    if (!p) return error{errc::out_of_memory, "host allocation of a StreamPool failed"};
    if (auto r = p->device_->make_current(); !r) return std::move(r).error();
    for (std::size_t i = 0; i < count; ++i) {
      auto s = p->device_->driver().stream_create();
      if (!s) return std::move(s).error();  // the destructor destroys those made so far
      p->streams_[i] = *s;
      p->owned_[i] = true;
      auto key = p->device_->driver().stream_get_id(*s);
      if (!key) {
        p->count_.store(static_cast<std::uint32_t>(i + 1), std::memory_order_release);
        return std::move(key).error();
      }
      p->keys_[i] = *key;
      p->count_.store(static_cast<std::uint32_t>(i + 1), std::memory_order_release);
    }
    return p;
  }

  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;
  ~StreamPool() {
    if (detail::process_exiting()) return;
    if (!device_->make_current()) return;
    const auto n = count_.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (owned_[i]) (void)device_->driver().stream_destroy(streams_[i]);
    }
  }

  /// The driver stream of `id`. Errors: unknown_stream.
  result<stream_t> get(StreamId id) const noexcept {
    if (contains(id)) return at(id);
    return unknown(id);
  }

  /// The driver stream of `id`, which must be in the pool (contains(id)): get() without
  /// the check or the result, for hot paths that checked already.
  stream_t at(StreamId id) const noexcept { return streams_[id.value]; }

  /// True when `id` names a stream of this pool.
  bool contains(StreamId id) const noexcept {
    return id.value < count_.load(std::memory_order_acquire);
  }

  /// Adopts a caller's stream (not destroyed by the pool) and returns its id; a stream
  /// already in the pool (one of its own, or adopted before) returns its existing id.
  /// Makes the device's context current first: the driver's stream id needs it, and a
  /// caller's thread may have none (torch's autograd threads have none). A driver that
  /// tells a stream's context (D::stream_context, cuStreamGetCtx) has a new stream checked
  /// against the device's: a stream of another device is refused. Errors:
  /// invalid_argument when full; foreign_block for a stream of another device's context;
  /// the driver's error for a handle it does not know (a destroyed stream, a stream of
  /// another driver instance).
  ///
  /// Capture. cuStreamGetId is refused on a capturing stream (and breaks the capture), so
  /// while a capture window is open (detail::capture_windows_open) a stream already in the
  /// pool is found by its handle (its newest entry: a capture proves the stream alive), a
  /// capturing stream not in the pool is refused with stream_misuse (adopt it before the
  /// capture begins, as the PyTorch bridge does with torch's capture stream), and any
  /// other new stream is adopted with the thread's capture mode relaxed.
  result<StreamId> adopt(stream_t s) noexcept {
    if (detail::capture_windows_open()) [[unlikely]] return adopt_in_window(s);
    return adopt_by_key(s);
  }

  /// A new non-blocking stream that the pool owns (destroyed with the pool, after every
  /// resource that holds the pool): for a layer that needs a stream of its own (GraphPools).
  /// Errors: invalid_argument when full; the driver's.
  result<StreamId> create_owned() noexcept {
    if (auto r = device_->make_current(); !r) return std::move(r).error();
    auto s = driver_->stream_create();
    if (!s) return std::move(s).error();
    auto key = driver_->stream_get_id(*s);
    if (!key) {
      (void)driver_->stream_destroy(*s);
      return std::move(key).error();
    }
    std::lock_guard lock(adopt_mu_);
    const auto n = count_.load(std::memory_order_relaxed);
    if (n == MAX_STREAMS) {
      (void)driver_->stream_destroy(*s);
      return full();
    }
    streams_[n] = *s;
    owned_[n] = true;
    keys_[n] = *key;
    count_.store(n + 1, std::memory_order_release);
    return StreamId{n};
  }

  std::size_t size() const noexcept { return count_.load(std::memory_order_acquire); }
  const std::shared_ptr<Device<D>>& device() const noexcept { return device_; }
  D& driver() const noexcept { return *driver_; }

  /// The error get() returns for `id`, for callers that validated with contains().
  [[gnu::cold, gnu::noinline]] error unknown(StreamId id) const {
    return error{errc::unknown_stream, "stream " + std::to_string(id.value) +
                                           " is not in the pool of ordinal " +
                                           std::to_string(device_->ordinal()) + " (" +
                                           std::to_string(size()) + " streams)"};
  }

 private:
  /// The StreamId whose driver stream id is `key`, if any. Lock-free: entries below the
  /// (acquired) count are written before it is published and never change.
  std::optional<StreamId> find(std::uint64_t key) const noexcept {
    const auto n = count_.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (keys_[i] == key) return StreamId{i};
    }
    return std::nullopt;
  }

  result<StreamId> adopt_by_key(stream_t s) noexcept {
    if (auto r = device_->make_current(); !r) return std::move(r).error();
    auto key = driver_->stream_get_id(s);
    if (!key) return std::move(key).error();
    if (auto known = find(*key)) return *known;
    if constexpr (requires(D& d) { { d.stream_context(s) } -> std::same_as<result<typename D::context_t>>; }) {
      auto ctx = driver_->stream_context(s);
      if (!ctx) return std::move(ctx).error();
      if (*ctx != device_->context()) {
        return error{errc::foreign_block, "stream " + std::to_string(*key) +
                                              " belongs to another device's context, not ordinal " +
                                              std::to_string(device_->ordinal()) + "'s: it cannot join its pool"};
      }
    }
    std::lock_guard lock(adopt_mu_);
    const auto n = count_.load(std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (keys_[i] == *key) return StreamId{i};
    }
    if (n == MAX_STREAMS) return full();
    streams_[n] = s;
    owned_[n] = false;
    keys_[n] = *key;
    count_.store(n + 1, std::memory_order_release);
    return StreamId{n};
  }

  [[gnu::cold, gnu::noinline]] result<StreamId> adopt_in_window(stream_t s) noexcept {
    const auto n = count_.load(std::memory_order_acquire);
    for (std::uint32_t i = n; i-- > 0;) {
      if (streams_[i] == s) return StreamId{i};
    }
    auto info = driver_->stream_capture_info(s);
    if (!info) return std::move(info).error();
    if (info->status != CaptureStatus::none) {
      return error{errc::stream_misuse, "a stream first seen while it captures cannot join ordinal " +
                                            std::to_string(device_->ordinal()) +
                                            "'s pool (its id cannot be read during the capture): allocate on it, "
                                            "or adopt it, before the capture begins"};
    }
    detail::RelaxedCapture relaxed(*driver_);
    return adopt_by_key(s);
  }

  [[gnu::cold]] error full() const {
    return error{errc::invalid_argument, "stream pool of ordinal " + std::to_string(device_->ordinal()) +
                                             " is full (" + std::to_string(MAX_STREAMS) + " streams)"};
  }

  explicit StreamPool(std::shared_ptr<Device<D>> device)
      : device_(std::move(device)), driver_(&device_->driver()) {}

  // get() and driver() read the first line only, for the first few streams: the count,
  // the driver and streams_[0..4] share it.
  std::shared_ptr<Device<D>> device_;
  D* driver_;
  std::atomic<std::uint32_t> count_{0};
  std::array<stream_t, MAX_STREAMS> streams_{};
  std::array<bool, MAX_STREAMS> owned_{};
  std::array<std::uint64_t, MAX_STREAMS> keys_{};  // D::stream_get_id of each stream
  std::mutex adopt_mu_;
};

}  // namespace xlogrt
