// SPDX-License-Identifier: Apache-2.0
#pragma once

// The environment variables that configure the default stack, the way users configure
// PyTorch's and RMM's allocators:
//   XLOGRT_BUDGET_BYTES  the byte budget of each device ordinal: a whole number with an
//                        optional K, M, G or T suffix (powers of 1024; "KiB"/"KB"/"K"
//                        alike, any case), e.g. 512M, 8G, 1073741824. Unset or empty: no
//                        budget.
//   XLOGRT_LOG_FILE      the CSV file Logging writes (see logging.hpp). Unset or empty:
//                        logging off.
//   XLOGRT_LOG_SAMPLES   how often the log samples what the stack holds ('sample' lines,
//                        which tools/memviz draws): whole milliseconds, an optional "ms"
//                        suffix, at most 3600000; 0 / off: no sample lines, the log is
//                        RMM's layout alone (for RMM's replay tools). Unset or empty:
//                        LogSinkOptions' default (10 ms).
//   XLOGRT_CACHE         comma-separated items. 0 / off / false: the caching layer
//                        passes every call straight to the base resource; nvtx: caching
//                        on, its blocks marked for compute-sanitizer (in a program that
//                        includes <xlogrt/resource/nvtx_marks.hpp>; see cached.hpp); 1 /
//                        on / true, unset or empty: caching on. KEY=SIZE sets one of
//                        CachedOptions' sizes (see cached.hpp), SIZE as for the budget:
//                        max_block_bytes, thread_block_bytes, bin_bytes, thread_bytes,
//                        depot_bytes; and small_pool_bytes, the default stack's
//                        AsyncCudaOptions::small_pool_bytes (default 0: one pool; with
//                        XLOGRT_BACKEND=pool only, the stack refuses it otherwise). E.g.
//                        XLOGRT_CACHE=on,depot_bytes=4G,thread_bytes=256M.
//                        A later item overrides an earlier one. A size of 0 is refused,
//                        except thread_block_bytes=0, which CachedOptions defines (no
//                        thread bins, every block goes through the depots), and
//                        small_pool_bytes=0 (one pool for all sizes).
//   XLOGRT_BACKEND       the default stack's base resource: vmm (VirtualCuda: one reserved
//                        address range, physical pages mapped on demand and given back by
//                        trim; needs a device with virtual memory management), pool
//                        (AsyncCuda, the device's stream-ordered memory pool) or auto: vmm
//                        where it can be had, else pool. Any case. Unset or empty: auto.
// A malformed value is an invalid_argument error that names the variable and the value;
// nothing here aborts or throws.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "xlogrt/core/result.hpp"

namespace xlogrt {

inline constexpr const char* ENV_BUDGET_BYTES = "XLOGRT_BUDGET_BYTES";
inline constexpr const char* ENV_LOG_FILE = "XLOGRT_LOG_FILE";
inline constexpr const char* ENV_CACHE = "XLOGRT_CACHE";
inline constexpr const char* ENV_BACKEND = "XLOGRT_BACKEND";
inline constexpr const char* ENV_LOG_SAMPLES = "XLOGRT_LOG_SAMPLES";

/// The default stack's base resource (XLOGRT_BACKEND).
enum class Backend : std::uint8_t {
  automatic,  ///< VirtualCuda where the driver and the device can have it, else AsyncCuda
  pool,       ///< AsyncCuda
  vmm,        ///< VirtualCuda, or an error where it cannot be had
};

/// What the environment asks of the default stack.
/// Not thread-safe: a value, owned by one thread at a time.
struct EnvConfig {
  std::optional<std::size_t> budget_bytes;  ///< unset: no budget
  std::optional<std::string> log_file;      ///< unset: no logging
  std::optional<std::uint32_t> log_sample_ms;  ///< XLOGRT_LOG_SAMPLES; 0: none; unset: the sink's default
  bool cache = true;                        ///< the caching layer on
  bool cache_nvtx = false;                  ///< ... marking its blocks for compute-sanitizer
  Backend backend = Backend::automatic;     ///< the base resource
  /// The caching layer's sizes XLOGRT_CACHE sets; unset: CachedOptions' defaults.
  struct CacheSizes {
    std::optional<std::size_t> max_block_bytes, thread_block_bytes, bin_bytes, thread_bytes, depot_bytes;
    /// Not a CachedOptions size: AsyncCudaOptions::small_pool_bytes of the default stack
    /// (unset: 0, one pool).
    std::optional<std::size_t> small_pool_bytes;
  } cache_sizes;
};

/// The largest budget XLOGRT_BUDGET_BYTES accepts: 2^63 - 2 bytes (a limit of 2^63 - 1 or
/// more is how Budget spells "no limit", and a larger one would read as none).
inline constexpr std::uint64_t MAX_BUDGET_BYTES = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - 1;

namespace detail {
/// `text` as a message may quote it: control characters and backslashes escaped as \xNN and
/// \\, so that a value read from the environment cannot put a newline, an escape
/// sequence or a NUL into a log or a terminal.
inline std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7f) {
      static constexpr char digits[] = "0123456789abcdef";
      out += "\\x";
      out += digits[c >> 4];
      out += digits[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}
}  // namespace detail

/// Parses a byte count: digits, optional spaces, an optional K/M/G/T (any case) optionally
/// followed by "B" or "iB", or a bare "B". Errors: invalid_argument (malformed, zero, or
/// more than `max` bytes), the message naming `what` and the text (escaped: see
/// detail::printable), and for zero, `zero_means` after "is zero". `zero_allowed`: 0 (with
/// or without a suffix) is a value, for a size whose 0 means something.
inline result<std::size_t> parse_byte_size(std::string_view text, std::string_view what = "byte size",
                                           std::uint64_t max = std::numeric_limits<std::size_t>::max(),
                                           std::string_view zero_means = {}, bool zero_allowed = false) {
  auto bad = [&](std::string_view why) {
    return error{errc::invalid_argument, std::string(what) + "='" + detail::printable(text) + "' " +
                                             std::string(why) +
                                             ": expected a whole number of bytes with an optional K, M, G or T "
                                             "suffix (powers of 1024), e.g. 512M or 8G"};
  };
  std::string_view s = text;
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  if (s.empty()) return bad("is empty");
  std::uint64_t v = 0;
  std::size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    const auto d = static_cast<std::uint64_t>(s[i] - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return bad("is too large");
    v = v * 10 + d;
  }
  if (i == 0) return bad("is not a number");
  std::string_view suffix = s.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  unsigned shift = 0;
  if (!suffix.empty()) {
    switch (suffix.front()) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      case 'b': case 'B': shift = 0; break;
      default: return bad("has an unknown suffix");
    }
    std::string_view rest = suffix.substr(1);
    const bool bare_b = suffix.front() == 'b' || suffix.front() == 'B';
    if (!bare_b) {
      if (rest == "iB" || rest == "ib" || rest == "IB") rest = {};
      if (rest == "B" || rest == "b") rest = {};
    }
    if (!rest.empty()) return bad("has an unknown suffix");
  }
  if (v == 0) {
    if (zero_allowed) return std::size_t{0};
    return bad("is zero" + std::string(zero_means));
  }
  if (shift != 0 && v > (std::numeric_limits<std::uint64_t>::max() >> shift)) return bad("is too large");
  v <<= shift;
  if (v > std::numeric_limits<std::size_t>::max() || v > max) {
    return bad("is too large (at most " + std::to_string(std::min<std::uint64_t>(max, std::numeric_limits<std::size_t>::max())) +
               " bytes)");
  }
  return static_cast<std::size_t>(v);
}

/// Builds the configuration from the variables' values (nullptr: unset). Errors:
/// invalid_argument naming the variable and its value.
inline result<EnvConfig> parse_env_config(const char* budget_bytes, const char* log_file,
                                          const char* cache = nullptr, const char* backend = nullptr,
                                          const char* log_samples = nullptr) {
  EnvConfig c;
  if (log_samples != nullptr && *log_samples != '\0') {
    std::string_view v = log_samples;
    if (v == "off") {
      c.log_sample_ms = 0;
    } else {
      if (v.size() > 2 && v.substr(v.size() - 2) == "ms") v.remove_suffix(2);
      std::uint64_t ms = 0;
      const bool digits = !v.empty() && v.size() <= 7 && std::all_of(v.begin(), v.end(), [](char ch) {
        return ch >= '0' && ch <= '9';
      });
      for (char ch : v) ms = ms * 10 + static_cast<std::uint64_t>(ch - '0');
      if (!digits || ms > 3600000) {
        return error{errc::invalid_argument, std::string(ENV_LOG_SAMPLES) + "='" + detail::printable(log_samples) +
                                                 "' is not a whole number of milliseconds from 0 to 3600000 "
                                                 "(optionally with ms) or off; 0 or off writes no sample lines"};
      }
      c.log_sample_ms = static_cast<std::uint32_t>(ms);
    }
  }
  if (backend != nullptr && *backend != '\0') {
    std::string lower(backend);
    for (char& ch : lower) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    if (lower == "auto") {
      c.backend = Backend::automatic;
    } else if (lower == "pool") {
      c.backend = Backend::pool;
    } else if (lower == "vmm") {
      c.backend = Backend::vmm;
    } else {
      return error{errc::invalid_argument, std::string(ENV_BACKEND) + "='" + detail::printable(backend) +
                                               "' is not one of auto (the default: vmm where the device has virtual "
                                               "memory management, else pool), pool (the device's memory pool) or "
                                               "vmm (virtual memory)"};
    }
  }
  if (budget_bytes != nullptr && *budget_bytes != '\0') {
    auto b = parse_byte_size(budget_bytes, ENV_BUDGET_BYTES, MAX_BUDGET_BYTES,
                             " (a budget of 0 bytes would refuse every allocation; unset the variable for no budget)");
    if (!b) return std::move(b).error();
    c.budget_bytes = *b;
  }
  if (log_file != nullptr && *log_file != '\0') c.log_file = std::string(log_file);
  if (cache != nullptr && *cache != '\0') {
    const std::string_view all = cache;
    auto bad = [&](std::string_view item, const std::string& why) {
      return error{errc::invalid_argument, std::string(ENV_CACHE) + "='" + detail::printable(all) + "': '" +
                                               detail::printable(item) + "' " + why};
    };
    std::size_t at = 0;
    while (true) {
      const std::size_t comma = all.find(',', at);
      const std::string_view item = all.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
      const std::size_t eq = item.find('=');
      if (eq != std::string_view::npos) {
        const std::string_view key = item.substr(0, eq);
        auto& z = c.cache_sizes;
        std::optional<std::size_t>* field = key == "max_block_bytes"      ? &z.max_block_bytes
                                            : key == "thread_block_bytes" ? &z.thread_block_bytes
                                            : key == "bin_bytes"          ? &z.bin_bytes
                                            : key == "thread_bytes"       ? &z.thread_bytes
                                            : key == "depot_bytes"        ? &z.depot_bytes
                                            : key == "small_pool_bytes"   ? &z.small_pool_bytes
                                                                          : nullptr;
        if (field == nullptr) {
          return bad(item, "has an unknown key (max_block_bytes, thread_block_bytes, bin_bytes, thread_bytes, "
                           "depot_bytes, small_pool_bytes)");
        }
        // thread_block_bytes=0 has a meaning (no thread bins: every block through the
        // depots), as small_pool_bytes=0 (one pool for all sizes); a 0 for any other size
        // would disable or break the cache.
        const bool zero_allowed = field == &z.thread_block_bytes || field == &z.small_pool_bytes;
        auto size = parse_byte_size(item.substr(eq + 1), std::string(ENV_CACHE) + " " + std::string(key),
                                    std::numeric_limits<std::size_t>::max(),
                                    " (of the sizes, only thread_block_bytes and small_pool_bytes may be 0; use off to "
                                    "disable the cache)",
                                    zero_allowed);
        if (!size) return std::move(size).error();
        *field = *size;
      } else if (item == "0" || item == "off" || item == "false") {
        c.cache = false;
        c.cache_nvtx = false;
      } else if (item == "nvtx") {
        c.cache = true;
        c.cache_nvtx = true;
      } else if (item == "1" || item == "on" || item == "true") {
        c.cache = true;
        c.cache_nvtx = false;
      } else {
        return bad(item, "is not one of 0, off, false, 1, on, true, nvtx or KEY=SIZE");
      }
      if (comma == std::string_view::npos) break;
      at = comma + 1;
    }
  }
  return c;
}

/// Reads XLOGRT_BUDGET_BYTES, XLOGRT_LOG_FILE, XLOGRT_CACHE, XLOGRT_BACKEND and
/// XLOGRT_LOG_SAMPLES from the environment. Not thread-safe against a concurrent setenv
/// (std::getenv's own rule).
inline result<EnvConfig> read_env_config() {
  return parse_env_config(std::getenv(ENV_BUDGET_BYTES), std::getenv(ENV_LOG_FILE), std::getenv(ENV_CACHE),
                          std::getenv(ENV_BACKEND), std::getenv(ENV_LOG_SAMPLES));
}

}  // namespace xlogrt
