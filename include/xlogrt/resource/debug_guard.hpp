// SPDX-License-Identifier: Apache-2.0
#pragma once

// DebugGuard<Up>: guard bytes around every block, checked when it is freed.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/detail/archetypes.hpp"

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
  /// The largest guard DebugGuard accepts (1 GiB): far beyond any use, and small enough
  /// that a block's size plus both guards cannot overflow unnoticed.
  static constexpr std::size_t MAX_GUARD_BYTES = std::size_t{1} << 30;
  /// Guards are a multiple of this, so that the caller's pointer keeps 8-byte alignment.
  static constexpr std::size_t GUARD_ALIGN = 8;

  /// Before and after every block (0: no guards, poison only). A multiple of 8, at most
  /// MAX_GUARD_BYTES. The caller's pointer is the upstream's plus guard_bytes, so it is
  /// aligned to the largest power of two dividing guard_bytes (at most the upstream's
  /// alignment, 256 for CUDA): keep a multiple of 256, as the default is, for kernels
  /// that need cudaMalloc's alignment.
  std::size_t guard_bytes = 256;
  std::uint8_t pattern = 0xA5;  ///< what the guards are filled with
  std::uint8_t poison = 0xDD;   ///< what a freed block (guards included) is filled with
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
/// free, a block of another resource: its id, pointer, size, stream, ordinal and tag are
/// all compared) goes to the upstream untouched, which names the error.
/// bytes_outstanding() is the upstream's less the guard bytes of live blocks, so it counts
/// what callers asked for, as the contract says (exact whenever no call is in flight). A
/// free queued by an asynchronous upstream counts its whole upstream block, guards
/// included, until reap_pending sees it complete: those bytes are still the upstream's.
///
/// Driver failures lose nothing:
/// - If the upstream refuses the free after the check (a driver error), the block stays
///   with the caller and stays live, its guards are written again, but its contents have
///   already been poisoned: a debugging tool's trade, rather than a host copy of every
///   block. The poison and the new guards are writes on the alloc stream: over a tracking
///   upstream they are recorded as a use there (finish_block_use), so later uses on other
///   streams wait for them; over one that does not track, the alloc stream is
///   synchronised before the block goes back. When the guards cannot be written again,
///   the error says so and the block's next free does not check them (it would report a
///   corruption nobody caused).
/// - When a copy of the guards back to the host was queued and a later step of the check
///   fails, the host buffer it writes is kept (never returned to the heap while a copy
///   may still write it) until a later synchronisation of that stream succeeds: the next
///   check on it, or reap_pending. One still kept when the DebugGuard is destroyed is
///   leaked on purpose.
/// - When a step of allocate after the upstream's allocation fails and giving that block
///   back fails too, DebugGuard keeps the upstream block and frees it again at each later
///   allocate, deallocate and reap_pending until the upstream takes it
///   (unfreed_blocks() counts them; bytes_outstanding() counts their bytes meanwhile, so
///   the accounting sees them).
///
/// Errors (deallocate): guard_corrupted (freed); a driver error while checking (not
/// freed, the block stays with the caller); foreign_block for a block whose pointer,
/// size, stream, ordinal or tag does not match the one handed out under its id;
/// double_free for a block another call is freeing right now; whatever the upstream
/// returns.
///
/// Thread-safe. Live blocks are kept in 16 shards, each under its own mutex, picked by
/// BlockId. Construction and moves happen-before use.
template <GuardableResource Upstream>
class DebugGuard : public Adaptor<Upstream> {
 public:
  using Adaptor<Upstream>::upstream;

  /// Options out of range are clamped (guard_bytes to MAX_GUARD_BYTES, then up to a
  /// multiple of 8); create() refuses them instead.
  explicit DebugGuard(Upstream up, DebugGuardOptions options = {})
      : Adaptor<Upstream>(std::move(up)), opt_(clamped(options)), table_(std::make_unique<Table>()) {}

  /// Errors: invalid_argument for guard_bytes above MAX_GUARD_BYTES or not a multiple of
  /// 8; out_of_memory when host memory runs out.
  static result<DebugGuard> create(Upstream upstream, DebugGuardOptions options = {}) noexcept {
    if (auto bad = invalid(options)) return std::move(*bad);
    try {
      return DebugGuard(std::move(upstream), options);
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted building a DebugGuard"};
    }
  }

  /// Errors: too_large when the guards would overflow the size; the upstream's errors; a
  /// driver error writing the guards (the upstream block is freed again, or kept and
  /// freed later when that fails too: see the class comment).
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    free_unfreed();
    if (bytes == 0) return upstream().allocate(bytes, stream, tag);  // the upstream names it
    const std::size_t g = opt_.guard_bytes;  // <= MAX_GUARD_BYTES: 2 * g cannot wrap
    if (bytes > std::numeric_limits<std::size_t>::max() - 2 * g) {
      return error{errc::too_large, "a request of " + std::to_string(bytes) + " bytes plus 2 guards of " +
                                        std::to_string(g) + " bytes overflows the size type"};
    }
    auto u = upstream().allocate(bytes + 2 * g, stream, tag);
    if (!u) return u;
    auto undo = [&](error e) -> result<DeviceBlock> {
      auto f = upstream().deallocate(std::move(*u));
      if (f || u->empty()) return e;  // a queued free counts, guards included, until reaped
      const bool kept = keep_unfreed(std::move(*u));
      return error{e.code(),
                   e.message() + "; giving the upstream block back failed too (" + f.error().what() +
                       (kept ? "): DebugGuard keeps it and frees it again at its next call"
                             : "): host memory ran out keeping it, and it is leaked (the upstream still counts it)"),
                   e.driver_status()};
    };
    if (g != 0) {
      auto h = handle(stream);
      if (!h) return undo(std::move(h).error());
      auto& d = upstream().driver();
      if (auto r = d.memset_d8_async(u->ptr(), opt_.pattern, g, *h); !r) return undo(std::move(r).error());
      if (auto r = d.memset_d8_async(u->ptr() + g + bytes, opt_.pattern, g, *h); !r) {
        return undo(std::move(r).error());
      }
    }
    DeviceBlock out{u->ptr() + g, bytes, stream, u->device_ordinal(), tag, u->id()};
    if (!table_->insert(out)) {
      return undo(error{errc::out_of_memory, "host memory exhausted recording a guarded block"});
    }
    guards_held_->fetch_add(2 * g, std::memory_order_release);
    DeviceBlock forgotten = std::move(*u);  // rebuilt from `out` at free
    return out;
  }

  result<void> deallocate(DeviceBlock&& b) noexcept {
    free_unfreed();
    if (b.empty()) return upstream().deallocate(std::move(b));
    bool guarded = true;
    switch (table_->take(b, guarded)) {
      case Table::Found::taken: break;
      case Table::Found::absent: return upstream().deallocate(std::move(b));
      case Table::Found::busy:
        return error{errc::double_free, "block " + b.id().to_string() + " is being freed by another call"};
      case Table::Found::mismatch:
        return error{errc::foreign_block, "block " + b.id().to_string() + " (" + std::to_string(b.bytes()) +
                                              " bytes at " + hex(b.ptr()) + ", ordinal " +
                                              std::to_string(b.device_ordinal()) + ", stream " +
                                              std::to_string(b.alloc_stream().value) + ", tag " +
                                              std::to_string(b.tag().value) +
                                              ") does not match the block DebugGuard handed out under that id"};
    }
    // From here on the entry is taken (marked busy); every refusal gives it back.
    const std::size_t g = opt_.guard_bytes;
    auto h = handle(b.alloc_stream());
    if (!h) {
      table_->give_back(b, guarded);
      return std::move(h).error();
    }
    if constexpr (TrackingResource<Upstream>) {
      // The guards are read and the block poisoned on the alloc stream: only after every
      // tracked use on another stream (the free itself will wait for the same uses).
      if (auto r = upstream().prepare_block_use(b.id(), b.alloc_stream(), Access::ReadWrite); !r) {
        table_->give_back(b, guarded);
        return r;
      }
    }
    result<std::string> verdict = guarded ? check(b, *h) : result<std::string>{std::string{}};
    if (!verdict) {
      table_->give_back(b, guarded);
      return std::move(verdict).error();
    }
    DeviceBlock u{b.ptr() - g, b.bytes() + 2 * g, b.alloc_stream(), b.device_ordinal(), b.tag(), b.id()};
    if (auto r = upstream().driver().memset_d8_async(u.ptr(), opt_.poison, u.bytes(), *h); !r) {
      table_->give_back(b, guarded);  // not queued: the block is as it was
      return r;
    }
    auto r = upstream().deallocate(std::move(u));
    if (!r && !u.empty()) return refused(b, *h, std::move(r).error());
    // The upstream took the block (a failed free that consumed it included): it is gone.
    table_->erase(b);
    guards_held_->fetch_sub(2 * g, std::memory_order_release);
    DeviceBlock gone = std::move(b);
    if (verdict->empty()) return r;
    return error{errc::guard_corrupted, std::move(*verdict) + (r ? "" : "; then " + r.error().what())};
  }

  std::size_t bytes_outstanding() const noexcept {
    const std::size_t extra = guards_held_->load(std::memory_order_acquire);
    const std::size_t all = upstream().bytes_outstanding();
    return all > extra ? all - extra : 0;
  }
  /// Frees again the upstream blocks a failed allocate kept, releases the host buffers of
  /// failed checks whose stream now synchronises, and reaps the upstream.
  result<void> reap_pending() noexcept {
    free_unfreed();
    release_parked(std::nullopt);
    return upstream().reap_pending();
  }

  const DebugGuardOptions& options() const noexcept { return opt_; }
  /// Blocks handed out and not yet freed.
  std::size_t live_blocks() const { return table_->size(); }
  /// Upstream blocks a failed allocate could not give back yet (see the class comment).
  std::size_t unfreed_blocks() const noexcept { return spill_->unfreed_count.load(std::memory_order_acquire); }
  /// Host buffers of failed checks kept until their stream synchronises.
  std::size_t parked_buffers() const noexcept { return spill_->parked_count.load(std::memory_order_acquire); }

  // ---- tracking: a user's block is the inner part of the upstream's ----

  result<void> record_block_use(const DeviceBlock& b, StreamId use) noexcept
    requires TrackingResource<Upstream>
  {
    if (b.empty()) return upstream().record_block_use(b, use);
    const std::size_t g = opt_.guard_bytes;
    const DeviceBlock u{b.ptr() - g, b.bytes() + 2 * g, b.alloc_stream(), b.device_ordinal(), b.tag(), b.id()};
    return upstream().record_block_use(u, use);
  }
  /// A recycled block would skip the poison and the guard check: a caching layer goes
  /// below DebugGuard, never above it.
  result<DeviceBlock> recycle_block(DeviceBlock&, StreamId, Recycle = Recycle::live) noexcept = delete;
  bool unpark_block(BlockId, AllocTag) noexcept = delete;

 private:
  /// Live blocks by id, with what was handed out, to refuse a forged block.
  class Table {
   public:
    enum class Found { taken, absent, mismatch, busy };

    bool insert(const DeviceBlock& b) noexcept {
      Shard& s = shard(b.id());
      try {
        std::lock_guard lock(s.mu);
        s.map.insert_or_assign(b.id(), Info{b.ptr(), b.bytes(), b.device_ordinal(), b.alloc_stream(), b.tag()});
      } catch (...) {
        return false;
      }
      return true;
    }
    /// Marks `b`'s entry busy when it is there, matches and is not busy; `guarded` says
    /// whether its guards hold the pattern. The entry stays (erase() or give_back()
    /// ends the take), so giving it back cannot fail.
    Found take(const DeviceBlock& b, bool& guarded) noexcept {
      Shard& s = shard(b.id());
      std::lock_guard lock(s.mu);
      auto it = s.map.find(b.id());
      if (it == s.map.end()) return Found::absent;
      Info& i = it->second;
      if (i.ptr != b.ptr() || i.bytes != b.bytes() || i.ordinal != b.device_ordinal() ||
          i.stream != b.alloc_stream() || i.tag != b.tag()) {
        return Found::mismatch;
      }
      if (i.busy) return Found::busy;
      i.busy = true;
      guarded = i.guarded;
      return Found::taken;
    }
    /// Ends a take: the block was freed.
    void erase(const DeviceBlock& b) noexcept {
      Shard& s = shard(b.id());
      std::lock_guard lock(s.mu);
      s.map.erase(b.id());
    }
    /// Ends a take: the block stays live, its guards holding the pattern or not.
    void give_back(const DeviceBlock& b, bool guarded) noexcept {
      Shard& s = shard(b.id());
      std::lock_guard lock(s.mu);
      if (auto it = s.map.find(b.id()); it != s.map.end()) {
        it->second.busy = false;
        it->second.guarded = guarded;
      }
    }
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
      bool busy = false;     // a free is in progress
      bool guarded = true;   // the guards hold the pattern
    };
    /// The whole id is the key: owner, index and generation (a forged block that differs
    /// in any bit of any of them is not the live block).
    struct KeyHash {
      std::size_t operator()(const BlockId& id) const noexcept {
        std::uint64_t h = (std::uint64_t{id.generation} << 32 | id.index) * 0x9E3779B97F4A7C15ULL;
        h ^= std::uint64_t{id.owner} * 0xC2B2AE3D27D4EB4FULL;
        return static_cast<std::size_t>(h ^ (h >> 29));
      }
    };
    struct alignas(64) Shard {
      mutable std::mutex mu;
      std::unordered_map<BlockId, Info, KeyHash> map;
    };
    Shard& shard(BlockId id) noexcept { return shards_[(id.index ^ id.generation) % shards_.size()]; }
    std::array<Shard, 16> shards_;
  };

  static std::optional<error> invalid(const DebugGuardOptions& o) {
    if (o.guard_bytes > DebugGuardOptions::MAX_GUARD_BYTES) {
      return error{errc::invalid_argument, "DebugGuardOptions: guard_bytes is " + std::to_string(o.guard_bytes) +
                                               ", above " + std::to_string(DebugGuardOptions::MAX_GUARD_BYTES)};
    }
    if (o.guard_bytes % DebugGuardOptions::GUARD_ALIGN != 0) {
      return error{errc::invalid_argument, "DebugGuardOptions: guard_bytes is " + std::to_string(o.guard_bytes) +
                                               ", not a multiple of 8 (the block's pointer would lose its alignment)"};
    }
    return std::nullopt;
  }
  static DebugGuardOptions clamped(DebugGuardOptions o) noexcept {
    constexpr std::size_t a = DebugGuardOptions::GUARD_ALIGN;
    o.guard_bytes = (std::min(o.guard_bytes, DebugGuardOptions::MAX_GUARD_BYTES) + a - 1) / a * a;
    return o;
  }

  result<typename Upstream::driver_type::stream_t> handle(StreamId s) noexcept {
    if (auto r = upstream().make_current(); !r) return std::move(r).error();
    return upstream().stream_handle(s);
  }

  static std::string hex(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
  }

  /// The upstream refused the free of `b` (taken from the table, poisoned on stream `h`)
  /// and left it with the caller: writes its guards again, orders those writes and the
  /// poison before the block's later uses, and gives the entry back.
  result<void> refused(const DeviceBlock& b, typename Upstream::driver_type::stream_t h, error why) noexcept {
    const std::size_t g = opt_.guard_bytes;
    auto& d = upstream().driver();
    std::string trouble;
    bool guarded = true;
    if (g != 0) {
      auto front = d.memset_d8_async(b.ptr() - g, opt_.pattern, g, h);
      auto back = front ? d.memset_d8_async(b.ptr() + b.bytes(), opt_.pattern, g, h) : result<void>{};
      if (!front || !back) {
        guarded = false;
        trouble += "; the guards could not be written again (" + (front ? back : front).error().what() +
                   "), so the block's next free does not check them";
      }
    }
    if constexpr (TrackingResource<Upstream>) {
      if (auto r = upstream().finish_block_use(b.id(), b.alloc_stream(), Access::Write); !r) {
        trouble += "; recording the poison as a write on stream " + std::to_string(b.alloc_stream().value) +
                   " failed (" + r.error().what() + ")";
      }
    } else {
      if (auto r = d.stream_synchronize(h); !r) {
        trouble += "; waiting for the poison on stream " + std::to_string(b.alloc_stream().value) + " failed (" +
                   r.error().what() + "): order later uses after that stream";
      }
    }
    table_->give_back(b, guarded);
    if (trouble.empty()) return why;
    return error{why.code(), why.message() + trouble, why.driver_status()};
  }

  /// Copies the guards back on stream `h` and compares them. The value is the corruption
  /// report (empty: intact); an error means the check itself failed.
  result<std::string> check(const DeviceBlock& b, typename Upstream::driver_type::stream_t h) noexcept {
    const std::size_t g = opt_.guard_bytes;
    if (g == 0) return std::string{};
    std::unique_ptr<std::uint8_t[]> host(new (std::nothrow) std::uint8_t[2 * g]);
    if (!host) return error{errc::out_of_memory, "host memory exhausted copying guard bytes back"};
    auto& d = upstream().driver();
    // A failed call queued nothing; once a copy is queued, the buffer outlives it.
    if (auto r = d.memcpy_dtoh_async(host.get(), b.ptr() - g, g, h); !r) return std::move(r).error();
    if (auto r = d.memcpy_dtoh_async(host.get() + g, b.ptr() + b.bytes(), g, h); !r) {
      park(b.alloc_stream(), std::move(host));
      return std::move(r).error();
    }
    if (auto r = d.stream_synchronize(h); !r) {
      park(b.alloc_stream(), std::move(host));
      return std::move(r).error();
    }
    release_parked(b.alloc_stream());  // the synchronisation completed their copies too
    const std::uint8_t* bytes = host.get();
    for (std::size_t i = 0; i < 2 * g; ++i) {
      if (bytes[i] == opt_.pattern) continue;
      const bool front = i < g;
      const std::size_t offset = front ? i : i - g;
      char found[8], expected[8];
      std::snprintf(found, sizeof found, "0x%02x", bytes[i]);
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

  /// Keeps a host buffer that a queued copy on `stream` may still write.
  void park(StreamId stream, std::unique_ptr<std::uint8_t[]> buf) noexcept {
    Spill& sp = *spill_;
    std::lock_guard lock(sp.mu);
    try {
      sp.parked.push_back(Parked{stream, std::move(buf)});
      sp.parked_count.store(sp.parked.size(), std::memory_order_release);
    } catch (...) {
      (void)buf.release();  // host memory ran out: leaked, never freed under the copy
    }
  }
  /// Frees the parked buffers of `stream` (all streams: nullopt) whose stream has
  /// synchronised: at once for `stream`, whose caller has just synchronised it; for the
  /// others, after a synchronisation made here.
  void release_parked(std::optional<StreamId> synced) noexcept {
    Spill& sp = *spill_;
    if (sp.parked_count.load(std::memory_order_acquire) == 0) return;
    std::lock_guard lock(sp.mu);
    std::vector<StreamId> done;
    for (std::size_t i = 0; i < sp.parked.size();) {
      const StreamId s = sp.parked[i].stream;
      bool free_it = synced && *synced == s;
      if (!synced) {
        free_it = std::find(done.begin(), done.end(), s) != done.end();
        if (!free_it) {
          auto h = handle(s);
          free_it = h && upstream().driver().stream_synchronize(*h);
          if (free_it) {
            try {
              done.push_back(s);
            } catch (...) {
            }
          }
        }
      }
      if (free_it) {
        sp.parked[i] = std::move(sp.parked.back());
        sp.parked.pop_back();
      } else {
        ++i;
      }
    }
    sp.parked_count.store(sp.parked.size(), std::memory_order_release);
  }

  /// Keeps an upstream block that allocate could not give back. False when host memory
  /// ran out (the block is then lost to DebugGuard; the upstream still counts it).
  bool keep_unfreed(DeviceBlock&& u) noexcept {
    Spill& sp = *spill_;
    std::lock_guard lock(sp.mu);
    try {
      sp.unfreed.push_back(std::move(u));
    } catch (...) {
      return false;
    }
    sp.unfreed_count.store(sp.unfreed.size(), std::memory_order_release);
    return true;
  }
  /// Frees again the blocks keep_unfreed kept; those the upstream refuses stay.
  void free_unfreed() noexcept {
    Spill& sp = *spill_;
    if (sp.unfreed_count.load(std::memory_order_acquire) == 0) [[likely]] return;
    std::lock_guard lock(sp.mu);
    for (std::size_t i = 0; i < sp.unfreed.size();) {
      (void)upstream().deallocate(std::move(sp.unfreed[i]));
      if (sp.unfreed[i].empty()) {
        sp.unfreed[i] = std::move(sp.unfreed.back());
        sp.unfreed.pop_back();
      } else {
        ++i;
      }
    }
    sp.unfreed_count.store(sp.unfreed.size(), std::memory_order_release);
  }

  /// What driver failures left behind: host buffers queued copies may still write, and
  /// upstream blocks a failed allocate could not give back. Both are rare; the counts let
  /// the common path skip the lock.
  struct Parked {
    StreamId stream;
    std::unique_ptr<std::uint8_t[]> buf;
  };
  struct Spill {
    std::mutex mu;
    std::vector<Parked> parked;
    std::vector<DeviceBlock> unfreed;
    std::atomic<std::size_t> parked_count{0};
    std::atomic<std::size_t> unfreed_count{0};
    ~Spill() {
      for (Parked& p : parked) (void)p.buf.release();  // a copy may still write it: leaked
    }
  };

  DebugGuardOptions opt_;
  std::unique_ptr<Table> table_;
  /// Guard bytes of live blocks, which the upstream counts and the caller did not ask for.
  /// A freed block's leave at its free: the upstream block still counts whole until the
  /// upstream reaps it, so no reap (not even one that fails part way) has any to settle.
  std::unique_ptr<std::atomic<std::size_t>> guards_held_ = std::make_unique<std::atomic<std::size_t>>(0);
  std::unique_ptr<Spill> spill_ = std::make_unique<Spill>();
};

static_assert(GuardableResource<detail::DriverArchetype>);
static_assert(TrackingResource<DebugGuard<detail::DriverArchetype>>);
static_assert(DriverResource<DebugGuard<detail::DriverArchetype>>);

}  // namespace xlogrt
