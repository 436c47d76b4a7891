// SPDX-License-Identifier: Apache-2.0
// Logging<Up, Sink>: RMM's CSV layout, every record present under 8 writing threads, a
// failing sink never fails an allocation, NullSink compiles away.

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <streambuf>
#include <thread>
#include <unistd.h>
#include <vector>

#include <xlogrt/resource/logging.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {

/// Checks a parsed log: for each pointer, allocate and free alternate (a free never
/// comes before its allocate, an address is never handed out twice without a free).
void check_alternation(const std::vector<LogRecord>& log) {
  std::map<std::uint64_t, std::size_t> live;
  int bad = 0;
  for (const auto& r : log) {
    if (r.action == LogAction::allocate) {
      if (!live.emplace(r.ptr, r.bytes).second) ++bad;
    } else if (r.action == LogAction::free) {
      auto it = live.find(r.ptr);
      if (it == live.end() || it->second != r.bytes) {
        ++bad;
      } else {
        live.erase(it);
      }
    }
  }
  CHECK(bad == 0);
  CHECK(live.empty());
}

/// Runs `threads` threads that each allocate and free `rounds` blocks through `log`.
template <class L>
int hammer(L& log, int threads, int rounds) {
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        auto b = log.allocate(static_cast<std::size_t>(16 + i % 64), StreamId{static_cast<std::uint32_t>(t)},
                              AllocTag{static_cast<std::uint32_t>(100 + t)});
        if (!b) {
          ++errors;
          continue;
        }
        if (!log.deallocate(std::move(*b))) ++errors;
      }
    });
  }
  for (auto& th : ts) th.join();
  return errors.load();
}

/// A stream buffer that refuses every write once broken.
struct BreakableBuf : std::stringbuf {
  std::atomic<bool> broken{false};
  int_type overflow(int_type c) override { return broken ? traits_type::eof() : std::stringbuf::overflow(c); }
  std::streamsize xsputn(const char* p, std::streamsize n) override {
    return broken ? 0 : std::stringbuf::xsputn(p, n);
  }
};

/// Hands addresses back out as soon as they are freed (LIFO), so that a log that wrote a
/// free after the reuse of its address would show it.
class ReusingUpstream {
 public:
  static constexpr bool supports_block_use_tracking = false;
  result<DeviceBlock> allocate(std::size_t bytes, StreamId s, AllocTag t) noexcept {
    std::lock_guard lock(st_->mu);
    std::uint64_t p;
    if (st_->free.empty()) {
      p = 0x10000 + 0x100 * st_->next++;
    } else {
      p = st_->free.back();
      st_->free.pop_back();
    }
    return DeviceBlock{p, bytes, s, 0, t, BlockId{1, static_cast<std::uint32_t>(p >> 8), 0}};
  }
  result<void> deallocate(DeviceBlock&& b) noexcept {
    std::lock_guard lock(st_->mu);
    st_->free.push_back(b.ptr());
    DeviceBlock gone = std::move(b);
    return ok();
  }
  std::size_t bytes_outstanding() const noexcept { return 0; }
  result<void> reap_pending() noexcept { return ok(); }
  std::uint32_t device_ordinal() const noexcept { return 0; }

 private:
  struct State {
    std::mutex mu;
    std::vector<std::uint64_t> free;
    std::uint64_t next = 0;
  };
  std::unique_ptr<State> st_ = std::make_unique<State>();
};

}  // namespace

TEST_CASE("a log line reads back as the record it was written from", "[logging]") {
  LogRecord r{12345, 0, LogAction::allocate_failure, 0, 4096, StreamId{3}, AllocTag{9}};
  r.time_ns = ((13LL * 60 + 7) * 60 + 42) * 1'000'000'000LL + 123'456'000;  // 13:07:42.123456 UTC
  char line[detail::LOG_LINE_MAX];
  const std::size_t n = detail::format_log_line(r, 0, line);
  const std::string s(line, n);
  CHECK(s == "12345,13:07:42.123456,allocate failure,0x0,4096,3,9\n");
  auto back = parse_log_line(std::string_view(s).substr(0, n - 1));
  REQUIRE(back.has_value());
  CHECK(*back == r);

  // A line as RMM writes it: no Tag column, the stream as a pointer.
  auto rmm = parse_log_line("140573312345856,10:30:45.123456,free,0x7f8a40000000,1024,0x7f8a38001020");
  REQUIRE(rmm.has_value());
  CHECK(rmm->action == LogAction::free);
  CHECK(rmm->ptr == 0x7f8a40000000ULL);
  CHECK(rmm->bytes == 1024);
  CHECK(rmm->tag == AllocTag::UNTAGGED);

  CHECK(parse_log_line("1,10:30:45.1,alloc,0x1,1,0").error().code() == errc::invalid_argument);
  CHECK(parse_log_line("1,10:99:45.1,free,0x1,1,0").error().code() == errc::invalid_argument);
  CHECK(parse_log_line("1,10:30:45.1,free,0x1").error().code() == errc::invalid_argument);
  std::istringstream bad(std::string(LOG_CSV_HEADER) + "\n1,00:00:00.000001,free,zz,1,0,0\n");
  auto e = read_log_csv(bad);
  REQUIRE_FALSE(e);
  CHECK_THAT(e.error().message(), Catch::Contains("line 2") && Catch::Contains("Pointer"));
}

TEST_CASE("every allocate, failure and free is logged with its fields", "[logging]") {
  PlainSpy spy;
  auto st = spy.state();
  Logging<PlainSpy, RingSink> log{std::move(spy), RingSink(64)};
  auto a = log.allocate(256, StreamId{2}, AllocTag{5});
  REQUIRE(a.has_value());
  const auto ptr = a->ptr();
  st->fail_allocate_in = 1;
  REQUIRE_FALSE(log.allocate(512, StreamId{1}, AllocTag{6}));
  REQUIRE(log.deallocate(std::move(*a)).has_value());
  DeviceBlock forged{ptr, 256, StreamId{2}, 0, AllocTag{5}, BlockId{st->owner, 0, 0}};
  REQUIRE_FALSE(log.deallocate(std::move(forged)));  // a double free

  const auto recs = log.sink().records();
  REQUIRE(recs.size() == 5);
  CHECK(recs[0].action == LogAction::allocate);
  CHECK(recs[0].ptr == ptr);
  CHECK(recs[0].bytes == 256);
  CHECK(recs[0].stream == StreamId{2});
  CHECK(recs[0].tag == AllocTag{5});
  CHECK(recs[0].thread == detail::os_thread_id());
  CHECK(recs[0].time_ns > 0);
  CHECK(recs[1].action == LogAction::allocate_failure);
  CHECK(recs[1].ptr == 0);
  CHECK(recs[1].bytes == 512);
  CHECK(recs[1].tag == AllocTag{6});
  CHECK(recs[2].action == LogAction::free);
  CHECK(recs[2].ptr == ptr);
  CHECK(recs[3].action == LogAction::free);
  CHECK(recs[4].action == LogAction::free_failure);
  CHECK(recs[4].time_ns >= recs[0].time_ns);

  std::istringstream csv(log.sink().csv());
  std::string header;
  std::getline(csv, header);
  CHECK(header == "Thread,Time,Action,Pointer,Size,Stream,Tag");
  auto parsed = read_log_csv(csv);
  REQUIRE(parsed.has_value());
  REQUIRE(parsed->size() == 5);
  CHECK((*parsed)[1].action == LogAction::allocate_failure);
  CHECK((*parsed)[2].ptr == ptr);
}

TEST_CASE("a ring sink keeps the last records", "[logging]") {
  RingSink ring(4);
  for (std::uint64_t i = 1; i <= 10; ++i) ring.write(LogRecord{1, 0, LogAction::free, i, 1, {}, {}});
  const auto r = ring.records();
  REQUIRE(r.size() == 4);
  CHECK(r.front().ptr == 7);
  CHECK(r.back().ptr == 10);
  CHECK(ring.overwritten() == 6);
  CHECK(ring.dropped() == 0);
}

TEST_CASE("8 threads logging to a stream: the CSV parses back with every record", "[logging][threads]") {
  constexpr int THREADS = 8, ROUNDS = 2000;
  std::ostringstream out;
  {
    // A small ring that wraps many times; producers wait for room rather than drop (a slow
    // sanitizer build must not turn into drops).
    auto sink = OStreamSink::open(out, LogSinkOptions{.capacity = 256, .max_wait = std::chrono::seconds(60)});
    REQUIRE(sink.has_value());
    Logging<ReusingUpstream, OStreamSink> log{ReusingUpstream{}, std::move(*sink)};
    CHECK(hammer(log, THREADS, ROUNDS) == 0);
    REQUIRE(log.flush().has_value());
    CHECK(log.dropped() == 0);
  }
  std::istringstream in(out.str());
  std::string header;
  std::getline(in, header);
  CHECK(header == LOG_CSV_HEADER);
  auto log = read_log_csv(in);
  REQUIRE(log.has_value());
  REQUIRE(log->size() == std::size_t{THREADS} * ROUNDS * 2);
  std::map<std::uint32_t, int> per_tag;
  std::set<std::uint64_t> os_threads;
  for (const auto& r : *log) {
    ++per_tag[r.tag.value];
    os_threads.insert(r.thread);
    CHECK(r.stream.value == r.tag.value - 100);
  }
  CHECK(os_threads.size() == THREADS);
  for (int t = 0; t < THREADS; ++t) CHECK(per_tag[static_cast<std::uint32_t>(100 + t)] == 2 * ROUNDS);
  check_alternation(*log);
}

TEST_CASE("8 threads logging to a file: every record is there", "[logging][threads]") {
  const std::string path = "xlogrt_test_log_" + std::to_string(::getpid()) + ".csv";
  constexpr int THREADS = 8, ROUNDS = 1000;
  {
    auto sink = FileSink::open(path);
    REQUIRE(sink.has_value());
    Logging<PlainSpy, FileSink> log{PlainSpy{}, std::move(*sink)};
    CHECK(hammer(log, THREADS, ROUNDS) == 0);
  }  // destruction drains and closes
  std::ifstream in(path);
  auto log = read_log_csv(in);
  std::remove(path.c_str());
  REQUIRE(log.has_value());
  CHECK(log->size() == std::size_t{THREADS} * ROUNDS * 2);
  check_alternation(*log);

  auto missing = FileSink::open("/nonexistent-dir/x.csv");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code() == errc::sink_failure);
  CHECK_THAT(missing.error().message(), Catch::Contains("/nonexistent-dir/x.csv"));
}

TEST_CASE("a failing sink never fails an allocation; it counts what it drops", "[logging]") {
  {
    BreakableBuf buf;
    buf.broken = true;
    std::ostream broken(&buf);
    auto sink = OStreamSink::open(broken);
    REQUIRE_FALSE(sink);  // the header cannot be written: said at once
    CHECK(sink.error().code() == errc::sink_failure);
  }
  // A stream that breaks after the header.
  BreakableBuf buf;
  std::ostream os(&buf);
  auto s2 = OStreamSink::open(os);
  REQUIRE(s2.has_value());
  Logging<SyncSpy, OStreamSink> log{SyncSpy{}, std::move(*s2)};
  buf.broken = true;
  for (int i = 0; i < 10; ++i) {
    auto b = log.allocate(64, StreamId{0}, AllocTag{});
    REQUIRE(b.has_value());
    REQUIRE(log.deallocate(std::move(*b)).has_value());
  }
  auto f = log.flush();
  REQUIRE_FALSE(f);
  CHECK(f.error().code() == errc::sink_failure);
  CHECK(log.dropped() == 20);
}

TEST_CASE("NullSink compiles away; FileSink without a file logs nothing", "[logging]") {
  STATIC_REQUIRE(sizeof(Logging<PlainSpy, NullSink>) == sizeof(PlainSpy));
  STATIC_REQUIRE(TrackingResource<Logging<TrackingSpy, NullSink>>);
  STATIC_REQUIRE_FALSE(TrackingResource<Logging<PlainSpy, NullSink>>);
  Logging<PlainSpy> off{PlainSpy{}};
  CHECK_FALSE(off.sink().active());
  auto b = off.allocate(8, StreamId{0}, AllocTag{});
  REQUIRE(b.has_value());
  REQUIRE(off.deallocate(std::move(*b)).has_value());
  CHECK(off.dropped() == 0);
  CHECK(off.flush().has_value());
}
