// SPDX-License-Identifier: Apache-2.0
#pragma once

// The log record of Logging<Up, Sink> and its CSV line (public through logging.hpp).
//
// The columns are those RAPIDS RMM's logging_resource_adaptor writes, then ours:
//   Thread,Time,Action,Pointer,Size,Stream,Tag
//   140573312345856,10:30:45.123456,allocate,0x7f8a40000000,1024,2,5
// Thread is the OS thread id (gettid), Time the local wall-clock time of day with
// microseconds (RMM's HH:MM:SS.ffffff), Action one of `allocate`, `allocate failure`,
// `free` (RMM's three) or `free failure` (ours: a free the upstream refused, logged right
// after its `free` line), Pointer hexadecimal with 0x, Size decimal bytes, Stream the
// StreamId number (RMM writes the CUstream pointer there; its tools read the column as an
// integer), Tag the AllocTag number (a column RMM does not have; readers that select
// columns by name ignore it).
//
// Samples (ours): what the stack below Logging holds, beside what its users hold. A
// sample is a run of lines at one moment, one per figure the stack reports, each with
// the figure in Size and 0 in Pointer, Stream and Tag:
//   140573312345856,10:30:45.130001,sample held,0x0,7340032,0,0
// `sample held`: the bytes the base resource holds from the device (its
// bytes_outstanding(): live blocks, cached ones, frees queued); `sample cached`: the
// idle blocks a caching layer keeps; `sample queued`: frees queued on a stream and not
// yet known complete; `sample pool reserved` and `sample pool used`: the device pools'
// own counters (what the driver gives the process, and what its allocations occupy),
// where the driver reports them. Live bytes are not sampled: the log's own allocate and
// free lines give them exactly. A reader that knows only RMM's three actions must skip
// these lines (tools/memviz and read_log_csv read them; LogSinkOptions::sample_every = 0
// writes none).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <istream>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"

namespace xlogrt {

enum class LogAction : std::uint8_t {
  allocate,
  allocate_failure,
  free,
  free_failure,
  // A sample's figures (see the header comment); the record's bytes hold the figure.
  sample_held,
  sample_cached,
  sample_queued,
  sample_pool_reserved,
  sample_pool_used,
};

/// The last LogAction: the actions are the values up to it.
inline constexpr LogAction LAST_LOG_ACTION = LogAction::sample_pool_used;

/// Whether `a` is one of a sample's figures rather than an allocation or a free.
constexpr bool is_sample(LogAction a) noexcept { return a >= LogAction::sample_held; }

/// The Action column's text ("allocate failure").
constexpr std::string_view to_string(LogAction a) noexcept {
  switch (a) {
    case LogAction::allocate: return "allocate";
    case LogAction::allocate_failure: return "allocate failure";
    case LogAction::free: return "free";
    case LogAction::free_failure: return "free failure";
    case LogAction::sample_held: return "sample held";
    case LogAction::sample_cached: return "sample cached";
    case LogAction::sample_queued: return "sample queued";
    case LogAction::sample_pool_reserved: return "sample pool reserved";
    case LogAction::sample_pool_used: return "sample pool used";
  }
  return "?";
}

/// One allocate, failed allocate or free, or one figure of a sample.
/// Not thread-safe: a value, owned by one thread at a time.
struct LogRecord {
  std::uint64_t thread = 0;  ///< OS thread id
  /// Nanoseconds since the Unix epoch (system_clock) when logged; nanoseconds since local
  /// midnight when parsed back from CSV (the line holds the time of day only).
  std::int64_t time_ns = 0;
  LogAction action = LogAction::allocate;
  std::uint64_t ptr = 0;    ///< 0 for a failed allocation
  std::size_t bytes = 0;
  StreamId stream{};
  AllocTag tag{};
  friend bool operator==(const LogRecord&, const LogRecord&) = default;
};

/// The CSV header line (without the newline).
inline constexpr std::string_view LOG_CSV_HEADER = "Thread,Time,Action,Pointer,Size,Stream,Tag";

namespace detail {

/// The calling thread's OS id (gettid on Linux), read once per thread.
inline std::uint64_t os_thread_id() noexcept {
#if defined(__linux__)
  static thread_local const std::uint64_t id = static_cast<std::uint64_t>(::syscall(SYS_gettid));
#else
  static thread_local const std::uint64_t id = std::hash<std::thread::id>{}(std::this_thread::get_id());
#endif
  return id;
}

inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The local time zone's offset from UTC now, in nanoseconds (read once per sink, so
/// formatting a line needs no time-zone lookup; a DST change during a run is not seen).
inline std::int64_t local_utc_offset_ns() noexcept {
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  if (::localtime_r(&t, &local) == nullptr) return 0;
  return static_cast<std::int64_t>(local.tm_gmtoff) * 1'000'000'000;
}

/// Longest line format_log_line writes, newline included.
inline constexpr std::size_t LOG_LINE_MAX = 128;

/// Appends the decimal digits of `v` at `out`; returns the end.
inline char* put_decimal(char* out, std::uint64_t v) noexcept {
  char tmp[20];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *out++ = tmp[--n];
  return out;
}

/// Appends `v` as exactly `width` decimal digits (zero-padded).
inline char* put_fixed(char* out, std::uint64_t v, int width) noexcept {
  for (int i = width - 1; i >= 0; --i) {
    out[i] = static_cast<char>('0' + v % 10);
    v /= 10;
  }
  return out + width;
}

/// Writes `r` as one CSV line ending in '\n' into `out` (>= LOG_LINE_MAX chars); returns
/// its length. Hand-rolled rather than snprintf: the writer thread formats every record,
/// and this is several times faster.
inline std::size_t format_log_line(const LogRecord& r, std::int64_t utc_offset_ns, char* out) noexcept {
  constexpr std::int64_t day = 86'400'000'000'000;
  std::int64_t tod = (r.time_ns + utc_offset_ns) % day;
  if (tod < 0) tod += day;
  const auto us = static_cast<std::uint64_t>(tod / 1000);
  char* p = out;
  p = put_decimal(p, r.thread);
  *p++ = ',';
  p = put_fixed(p, us / 3'600'000'000ULL, 2);
  *p++ = ':';
  p = put_fixed(p, us / 60'000'000ULL % 60, 2);
  *p++ = ':';
  p = put_fixed(p, us / 1'000'000ULL % 60, 2);
  *p++ = '.';
  p = put_fixed(p, us % 1'000'000ULL, 6);
  *p++ = ',';
  const std::string_view a = to_string(r.action);
  std::memcpy(p, a.data(), a.size());
  p += a.size();
  *p++ = ',';
  *p++ = '0';
  *p++ = 'x';
  {
    static constexpr char hex[] = "0123456789abcdef";
    char tmp[16];
    int n = 0;
    std::uint64_t v = r.ptr;
    do {
      tmp[n++] = hex[v & 15];
      v >>= 4;
    } while (v != 0);
    while (n > 0) *p++ = tmp[--n];
  }
  *p++ = ',';
  p = put_decimal(p, r.bytes);
  *p++ = ',';
  p = put_decimal(p, r.stream.value);
  *p++ = ',';
  p = put_decimal(p, r.tag.value);
  *p++ = '\n';
  return static_cast<std::size_t>(p - out);  // at most 20+16+21+18+20+10+10+6 < LOG_LINE_MAX
}

/// Parses an unsigned number, decimal or (with 0x) hexadecimal. False on anything else.
inline bool parse_log_number(std::string_view s, std::uint64_t& v) noexcept {
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  }
  if (s.empty()) return false;
  std::uint64_t x = 0;
  for (char c : s) {
    unsigned d;
    if (c >= '0' && c <= '9') {
      d = static_cast<unsigned>(c - '0');
    } else if (base == 16 && c >= 'a' && c <= 'f') {
      d = static_cast<unsigned>(c - 'a' + 10);
    } else if (base == 16 && c >= 'A' && c <= 'F') {
      d = static_cast<unsigned>(c - 'A' + 10);
    } else {
      return false;
    }
    if (d >= static_cast<unsigned>(base)) return false;
    if (x > (UINT64_MAX - d) / static_cast<unsigned>(base)) return false;
    x = x * static_cast<unsigned>(base) + d;
  }
  v = x;
  return true;
}

/// `records` as a CSV text, the header line first (what FileSink writes for them).
inline std::string log_csv(std::span<const LogRecord> records) {
  std::string s(LOG_CSV_HEADER);
  s += '\n';
  s.reserve(s.size() + records.size() * 64);
  char line[LOG_LINE_MAX];
  const auto offset = local_utc_offset_ns();
  for (const auto& r : records) s.append(line, format_log_line(r, offset, line));
  return s;
}

}  // namespace detail

/// Parses one CSV line of our layout, or of RMM's (no Tag column: UNTAGGED; a Stream
/// column holding a 0x pointer is kept as its low 32 bits). `time_ns` becomes nanoseconds
/// since local midnight. Errors: invalid_argument naming the line and the bad field.
inline result<LogRecord> parse_log_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::string_view f[8];
  std::size_t n = 0;
  while (n < 8) {
    const auto comma = line.find(',');
    f[n++] = line.substr(0, comma);
    if (comma == std::string_view::npos) break;
    line.remove_prefix(comma + 1);
  }
  auto bad = [&](std::string_view what) {
    return error{errc::invalid_argument,
                 "log line has a bad " + std::string(what) + " field: expected " +
                     std::string(LOG_CSV_HEADER) + " (the Tag column may be absent)"};
  };
  if (n != 6 && n != 7) return bad("column count");
  LogRecord r;
  std::uint64_t v = 0;
  if (!detail::parse_log_number(f[0], v)) return bad("Thread");
  r.thread = v;
  {
    // HH:MM:SS.ffffff
    const auto t = f[1];
    std::uint64_t h, m, s, us = 0;
    const auto c1 = t.find(':'), c2 = t.find(':', c1 == t.npos ? t.npos : c1 + 1), dot = t.find('.');
    if (c1 == t.npos || c2 == t.npos || !detail::parse_log_number(t.substr(0, c1), h) ||
        !detail::parse_log_number(t.substr(c1 + 1, c2 - c1 - 1), m) ||
        !detail::parse_log_number(t.substr(c2 + 1, dot == t.npos ? t.npos : dot - c2 - 1), s) ||
        (dot != t.npos && !detail::parse_log_number(t.substr(dot + 1), us)) || h > 23 || m > 59 ||
        s > 60 || us > 999'999) {
      return bad("Time");
    }
    r.time_ns = static_cast<std::int64_t>(((h * 60 + m) * 60 + s) * 1'000'000 + us) * 1000;
  }
  {
    bool known = false;
    for (std::uint8_t a = 0; a <= static_cast<std::uint8_t>(LAST_LOG_ACTION); ++a) {
      if (f[2] == to_string(static_cast<LogAction>(a))) {
        r.action = static_cast<LogAction>(a);
        known = true;
        break;
      }
    }
    if (!known) return bad("Action");
  }
  if (!detail::parse_log_number(f[3], v)) return bad("Pointer");
  r.ptr = v;
  if (!detail::parse_log_number(f[4], v)) return bad("Size");
  r.bytes = static_cast<std::size_t>(v);
  if (!detail::parse_log_number(f[5], v)) return bad("Stream");
  r.stream = StreamId{static_cast<std::uint32_t>(v)};
  if (n == 7) {
    if (!detail::parse_log_number(f[6], v) || v > UINT32_MAX) return bad("Tag");
    r.tag = AllocTag{static_cast<std::uint32_t>(v)};
  }
  return r;
}

/// Reads a whole log: the header line (ours or RMM's) and every record. Errors:
/// invalid_argument naming the first bad line (1-based).
inline result<std::vector<LogRecord>> read_log_csv(std::istream& in) {
  std::vector<LogRecord> out;
  std::string line;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    if (line.rfind("Thread,", 0) == 0) continue;  // a header
    auto r = parse_log_line(line);
    if (!r) {
      return error{errc::invalid_argument, "line " + std::to_string(number) + ": " + r.error().message()};
    }
    out.push_back(*r);
  }
  return out;
}

}  // namespace xlogrt
