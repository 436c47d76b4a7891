// SPDX-License-Identifier: Apache-2.0
#pragma once

// The machinery behind FileSink and OStreamSink: a bounded multi-producer /
// single-consumer ring of log records, and a writer thread that drains it.
//
// Ring protocol (D. Vyukov's bounded queue, with one consumer). Each cell holds a
// sequence number `seq` and a record. Cell i starts with seq = i.
// - A producer reads `tail_` (relaxed) = position p, and the cell c = p & mask. If
//   c.seq (acquire) == p the cell is free for lap p: it claims p with a compare-exchange
//   of `tail_` from p to p+1 (relaxed: the claim orders nothing, it only makes p
//   unique), writes the record, and publishes it with c.seq = p+1 (release). If
//   c.seq < p the ring is full (the consumer has not freed this cell since the last
//   lap); if c.seq > p another producer took p, and it retries with a fresh tail.
// - The consumer, at position q, waits for c.seq == q+1 (acquire: pairs with the
//   producer's release, so the record it copies is complete), copies the record, and
//   frees the cell for lap q+capacity with c.seq = q+capacity (release: pairs with the
//   next producer's acquire, so the consumer's copy is done before the cell is reused).
// Producers never wait for each other except on the claim of one position; no thread
// takes a lock. A producer suspended between its claim and its publish delays the
// writer at that cell (records stay in order), never the other producers. Why not a
// mutex around a std::queue: every allocating thread would queue on it, which is what
// the sink must not do. Why not per-thread buffers: a thread that ends, or never logs
// again, would strand its records until someone flushes them.

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <thread>

#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/detail/log_record.hpp"

namespace xlogrt {

/// How FileSink and OStreamSink buffer records on their way to the writer thread.
/// Not thread-safe: a value, owned by one thread at a time.
struct LogSinkOptions {
  /// Records the ring holds (rounded up to a power of two, at least 64).
  std::size_t capacity = std::size_t{1} << 14;
  /// How long an allocating thread waits for room when the ring is full before it drops
  /// its record (counted in dropped()). Zero: never wait.
  std::chrono::microseconds max_wait{std::chrono::milliseconds(100)};
  /// How often Logging writes a sample of what the stack below it holds (the `sample`
  /// lines of detail/log_record.hpp): at the first record, then at the first record
  /// this long after the last sample. Zero: no samples (a log RMM's tools read whole).
  std::chrono::microseconds sample_every{std::chrono::milliseconds(10)};
};

namespace detail {

/// Thread-safe; lock-free. try_push from any thread; try_pop from one consumer thread.
template <class T>
class MpscRing {
 public:
  explicit MpscRing(std::size_t capacity) : mask_(round_up(capacity) - 1), cells_(new Cell[mask_ + 1]) {
    for (std::size_t i = 0; i <= mask_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  bool try_push(const T& v) noexcept {
    std::size_t p = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[p & mask_];
      const std::size_t seq = c.seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::ptrdiff_t>(seq - p);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(p, p + 1, std::memory_order_relaxed)) {
          c.value = v;
          c.seq.store(p + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        p = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  /// Single consumer.
  bool try_pop(T& out) noexcept {
    Cell& c = cells_[head_ & mask_];
    if (c.seq.load(std::memory_order_acquire) != head_ + 1) return false;
    out = c.value;
    c.seq.store(head_ + mask_ + 1, std::memory_order_release);
    ++head_;
    return true;
  }

  /// Positions claimed so far (records pushed or being pushed).
  std::size_t claimed() const noexcept { return tail_.load(std::memory_order_acquire); }

 private:
  static std::size_t round_up(std::size_t n) noexcept {
    std::size_t c = 64;
    while (c < n) c <<= 1;
    return c;
  }
  struct alignas(64) Cell {
    std::atomic<std::size_t> seq{0};
    T value{};
  };
  const std::size_t mask_;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<std::size_t> tail_{0};
  alignas(64) std::size_t head_ = 0;  // consumer only
};

/// A ring drained by its own thread into a file descriptor (owned) or an std::ostream
/// (borrowed). Each batch is written and flushed, so a sink that is never destroyed (a
/// leaked runtime's) loses at most the last batch at exit.
///
/// Whole lines only. The descriptor is written with write(2), no stdio buffer between: a
/// batch that cannot be written whole (the disk or RLIMIT_FSIZE fills up mid-batch, an
/// I/O error) is cut off again, the file truncated back to the end of the last batch
/// written whole (`committed_`) and the offset moved there, and its records are counted
/// dropped. So the file never ends in a partial CSV line, and a later batch that fits
/// starts on a line of its own. (stdio could not do this: after a failed fflush the FILE
/// keeps the unwritten tail in its buffer and writes it with the next batch.)
///
/// Thread-safe. push and flush from any thread; construction and destruction are not
/// concurrent with use.
class LogWriter {
 public:
  /// Starts the writer thread after writing the header line. `fd` (taken over, closed
  /// on every path) is a regular file opened for writing at offset 0, or -1 with `os`.
  /// Errors: sink_failure.
  static result<std::unique_ptr<LogWriter>> start(int fd, std::ostream* os, LogSinkOptions options) noexcept {
    std::unique_ptr<LogWriter> w;
    try {
      w.reset(new LogWriter(fd, os, options));
      std::string header(LOG_CSV_HEADER);
      header += '\n';
      if (!w->write(header.data(), header.size())) {
        return error{errc::sink_failure, "writing the log's header line failed"};
      }
      w->thread_ = std::thread([p = w.get()] { p->run(); });
    } catch (const std::exception& e) {
      if (!w && fd >= 0) ::close(fd);
      return error{errc::sink_failure, std::string("starting the log writer failed: ") + e.what()};
    }
    return w;
  }

  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  /// Drains what was pushed, then stops the thread and closes the file.
  ~LogWriter() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }

  /// Never blocks longer than options.max_wait; a record that finds no room is counted
  /// in dropped().
  void push(const LogRecord& r) noexcept {
    if (ring_.try_push(r)) return;
    if (max_wait_.count() > 0) {
      const auto deadline = std::chrono::steady_clock::now() + max_wait_;
      for (unsigned spin = 1;; ++spin) {
        std::this_thread::yield();
        if (ring_.try_push(r)) return;
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
      }
    }
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }

  /// Waits until every record pushed before the call is written (or counted dropped).
  /// Errors: sink_failure when records have been dropped since the sink started.
  result<void> flush() noexcept {
    const std::size_t target = ring_.claimed();
    while (written_.load(std::memory_order_acquire) < target) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    const auto d = dropped_.load(std::memory_order_relaxed);
    if (d != 0) {
      return error{errc::sink_failure, std::to_string(d) + " log records were dropped (the sink could not "
                                                             "write them, or its ring stayed full)"};
    }
    return ok();
  }

  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

  std::chrono::microseconds sample_every() const noexcept { return sample_every_; }

 private:
  LogWriter(int fd, std::ostream* os, LogSinkOptions o)
      : fd_(fd),
        os_(os),
        max_wait_(o.max_wait),
        sample_every_(o.sample_every),
        ring_(o.capacity),
        utc_offset_ns_(local_utc_offset_ns()) {}

  /// Writes all of [p, p+n) or, failing that, nothing: see "Whole lines only" above.
  bool write(const char* p, std::size_t n) noexcept {
    if (fd_ >= 0) {
      std::size_t done = 0;
      while (done < n) {
        const ssize_t k = ::write(fd_, p + done, n - done);
        if (k > 0) {
          done += static_cast<std::size_t>(k);
        } else if (k < 0 && errno == EINTR) {
          continue;
        } else {  // ENOSPC, EFBIG, EIO ... (or 0 bytes, which write(2) gives for n > 0 only then)
          if (done != 0) {
            // A failed cut leaves the partial batch; nothing better is possible then, and
            // the next batch, at the offset moved back, overwrites it.
            (void)::ftruncate(fd_, committed_);
            (void)::lseek(fd_, committed_, SEEK_SET);
          }
          return false;
        }
      }
      committed_ += static_cast<off_t>(n);
      return true;
    }
    try {
      os_->write(p, static_cast<std::streamsize>(n));
      os_->flush();
      if (os_->good()) return true;
      os_->clear();
    } catch (...) {
    }
    return false;
  }

  void run() noexcept {
    constexpr std::size_t BATCH = 256;
    char buf[BATCH * LOG_LINE_MAX];
    auto idle = std::chrono::microseconds(20);
    for (;;) {
      std::size_t n = 0, len = 0;
      LogRecord r;
      while (n < BATCH && ring_.try_pop(r)) {
        len += format_log_line(r, utc_offset_ns_, buf + len);
        ++n;
      }
      if (n != 0) {
        if (!write(buf, len)) dropped_.fetch_add(n, std::memory_order_relaxed);
        written_.fetch_add(n, std::memory_order_release);
        idle = std::chrono::microseconds(20);
        continue;
      }
      // Stop only once every claimed record is out: a producer may still be between
      // its claim and its publish.
      if (stop_.load(std::memory_order_acquire) &&
          written_.load(std::memory_order_relaxed) >= ring_.claimed()) {
        return;
      }
      std::this_thread::sleep_for(idle);
      if (idle < std::chrono::milliseconds(1)) idle *= 2;
    }
  }

  int fd_;
  off_t committed_ = 0;  // the file's length after the last batch written whole (writer thread's)
  std::ostream* os_;
  std::chrono::microseconds max_wait_;
  std::chrono::microseconds sample_every_;
  MpscRing<LogRecord> ring_;
  std::int64_t utc_offset_ns_;
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::size_t> written_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace detail
}  // namespace xlogrt
