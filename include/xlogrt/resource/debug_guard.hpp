// SPDX-License-Identifier: Apache-2.0
#pragma once

// DebugGuard<Up>: guard bytes around every block, checked when it is freed.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/decorator.hpp"

namespace xlogrt {

/// A DriverResource whose driver can fill, copy back and wait: what DebugGuard needs.
template <class R>
concept GuardableResource =
    DriverResource<R> &&
    requires(typename R::driver_type& d, typename R::driver_type::stream_t s, std::uint64_t p,
             std::uint8_t v, std::size_t n, void* host) {
      { d.memset_d8_async(p, v, n, s) } -> std::same_as<result<void>>;
      { d.memcpy_dtoh_async(host, p, n, s) } -> std::same_as<result<void>>;
      { d.stream_synchronize(s) } -> std::same_as<result<void>>;
    };

/// Not thread-safe: a value, owned by one thread at a time.
struct DebugGuardOptions {
  std::size_t guard_bytes = 256;  ///< before and after every block (0: no guards, poison only)
  std::uint8_t pattern = 0xA5;    ///< what the guards are filled with
  std::uint8_t poison = 0xDD;     ///< what a freed block (guards included) is filled with
};

/// For tests and debugging, not production: it synchronises a stream on every free.
///
/// Every block gets `guard_bytes` of `pattern` before and after it: the upstream block is
/// `bytes + 2 * guard_bytes`, and the caller's block starts `guard_bytes` into it. The
/// guards are written at allocate on the block's stream (memset_d8_async). At deallocate
/// DebugGuard makes the alloc stream wait for every tracked use on other streams (when the
/// upstream tracks), copies both guards back on the alloc stream, synchronises it, and
/// compares; then it poisons the whole upstream block with `poison` and frees it. An
/// overwritten guard byte is errc::guard_corrupted, naming the block, its tag, the side
/// (front or back) and the offset of the first bad byte; the block is freed all the same
/// (the caller's DeviceBlock is consumed) and the accounting stays exact: the decorators
/// above it tell a freed block from a refused one by the block (emptied when freed), not
/// by the result.
///
/// The block the caller gets keeps the upstream's BlockId, so prepare_block_use and
/// finish_block_use pass through unchanged; a block DebugGuard does not know (a double
/// free, a block of another resource) goes to the upstream untouched, which names the
/// error. bytes_outstanding() is the upstream's less the guard bytes, so it counts what
/// callers asked for, as the contract says (exact whenever no call is in flight; a free
/// queued by an asynchronous upstream counts, guards excluded, until reap_pending).
///
/// If the upstream refuses the free after the check (a driver error), the block stays
/// with the caller and stays live, its guards are written again, but its contents have
/// already been poisoned: a debugging tool's trade, rather than a host copy of every
/// block.
///
/// Errors (deallocate): guard_corrupted (freed); a driver error while checking (not
/// freed, the block stays with the caller); foreign_block for a block whose pointer or
/// size does not match the one handed out; whatever the upstream returns.
///
/// Thread-safe. Live blocks are kept in 16 shards, each under its own mutex, picked by
/// BlockId. Construction and moves happen-before use.
template <GuardableResource Upstream>
class DebugGuard : public detail::DriverTypeOf<Upstream> {
 public:
  static constexpr bool supports_block_use_tracking = Upstream::supports_block_use_tracking;
  static constexpr bool frees_synchronously = SynchronousFree<Upstream>;

  explicit DebugGuard(Upstream upstream, DebugGuardOptions options = {})
      : up_(std::move(upstream)), opt_(options), table_(std::make_unique<Table>()) {}

  /// Errors: too_large when the guards would overflow the size; the upstream's errors; a
  /// driver error writing the guards (the upstream block is freed again).
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    if (bytes == 0) return up_.allocate(bytes, stream, tag);  // the upstream names it
    const std::size_t g = opt_.guard_bytes;
    if (bytes > std::numeric_limits<std::size_t>::max() - 2 * g) {
      return error{errc::too_large, "a request of " + std::to_string(bytes) + " bytes plus 2 guards of " +
                                        std::to_string(g) + " bytes overflows the size type"};
    }
    auto u = up_.allocate(bytes + 2 * g, stream, tag);
    if (!u) return u;
    auto undo = [&](error e) -> result<DeviceBlock> {
      (void)up_.deallocate(std::move(*u));
      return e;
    };
    if (g != 0) {
      auto h = handle(stream);
      if (!h) return undo(std::move(h).error());
      auto& d = up_.driver();
      if (auto r = d.memset_d8_async(u->ptr(), opt_.pattern, g, *h); !r) return undo(std::move(r).error());
      if (auto r = d.memset_d8_async(u->ptr() + g + bytes, opt_.pattern, g, *h); !r) {
        return undo(std::move(r).error());
      }
    }
    DeviceBlock out{u->ptr() + g, bytes, stream, u->device_ordinal(), tag, u->id()};
    if (!table_->insert(out)) {
      return undo(error{errc::out_of_memory, "host memory exhausted recording a guarded block"});
    }
    overhead_->held.fetch_add(2 * g, std::memory_order_release);
    DeviceBlock forgotten = std::move(*u);  // rebuilt from `out` at free
    return out;
  }

  result<void> deallocate(DeviceBlock&& b) noexcept {
    if (b.empty()) return up_.deallocate(std::move(b));
    const auto found = table_->take(b);
    if (found == Table::Found::absent) return up_.deallocate(std::move(b));
    if (found == Table::Found::mismatch) {
      return error{errc::foreign_block, "block " + b.id().to_string() + " (" + std::to_string(b.bytes()) +
                                            " bytes at " + hex(b.ptr()) + ", ordinal " +
                                            std::to_string(b.device_ordinal()) + ", stream " +
                                            std::to_string(b.alloc_stream().value) +
                                            ") does not match the block DebugGuard handed out under that id"};
    }
    auto verdict = check(b);
    if (!verdict) {
      table_->put_back(b);
      return std::move(verdict).error();
    }
    const std::size_t g = opt_.guard_bytes;
    DeviceBlock u{b.ptr() - g, b.bytes() + 2 * g, b.alloc_stream(), b.device_ordinal(), b.tag(), b.id()};
    auto h = handle(b.alloc_stream());
    if (!h) {
      table_->put_back(b);
      return std::move(h).error();
    }
    if (auto r = up_.driver().memset_d8_async(u.ptr(), opt_.poison, u.bytes(), *h); !r) {
      table_->put_back(b);
      return r;
    }
    if (auto r = up_.deallocate(std::move(u)); !r) {
      if (!u.empty()) {  // not freed: the caller keeps the block, with its guards back
        auto& d = up_.driver();
        (void)d.memset_d8_async(u.ptr(), opt_.pattern, g, *h);
        (void)d.memset_d8_async(b.ptr() + b.bytes(), opt_.pattern, g, *h);
        table_->put_back(b);
        return r;
      }
      overhead_->freed(2 * g, frees_synchronously);
      DeviceBlock gone = std::move(b);
      if (!verdict->empty()) return error{errc::guard_corrupted, std::move(*verdict) + "; then " + r.error().what()};
      return r;
    }
    overhead_->freed(2 * g, frees_synchronously);
    DeviceBlock gone = std::move(b);
    if (!verdict->empty()) return error{errc::guard_corrupted, std::move(*verdict)};
    return ok();
  }

  std::size_t bytes_outstanding() const noexcept {
    const std::size_t extra = overhead_->held.load(std::memory_order_acquire);
    const std::size_t all = up_.bytes_outstanding();
    return all > extra ? all - extra : 0;
  }
  /// Reaps the upstream; the guard bytes of the frees it has seen complete stop counting.
  result<void> reap_pending() noexcept {
    const std::size_t taken = overhead_->pending.exchange(0, std::memory_order_acquire);
    auto r = up_.reap_pending();
    if (!r) {
      if (taken != 0) overhead_->pending.fetch_add(taken, std::memory_order_relaxed);
      return r;
    }
    overhead_->held.fetch_sub(taken, std::memory_order_release);
    return ok();
  }
  std::uint32_t device_ordinal() const noexcept { return up_.device_ordinal(); }

  const DebugGuardOptions& options() const noexcept { return opt_; }
  /// Blocks handed out and not yet freed.
  std::size_t live_blocks() const { return table_->size(); }

  // ---- forwarded ------------------------------------------------------------------

  result<void> record_block_use(const DeviceBlock& b, StreamId use) noexcept
    requires TrackingResource<Upstream>
  {
    if (b.empty()) return up_.record_block_use(b, use);
    const std::size_t g = opt_.guard_bytes;
    const DeviceBlock u{b.ptr() - g, b.bytes() + 2 * g, b.alloc_stream(), b.device_ordinal(), b.tag(), b.id()};
    return up_.record_block_use(u, use);
  }
  result<void> prepare_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Upstream>
  {
    return up_.prepare_block_use(id, use, a);
  }
  result<void> finish_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Upstream>
  {
    return up_.finish_block_use(id, use, a);
  }

  decltype(auto) driver() noexcept { return up_.driver(); }
  auto stream_handle(StreamId s) noexcept { return up_.stream_handle(s); }
  result<void> make_current() noexcept { return up_.make_current(); }

  Upstream& upstream() noexcept { return up_; }
  const Upstream& upstream() const noexcept { return up_; }

 private:
  /// Live blocks by id, with what was handed out, to refuse a forged block.
  class Table {
   public:
    enum class Found { taken, absent, mismatch };

    bool insert(const DeviceBlock& b) noexcept {
      Shard& s = shard(b.id());
      try {
        std::lock_guard lock(s.mu);
        s.map.insert_or_assign(key(b.id()), Info{b.ptr(), b.bytes(), b.device_ordinal(), b.alloc_stream(), b.tag()});
      } catch (...) {
        return false;
      }
      return true;
    }
    /// Removes `b`'s entry when it is there and matches.
    Found take(const DeviceBlock& b) noexcept {
      Shard& s = shard(b.id());
      std::lock_guard lock(s.mu);
      auto it = s.map.find(key(b.id()));
      if (it == s.map.end()) return Found::absent;
      const Info& i = it->second;
      if (i.ptr != b.ptr() || i.bytes != b.bytes() || i.ordinal != b.device_ordinal() ||
          i.stream != b.alloc_stream() || i.tag != b.tag()) {
        return Found::mismatch;
      }
      s.map.erase(it);
      return Found::taken;
    }
    /// Undoes take() (the node was just freed, so the insert has room).
    void put_back(const DeviceBlock& b) noexcept { (void)insert(b); }
    std::size_t size() const {
      std::size_t n = 0;
      for (auto& s : shards_) {
        std::lock_guard lock(s.mu);
        n += s.map.size();
      }
      return n;
    }

   private:
    struct Info {
      std::uint64_t ptr;
      std::size_t bytes;
      std::uint32_t ordinal;
      StreamId stream;
      AllocTag tag;
    };
    struct alignas(64) Shard {
      mutable std::mutex mu;
      std::unordered_map<std::uint64_t, Info> map;
    };
    static std::uint64_t key(BlockId id) noexcept {
      // owner, index and generation fold into 64 bits: the index and generation of one
      // owner (the upstream) are what distinguish live blocks.
      return (std::uint64_t{id.generation} << 32 | id.index) ^ (std::uint64_t{id.owner} << 48);
    }
    Shard& shard(BlockId id) noexcept { return shards_[(id.index ^ id.generation) % shards_.size()]; }
    std::array<Shard, 16> shards_;
  };

  result<typename Upstream::driver_type::stream_t> handle(StreamId s) noexcept {
    if (auto r = up_.make_current(); !r) return std::move(r).error();
    return up_.stream_handle(s);
  }

  static std::string hex(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
  }

  /// Copies the guards back and compares them. The value is the corruption report
  /// (empty: intact); an error means the check itself failed.
  result<std::string> check(const DeviceBlock& b) noexcept {
    const std::size_t g = opt_.guard_bytes;
    if (g == 0) return std::string{};
    auto h = handle(b.alloc_stream());
    if (!h) return std::move(h).error();
    if constexpr (TrackingResource<Upstream>) {
      // Read the guards only after every tracked use on another stream (the free itself
      // will wait for the same uses).
      if (auto r = up_.prepare_block_use(b.id(), b.alloc_stream(), Access::ReadWrite); !r) {
        return std::move(r).error();
      }
    }
    std::vector<std::uint8_t> host;
    try {
      host.resize(2 * g);
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted copying guard bytes back"};
    }
    auto& d = up_.driver();
    if (auto r = d.memcpy_dtoh_async(host.data(), b.ptr() - g, g, *h); !r) return std::move(r).error();
    if (auto r = d.memcpy_dtoh_async(host.data() + g, b.ptr() + b.bytes(), g, *h); !r) {
      return std::move(r).error();
    }
    if (auto r = d.stream_synchronize(*h); !r) return std::move(r).error();
    for (std::size_t i = 0; i < 2 * g; ++i) {
      if (host[i] == opt_.pattern) continue;
      const bool front = i < g;
      const std::size_t offset = front ? i : i - g;
      char found[8], expected[8];
      std::snprintf(found, sizeof found, "0x%02x", host[i]);
      std::snprintf(expected, sizeof expected, "0x%02x", opt_.pattern);
      return "block " + b.id().to_string() + " (tag " + std::to_string(b.tag().value) + ", " +
             std::to_string(b.bytes()) + " bytes at " + hex(b.ptr()) + ", stream " +
             std::to_string(b.alloc_stream().value) + "): " + (front ? "front" : "back") +
             " guard overwritten at offset " + std::to_string(offset) + " of " + std::to_string(g) +
             (front ? " (counting from the guard's start, " + std::to_string(g - offset) +
                          " bytes before the block)"
                    : " (the block's byte " + std::to_string(b.bytes() + offset) + ")") +
             ": found " + found + ", expected " + expected + "; the block was freed";
    }
    return std::string{};
  }

  /// Guard bytes the upstream counts in its bytes_outstanding: those of live blocks and
  /// of frees not yet reaped (taken at reap exactly as Budget takes its pending credit).
  struct Overhead {
    std::atomic<std::size_t> held{0};
    std::atomic<std::size_t> pending{0};
    void freed(std::size_t n, bool synchronous) noexcept {
      if (synchronous) {
        held.fetch_sub(n, std::memory_order_release);
      } else {
        pending.fetch_add(n, std::memory_order_release);
      }
    }
  };

  [[no_unique_address]] Upstream up_;
  DebugGuardOptions opt_;
  std::unique_ptr<Table> table_;
  std::unique_ptr<Overhead> overhead_ = std::make_unique<Overhead>();
};

static_assert(GuardableResource<detail::DriverArchetype>);
static_assert(TrackingResource<DebugGuard<detail::DriverArchetype>>);
static_assert(DriverResource<DebugGuard<detail::DriverArchetype>>);

}  // namespace xlogrt
