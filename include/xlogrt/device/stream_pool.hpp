// SPDX-License-Identifier: Apache-2.0
#pragma once

// StreamPool<D>: the streams of one device, named by StreamId.

#include <array>
#include <atomic>
#include <bitset>
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

/// The non-blocking streams of one device, named by StreamId. StreamId{0}
/// (StreamId::DEFAULT) is the pool's first stream, StreamId{i} the i-th; a caller's own
/// stream can be adopted and gets a free id (the pool never destroys an adopted stream).
/// At most MAX_STREAMS ids are in use at once.
///
/// Streams are known by the driver's stream id (D::stream_get_id, cuStreamGetId), not
/// by handle: the driver may hand a destroyed stream's handle to a new stream, and the
/// new stream must not be taken for the old one.
///
/// Streams that come and go. An adopted stream's id is recycled once the stream is known
/// to be gone: when its handle comes back from the driver with another stream id (a
/// handle names one live stream, so the old stream was destroyed), or when its owner
/// says so (forget). Before the id names another stream, the pool synchronises the
/// device (D::ctx_synchronize): every piece of per-stream state that the layers above
/// keep under the old id (blocks cached for it, queued frees, tracked uses, waits
/// already made) describes work enqueued before that point, which has then all run, so
/// for the id's next stream such state can only cost an extra wait or hand out memory
/// that is idle; it can never let the new stream run ahead of the old one's work. Once
/// the pool knows a stream gone it makes no call on its handle: a reused handle is the
/// new stream's, and a forgotten stream's id is pointed at the pool's own first stream
/// until it is reused, so a late free of a block allocated on it (or the cache's trim of
/// its idle blocks) is queued there, after the synchronisation. A process that creates
/// and destroys streams without end therefore keeps working in constant memory, as long
/// as at most MAX_STREAMS of them are live at once.
///
/// Until then, a destroyed stream's id still holds its handle, and the layers above may
/// call on it (the poll that retires queued frees records an event on the stream of each
/// id with frees queued, reap synchronises it, trim frees its cached blocks there), as
/// PyTorch's allocators call on the stream of a tensor that outlives it. A program that
/// destroys a stream it allocated on, and whose handles the driver does not reuse at
/// once, should forget the stream.
///
/// The synchronisation is not made while a capture window is open (a device-wide
/// synchronisation would invalidate the capture), nor retried when it fails: the new
/// stream then takes another id, and the gone stream's id is recycled when its handle
/// comes back again. forget() is refused in a window.
///
/// Thread-safe. get() and at() are lock-free (a bounds check and an atomic read).
/// adopt() of a stream already in the pool is lock-free too (one stream_get_id call and
/// a scan of the ids); a new stream takes a mutex. An id's handle is stored before its
/// key is published (release), and a lookup that finds the key reads it after (acquire).
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
      const auto n = static_cast<std::uint32_t>(i);
      p->streams_[n].store(*s, std::memory_order_relaxed);
      p->owned_[n].store(true, std::memory_order_relaxed);
      p->count_.store(n + 1, std::memory_order_release);
      auto key = p->device_->driver().stream_get_id(*s);
      if (!key) return std::move(key).error();
      p->keys_[n].store(*key, std::memory_order_release);
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
      if (owned(StreamId{i})) (void)device_->driver().stream_destroy(streams_[i].load(std::memory_order_relaxed));
    }
  }

  /// The driver stream of `id`. Errors: unknown_stream.
  result<stream_t> get(StreamId id) const noexcept {
    if (contains(id)) return at(id);
    return unknown(id);
  }

  /// The driver stream of `id`, which must be in the pool (contains(id)): get() without
  /// the check or the result, for hot paths that checked already.
  stream_t at(StreamId id) const noexcept { return streams_[id.value].load(std::memory_order_relaxed); }

  /// True when `id` names a stream of this pool (an id whose stream was forgotten still
  /// does: it names the pool's first stream until it is reused).
  bool contains(StreamId id) const noexcept {
    return id.value < count_.load(std::memory_order_acquire);
  }

  /// Adopts a caller's stream (not destroyed by the pool) and returns its id; a stream
  /// already in the pool (one of its own, or adopted before) returns its existing id.
  /// A new stream takes the id of the stream whose handle it reuses, else the id of a
  /// stream gone before, else a new id (see the class comment). Makes the device's context
  /// current first: the driver's stream id needs it, and a caller's thread may have none
  /// (torch's autograd threads have none). A driver that tells a stream's context
  /// (D::stream_context, cuStreamGetCtx) has a new stream checked against the device's:
  /// a stream of another device is refused. Errors: invalid_argument when MAX_STREAMS
  /// streams are in the pool and none is known gone; foreign_block for a stream of
  /// another device's context; the driver's error for a handle it does not know (a
  /// destroyed stream, a stream of another driver instance) and for a failed
  /// synchronisation before an id is recycled.
  ///
  /// Capture. cuStreamGetId is refused on a capturing stream (and breaks the capture), so
  /// while a capture window is open (detail::capture_windows_open) a stream already in the
  /// pool is found by its handle, a capturing stream not in the pool is refused with
  /// stream_misuse (adopt it before the capture begins, as the PyTorch bridge does with
  /// torch's capture stream), and any other new stream is adopted with the thread's
  /// capture mode relaxed.
  result<StreamId> adopt(stream_t s) noexcept {
    if (detail::capture_windows_open()) [[unlikely]] return adopt_in_window(s);
    return adopt_by_key(s);
  }

  /// The caller's adopted stream `s` is destroyed, or will not be used again: its id is
  /// recycled for a later stream. Synchronises the device first, then points the id at
  /// the pool's first stream until it is reused, so that blocks still allocated on it
  /// are freed there. Finds the stream by its handle, with no call on it. Errors:
  /// unknown_stream for a handle the pool has not adopted; stream_misuse for one of the
  /// pool's own streams, and while a capture window is open; the synchronisation's.
  result<void> forget(stream_t s) noexcept {
    if (detail::capture_windows_open()) {
      return error{errc::stream_misuse, "a stream cannot be forgotten while a capture window is open on ordinal " +
                                            std::to_string(device_->ordinal()) + ": forget it after the capture ends"};
    }
    std::lock_guard lock(adopt_mu_);
    const auto n = count_.load(std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (keys_[i].load(std::memory_order_relaxed) == GONE || streams_[i].load(std::memory_order_relaxed) != s) continue;
      if (owned(StreamId{i})) {
        return error{errc::stream_misuse, "stream " + std::to_string(i) + " is one of ordinal " +
                                              std::to_string(device_->ordinal()) +
                                              "'s pool's own streams: the pool destroys it, nobody forgets it"};
      }
      if (auto r = synchronize_locked(); !r) return r;
      release_locked(i);
      return ok();
    }
    return error{errc::unknown_stream, "forget: the handle is not an adopted stream of ordinal " +
                                           std::to_string(device_->ordinal()) + "'s pool (never adopted, or forgotten)"};
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
    auto id = take_id_locked(*s);
    if (!id) {
      (void)driver_->stream_destroy(*s);
      return std::move(id).error();
    }
    owned_[id->value].store(true, std::memory_order_relaxed);
    publish_locked(*id, *s, *key);
    return *id;
  }

  /// Whether `id` names one of the pool's own streams (made by create or create_owned,
  /// destroyed with the pool), as opposed to an adopted one. The layers above call on an
  /// adopted stream's handle only within a call that names the stream (its owner may
  /// destroy it at any time after), or after synchronising the device; on the pool's own
  /// streams they may call at any time.
  bool owned(StreamId id) const noexcept {
    return id.value < MAX_STREAMS && owned_[id.value].load(std::memory_order_relaxed);
  }

  /// Ids handed out so far (the highest id in use, plus one).
  std::size_t size() const noexcept { return count_.load(std::memory_order_acquire); }
  /// How many times an id was given to a new stream after its stream was gone.
  std::uint64_t recycled() const noexcept { return recycled_.load(std::memory_order_relaxed); }
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
  /// The key of an id whose stream is gone: no driver stream id is all ones.
  static constexpr std::uint64_t GONE = ~std::uint64_t{0};

  /// The StreamId whose driver stream id is `key`, if any. Lock-free: a key is published
  /// (release) after its handle is stored.
  std::optional<StreamId> find(std::uint64_t key) const noexcept {
    const auto n = count_.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (keys_[i].load(std::memory_order_acquire) == key) return StreamId{i};
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
    if (auto known = find(*key)) return *known;  // adopted by another thread meanwhile
    auto id = take_id_locked(s);
    if (!id) return std::move(id).error();
    publish_locked(*id, s, *key);
    return *id;
  }

  /// An id for a new stream with handle `s`, under adopt_mu_ (see the class comment):
  /// the id of a stream whose handle `s` was (that stream is gone); else a gone stream's
  /// id already synchronised (so that the layers' per-id state stays as small as the
  /// streams live at once); else a new id.
  result<StreamId> take_id_locked(stream_t s) noexcept {
    const auto n = count_.load(std::memory_order_relaxed);
    // Every id whose handle is `s` names a stream that is gone. Once the device has run
    // their work they are free, and the new stream takes the last of them. In a capture
    // window (or when the synchronisation fails) they are left as they are: their
    // handle is the new stream's, and the next reuse of it recycles them.
    if (!detail::capture_windows_open()) {
      std::bitset<MAX_STREAMS> gone;
      for (std::uint32_t i = 0; i < n; ++i) {
        if (!owned(StreamId{i}) && !free_.test(i) && streams_[i].load(std::memory_order_relaxed) == s) gone.set(i);
      }
      if (gone.any() && synchronize_locked().has_value()) {
        std::uint32_t last = 0;
        for (std::uint32_t i = 0; i < n; ++i) {
          if (gone.test(i)) release_locked(i), last = i;
        }
        return recycle_locked(last);
      }
    }
    if (free_.any()) return recycle_locked(first(free_));
    if (n < MAX_STREAMS) return StreamId{n};
    return full();
  }

  result<void> synchronize_locked() noexcept {
    if (auto r = device_->make_current(); !r) return r;
    return driver_->ctx_synchronize();
  }

  /// After a synchronisation: id `i`'s stream is gone and its work has run. The id names
  /// the pool's first stream until it is reused.
  void release_locked(std::uint32_t i) noexcept {
    keys_[i].store(GONE, std::memory_order_relaxed);
    streams_[i].store(streams_[0].load(std::memory_order_relaxed), std::memory_order_relaxed);
    free_.set(i);
  }

  StreamId recycle_locked(std::uint32_t i) noexcept {
    free_.reset(i);
    recycled_.fetch_add(1, std::memory_order_relaxed);
    return StreamId{i};
  }

  /// Stores the handle, then publishes the key (and the count, for a new id).
  void publish_locked(StreamId id, stream_t s, std::uint64_t key) noexcept {
    streams_[id.value].store(s, std::memory_order_relaxed);
    if (id.value == count_.load(std::memory_order_relaxed)) count_.store(id.value + 1, std::memory_order_release);
    keys_[id.value].store(key, std::memory_order_release);
  }

  static std::uint32_t first(const std::bitset<MAX_STREAMS>& set) noexcept {
    for (std::uint32_t i = 0; i < MAX_STREAMS; ++i) {
      if (set.test(i)) return i;
    }
    return MAX_STREAMS;
  }

  [[gnu::cold, gnu::noinline]] result<StreamId> adopt_in_window(stream_t s) noexcept {
    const auto n = count_.load(std::memory_order_acquire);
    for (std::uint32_t i = n; i-- > 0;) {
      if (keys_[i].load(std::memory_order_acquire) != GONE && streams_[i].load(std::memory_order_relaxed) == s) {
        return StreamId{i};
      }
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
    return error{errc::invalid_argument,
                 "stream pool of ordinal " + std::to_string(device_->ordinal()) + " is full (" +
                     std::to_string(MAX_STREAMS) +
                     " streams, none known gone): an id is recycled when its stream's handle comes back from the "
                     "driver for a new stream, or when its owner forgets it (StreamPool::forget)"};
  }

  explicit StreamPool(std::shared_ptr<Device<D>> device)
      : device_(std::move(device)), driver_(&device_->driver()) {
    for (auto& k : keys_) k.store(GONE, std::memory_order_relaxed);
  }

  // get() and driver() read the first line only, for the first few streams: the count,
  // the driver and streams_[0..4] share it.
  std::shared_ptr<Device<D>> device_;
  D* driver_;
  std::atomic<std::uint32_t> count_{0};
  std::array<std::atomic<stream_t>, MAX_STREAMS> streams_{};
  std::array<std::atomic<bool>, MAX_STREAMS> owned_{};
  std::array<std::atomic<std::uint64_t>, MAX_STREAMS> keys_{};  // D::stream_get_id of each stream, or GONE
  std::mutex adopt_mu_;
  std::bitset<MAX_STREAMS> free_;  // ids of gone streams whose work has run: reusable at once
  std::atomic<std::uint64_t> recycled_{0};
};

}  // namespace xlogrt
