// SPDX-License-Identifier: Apache-2.0
// Fuzzes the environment configuration (runtime/env_config.hpp): the input is up to
// three NUL-separated values of XLOGRT_BUDGET_BYTES, XLOGRT_LOG_FILE and XLOGRT_CACHE
// (a missing one is unset); XLOGRT_CACHE's modes and sizes must agree with an
// independent reading of its grammar. parse_env_config must give a configuration or an
// invalid_argument error naming the variable, never throw or abort; the budget must
// agree with an independent reading of the byte-size grammar, in 128-bit arithmetic,
// and a size it accepts must parse again, printed in bytes, to the same value; a budget
// above MAX_BUDGET_BYTES is refused by parse_env_config alone.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <xlogrt/runtime/env_config.hpp>

namespace {
[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "xlogrt fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

/// The grammar of env_config.hpp's header comment, read independently.
std::optional<std::size_t> reference_size(std::string_view s, bool zero_allowed = false) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  std::size_t i = 0;
  unsigned __int128 v = 0;
  bool overflow = false;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    v = v * 10 + static_cast<unsigned>(s[i] - '0');
    if (v > UINT64_MAX) overflow = true, v = UINT64_MAX;
    ++i;
  }
  if (i == 0) return std::nullopt;
  std::string_view rest = s.substr(i);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  unsigned shift = 0;
  if (!rest.empty()) {
    const char c = static_cast<char>(rest.front() | 0x20);
    const std::string_view tail = rest.substr(1);
    if (c == 'b') {
      if (!tail.empty()) return std::nullopt;
    } else {
      if (c == 'k') shift = 10;
      else if (c == 'm') shift = 20;
      else if (c == 'g') shift = 30;
      else if (c == 't') shift = 40;
      else return std::nullopt;
      if (!(tail.empty() || tail == "B" || tail == "b" || tail == "iB" || tail == "ib" || tail == "IB")) return std::nullopt;
    }
  }
  if (overflow || (v == 0 && !zero_allowed)) return std::nullopt;
  v <<= shift;
  if (v > SIZE_MAX) return std::nullopt;
  return static_cast<std::size_t>(v);
}

/// XLOGRT_CACHE as env_config.hpp's header comment describes it, read independently.
struct CacheReading {
  bool on = true, nvtx = false;
  std::optional<std::size_t> sizes[6];  // max_block, thread_block, bin, thread, depot, small_pool
};
constexpr const char* SIZE_KEYS[6] = {"max_block_bytes", "thread_block_bytes", "bin_bytes", "thread_bytes",
                                      "depot_bytes", "small_pool_bytes"};
/// The sizes whose 0 has a meaning (no thread bins; one pool for all sizes).
constexpr bool ZERO_ALLOWED[6] = {false, true, false, false, false, true};

std::optional<CacheReading> reference_cache(std::string_view v) {
  CacheReading r;
  if (v.empty()) return r;
  for (std::size_t start = 0;;) {
    const std::size_t end = std::min(v.find(',', start), v.size());
    const std::string_view item = v.substr(start, end - start);
    const std::size_t eq = item.find('=');
    if (eq != std::string_view::npos) {
      int k = 0;
      while (k < 6 && item.substr(0, eq) != SIZE_KEYS[k]) ++k;
      if (k == 6) return std::nullopt;
      const auto size = reference_size(item.substr(eq + 1), ZERO_ALLOWED[k]);
      if (!size) return std::nullopt;
      r.sizes[k] = size;
    } else if (item == "0" || item == "off" || item == "false") {
      r.on = false, r.nvtx = false;
    } else if (item == "1" || item == "on" || item == "true") {
      r.on = true, r.nvtx = false;
    } else if (item == "nvtx") {
      r.on = true, r.nvtx = true;
    } else {
      return std::nullopt;
    }
    if (end == v.size()) return r;
    start = end + 1;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace xlogrt;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::optional<std::string> vars[3];
  std::size_t at = 0;
  for (auto& v : vars) {
    if (at > text.size()) break;
    const std::size_t nul = text.find('\0', at);
    v = text.substr(at, nul == std::string::npos ? std::string::npos : nul - at);
    at = nul == std::string::npos ? text.size() + 1 : nul + 1;
  }
  auto c = [&](int i) { return vars[i] ? vars[i]->c_str() : nullptr; };
  auto cfg = parse_env_config(c(0), c(1), c(2));

  const bool budget_set = vars[0] && !vars[0]->empty();
  const auto want = budget_set ? reference_size(*vars[0]) : std::nullopt;
  auto sized = budget_set ? parse_byte_size(*vars[0], ENV_BUDGET_BYTES) : result<std::size_t>(std::size_t{0});
  if (budget_set) {
    if (sized.has_value() != want.has_value() || (want && *sized != *want)) {
      broken("parse_byte_size('" + *vars[0] + "') gave " + (sized ? std::to_string(*sized) : sized.error().what()) +
             ", the grammar says " + (want ? std::to_string(*want) : std::string("an error")));
    }
    if (sized) {
      auto again = parse_byte_size(std::to_string(*sized));
      if (!again || *again != *sized) broken("a parsed size does not parse again in bytes");
    } else if (sized.error().code() != errc::invalid_argument ||
               sized.error().message().find(ENV_BUDGET_BYTES) == std::string::npos) {
      broken("parse_byte_size's error does not name the variable: " + sized.error().what());
    }
  }
  if (!cfg) {
    if (cfg.error().code() != errc::invalid_argument || cfg.error().message().find("XLOGRT_") == std::string::npos) {
      broken("parse_env_config's error is not named: " + cfg.error().what());
    }
    if ((!budget_set || (sized && *sized <= MAX_BUDGET_BYTES)) && reference_cache(vars[2] ? *vars[2] : "")) {
      broken("parse_env_config refused a good configuration: " + cfg.error().what());
    }
    return 0;
  }
  if (budget_set && sized && *sized > MAX_BUDGET_BYTES) broken("parse_env_config accepted a budget above MAX_BUDGET_BYTES");
  if (budget_set != cfg->budget_bytes.has_value() || (budget_set && (!sized || *cfg->budget_bytes != *sized))) {
    broken("parse_env_config's budget differs from parse_byte_size's");
  }
  const bool log_set = vars[1] && !vars[1]->empty();
  if (log_set != cfg->log_file.has_value() || (log_set && *cfg->log_file != *vars[1])) {
    broken("parse_env_config's log file differs from XLOGRT_LOG_FILE");
  }
  const auto want_cache = reference_cache(vars[2] ? *vars[2] : "");
  if (!want_cache) broken("parse_env_config accepted an XLOGRT_CACHE the grammar refuses");
  const auto& z = cfg->cache_sizes;
  const std::optional<std::size_t> got[6] = {z.max_block_bytes, z.thread_block_bytes, z.bin_bytes, z.thread_bytes,
                                             z.depot_bytes, z.small_pool_bytes};
  bool same = cfg->cache == want_cache->on && cfg->cache_nvtx == want_cache->nvtx;
  for (int k = 0; k < 6; ++k) same = same && got[k] == want_cache->sizes[k];
  if (!same) broken("parse_env_config's XLOGRT_CACHE reading is wrong");
  return 0;
}
