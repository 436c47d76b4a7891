// SPDX-License-Identifier: Apache-2.0
// SimDriver as a machine: streams, events, memory, host functions, failure injection,
// faults and contexts. Most cases run in manual mode, so each step is deterministic.

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "sim_fixture.hpp"
#include "xlogrt/driver/status.hpp"

using namespace xlogrt;
using simtest::expect_ok;
using simtest::manual;
using simtest::Sim;
using simtest::value;

namespace {

struct Log {
  std::vector<int> order;
};

template <int N>
void log_call(void* p) {
  static_cast<Log*>(p)->order.push_back(N);
}

}  // namespace

TEST_CASE("the concept's static facts", "[sim]") {
  STATIC_REQUIRE(Driver<SimDriver>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<SimDriver::stream_t>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<SimDriver::event_t>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<SimDriver::context_t>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<SimDriver::mempool_t>);
  CHECK(std::string(SimDriver::kind) == "sim");
  CHECK(SimDriver::stream_t{} == nullptr);
}

TEST_CASE("devices, attributes and capability switches", "[sim]") {
  SimConfig c = manual();
  c.devices = 3;
  c.memory_pools_supported = false;
  c.stream_mem_ops_supported = false;
  SimDriver d(c);
  CHECK(value(d.device_count()) == 3);
  CHECK(value(d.device_get(2)) == 2);
  auto bad = d.device_get(3);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::no_device);
  CHECK(bad.error().driver_status() == status::invalid_device);
  CHECK(value(d.device_total_mem(1)) == (std::size_t{1} << 20));
  CHECK(value(d.device_attribute(0, DeviceAttr::memory_pools_supported)) == 0);
  CHECK(value(d.device_attribute(0, DeviceAttr::stream_mem_ops_supported)) == 0);
  CHECK(value(d.device_attribute(0, DeviceAttr::can_map_host_memory)) == 1);
  CHECK(value(d.device_attribute(0, DeviceAttr::compute_capability_major)) == 9);
  CHECK(value(d.device_name(1)).find("1") != std::string::npos);

  auto pool = d.device_default_mempool(0);
  REQUIRE_FALSE(pool);
  CHECK(pool.error().driver_status() == status::not_supported);

  auto ctx = value(d.primary_ctx_retain(0));
  expect_ok(d.ctx_make_current(ctx));
  auto s = value(d.stream_create());
  auto w = d.stream_write_value32(s, 0, 1);
  REQUIRE_FALSE(w);
  CHECK(w.error().driver_status() == status::not_supported);
  CHECK(w.error().message().find("cuStreamWriteValue32") == 0);
}

TEST_CASE("a configuration that cannot be honoured fails every call with the reason", "[sim]") {
  SimConfig c = manual();
  c.devices = 0;
  SimDriver d(c);
  auto n = d.device_count();
  REQUIRE_FALSE(n);
  CHECK(n.error().message().find("SimConfig::devices") != std::string::npos);
}

TEST_CASE("open() hands out one process-wide simulator", "[sim]") {
  auto a = value(SimDriver::open());
  auto b = value(SimDriver::open());
  CHECK(a == b);
  CHECK(a->config().executor == SimExecutor::threaded);
  CHECK(value(a->device_count()) == 2);
  CHECK(value(a->device_total_mem(0)) == (std::size_t{1} << 30));
}

TEST_CASE("calls that need a context fail without a current one", "[sim]") {
  SimDriver d(manual());
  auto s = d.stream_create();
  REQUIRE_FALSE(s);
  CHECK(s.error().driver_status() == status::invalid_context);
  CHECK(s.error().message().find("ctx_make_current") != std::string::npos);
  auto q = d.stream_query(SimDriver::stream_t{});  // the legacy stream needs one too
  REQUIRE_FALSE(q);
  CHECK(q.error().driver_status() == status::invalid_context);

  // A context current on another simulator is not current on this one.
  SimDriver other(manual());
  expect_ok(other.ctx_make_current(value(other.primary_ctx_retain(0))));
  CHECK_FALSE(d.stream_create());
  CHECK(other.stream_create());
}

TEST_CASE("operations on one stream run in the order they were enqueued", "[sim]") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    Sim sim(manual(seed));
    auto s = sim.stream();
    auto p = sim.alloc(64, s);
    Log log;
    sim.fill(p, 1, 64, s);
    expect_ok(sim.d.launch_host_func(s, log_call<1>, &log));
    sim.fill(p, 2, 32, s);
    expect_ok(sim.d.launch_host_func(s, log_call<2>, &log));
    std::vector<std::uint8_t> pattern(16, 7);
    expect_ok(sim.d.memcpy_htod_async(p + 8, pattern.data(), pattern.size(), s));
    expect_ok(sim.d.launch_host_func(s, log_call<3>, &log));
    CHECK(log.order.empty());  // manual mode: nothing ran yet
    CHECK(sim.d.pending_ops() == 7);
    auto out = sim.read(p, 64, s);
    CHECK(log.order == std::vector<int>{1, 2, 3});
    for (int i = 0; i < 64; ++i) {
      const int want = i >= 8 && i < 24 ? 7 : i < 32 ? 2 : 1;
      INFO("byte " << i);
      CHECK(out[static_cast<std::size_t>(i)] == want);
    }
    CHECK(sim.d.hazards().empty());
  }
}

TEST_CASE("step runs one operation at a time and queries do not advance", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  auto p = sim.alloc(16, s);
  sim.fill(p, 3, 16, s);
  CHECK_FALSE(value(sim.d.stream_query(s)));
  CHECK(sim.d.step());
  CHECK_FALSE(value(sim.d.stream_query(s)));
  CHECK(sim.d.step());
  CHECK(value(sim.d.stream_query(s)));
  CHECK_FALSE(sim.d.step());
  CHECK(sim.d.run_until_idle() == 0);
}

TEST_CASE("a wait on an event orders another stream after the recorded point", "[sim]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  auto e = sim.event();
  auto src = sim.alloc(32, a);
  auto dst = sim.alloc(32, a);
  sim.fill(src, 9, 32, a);
  expect_ok(sim.d.event_record(e, a));
  CHECK_FALSE(value(sim.d.event_query(e)));
  expect_ok(sim.d.stream_wait_event(b, e));
  expect_ok(sim.d.memcpy_dtod_async(dst, src, 32, b));

  // Only b is given to the scheduler: b's copy cannot run before a's record.
  CHECK(sim.d.pending_ops() == 6);
  expect_ok(sim.d.stream_synchronize(b));
  CHECK(value(sim.d.event_query(e)));
  CHECK(value(sim.d.stream_query(a)));
  auto out = sim.read(dst, 32, b);
  CHECK(out == std::vector<std::uint8_t>(32, 9));
  CHECK(sim.d.hazards().empty());
}

TEST_CASE("synchronising one stream does not run unrelated streams in manual mode", "[sim]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  auto pa = sim.alloc(8, a);
  auto pb = sim.alloc(8, b);
  sim.fill(pa, 1, 8, a);
  sim.fill(pb, 2, 8, b);
  expect_ok(sim.d.stream_synchronize(a));
  CHECK(value(sim.d.stream_query(a)));
  CHECK_FALSE(value(sim.d.stream_query(b)));
  CHECK(sim.d.pending_ops() == 2);
}

TEST_CASE("an event never recorded is complete, and waiting on it is a no-op", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  auto e = sim.event();
  CHECK(value(sim.d.event_query(e)));
  expect_ok(sim.d.event_synchronize(e));
  expect_ok(sim.d.stream_wait_event(s, e));
  CHECK(sim.d.pending_ops() == 0);
  expect_ok(sim.d.event_destroy(e));
  auto gone = sim.d.event_query(e);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().driver_status() == status::invalid_handle);
}

TEST_CASE("re-recording an event moves the point later waits see", "[sim]") {
  Sim sim;
  auto a = sim.stream();
  auto e = sim.event();
  auto p = sim.alloc(4, a);
  expect_ok(sim.d.event_record(e, a));
  sim.fill(p, 1, 4, a);
  expect_ok(sim.d.event_record(e, a));
  CHECK(sim.d.step());                       // alloc
  CHECK(sim.d.step());                       // first record
  CHECK_FALSE(value(sim.d.event_query(e)));  // the query sees the latest record
  sim.d.run_until_idle();
  CHECK(value(sim.d.event_query(e)));
}

TEST_CASE("the legacy default stream is a value-initialised handle", "[sim]") {
  Sim sim;
  const SimDriver::stream_t legacy{};
  auto p = value(sim.d.mem_alloc(64));
  sim.fill(p, 5, 64, legacy);
  CHECK(sim.read(p, 64, legacy) == std::vector<std::uint8_t>(64, 5));
  CHECK(value(sim.d.stream_id(legacy)) != 0);
  auto destroyed = sim.d.stream_destroy(legacy);
  REQUIRE_FALSE(destroyed);
  CHECK(destroyed.error().driver_status() == status::invalid_handle);
  expect_ok(sim.d.mem_free(p));
}

TEST_CASE("async allocations are live once they run and freed when the free runs", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  auto p = sim.alloc(1000, s);
  CHECK(p % SimDriver::alloc_granularity == 0);
  auto st = value(sim.d.memory_stats(0));
  CHECK(st.allocated == 1024);  // rounded to 256
  CHECK(st.live_blocks == 1);
  CHECK(value(sim.d.bytes_reserved(0)) == 1024);

  expect_ok(sim.d.mem_free_async(p, s));
  st = value(sim.d.memory_stats(0));
  CHECK(st.allocated == 0);
  CHECK(st.free_pending == 1024);
  CHECK(value(sim.d.bytes_reserved(0)) == 1024);  // the free has not run
  sim.d.run_until_idle();
  st = value(sim.d.memory_stats(0));
  CHECK(st.free_pending == 0);
  CHECK(st.quarantined == 1024);
  CHECK(value(sim.d.bytes_reserved(0)) == 0);
  CHECK(st.peak_allocated == 1024);

  auto again = sim.d.mem_free_async(p, s);
  REQUIRE_FALSE(again);
  CHECK(again.error().driver_status() == status::invalid_value);
  CHECK(again.error().message().find("not the start of a live allocation") != std::string::npos);
  auto zero = sim.d.mem_alloc_async(0, sim.pool, s);
  REQUIRE_FALSE(zero);
  CHECK(zero.error().driver_status() == status::invalid_value);
}

TEST_CASE("a free is reused early by later work ordered after it, and only by that", "[sim]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  auto c = sim.stream();
  auto p = sim.alloc(256, a);
  expect_ok(sim.d.mem_free_async(p, a));
  // Same stream: stream order makes the reuse legal before the free has run.
  auto q = sim.alloc(256, a);
  CHECK(q == p);
  CHECK(sim.d.pending_ops() == 3);
  expect_ok(sim.d.mem_free_async(q, a));
  // Another stream with no ordering never gets it.
  auto r = sim.alloc(256, b);
  CHECK(r != p);
  // A stream ordered after the free by an event wait does.
  auto e = sim.event();
  expect_ok(sim.d.event_record(e, a));
  expect_ok(sim.d.stream_wait_event(c, e));
  auto t = sim.alloc(256, c);
  CHECK(t == p);
  CHECK(sim.d.hazards().empty());
}

TEST_CASE("freed memory is poisoned and quarantined, not handed to unrelated work", "[sim]") {
  SimConfig cfg = manual(1, 1024);  // four 256-byte blocks
  Sim sim(cfg);
  auto a = sim.stream();
  auto b = sim.stream();
  auto p = sim.alloc(256, a);
  sim.fill(p, 0x11, 256, a);
  expect_ok(sim.d.mem_free_async(p, a));
  sim.d.run_until_idle();  // the free runs, but no host synchronisation saw it
  auto view = value(sim.d.host_view(p, 256));
  CHECK(std::to_integer<int>(view[0]) == cfg.poison_byte);
  CHECK(std::to_integer<int>(view[255]) == cfg.poison_byte);
  CHECK(value(sim.d.memory_stats(0)).quarantined == 256);

  std::set<std::uint64_t> got;
  for (int i = 0; i < 3; ++i) got.insert(sim.alloc(256, b));
  CHECK(got.count(p) == 0);  // the quarantined block is the last resort
  // Under pressure the quarantine gives way instead of failing.
  CHECK(sim.alloc(256, b) == p);
  CHECK(value(sim.d.memory_stats(0)).quarantined == 0);
}

TEST_CASE("fresh memory holds garbage, not zeros", "[sim]") {
  SimConfig cfg = manual();
  Sim sim(cfg);
  auto s = sim.stream();
  auto p = sim.alloc(64, s);
  auto out = sim.read(p, 64, s);
  CHECK(out == std::vector<std::uint8_t>(64, cfg.uninit_byte));
}

TEST_CASE("fill_memory = false: device bytes change only when an operation writes them", "[sim]") {
  SimConfig cfg = manual(1, 4096);
  cfg.fill_memory = false;
  Sim sim(cfg);
  auto s = sim.stream();
  auto p = sim.alloc(256, s);
  CHECK(sim.read(p, 256, s) == std::vector<std::uint8_t>(256, 0));  // the fresh mapping's zeros
  sim.fill(p, 0x11, 256, s);
  expect_ok(sim.d.mem_free_async(p, s));
  sim.d.run_until_idle();
  auto view = value(sim.d.host_view(p, 256));
  CHECK(std::to_integer<int>(view[0]) == 0x11);  // not poisoned
  CHECK(std::to_integer<int>(view[255]) == 0x11);
  auto q = value(sim.d.mem_alloc(256));  // the synchronous pair: the same
  expect_ok(sim.d.memset_d8_async(q, 0x22, 256, s));
  expect_ok(sim.d.stream_synchronize(s));
  expect_ok(sim.d.mem_free(q));
  CHECK(std::to_integer<int>(value(sim.d.host_view(q, 1))[0]) == 0x22);
  // The checker does not depend on the fills: a use after free is still reported.
  expect_ok(sim.d.memset_d8_async(q, 0x33, 16, s));
  REQUIRE(sim.d.hazards().size() == 1);
  CHECK(sim.d.hazards().front().kind == SimHazardKind::use_after_free);
}

TEST_CASE("out of memory is status::out_of_memory and changes nothing", "[sim]") {
  Sim sim(manual(1, 4096));
  auto s = sim.stream();
  auto other = sim.stream();
  auto p = sim.alloc(4096, s);
  auto more = sim.d.mem_alloc_async(1, sim.pool, other);
  REQUIRE_FALSE(more);
  CHECK(more.error().code() == errc::out_of_memory);
  CHECK(more.error().driver_status() == status::out_of_memory);
  CHECK(more.error().message().find(
            "cuMemAllocFromPoolAsync failed with CUDA_ERROR_OUT_OF_MEMORY (2)") == 0);
  auto huge = sim.d.mem_alloc_async(std::size_t{1} << 40, sim.pool, s);
  REQUIRE_FALSE(huge);
  CHECK(huge.error().code() == errc::out_of_memory);
  CHECK(value(sim.d.memory_stats(0)).allocated == 4096);
  CHECK(sim.d.pending_ops() == 1);

  // A free pending on s is not memory for an unordered stream, even under pressure...
  expect_ok(sim.d.mem_free_async(p, s));
  CHECK_FALSE(sim.d.mem_alloc_async(256, sim.pool, other));
  // ...until the host has seen it run.
  expect_ok(sim.d.stream_synchronize(s));
  CHECK(sim.d.mem_alloc_async(256, sim.pool, other));
  auto info = value(sim.d.mem_get_info());
  CHECK(info.total == 4096);
  CHECK(info.free == 4096 - 256);
}

TEST_CASE("memset and memcpy move bytes between host and devices", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  auto a = sim.alloc(128, s);
  auto b = sim.alloc(128, s);
  std::vector<std::uint8_t> in(128);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i * 7 + 1);
  expect_ok(sim.d.memcpy_htod_async(a, in.data(), in.size(), s));
  expect_ok(sim.d.memcpy_dtod_async(b, a, 128, s));
  sim.fill(b + 100, 0xEE, 28, s);
  auto out = sim.read(b, 128, s);
  for (std::size_t i = 0; i < 128; ++i) {
    INFO("byte " << i);
    CHECK(out[i] == (i < 100 ? in[i] : 0xEE));
  }

  // Across devices, through device 1's context and stream.
  auto ctx1 = value(sim.d.primary_ctx_retain(1));
  expect_ok(sim.d.ctx_make_current(ctx1));
  auto s1 = value(sim.d.stream_create());
  auto pool1 = value(sim.d.device_default_mempool(1));
  auto c = value(sim.d.mem_alloc_async(128, pool1, s1));
  CHECK(c != a);
  auto e = value(sim.d.event_create());
  expect_ok(sim.d.event_record(e, s1));
  expect_ok(sim.d.memcpy_dtod_async(c, b, 128, s1));
  CHECK(sim.read(c, 128, s1) == out);
  auto wrong = sim.d.event_record(e, s);  // an event of device 1 on a stream of device 0
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().driver_status() == status::invalid_handle);
}

TEST_CASE("a host function runs in stream order and may call the driver", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  struct Ctx {
    SimDriver* d;
    SimDriver::stream_t s;
    std::uint64_t p;
    std::vector<std::uint8_t> seen = std::vector<std::uint8_t>(4, 0);
    bool enqueued = false;
  } ctx{&sim.d, s, sim.alloc(4, s)};
  sim.fill(ctx.p, 4, 4, s);
  expect_ok(sim.d.launch_host_func(
      s,
      [](void* v) {
        auto* c = static_cast<Ctx*>(v);
        // Work enqueued from inside a host function goes after it in stream order.
        c->enqueued = c->d->memset_d8_async(c->p, 8, 4, c->s).has_value();
      },
      &ctx));
  sim.fill(ctx.p, 6, 2, s);
  expect_ok(sim.d.stream_synchronize(s));
  CHECK(ctx.enqueued);
  expect_ok(sim.d.stream_synchronize(s));
  // Order: fill 4, host func (enqueues fill 8 at the tail), fill 6 on [0,2), then fill 8.
  CHECK(sim.read(ctx.p, 4, s) == std::vector<std::uint8_t>{8, 8, 8, 8});
}

TEST_CASE("failure injection fails the n-th call exactly, with CUDA's status", "[sim][inject]") {
  Sim sim;
  auto s = sim.stream();
  const auto before = sim.d.calls("cuMemAllocAsync");
  CHECK(sim.d.fail_nth("cuMemAllocAsync", 3, status::out_of_memory));
  CHECK(sim.d.mem_alloc_async(64, sim.pool, s));
  CHECK(sim.d.mem_alloc_async(64, sim.pool, s));
  const auto allocated = value(sim.d.memory_stats(0)).allocated;
  auto third = sim.d.mem_alloc_async(64, sim.pool, s);
  REQUIRE_FALSE(third);
  CHECK(third.error().code() == errc::out_of_memory);
  CHECK(third.error().driver_status() == status::out_of_memory);
  CHECK(third.error().message().find(
            "cuMemAllocFromPoolAsync failed with CUDA_ERROR_OUT_OF_MEMORY (2)") == 0);
  CHECK(value(sim.d.memory_stats(0)).allocated == allocated);  // no effect
  CHECK(sim.d.mem_alloc_async(64, sim.pool, s));               // only the third
  CHECK(sim.d.calls("cuMemAllocAsync") == before + 4);
  CHECK(sim.d.calls("cuMemAllocFromPoolAsync") == before + 4);

  // Any entry point, any status; unnamed statuses get CUDA_ERROR_<n>.
  sim.d.fail_nth("cuStreamCreate", 1, 46);
  auto sc = sim.d.stream_create();
  REQUIRE_FALSE(sc);
  CHECK(sc.error().driver_status() == 46);
  CHECK(sc.error().message().find("cuStreamCreate failed with CUDA_ERROR_46 (46)") == 0);
  CHECK(sim.d.status_name(46) == "CUDA_ERROR_46");
  CHECK(sim.d.status_name(status::launch_failed) == "CUDA_ERROR_LAUNCH_FAILED");

  sim.d.fail_always("cuEventRecord", status::launch_failed);
  auto e = sim.event();
  for (int i = 0; i < 3; ++i) {
    auto r = sim.d.event_record(e, s);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::stream_fault);
  }
  CHECK(value(sim.d.event_query(e)));  // never recorded: the failures had no effect
  sim.d.clear_failures();
  expect_ok(sim.d.event_record(e, s));

  for (const char* name :
       {"cuDevicePrimaryCtxRetain", "cuStreamWaitEvent", "cuStreamWriteValue32", "cuLaunchHostFunc",
        "cuMemFreeAsync", "cuCtxSetCurrent", "cuMemHostAlloc", "cuLaunchKernel"}) {
    INFO(name);
    CHECK(sim.d.calls(name) >= 0);
    sim.d.fail_nth(name, 1, status::unknown);
  }
  CHECK_FALSE(sim.d.primary_ctx_retain(0));
  CHECK_FALSE(sim.d.launch_host_func(s, log_call<1>, nullptr));
  CHECK_FALSE(sim.d.ctx_make_current(sim.ctx));
  sim.d.clear_failures();

  CHECK(sim.d.calls("cuMemAlocAsync") == -1);
}

TEST_CASE("misusing failure injection makes every later call fail until cleared", "[sim][inject]") {
  Sim sim;
  auto s = sim.stream();
  auto check_misuse = [&](const char* needle) {
    auto r = sim.d.stream_query(s);
    REQUIRE_FALSE(r);
    CHECK(r.error().driver_status() == status::invalid_value);
    CHECK(r.error().message().find(needle) != std::string::npos);
    CHECK_FALSE(sim.d.device_count());
    sim.d.clear_failures();
    CHECK(sim.d.stream_query(s));
  };
  auto armed = sim.d.fail_nth("cuMemAlocAsync", 1, status::out_of_memory);  // misspelt
  CHECK_FALSE(armed);
  CHECK(armed.problem.find("no entry point") != std::string::npos);
  check_misuse("cuMemAlocAsync");
  sim.d.fail_nth("cuMemAllocAsync", 0, status::out_of_memory);
  check_misuse("n must be >= 1");
  sim.d.fail_always("cuMemAllocAsync", 0);
  check_misuse("non-zero");
  sim.d.fail_always("cuNoSuchCall", status::unknown);
  check_misuse("cuNoSuchCall");
}

TEST_CASE("a faulted stream stops, reports its status, and takes its waiters down",
          "[sim][fault]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  auto e = sim.event();
  auto p = sim.alloc(16, a);
  expect_ok(sim.d.event_record(e, a));
  expect_ok(sim.d.stream_wait_event(b, e));
  sim.fill(p, 1, 16, b);
  expect_ok(sim.d.fault_stream(a, status::launch_failed));

  auto q = sim.d.stream_query(a);
  REQUIRE_FALSE(q);
  CHECK(q.error().code() == errc::stream_fault);
  CHECK(q.error().driver_status() == status::launch_failed);
  CHECK_FALSE(sim.d.memset_d8_async(p, 0, 16, a));
  CHECK_FALSE(sim.d.event_query(e));
  auto sb = sim.d.stream_synchronize(b);
  REQUIRE_FALSE(sb);
  CHECK(sb.error().driver_status() == status::launch_failed);
  CHECK(sim.d.run_until_idle() == 0);
  CHECK(sim.d.pending_ops() == 4);  // nothing of either stream ran
}

TEST_CASE("an access outside simulated memory faults the stream with illegal_address",
          "[sim][fault]") {
  Sim sim;
  auto s = sim.stream();
  sim.fill(0x1000, 0, 16, s);
  auto r = sim.d.stream_synchronize(s);
  REQUIRE_FALSE(r);
  CHECK(r.error().driver_status() == status::illegal_address);
  CHECK(r.error().code() == errc::stream_fault);
  auto h = sim.d.hazards();
  REQUIRE(h.size() == 1);
  CHECK(h[0].kind == SimHazardKind::unallocated);
}

TEST_CASE("device pointers are not host memory", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  auto p = sim.alloc(64, s);
  expect_ok(sim.d.stream_synchronize(s));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    struct sigaction sa {};
    sa.sa_handler = [](int) { ::_exit(42); };
    ::sigaction(SIGSEGV, &sa, nullptr);
    ::sigaction(SIGBUS, &sa, nullptr);
    volatile std::uint8_t v =
        *reinterpret_cast<volatile std::uint8_t*>(static_cast<std::uintptr_t>(p));
    (void)v;
    ::_exit(0);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 42);
}

TEST_CASE("releasing the primary context destroys its streams, events and memory", "[sim]") {
  Sim sim;
  auto again = value(sim.d.primary_ctx_retain(0));  // a second reference
  CHECK(again == sim.ctx);
  auto s = sim.stream();
  auto e = sim.event();
  auto p = sim.alloc(512, s);
  sim.fill(p, 1, 512, s);
  expect_ok(sim.d.primary_ctx_release(0));
  CHECK(sim.d.stream_query(s));  // still retained once
  expect_ok(sim.d.primary_ctx_release(0));

  auto gone = sim.d.stream_query(s);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().driver_status() == status::invalid_context);
  CHECK_FALSE(sim.d.event_query(e));
  CHECK(value(sim.d.memory_stats(0)).allocated == 0);
  CHECK(value(sim.d.memory_stats(0)).live_blocks == 0);
  CHECK_FALSE(sim.d.stream_create());  // the current context is gone
  auto over = sim.d.primary_ctx_release(0);
  REQUIRE_FALSE(over);
  CHECK(over.error().driver_status() == status::invalid_context);

  auto fresh = value(sim.d.primary_ctx_retain(0));
  expect_ok(sim.d.ctx_make_current(fresh));
  auto s2 = sim.stream();
  auto q = sim.alloc(512, s2);
  CHECK(sim.read(q, 4, s2).size() == 4);
}

TEST_CASE("destroyed streams finish their work but refuse new work", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  auto p = value(sim.d.mem_alloc(8));
  sim.fill(p, 3, 8, s);
  expect_ok(sim.d.stream_destroy(s));
  auto r = sim.d.memset_d8_async(p, 4, 8, s);
  REQUIRE_FALSE(r);
  CHECK(r.error().driver_status() == status::invalid_handle);
  sim.d.run_until_idle();
  auto view = value(sim.d.host_view(p, 8));
  CHECK(std::to_integer<int>(view[7]) == 3);
}

TEST_CASE("stream ids are distinct, stable, and refused for a destroyed stream", "[sim]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  const auto ida = value(sim.d.stream_get_id(a));
  CHECK(value(sim.d.stream_get_id(a)) == ida);
  CHECK(value(sim.d.stream_get_id(b)) != ida);
  CHECK(value(sim.d.stream_get_id(SimDriver::stream_t{})) != ida);  // the legacy stream has one
  expect_ok(sim.d.stream_destroy(a));
  auto gone = sim.d.stream_get_id(a);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().driver_status() == status::invalid_handle);
}

TEST_CASE("mapped host memory has its own device address", "[sim]") {
  Sim sim;
  auto* host = static_cast<std::uint32_t*>(value(sim.d.mem_host_alloc_mapped(64)));
  auto dev = value(sim.d.mem_host_device_pointer(host));
  CHECK(dev != reinterpret_cast<std::uintptr_t>(host));
  CHECK(value(sim.d.mem_host_device_pointer(host + 3)) == dev + 12);
  auto s = sim.stream();
  expect_ok(sim.d.stream_write_value32(s, dev + 8, 0xC0FFEEu));
  CHECK(std::atomic_ref<std::uint32_t>(host[2]).load() != 0xC0FFEEu);  // manual: not run
  expect_ok(sim.d.stream_synchronize(s));
  CHECK(std::atomic_ref<std::uint32_t>(host[2]).load(std::memory_order_acquire) == 0xC0FFEEu);
  auto misaligned = sim.d.stream_write_value32(s, dev + 2, 1);
  REQUIRE_FALSE(misaligned);
  CHECK(misaligned.error().driver_status() == status::invalid_value);

  // A write that runs after the memory was freed faults instead of touching it.
  expect_ok(sim.d.stream_write_value32(s, dev, 1));
  expect_ok(sim.d.mem_host_free(host));
  CHECK_FALSE(sim.d.mem_host_free(host));
  CHECK_FALSE(sim.d.mem_host_device_pointer(host));
  auto r = sim.d.stream_synchronize(s);
  REQUIRE_FALSE(r);
  CHECK(r.error().driver_status() == status::illegal_address);
}

TEST_CASE("a zero-byte memset or copy enqueues nothing but still checks its stream", "[sim]") {
  Sim sim;
  auto s = sim.stream();
  auto p = value(sim.d.mem_alloc(64));
  expect_ok(sim.d.memset_d8_async(p, 1, 0, s));
  expect_ok(sim.d.memcpy_htod_async(p, nullptr, 0, s));  // no bytes: a null host pointer is fine
  expect_ok(sim.d.memcpy_dtoh_async(nullptr, p, 0, s));
  expect_ok(sim.d.memcpy_dtod_async(p, p, 0, s));
  CHECK(sim.d.pending_ops() == 0);
  auto nul = sim.d.memcpy_htod_async(p, nullptr, 4, s);  // with bytes it is an error
  REQUIRE_FALSE(nul);
  CHECK(nul.error().driver_status() == status::invalid_value);
  expect_ok(sim.d.stream_destroy(s));
  auto gone = sim.d.memset_d8_async(p, 1, 0, s);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().driver_status() == status::invalid_handle);
  expect_ok(sim.d.mem_free(p));
}
