// SPDX-License-Identifier: Apache-2.0
// Fuzzes the CSV log reader (read_log_csv / parse_log_line, which bench/log_replay reads
// logs with): any bytes give the records (allocations, frees and samples) or an
// invalid_argument error that names the line; each record read formats back (format_log_line) to a line that parses to the
// same record; and read_log_csv agrees with parse_log_line line by line.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <xlogrt/resource/detail/log_record.hpp>

namespace {
[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "xlogrt fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace xlogrt;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  auto log = read_log_csv(in);
  // The same, line by line.
  std::istringstream again(text);
  std::string line;
  std::size_t number = 0, first_bad = 0;
  std::vector<LogRecord> records;
  while (std::getline(again, line)) {
    ++number;
    if (line.empty() || line.rfind("Thread,", 0) == 0) continue;
    auto r = parse_log_line(line);
    if (!r) {
      if (r.error().code() != errc::invalid_argument || r.error().message().empty()) {
        broken("parse_log_line gave an unnamed error: " + r.error().what());
      }
      first_bad = number;
      break;
    }
    records.push_back(*r);
    // The round trip through the writer's format (the time of day: within one day).
    constexpr std::int64_t day = 86'400'000'000'000;
    if (r->time_ns < day) {
      char buf[detail::LOG_LINE_MAX];
      const std::size_t n = detail::format_log_line(*r, 0, buf);
      if (n == 0 || n > detail::LOG_LINE_MAX || buf[n - 1] != '\n') broken("format_log_line wrote a bad line");
      auto back = parse_log_line(std::string_view(buf, n - 1));
      if (!back) broken("a formatted record does not parse: " + back.error().what());
      if (!(*back == *r)) broken("a record does not survive format_log_line: " + std::string(buf, n - 1));
    }
  }
  if (first_bad != 0) {
    if (log) broken("read_log_csv accepted line " + std::to_string(first_bad) + ", which parse_log_line refuses");
    if (log.error().code() != errc::invalid_argument ||
        log.error().message().rfind("line " + std::to_string(first_bad) + ":", 0) != 0) {
      broken("read_log_csv's error does not name line " + std::to_string(first_bad) + ": " + log.error().what());
    }
  } else {
    if (!log) broken("read_log_csv refused a log whose lines all parse: " + log.error().what());
    if (*log != records) broken("read_log_csv and parse_log_line disagree");
  }
  return 0;
}
