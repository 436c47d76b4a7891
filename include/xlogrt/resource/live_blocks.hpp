// SPDX-License-Identifier: Apache-2.0
#pragma once

// LiveBlocks<Up>: a table of the blocks live now — address, size, tag, stream, the
// allocating thread and the time — that a program can dump at any moment, when an
// allocation fails say, like torch.cuda.memory_snapshot(). The dump is a CSV in
// Logging's format (one `allocate` line per live block, the latest failed allocate, and
// a sample of what the stack below held then: stack_sample.hpp), so tools/memviz draws
// it as it draws a log, and log_replay replays it.
//
// Why its own decorator, not Logging or Statistics: Logging streams records to a sink
// and keeps nothing, Statistics keeps counters, not blocks; a table of live blocks is a
// third kind of state, wanted also in stacks that log nothing (the OOM dump of a
// production run). Stack it anywhere above the base resource.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
#include "xlogrt/resource/detail/log_record.hpp"
#include "xlogrt/resource/detail/spin_lock.hpp"
#include "xlogrt/resource/detail/stripes.hpp"
#include "xlogrt/resource/stack_sample.hpp"

namespace xlogrt {

/// What LiveBlocks::snapshot() saw. Not thread-safe: a value, owned by one thread at a time.
struct LiveBlocksSnapshot {
  /// One `allocate` record per live block (thread, time, address, size, stream, tag of
  /// its allocation), oldest first.
  std::vector<LogRecord> blocks;
  /// The latest allocation the upstream refused while recording, if any.
  std::optional<LogRecord> last_failure;
  /// Allocations refused while recording, in all.
  std::uint64_t failures = 0;
  /// Blocks that could not be recorded (host memory ran out): the table misses them.
  std::uint64_t lost = 0;
  /// What the stack below held when the snapshot was taken (sample lines: held, cached,
  /// queued, the pool's counters, each where a layer reports it), after the blocks.
  std::vector<LogRecord> sample;
  std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& r : blocks) n += r.bytes;
    return n;
  }
  /// The snapshot in Logging's CSV format, the header first: the blocks and the last
  /// failure, in time order, then the sample.
  std::string csv() const {
    std::vector<LogRecord> all = blocks;
    if (last_failure) {
      const auto at = std::upper_bound(all.begin(), all.end(), *last_failure,
                                       [](const LogRecord& a, const LogRecord& b) { return a.time_ns < b.time_ns; });
      all.insert(at, *last_failure);
    }
    all.insert(all.end(), sample.begin(), sample.end());
    return detail::log_csv(all);
  }
  /// Writes csv() to `path` (truncated). Errors: sink_failure naming the path and why.
  result<void> save(const std::string& path) const {
    const std::string text = csv();
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      const int e = errno;
      return error{errc::sink_failure, "cannot open snapshot file '" + path + "' for writing: " + std::strerror(e)};
    }
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written) {
      return error{errc::sink_failure, "writing snapshot file '" + path + "' failed"};
    }
    return ok();
  }
};

/// Not thread-safe: a value, owned by one thread at a time.
struct LiveBlocksOptions {
  /// Whether allocations are recorded from the start (set_recording switches it later).
  bool recording = true;
};

/// Records every block the stack below it hands out while recording is on, and forgets
/// it when it is freed; snapshot() lists those still live.
///
/// Cost. Recording off: an allocate reads one flag; a deallocate reads the count of the
/// block's shard, a line nobody writes while nothing is recorded there (blocks recorded
/// before recording was switched off are still forgotten when freed, so the table never
/// holds a freed block). Recording on: the OS thread id (cached per thread), the clock,
/// and an insert into one of SHARDS hash maps, each under its own spin lock, picked by
/// the address, so threads meet on a lock only when their blocks hash alike; a free
/// looks its entry up, and erases it once the upstream has accepted, under the same lock.
/// A failed allocate while recording updates the
/// last-failure record under one more lock (a cold path).
///
/// A free leaves the table only once the upstream has accepted it, and only the entry it
/// found: every insert gives its entry a serial (per shard, under the shard's lock), the
/// free notes the serial of the entry at its address before it calls the upstream and,
/// once the upstream has accepted, erases the entry at that address only if it still
/// bears that serial. So:
///   - a refused free (forged, stale, double, or a driver failure) changes nothing: the
///     block stays with the caller and in the table, and a refusal never puts back an
///     entry that the owner's real free has taken out meanwhile (the free a forger races
///     with leaves no freed block in the table for ever);
///   - an allocate that gets the same address back while the free is on its way out
///     replaces the entry (insert_or_assign, a new serial), and the free, seeing another
///     serial, leaves the new block's entry alone.
/// Between the upstream's acceptance and the erase a snapshot may still list the block:
/// a snapshot is a view of a moment per shard, and that block was live a moment ago.
///
/// Memory orders. The shard count is written under the shard's lock and read relaxed by
/// deallocate: the block's allocate (and so its insert) happened-before its free, via
/// the caller's own hand-off of the block, so the freeing thread sees a count that
/// includes it.
///
/// Thread-safe. Construction and moves happen-before use.
template <DeviceMemoryResource Upstream>
class LiveBlocks : public Adaptor<Upstream> {
 public:
  using Adaptor<Upstream>::upstream;
  static constexpr std::size_t SHARDS = 64;

  explicit LiveBlocks(Upstream up, LiveBlocksOptions options = {})
      : Adaptor<Upstream>(std::move(up)), state_(std::make_unique<State>()) {
    state_->recording.store(options.recording, std::memory_order_relaxed);
  }

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    auto b = upstream().allocate(bytes, stream, tag);
    if (state_->recording.load(std::memory_order_relaxed)) {
      if (b) {
        record(*b, stream, tag);
      } else {
        record_failure(bytes, stream, tag);
      }
    }
    return b;
  }

  result<void> deallocate(DeviceBlock&& block) noexcept {
    const std::uint64_t p = block.ptr();
    Shard& s = state_->shard(p);
    if (block.empty() || s.count.load(std::memory_order_relaxed) == 0) {
      return upstream().deallocate(std::move(block));
    }
    std::optional<std::uint64_t> serial;  // of the entry this free would take out
    {
      std::lock_guard lock(s.lock);
      if (auto it = s.map.find(p); it != s.map.end()) serial = it->second.serial;
    }
    auto r = upstream().deallocate(std::move(block));
    if (r && serial) {  // accepted: forget the entry found, unless it has been replaced since
      std::lock_guard lock(s.lock);
      if (auto it = s.map.find(p); it != s.map.end() && it->second.serial == *serial) {
        s.map.erase(it);
        s.count.store(s.map.size(), std::memory_order_relaxed);
      }
    }
    return r;  // refused: the table is as it was, the block still live with its caller
  }


  /// Switches recording of new allocations on or off (blocks already recorded stay
  /// until they are freed).
  void set_recording(bool on) noexcept { state_->recording.store(on, std::memory_order_relaxed); }
  bool recording() const noexcept { return state_->recording.load(std::memory_order_relaxed); }

  /// The blocks live now, among those allocated while recording. Each shard is read
  /// under its lock, one after another: a view of a moment per shard, not a stop of the
  /// world. Allocates; not for the hot path.
  LiveBlocksSnapshot snapshot() const {
    LiveBlocksSnapshot out;
    State& st = *state_;
    for (Shard& s : st.shards) {
      std::lock_guard lock(s.lock);
      for (const auto& [p, e] : s.map) out.blocks.push_back(e.record(p));
    }
    std::sort(out.blocks.begin(), out.blocks.end(), [](const LogRecord& a, const LogRecord& b) {
      return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.ptr < b.ptr;
    });
    {
      std::lock_guard lock(st.failure_lock);
      out.last_failure = st.last_failure;
      out.failures = st.failures;
    }
    out.lost = st.lost.load(std::memory_order_relaxed);
    const std::uint64_t thread = detail::os_thread_id();
    const std::int64_t now = detail::now_ns();
    for_each_figure(sample_stack(upstream()), [&](LogAction a, std::size_t v) {
      out.sample.push_back(LogRecord{thread, now, a, 0, v, StreamId{0}, AllocTag{0}});
    });
    return out;
  }

 private:
  struct Entry {
    std::uint64_t thread;
    std::int64_t time_ns;
    std::size_t bytes;
    StreamId stream;
    AllocTag tag;
    std::uint64_t serial = 0;  // set by insert: which recording of the address this is
    LogRecord record(std::uint64_t ptr) const noexcept {
      return LogRecord{thread, time_ns, LogAction::allocate, ptr, bytes, stream, tag};
    }
  };
  struct alignas(detail::STRIPE_ALIGN) Shard {
    detail::SpinLock lock;
    std::atomic<std::size_t> count{0};  // map.size(), readable without the lock
    std::uint64_t next_serial = 0;       // under the lock
    std::unordered_map<std::uint64_t, Entry> map;
  };
  struct State {
    std::atomic<bool> recording{true};
    std::atomic<std::uint64_t> lost{0};
    Shard shards[SHARDS];
    detail::SpinLock failure_lock;
    std::optional<LogRecord> last_failure;
    std::uint64_t failures = 0;

    /// Device addresses are aligned to at least 256 bytes: hash the bits above.
    Shard& shard(std::uint64_t ptr) noexcept {
      return shards[((ptr >> 8) * 0x9E3779B97F4A7C15ULL) >> 58];  // the top log2(SHARDS) bits
    }
  };
  static_assert(SHARDS == 64, "shard() takes the top 6 bits of the hash");

  void record(const DeviceBlock& b, StreamId stream, AllocTag tag) noexcept {
    const std::uint64_t p = b.ptr();
    insert(state_->shard(p), p, Entry{detail::os_thread_id(), detail::now_ns(), b.bytes(), stream, tag, 0});
  }

  void insert(Shard& s, std::uint64_t p, Entry e) noexcept {
    std::lock_guard lock(s.lock);
    e.serial = s.next_serial++;
    try {
      s.map.insert_or_assign(p, e);
      s.count.store(s.map.size(), std::memory_order_relaxed);
    } catch (...) {  // host memory ran out: the block goes unrecorded, and is counted
      state_->lost.fetch_add(1, std::memory_order_relaxed);
    }
  }

  [[gnu::cold]] void record_failure(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    const LogRecord r{detail::os_thread_id(), detail::now_ns(), LogAction::allocate_failure, 0, bytes, stream, tag};
    std::lock_guard lock(state_->failure_lock);
    state_->last_failure = r;
    ++state_->failures;
  }

  std::unique_ptr<State> state_;
};

static_assert(DeviceMemoryResource<LiveBlocks<detail::PlainArchetype>>);
static_assert(!TrackingResource<LiveBlocks<detail::PlainArchetype>>);
static_assert(TrackingResource<LiveBlocks<detail::TrackingArchetype>>);
static_assert(DriverResource<LiveBlocks<detail::DriverArchetype>>);

}  // namespace xlogrt
