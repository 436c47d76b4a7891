// SPDX-License-Identifier: Apache-2.0
// Logging<Up, Sink>: RMM's CSV layout, every record present under 8 writing threads, a
// failing sink never fails an allocation, NullSink compiles away.

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <streambuf>
#include <thread>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/// The records of `log` that are allocations and frees, in order (its samples left out),
/// and the number of sample records.
std::pair<std::vector<LogRecord>, std::size_t> without_samples(const std::vector<LogRecord>& log) {
  std::vector<LogRecord> out;
  for (const auto& r : log) {
    if (!is_sample(r.action)) out.push_back(r);
  }
  return {out, log.size() - out.size()};
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

TEST_CASE("sample lines read back as the records they were written from; old logs still read", "[logging]") {
  const std::pair<LogAction, const char*> kinds[] = {
      {LogAction::sample_held, "sample held"},
      {LogAction::sample_cached, "sample cached"},
      {LogAction::sample_queued, "sample queued"},
      {LogAction::sample_pool_reserved, "sample pool reserved"},
      {LogAction::sample_pool_used, "sample pool used"},
  };
  std::vector<LogRecord> written;
  for (const auto& [a, text] : kinds) {
    CHECK(is_sample(a));
    LogRecord r{UINT64_MAX, 0, a, 0, SIZE_MAX, StreamId{0}, AllocTag{0}};  // the longest line
    r.time_ns = ((23LL * 60 + 59) * 60 + 59) * 1'000'000'000LL + 999'999'000;
    char line[detail::LOG_LINE_MAX];
    const std::size_t n = detail::format_log_line(r, 0, line);
    const std::string l(line, n);
    CHECK(l == "18446744073709551615,23:59:59.999999," + std::string(text) + ",0x0,18446744073709551615,0,0\n");
    auto back = parse_log_line(std::string_view(l).substr(0, n - 1));
    REQUIRE(back.has_value());
    CHECK(*back == r);
    written.push_back(r);
  }
  for (auto a : {LogAction::allocate, LogAction::allocate_failure, LogAction::free, LogAction::free_failure}) {
    CHECK_FALSE(is_sample(a));
  }
  // A whole log: allocations and samples interleaved, through log_csv and read_log_csv.
  written.insert(written.begin(), LogRecord{7, 1'000, LogAction::allocate, 0x100, 512, StreamId{1}, AllocTag{2}});
  written.push_back(LogRecord{7, 2'000, LogAction::free, 0x100, 512, StreamId{1}, AllocTag{2}});
  // log_csv writes the local time of day, which reads back as such: compare the rest.
  std::istringstream in(detail::log_csv(written));
  auto parsed = read_log_csv(in);
  REQUIRE(parsed.has_value());
  REQUIRE(parsed->size() == written.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    CHECK((*parsed)[i].action == written[i].action);
    CHECK((*parsed)[i].bytes == written[i].bytes);
    CHECK((*parsed)[i].ptr == written[i].ptr);
  }
  // A log written before samples existed reads as it did; an unknown action is still refused.
  std::istringstream old(std::string(LOG_CSV_HEADER) + "\n1,00:00:00.000001,allocate,0x10,64,0,3\n"
                                                       "1,00:00:00.000002,free,0x10,64,0,3\n");
  auto o = read_log_csv(old);
  REQUIRE(o.has_value());
  CHECK(o->size() == 2);
  CHECK(parse_log_line("1,10:30:45.1,sample,0x0,1,0,0").error().code() == errc::invalid_argument);
  CHECK(parse_log_line("1,10:30:45.1,sample heldx,0x0,1,0,0").error().code() == errc::invalid_argument);
}

TEST_CASE("Logging samples the stack on its clock: at the first record, then once a period", "[logging]") {
  using namespace std::chrono_literals;
  // SyncSpy's bytes_outstanding() is its live bytes (its frees are synchronous).
  auto churn = [](auto& log, int n) {
    for (int i = 0; i < n; ++i) {
      auto b = log.allocate(64, StreamId{0}, AllocTag{1});
      REQUIRE(b.has_value());
      REQUIRE(log.deallocate(std::move(*b)).has_value());
    }
  };
  auto samples_in = [](const RingSink& ring) {
    std::vector<LogRecord> out;
    for (const auto& r : ring.records()) {
      if (is_sample(r.action)) out.push_back(r);
    }
    return out;
  };
  SECTION("a period longer than the run: one sample, after the first record") {
    Logging<SyncSpy, RingSink> log{SyncSpy{}, RingSink(256, std::chrono::hours(1))};
    churn(log, 50);
    const auto recs = log.sink().records();
    REQUIRE(recs.size() == 101);
    CHECK(recs[0].action == LogAction::allocate);
    CHECK(recs[1].action == LogAction::sample_held);  // the spy reports only bytes_outstanding()
    CHECK(recs[1].bytes == 64);                        // the block just allocated
    CHECK(recs[1].time_ns == recs[0].time_ns);
    CHECK(recs[1].thread == recs[0].thread);
  }
  SECTION("a period of a microsecond: samples all along") {
    Logging<SyncSpy, RingSink> log{SyncSpy{}, RingSink(4096, 1us)};
    churn(log, 200);
    std::this_thread::sleep_for(2ms);
    churn(log, 1);
    const auto s = samples_in(log.sink());
    CHECK(s.size() >= 2);
    CHECK(s.size() <= 402);  // at most one a record: 201 allocations and 201 frees
    for (const auto& r : s) CHECK((r.bytes == 0 || r.bytes == 64));
  }
  SECTION("no period: none on its own, one when asked; none from an inactive sink") {
    Logging<SyncSpy, RingSink> log{SyncSpy{}, RingSink(256)};
    churn(log, 50);
    CHECK(samples_in(log.sink()).empty());
    auto b = log.allocate(100, StreamId{0}, AllocTag{1});
    REQUIRE(b.has_value());
    log.sample();
    const auto s = samples_in(log.sink());
    REQUIRE(s.size() == 1);
    CHECK(s[0].bytes == 100);
    REQUIRE(log.deallocate(std::move(*b)).has_value());

    Logging<PlainSpy> off{PlainSpy{}};
    off.sample();  // no file: nothing, and no crash
    CHECK_FALSE(off.sink().active());
  }
  SECTION("a stream sink samples every 10 ms by default") {
    CHECK(LogSinkOptions{}.sample_every == 10ms);
    std::ostringstream out;
    {
      auto sink = OStreamSink::open(out);
      REQUIRE(sink.has_value());
      Logging<PlainSpy, OStreamSink> log{PlainSpy{}, std::move(*sink)};
      churn(log, 10);
      REQUIRE(log.flush().has_value());
    }
    std::istringstream in(out.str());
    auto parsed = read_log_csv(in);
    REQUIRE(parsed.has_value());
    REQUIRE(parsed->size() >= 21);
    CHECK((*parsed)[1].action == LogAction::sample_held);
  }
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
  auto parsed = read_log_csv(in);
  REQUIRE(parsed.has_value());
  // The stream sink samples the stack every 10 ms by default: at least once, at the
  // first record, each sample a `sample held` line (the upstream reports only that).
  auto [records, samples] = without_samples(*parsed);
  const auto* log = &records;
  CHECK(samples >= 1);
  for (const auto& r : *parsed) {
    if (is_sample(r.action)) CHECK(r.action == LogAction::sample_held);
  }
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
  auto parsed = read_log_csv(in);
  std::remove(path.c_str());
  REQUIRE(parsed.has_value());
  const auto [log, samples] = without_samples(*parsed);
  CHECK(samples >= 1);
  CHECK(log.size() == std::size_t{THREADS} * ROUNDS * 2);
  check_alternation(log);

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
  auto s2 = OStreamSink::open(os, LogSinkOptions{.sample_every = {}});  // 20 records, no sample
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

TEST_CASE("FileSink names the path escaped: a newline, ESC or BEL in it reaches no terminal", "[logging]") {
  // Issue #28, finding 4: the path was printed raw.
  const std::string path = "/nonexistent-dir/a\nb\x1b[31m\x07.csv";
  auto s = FileSink::open(path);
  REQUIRE_FALSE(s);
  CHECK(s.error().code() == errc::sink_failure);
  const std::string m = s.error().message();
  CHECK_THAT(m, Catch::Contains("'/nonexistent-dir/a\\x0ab\\x1b[31m\\x07.csv'"));
  CHECK(m.find_first_of("\n\x1b\x07") == std::string::npos);
}

TEST_CASE("FileSink refuses a FIFO by name at once, with or without a reader, and a directory", "[logging]") {
  // Issue #28, finding 4: a FIFO with no reader made the open wait for one for ever.
  const std::string fifo = "xlogrt_test_fifo_" + std::to_string(::getpid());
  (void)::unlink(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto opening = std::async(std::launch::async, [&] { return FileSink::open(fifo); });
  if (opening.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // lets the open return
    (void)opening.wait();
    if (reader >= 0) ::close(reader);
    (void)::unlink(fifo.c_str());
    FAIL("FileSink::open of a FIFO without a reader still waited after 5 s");
  }
  auto no_reader = opening.get();
  REQUIRE_FALSE(no_reader);
  CHECK(no_reader.error().code() == errc::sink_failure);
  CHECK_THAT(no_reader.error().message(), Catch::Contains(fifo) && Catch::Contains("a FIFO, not a regular file"));

  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // a reader does not make it a file
  REQUIRE(reader >= 0);
  auto with_reader = FileSink::open(fifo);
  ::close(reader);
  (void)::unlink(fifo.c_str());
  REQUIRE_FALSE(with_reader);
  CHECK_THAT(with_reader.error().message(), Catch::Contains("a FIFO, not a regular file"));

  auto dir = FileSink::open(".");
  REQUIRE_FALSE(dir);
  CHECK_THAT(dir.error().message(), Catch::Contains("a directory, not a regular file"));
}

TEST_CASE("a FileSink whose file fills up mid-batch leaves whole lines only, and goes on after them", "[logging]") {
  // Issue #28, finding 4: a short write (the disk full) left a partial CSV line at the
  // end, and a later batch was appended to it. A child process writes under a small
  // RLIMIT_FSIZE (SIGXFSZ ignored, so write(2) fails with EFBIG past the limit, as it
  // fails with ENOSPC on a full disk) that ends in the middle of the third record.
  const LogRecord rec{4242, 1'700'000'000'000'000'000, LogAction::allocate, 0x7f0000001000, 4096, StreamId{1}, AllocTag{2}};
  char line[detail::LOG_LINE_MAX];
  const std::size_t len = detail::format_log_line(rec, 0, line);
  const std::size_t header = LOG_CSV_HEADER.size() + 1;
  const std::size_t limit = header + 2 * len + len / 2;
  const std::string path = "xlogrt_test_fsize_" + std::to_string(::getpid()) + ".csv";
  (void)::unlink(path.c_str());
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 0;
    {
      std::signal(SIGXFSZ, SIG_IGN);
      rlimit rl{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
      if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) ::_exit(10);
      auto sink = FileSink::open(path);
      if (!sink) ::_exit(11);
      for (int i = 0; i < 5; ++i) sink->write(rec);
      if (sink->flush()) code = 12;  // some records cannot fit: flush must say so
      sink->write(rec);  // a later batch: it fits where the cut batch began, or is dropped
      (void)sink->flush();
    }  // drains and closes
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  (void)::unlink(path.c_str());
  INFO("the file: " << text);
  REQUIRE(text.size() >= header);
  CHECK(text.size() <= limit);
  CHECK(text.back() == '\n');
  CHECK((text.size() - header) % len == 0);  // whole lines, each the same record
  std::istringstream is(text);
  auto log = read_log_csv(is);
  INFO((log ? std::string() : log.error().what()));
  REQUIRE(log.has_value());
  CHECK(log->size() == (text.size() - header) / len);
  for (const auto& r : *log) CHECK(r.bytes == 4096u);
}
