// SPDX-License-Identifier: Apache-2.0
#pragma once

// Logging<Up, Sink>: one CSV record per allocate, failed allocate and free, in the
// column layout of RAPIDS RMM's logging_resource_adaptor (see detail/log_record.hpp for
// the exact format), so that logs from RMM's tools and ours read alike; and, on a clock,
// samples of what the stack below holds (stack_sample.hpp), so that a log shows the
// cached blocks, the queued frees and the pool's reserve beside the live bytes.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/detail/archetypes.hpp"
#include "xlogrt/resource/detail/log_record.hpp"
#include "xlogrt/resource/detail/log_writer.hpp"
#include "xlogrt/resource/stack_sample.hpp"
#include "xlogrt/runtime/env_config.hpp"

namespace xlogrt {

/// Where Logging sends its records.
/// - `S::enabled`: false makes Logging compile to its upstream (NullSink);
/// - `active()`: whether records are wanted now (a FileSink without a file is not);
/// - `write(record)`: never fails and never throws; a record it cannot keep is counted
///   in `dropped()`. It must not make every allocating thread queue on one lock;
/// - `flush()`: waits for what was written so far to reach its destination;
/// - optionally `sample_every()` (std::chrono::microseconds): how often Logging writes a
///   sample of the stack (zero, or no such member: never on its own; Logging::sample()
///   still writes one when asked).
template <class S>
concept LogSink = std::move_constructible<S> && requires(S& s, const S& cs, const LogRecord& r) {
  { S::enabled } -> std::convertible_to<bool>;
  { cs.active() } -> std::convertible_to<bool>;
  { s.write(r) } noexcept;
  { cs.dropped() } -> std::same_as<std::uint64_t>;
  { s.flush() } -> std::same_as<result<void>>;
};

/// Logs nothing; Logging<Up, NullSink> compiles to Up's own calls. Thread-safe; lock-free.
struct NullSink {
  static constexpr bool enabled = false;
  static constexpr bool active() noexcept { return false; }
  void write(const LogRecord&) noexcept {}
  std::uint64_t dropped() const noexcept { return 0; }
  result<void> flush() noexcept { return ok(); }
};

namespace detail {
/// What FileSink and OStreamSink share: a LogWriter (ring + writer thread), or none.
class WriterSink {
 public:
  static constexpr bool enabled = true;
  bool active() const noexcept { return w_ != nullptr; }
  void write(const LogRecord& r) noexcept {
    if (w_) w_->push(r);
  }
  std::uint64_t dropped() const noexcept { return w_ ? w_->dropped() : 0; }
  result<void> flush() noexcept { return w_ ? w_->flush() : ok(); }
  /// LogSinkOptions::sample_every of the open sink (zero without one).
  std::chrono::microseconds sample_every() const noexcept {
    return w_ ? w_->sample_every() : std::chrono::microseconds{0};
  }

 protected:
  std::unique_ptr<LogWriter> w_;
};
}  // namespace detail

/// Writes CSV to a file, truncated at open, through a lock-free ring drained by a writer
/// thread (allocating threads never wait for the file). A default-constructed FileSink
/// has no file and logs nothing (what an unset XLOGRT_LOG_FILE gives). Each batch is
/// flushed as it is written, so a sink that is never destroyed loses at most its last
/// milliseconds at exit. Destruction drains and closes.
///
/// Thread-safe. write() from any thread; construction and moves happen-before use,
/// destruction after.
class FileSink : public detail::WriterSink {
 public:

  FileSink() noexcept = default;

  /// Opens (creates or truncates) `path`, which must be a regular file, and writes the
  /// header line. Errors: sink_failure naming the path (escaped as detail::printable
  /// does: a path from the environment may hold a newline or an escape sequence) and the
  /// reason: the system's, or "is a FIFO" (a directory, a device ...).
  ///
  /// Never blocks: the file is opened O_NONBLOCK, so a FIFO without a reader fails at
  /// once (ENXIO) instead of waiting for one for ever, and anything that is not a regular
  /// file is refused by name, looked up before the open and checked again on the open
  /// descriptor (a path replaced between the two is caught). A FIFO or a device would
  /// take the writer thread's batches at its own pace, or not at all, and cannot be cut
  /// back to whole lines (see detail/log_writer.hpp).
  static result<FileSink> open(const std::string& path, LogSinkOptions options = {}) noexcept {
    auto fail = [&](const std::string& why) {
      return error{errc::sink_failure, "cannot open log file '" + detail::printable(path) + "' for writing: " + why};
    };
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return fail(not_regular(st.st_mode));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
    if (fd < 0) {
      const int e = errno;
      return fail(std::strerror(e));
    }
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const std::string why = S_ISREG(st.st_mode) ? std::string(std::strerror(errno)) : not_regular(st.st_mode);
      ::close(fd);
      return fail(why);
    }
    // A regular file never blocks; the writer's write(2) calls need no O_NONBLOCK.
    if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    auto w = detail::LogWriter::start(fd, nullptr, options);
    if (!w) {
      return error{errc::sink_failure, "log file '" + detail::printable(path) + "': " + w.error().message()};
    }
    FileSink s;
    s.w_ = std::move(*w);
    return s;
  }

 private:
  static std::string not_regular(mode_t mode) {
    const char* what = S_ISFIFO(mode)  ? "a FIFO"
                       : S_ISDIR(mode) ? "a directory"
                       : S_ISCHR(mode) ? "a character device"
                       : S_ISBLK(mode) ? "a block device"
                       : S_ISSOCK(mode) ? "a socket"
                                        : "not a regular file";
    return std::string("it is ") + what + ", not a regular file (a log file must be one)";
  }
};

/// Writes CSV to a caller's std::ostream (which must outlive the sink and not be written
/// by anyone else meanwhile), through the same ring and writer thread as FileSink.
///
/// Thread-safe. write() from any thread.
class OStreamSink : public detail::WriterSink {
 public:
  /// Errors: sink_failure when the header cannot be written or the thread not started.
  static result<OStreamSink> open(std::ostream& os, LogSinkOptions options = {}) noexcept {
    auto w = detail::LogWriter::start(-1, &os, options);
    if (!w) return std::move(w).error();
    OStreamSink s;
    s.w_ = std::move(*w);
    return s;
  }

 private:
  OStreamSink() noexcept = default;
};

/// Keeps the last `capacity` records in memory (older ones are overwritten, counted in
/// overwritten(), not dropped). For tests and for a crash handler that wants the recent
/// history. Samples the stack every `sample_every` (zero, the default: only when
/// Logging::sample() asks).
///
/// write: a ticket from one fetch_add picks the cell; each cell has its own tiny spin
/// lock, so writers contend only when the ring has wrapped onto a cell another writer is
/// filling. Thread-safe.
class RingSink {
 public:
  static constexpr bool enabled = true;

  explicit RingSink(std::size_t capacity = 4096, std::chrono::microseconds sample_every = {})
      : st_(std::make_unique<State>(capacity ? capacity : 1)), sample_every_(sample_every) {}

  bool active() const noexcept { return true; }
  std::chrono::microseconds sample_every() const noexcept { return sample_every_; }

  void write(const LogRecord& r) noexcept {
    const std::uint64_t t = st_->next.fetch_add(1, std::memory_order_relaxed);
    Cell& c = st_->cells[t % st_->capacity];
    lock(c);
    if (c.ticket <= t) {  // a slower writer never overwrites a newer record
      c.rec = r;
      c.ticket = t + 1;
    }
    c.busy.clear(std::memory_order_release);
  }

  std::uint64_t dropped() const noexcept { return 0; }
  result<void> flush() noexcept { return ok(); }

  /// Records written so far, oldest first (at most capacity; a record whose writer has
  /// not finished is left out).
  std::vector<LogRecord> records() const {
    const std::uint64_t end = st_->next.load(std::memory_order_relaxed);
    const std::uint64_t begin = end > st_->capacity ? end - st_->capacity : 0;
    std::vector<LogRecord> out;
    out.reserve(static_cast<std::size_t>(end - begin));
    for (std::uint64_t t = begin; t < end; ++t) {
      Cell& c = st_->cells[t % st_->capacity];
      lock(c);
      const bool mine = c.ticket == t + 1;
      const LogRecord r = c.rec;
      c.busy.clear(std::memory_order_release);
      if (mine) out.push_back(r);
    }
    return out;
  }

  /// records() as CSV, header first.
  std::string csv() const { return detail::log_csv(records()); }

  std::uint64_t written() const noexcept { return st_->next.load(std::memory_order_relaxed); }
  std::uint64_t overwritten() const noexcept {
    const auto n = written();
    return n > st_->capacity ? n - st_->capacity : 0;
  }

 private:
  struct Cell {
    std::atomic_flag busy;
    std::uint64_t ticket = 0;  // ticket+1 of the record held; 0: empty
    LogRecord rec{};
  };
  struct State {
    explicit State(std::size_t n) : capacity(n), cells(new Cell[n]) {}
    std::size_t capacity;
    std::unique_ptr<Cell[]> cells;
    alignas(64) std::atomic<std::uint64_t> next{0};
  };
  static void lock(Cell& c) noexcept {
    while (c.busy.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  }
  std::unique_ptr<State> st_;
  std::chrono::microseconds sample_every_;
};

namespace detail {
/// When Logging writes its next sample: `next`, nanoseconds on the records' clock; a
/// record stamped at or after it writes one (the thread whose compare-exchange moves
/// `next` on, one thread per period). Copied on a move of the layer, which happens
/// before use.
class SampleClock {
 public:
  explicit SampleClock(std::chrono::microseconds every) noexcept
      : every_ns_(every.count() > 0 ? std::chrono::duration_cast<std::chrono::nanoseconds>(every).count() : 0),
        next_(every_ns_ > 0 ? 0 : INT64_MAX) {}
  SampleClock(const SampleClock& o) noexcept : every_ns_(o.every_ns_), next_(o.next_.load(std::memory_order_relaxed)) {}
  SampleClock& operator=(const SampleClock&) = delete;

  /// Whether a record stamped `t` is due to sample: one relaxed load of a line written
  /// once a period.
  [[gnu::always_inline]] bool due(std::int64_t t) const noexcept {
    return t >= next_.load(std::memory_order_relaxed);
  }
  /// Claims the sample at `t` for the calling thread; false when another took it.
  bool claim(std::int64_t t) noexcept {
    std::int64_t n = next_.load(std::memory_order_relaxed);
    return t >= n && next_.compare_exchange_strong(n, t + every_ns_, std::memory_order_relaxed);
  }

 private:
  std::int64_t every_ns_;
  std::atomic<std::int64_t> next_;
};
struct NoSampleClock {
  explicit NoSampleClock(std::chrono::microseconds) noexcept {}
};
}  // namespace detail

/// Logs every allocate, failed allocate and free of the stack below it to `Sink`: the
/// OS thread, the wall-clock time, the action, pointer, bytes, stream and tag (see
/// detail/log_record.hpp for the CSV columns; read_log_csv parses them back).
///
/// A free is logged *before* it reaches the upstream, as RMM does, so a log never shows
/// an address handed out again before the free that released it; if the upstream then
/// refuses the free (leaves the block with the caller), a `free failure` record follows. A sink never fails an operation:
/// what it cannot write it counts (dropped()). With NullSink nothing is built at all.
///
/// Samples. With a sink whose sample_every() is not zero (FileSink and OStreamSink: 10 ms
/// unless LogSinkOptions says otherwise), the first record, and then the first record a
/// period after the last sample, is followed by a sample of the stack below
/// (sample_stack: held, cached, queued, pool reserved and used, each where a layer
/// reports it), written by the thread that logged that record. A record pays one relaxed
/// load of the sample clock and a compare; the thread that samples pays a stats() of
/// the cache and a look at the pools, once a period. Samples are written after the
/// record, from below Logging: an allocation logged by another thread meanwhile may be
/// in the sample and not yet in the log, or the other way round.
///
/// Thread-safe. (As the sink is; every shipped sink is.) Construction and moves
/// happen-before use.
template <DeviceMemoryResource Upstream, LogSink Sink = FileSink>
class Logging : public Adaptor<Upstream> {
 public:
  using Adaptor<Upstream>::upstream;
  using sink_type = Sink;

  explicit Logging(Upstream up, Sink sink = Sink{}) noexcept(
      std::is_nothrow_move_constructible_v<Upstream> && std::is_nothrow_move_constructible_v<Sink>)
      : Adaptor<Upstream>(std::move(up)), sink_(std::move(sink)), clock_(sample_period(sink_)) {}

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    auto b = upstream().allocate(bytes, stream, tag);
    if constexpr (Sink::enabled) {
      if (sink_.active()) {
        if (b) {
          log(LogAction::allocate, b->ptr(), b->bytes(), stream, tag);
        } else {
          log(LogAction::allocate_failure, 0, bytes, stream, tag);
        }
      }
    }
    return b;
  }

  result<void> deallocate(DeviceBlock&& block) noexcept {
    if constexpr (Sink::enabled) {
      if (sink_.active()) {
        const std::uint64_t p = block.ptr();
        const std::size_t n = block.bytes();
        const StreamId s = block.alloc_stream();
        const AllocTag t = block.tag();
        const bool was_live = !block.empty();
        log(LogAction::free, p, n, s, t);
        auto r = upstream().deallocate(std::move(block));
        if (!was_live || !block.empty()) log(LogAction::free_failure, p, n, s, t);
        return r;
      }
    }
    return upstream().deallocate(std::move(block));
  }


  /// Writes a sample of the stack below now (see the class comment), whatever the
  /// clock says: e.g. at a quiet point a test or a program picks, or before a dump.
  /// Nothing when the sink is inactive.
  void sample() noexcept {
    if constexpr (Sink::enabled) {
      if (sink_.active()) write_sample(detail::now_ns());
    }
  }

  Sink& sink() noexcept { return sink_; }
  const Sink& sink() const noexcept { return sink_; }
  /// Records the sink could not keep.
  std::uint64_t dropped() const noexcept { return sink_.dropped(); }
  result<void> flush() noexcept { return sink_.flush(); }

 private:
  static constexpr bool samples = Sink::enabled && requires(const Sink& s) {
    { s.sample_every() } -> std::convertible_to<std::chrono::microseconds>;
  };
  using Clock = std::conditional_t<samples, detail::SampleClock, detail::NoSampleClock>;

  static std::chrono::microseconds sample_period(const Sink& s) noexcept {
    if constexpr (samples) {
      return s.sample_every();
    } else {
      return {};
    }
  }

  void log(LogAction a, std::uint64_t ptr, std::size_t bytes, StreamId s, AllocTag t) noexcept {
    const std::int64_t now = detail::now_ns();
    sink_.write(LogRecord{detail::os_thread_id(), now, a, ptr, bytes, s, t});
    if constexpr (samples) {
      if (clock_.due(now)) [[unlikely]] sample_if_claimed(now);
    }
  }

  [[gnu::noinline]] void sample_if_claimed(std::int64_t now) noexcept {
    if constexpr (samples) {
      if (clock_.claim(now)) write_sample(now);
    }
  }

  [[gnu::noinline]] void write_sample(std::int64_t now) noexcept {
    const std::uint64_t thread = detail::os_thread_id();
    for_each_figure(sample_stack(upstream()), [&](LogAction a, std::size_t v) noexcept {
      sink_.write(LogRecord{thread, now, a, 0, v, StreamId{0}, AllocTag{0}});
    });
  }

  [[no_unique_address]] Sink sink_;
  [[no_unique_address]] Clock clock_;
};

static_assert(LogSink<NullSink> && LogSink<FileSink> && LogSink<OStreamSink> && LogSink<RingSink>);
static_assert(DeviceMemoryResource<Logging<detail::PlainArchetype, NullSink>>);
static_assert(!TrackingResource<Logging<detail::PlainArchetype, RingSink>>);
static_assert(TrackingResource<Logging<detail::TrackingArchetype, FileSink>>);
static_assert(DriverResource<Logging<detail::DriverArchetype, NullSink>>);

}  // namespace xlogrt
