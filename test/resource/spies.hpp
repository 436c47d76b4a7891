// SPDX-License-Identifier: Apache-2.0
#pragma once

// Spy upstreams for the decorator tests: they count every call, can be told to fail the
// N-th allocate / deallocate / reap, queue frees until reap_pending (like AsyncCuda) or
// free at once, track or not, and reach a "driver" or not. Memory is real host memory,
// so a fake driver can fill and copy it; freed blocks are quarantined until the spy
// dies, so a test can look at what a decorator left in freed memory.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <xlogrt/core/block.hpp>
#include <xlogrt/core/result.hpp>
#include <xlogrt/resource/concepts.hpp>

namespace xlogrt::testing {

struct SpyKind {
  bool tracking = false;   // has record / prepare / finish_block_use
  bool driver = false;     // models DriverResource (with HostDriver)
  bool sync_free = false;  // frees complete in deallocate (and says so)
};

/// A "driver" over host memory: every operation runs at once. Records the streams used.
struct HostDriver {
  struct stream_t {
    std::uint32_t id = 0;
  };
  result<void> memset_d8_async(std::uint64_t p, std::uint8_t v, std::size_t n, stream_t s) noexcept {
    if (fail_next.exchange(false)) return error{errc::driver_error, "cuMemsetD8Async failed (injected)", 999};
    std::memset(reinterpret_cast<void*>(p), v, n);
    last_stream.store(s.id);
    ++memsets;
    return ok();
  }
  result<void> memcpy_dtoh_async(void* h, std::uint64_t p, std::size_t n, stream_t s) noexcept {
    if (fail_next.exchange(false)) return error{errc::driver_error, "cuMemcpyDtoHAsync failed (injected)", 999};
    std::memcpy(h, reinterpret_cast<const void*>(p), n);
    last_stream.store(s.id);
    ++copies;
    return ok();
  }
  result<void> stream_synchronize(stream_t s) noexcept {
    last_stream.store(s.id);
    ++syncs;
    return ok();
  }
  std::atomic<bool> fail_next{false};
  std::atomic<std::uint32_t> last_stream{~0u};
  std::atomic<int> memsets{0}, copies{0}, syncs{0};
};

/// What a spy shares with the test that made it (the spy itself moves into a decorator).
struct SpyState {
  explicit SpyState(std::uint32_t ord) : ordinal(ord) {}
  ~SpyState() {
    for (auto& [k, v] : live) std::free(reinterpret_cast<void*>(v.ptr));
    for (auto& q : queued) std::free(reinterpret_cast<void*>(q.ptr));
    for (auto p : quarantine) std::free(reinterpret_cast<void*>(p));
  }
  struct Live {
    std::uint64_t ptr;
    std::size_t bytes;
  };
  const std::uint32_t ordinal;
  const std::uint32_t owner = next_owner();
  std::mutex mu;
  std::unordered_map<std::uint32_t, Live> live;  // by BlockId index
  std::vector<Live> queued;                      // frees not yet reaped
  std::vector<std::uint64_t> quarantine;         // freed memory, kept to be inspected
  std::uint32_t next_index = 0;

  std::atomic<std::uint64_t> allocates{0}, deallocates{0}, reaps{0};
  std::atomic<std::uint64_t> records{0}, prepares{0}, finishes{0};
  std::atomic<std::size_t> held{0};      // bytes live or queued: what "the device holds"
  std::atomic<std::size_t> max_held{0};
  std::atomic<std::size_t> outstanding{0};
  // Fail the N-th call from now (1 = the next); 0 = never.
  std::atomic<std::int64_t> fail_allocate_in{0}, fail_deallocate_in{0}, fail_reap_in{0};
  HostDriver driver;

  static bool due(std::atomic<std::int64_t>& c) {
    std::int64_t v = c.load();
    while (v > 0) {
      if (c.compare_exchange_weak(v, v - 1)) return v == 1;
    }
    return false;
  }
  static std::uint32_t next_owner() {
    static std::atomic<std::uint32_t> n{1u << 30};
    return n++;
  }
};

template <SpyKind K>
class SpyUpstream {
 public:
  static constexpr bool supports_block_use_tracking = K.tracking;
  static constexpr bool frees_synchronously = K.sync_free;

  explicit SpyUpstream(std::uint32_t ordinal = 0) : s_(std::make_shared<SpyState>(ordinal)) {}
  std::shared_ptr<SpyState> state() const { return s_; }

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    ++s_->allocates;
    if (bytes == 0) return error{errc::zero_bytes, "allocation of 0 bytes"};
    if (bytes > (std::size_t{1} << 40)) return error{errc::too_large, "too large for the spy"};
    if (SpyState::due(s_->fail_allocate_in)) return error{errc::out_of_memory, "spy: injected out_of_memory"};
    void* p = std::malloc(bytes);
    if (p == nullptr) return error{errc::out_of_memory, "spy: host malloc failed"};
    const auto ptr = reinterpret_cast<std::uint64_t>(p);
    std::uint32_t index;
    {
      std::lock_guard lock(s_->mu);
      index = s_->next_index++;
      s_->live.emplace(index, SpyState::Live{ptr, bytes});
    }
    const std::size_t h = s_->held.fetch_add(bytes) + bytes;
    std::size_t m = s_->max_held.load();
    while (h > m && !s_->max_held.compare_exchange_weak(m, h)) {
    }
    s_->outstanding.fetch_add(bytes);
    return DeviceBlock{ptr, bytes, stream, s_->ordinal, tag, BlockId{s_->owner, index, 0}};
  }

  result<void> deallocate(DeviceBlock&& b) noexcept {
    ++s_->deallocates;
    if (b.empty()) return error{errc::empty_block, "empty block"};
    if (b.id().owner != s_->owner || b.device_ordinal() != s_->ordinal) {
      return error{errc::foreign_block, "not the spy's block"};
    }
    if (SpyState::due(s_->fail_deallocate_in)) return error{errc::driver_error, "spy: injected free failure"};
    SpyState::Live l;
    {
      std::lock_guard lock(s_->mu);
      auto it = s_->live.find(b.id().index);
      if (it == s_->live.end()) return error{errc::double_free, "spy: block already freed"};
      if (it->second.ptr != b.ptr() || it->second.bytes != b.bytes()) {
        return error{errc::foreign_block, "spy: block does not match"};
      }
      l = it->second;
      s_->live.erase(it);
      if (!K.sync_free) s_->queued.push_back(l);
      else s_->quarantine.push_back(l.ptr);
    }
    if (K.sync_free) {
      s_->held.fetch_sub(l.bytes);
      s_->outstanding.fetch_sub(l.bytes);
    }
    DeviceBlock gone = std::move(b);
    return ok();
  }

  std::size_t bytes_outstanding() const noexcept { return s_->outstanding.load(); }

  result<void> reap_pending() noexcept {
    ++s_->reaps;
    if (SpyState::due(s_->fail_reap_in)) return error{errc::driver_error, "spy: injected reap failure"};
    // Retire under the lock: a reap that runs concurrently with this one must not return
    // before the frees this one has taken are complete (the contract: every free queued
    // before a reap began is complete when it returns).
    std::lock_guard lock(s_->mu);
    for (auto& l : s_->queued) {
      s_->quarantine.push_back(l.ptr);
      s_->held.fetch_sub(l.bytes);
      s_->outstanding.fetch_sub(l.bytes);
    }
    s_->queued.clear();
    return ok();
  }

  std::uint32_t device_ordinal() const noexcept { return s_->ordinal; }

  result<void> record_block_use(const DeviceBlock& b, StreamId) noexcept
    requires(K.tracking)
  {
    ++s_->records;
    return check_live(b.id(), &b);
  }
  result<void> prepare_block_use(BlockId id, StreamId, Access) noexcept
    requires(K.tracking)
  {
    ++s_->prepares;
    return check_live(id, nullptr);
  }
  result<void> finish_block_use(BlockId id, StreamId, Access) noexcept
    requires(K.tracking)
  {
    ++s_->finishes;
    return check_live(id, nullptr);
  }

  using driver_type = std::conditional_t<K.driver, HostDriver, void>;
  HostDriver& driver() const noexcept
    requires(K.driver)
  {
    return s_->driver;
  }
  result<HostDriver::stream_t> stream_handle(StreamId s) const noexcept
    requires(K.driver)
  {
    if (s.value >= 8) return error{errc::unknown_stream, "spy: unknown stream"};
    return HostDriver::stream_t{100 + s.value};
  }
  result<void> make_current() const noexcept
    requires(K.driver)
  {
    return ok();
  }

 private:
  result<void> check_live(BlockId id, const DeviceBlock* b) const {
    std::lock_guard lock(s_->mu);
    auto it = s_->live.find(id.index);
    if (id.owner != s_->owner || it == s_->live.end()) return error{errc::stale_block, "spy: stale block"};
    if (b != nullptr && (it->second.ptr != b->ptr() || it->second.bytes != b->bytes())) {
      return error{errc::foreign_block, "spy: block does not match"};
    }
    return ok();
  }
  std::shared_ptr<SpyState> s_;
};

/// Whether R has record_block_use at all (a non-tracking stack must not).
template <class R>
concept HasRecordBlockUse = requires(R& r, const DeviceBlock& b) { r.record_block_use(b, StreamId{}); };

using PlainSpy = SpyUpstream<SpyKind{}>;
using SyncSpy = SpyUpstream<SpyKind{.sync_free = true}>;
using TrackingSpy = SpyUpstream<SpyKind{.tracking = true}>;
using DriverSpy = SpyUpstream<SpyKind{.tracking = true, .driver = true}>;
using PlainDriverSpy = SpyUpstream<SpyKind{.driver = true, .sync_free = true}>;

static_assert(DeviceMemoryResource<PlainSpy> && !TrackingResource<PlainSpy> && !DriverResource<PlainSpy>);
static_assert(TrackingResource<TrackingSpy>);
static_assert(DriverResource<DriverSpy> && TrackingResource<DriverSpy>);
static_assert(DriverResource<PlainDriverSpy> && !TrackingResource<PlainDriverSpy>);

}  // namespace xlogrt::testing
