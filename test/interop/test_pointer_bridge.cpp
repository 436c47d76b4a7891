// SPDX-License-Identifier: Apache-2.0
// BlockMap, PointerResource and ThrustAllocator on SimDriver: the pointer-level core of
// the bridges (cuda::mr, Thrust, PyTorch). Foreign streams are adopted, bad frees are refused with
// their block kept, and record_use orders the free after a side stream's work (checked
// by the simulator's hazard checker, which does report the hazard without it).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <unistd.h>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include <xlogrt/interop/block_map.hpp>
#include <xlogrt/interop/pointer_resource.hpp>
#include <xlogrt/interop/thrust_allocator.hpp>
#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

using namespace xlogrt;

namespace {

DeviceBlock fake_block(std::uint64_t ptr, std::size_t bytes, std::uint32_t index) {
  return DeviceBlock{ptr, bytes, StreamId{0}, 0, AllocTag{}, BlockId{1, index, 1}};
}

using Stack = Statistics<AsyncCuda<SimDriver>>;
using Rt = DeviceRuntime<Stack>;

struct Rig {
  SimDriver sim;
  std::shared_ptr<StreamPool<SimDriver>> streams;
  std::unique_ptr<Rt> rt;

  Rig() : sim(SimConfig{.executor = SimExecutor::manual}) {
    auto made = Rt::open(sim, 0, 2);  // StackBuilder builds the stack
    REQUIRE(made.has_value());
    streams = made->streams();
    rt = std::make_unique<Rt>(std::move(*made));
  }
  SimDriver::stream_t foreign_stream() {
    auto s = sim.stream_create();
    REQUIRE(s.has_value());
    return *s;
  }
  std::uint64_t u(void* p) { return reinterpret_cast<std::uintptr_t>(p); }
};

}  // namespace

TEST_CASE("BlockMap files, finds and takes blocks by pointer, the overflow included", "[interop]") {
  BlockMap m(BlockMap::PROBES);  // the smallest table: most blocks overflow
  CHECK(m.capacity() == BlockMap::PROBES);
  constexpr std::uint64_t N = 200;
  for (std::uint64_t i = 1; i <= N; ++i) REQUIRE(m.insert(fake_block(i << 8, i, static_cast<std::uint32_t>(i))));
  CHECK(m.overflowed() == N - BlockMap::PROBES);
  auto dup = fake_block(5 << 8, 1, 999);
  CHECK_FALSE(m.insert(std::move(dup)));  // already live, and left with the caller
  CHECK(dup.id().index == 999);
  CHECK_FALSE(m.insert(DeviceBlock{}));               // empty
  for (std::uint64_t i = 1; i <= N; ++i) {
    const BlockMap::Entry* e = m.find(i << 8);
    REQUIRE(e != nullptr);
    CHECK(e->block.bytes() == i);
  }
  CHECK(m.find(7) == nullptr);
  for (std::uint64_t i = 1; i <= N; i += 2) {
    auto e = m.take(i << 8);
    REQUIRE(e.has_value());
    CHECK(e->block.bytes() == i);
    CHECK_FALSE(m.take(i << 8).has_value());  // once only
  }
  for (std::uint64_t i = 2; i <= N; i += 2) CHECK(m.find(i << 8) != nullptr);
  for (std::uint64_t i = 1; i <= N; i += 2) REQUIRE(m.insert(fake_block(i << 8, i + 1, 1)));  // slots reused
  for (std::uint64_t i = 1; i <= N; i += 2) CHECK(m.find(i << 8)->block.bytes() == i + 1);
}

TEST_CASE("BlockMap: threads file and take their own pointers at once", "[interop]") {
  BlockMap m(1024);
  constexpr int THREADS = 4, ROUNDS = 2000, LIVE = 300;  // more live blocks than fit their windows
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < THREADS; ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::uint64_t> mine;
      for (int r = 0; r < ROUNDS; ++r) {
        const std::uint64_t p = (static_cast<std::uint64_t>(t + 1) << 40) | (static_cast<std::uint64_t>(r) << 8);
        if (!m.insert(fake_block(p, static_cast<std::size_t>(r) + 1, 1))) ++errors;
        mine.push_back(p);
        if (mine.size() > LIVE) {
          const std::uint64_t q = mine[mine.size() - LIVE - 1];
          auto e = m.take(q);
          if (!e || e->block.ptr() != q) ++errors;
        }
      }
      for (std::uint64_t q : mine) {
        if (const BlockMap::Entry* e = m.find(q)) {
          if (e->block.ptr() != q) ++errors;
          (void)m.take(q);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(errors.load() == 0);
  CHECK(m.overflowed() == 0);
}

TEST_CASE("PointerResource allocates on an adopted foreign stream and frees by pointer", "[interop]") {
  Rig rig;
  PointerResource<Stack> res(*rig.rt, {.tag = AllocTag{9}});
  auto s = rig.foreign_stream();
  auto p = res.allocate(4096, s);
  REQUIRE(p.has_value());
  CHECK(rig.streams->size() == 3);  // adopted as StreamId{2}
  const DeviceBlock* b = res.find(*p);
  REQUIRE(b != nullptr);
  CHECK(b->alloc_stream() == StreamId{2});
  CHECK(b->tag() == AllocTag{9});
  auto q = res.allocate(512, s);  // the same stream: no new adoption
  REQUIRE(q.has_value());
  CHECK(rig.streams->size() == 3);
  CHECK(rig.rt->stack().snapshot().of(AllocTag{9}).current_bytes == 4096 + 512);

  REQUIRE(res.deallocate(*p, 4096, s).has_value());
  REQUIRE(res.deallocate(*q, 0, s).has_value());  // 0: the size is not checked
  CHECK(res.find(*p) == nullptr);
  REQUIRE(rig.rt->reap_pending().has_value());
  CHECK(rig.rt->bytes_outstanding() == 0);
  CHECK(rig.rt->stack().snapshot().of(AllocTag{9}).frees == 2);
}

TEST_CASE("PointerResource: a per-call tag replaces the resource's in Statistics; the free needs none",
          "[interop]") {
  Rig rig;
  PointerResource<Stack> res(*rig.rt, {.tag = AllocTag{1}});
  auto s = rig.foreign_stream();
  auto own = res.allocate(256, s);
  auto other = res.allocate(1024, s, AllocTag{3});
  REQUIRE(own.has_value());
  REQUIRE(other.has_value());
  CHECK(res.find(*other)->tag() == AllocTag{3});
  auto snap = rig.rt->stack().snapshot();
  CHECK(snap.of(AllocTag{1}).current_bytes == 256);
  CHECK(snap.of(AllocTag{3}).current_bytes == 1024);
  CHECK(!res.allocate(64, s, AllocTag{3}, 300).has_value());  // the alignment is still checked
  REQUIRE(res.deallocate(*other, 1024, s).has_value());
  REQUIRE(res.deallocate(*own, 256, s).has_value());
  snap = rig.rt->stack().snapshot();
  CHECK(snap.of(AllocTag{3}).frees == 1);
  CHECK(snap.of(AllocTag{3}).current_bytes == 0);
  CHECK(snap.of(AllocTag{1}).frees == 1);
}

TEST_CASE("PointerResource refuses bad input by name and keeps the block", "[interop]") {
  Rig rig;
  PointerResource<Stack> res(*rig.rt);
  auto s = rig.foreign_stream();
  for (std::size_t align : {std::size_t{0}, std::size_t{3}, std::size_t{512}}) {
    auto bad = res.allocate(64, s, align);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code() == errc::invalid_argument);
  }
  auto zero = res.allocate(0, s);
  REQUIRE_FALSE(zero);
  CHECK(zero.error().code() == errc::zero_bytes);
  CHECK(rig.rt->bytes_outstanding() == 0);

  auto p = res.allocate(1024, s);
  REQUIRE(p.has_value());
  auto wrong = res.deallocate(*p, 1000, s);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code() == errc::invalid_argument);
  CHECK(wrong.error().message().find("1024") != std::string::npos);
  CHECK(res.find(*p) != nullptr);  // still filed, still live
  CHECK(rig.rt->bytes_outstanding() == 1024);

  int host = 0;
  auto foreign = res.deallocate(&host, 4, s);
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().code() == errc::foreign_block);
  auto foreign_use = res.record_use(&host, s);
  REQUIRE_FALSE(foreign_use);
  CHECK(foreign_use.error().code() == errc::foreign_block);

  auto gone = rig.foreign_stream();
  REQUIRE(rig.sim.stream_destroy(gone).has_value());
  auto on_destroyed = res.allocate(64, gone);  // a destroyed stream has no id
  REQUIRE_FALSE(on_destroyed);
  CHECK(rig.rt->bytes_outstanding() == 1024);

  REQUIRE(res.deallocate(*p, 1024, s).has_value());
  auto twice = res.deallocate(*p, 1024, s);
  REQUIRE_FALSE(twice);
  CHECK(twice.error().code() == errc::foreign_block);
  REQUIRE(rig.rt->reap_pending().has_value());
  CHECK(rig.rt->bytes_outstanding() == 0);
}

namespace {
enum class Record { none, before_use, after_use };

/// Allocates on `a`, writes on side stream `b`, then frees (on `a`): with record_use on
/// `b` (before or after the write is enqueued: torch's record_stream covers the work up
/// to the free) the free is ordered after `b`'s write. Returns the simulator's hazard
/// reports.
std::size_t side_stream_hazards(Record record, bool free_on_side) {
  Rig rig;
  PointerResource<Stack> res(*rig.rt);
  auto a = rig.foreign_stream();
  auto b = rig.foreign_stream();
  auto p = res.allocate(1 << 12, a);
  REQUIRE(p.has_value());
  REQUIRE(rig.sim.launch_kernel(a, {SimAccess{rig.u(*p), 1 << 12, Access::Write}}).has_value());
  REQUIRE(rig.sim.stream_synchronize(a).has_value());  // b's use below starts after a's write
  if (record == Record::before_use) REQUIRE(res.record_use(*p, b).has_value());
  REQUIRE(rig.sim.launch_kernel(b, {SimAccess{rig.u(*p), 1 << 12, Access::Write}}).has_value());
  if (record == Record::after_use) REQUIRE(res.record_use(*p, b).has_value());
  REQUIRE(res.deallocate(*p, 1 << 12, free_on_side ? b : a).has_value());
  // A new block on a reuses the freed range: the simulator reports it if b still writes.
  auto q = res.allocate(1 << 12, a);
  REQUIRE(q.has_value());
  REQUIRE(rig.sim.launch_kernel(a, {SimAccess{rig.u(*q), 1 << 12, Access::Write}}).has_value());
  rig.sim.run_until_idle();
  REQUIRE(res.deallocate(*q, 1 << 12, a).has_value());
  rig.sim.run_until_idle();
  return rig.sim.hazards().size();
}
}  // namespace

TEST_CASE("record_use and a free on another stream order the free after that stream's work",
          "[interop]") {
  CHECK(side_stream_hazards(Record::after_use, false) == 0);
  CHECK(side_stream_hazards(Record::before_use, false) == 0);
  CHECK(side_stream_hazards(Record::none, true) == 0);  // the free's own stream counts as a use
  CHECK(side_stream_hazards(Record::none, false) > 0);  // proof that the check can fail
}

TEST_CASE("ThrustAllocator allocates on its stream, frees by pointer and throws a named bad_alloc",
          "[interop][thrust]") {
  Rig rig;
  PointerResource<Stack> res(*rig.rt, {.tag = AllocTag{4}});
  auto s = rig.foreign_stream();
  ThrustAllocator<PointerResource<Stack>> alloc(res, s);
  auto copy = alloc;  // Thrust copies its allocator
  CHECK(copy == alloc);
  char* p = copy.allocate(1 << 20);
  REQUIRE(p != nullptr);
  const DeviceBlock* b = res.find(p);
  REQUIRE(b != nullptr);
  CHECK(*rig.streams->get(b->alloc_stream()) == s);  // on the allocator's stream
  CHECK(rig.rt->stack().snapshot().of(AllocTag{4}).current_bytes == 1 << 20);
  alloc.deallocate(p, 1 << 20);
  CHECK(rig.rt->stack().snapshot().of(AllocTag{4}).current_bytes == 0);
  CHECK(alloc.allocate(0) == nullptr);  // an empty temporary buffer: no block, no error
  alloc.deallocate(nullptr, 0);
  CHECK(rig.rt->stack().snapshot().of(AllocTag{4}).allocations == 1);
  try {
    (void)alloc.allocate(std::ptrdiff_t{1} << 50);
    FAIL("a 1 PiB allocation succeeded");
  } catch (const std::bad_alloc& e) {
    CHECK(dynamic_cast<const allocation_error*>(&e) != nullptr);
  }
  CHECK(rig.rt->stack().snapshot().of(AllocTag{4}).failed == 1);
}

namespace {
/// What `f` writes to stderr (fd 2), through a temporary file.
template <class F>
std::string captured_stderr(F&& f) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int saved = ::dup(2);
  REQUIRE(saved >= 0);
  REQUIRE(::dup2(::fileno(tmp), 2) >= 0);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string out;
  std::rewind(tmp);
  for (int c; (c = std::fgetc(tmp)) != EOF;) out += static_cast<char>(c);
  std::fclose(tmp);
  return out;
}
}  // namespace

TEST_CASE("ThrustAllocator reports a refused free: counted by every copy, written to stderr once",
          "[interop][thrust]") {
  // Issue #28, finding 8: deallocate dropped the resource's error silently.
  Rig rig;
  PointerResource<Stack> res(*rig.rt, {.tag = AllocTag{5}});
  auto s = rig.foreign_stream();
  ThrustAllocator<PointerResource<Stack>> alloc(res, s);
  auto copy = alloc;  // Thrust frees through its copy
  char* p = alloc.allocate(4096);
  REQUIRE(p != nullptr);
  alignas(256) static char foreign[256];
  const std::string out = captured_stderr([&] {
    copy.deallocate(foreign, sizeof foreign);  // not the resource's pointer
    copy.deallocate(p, 8192);                  // the wrong size: refused, the block stays live
  });
  CHECK(alloc.refused_frees() == 2);
  CHECK(copy.refused_frees() == 2);
  CHECK_THAT(out, Catch::Contains("ThrustAllocator") && Catch::Contains("refused"));
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);  // once, not per refusal
  REQUIRE(res.find(p) != nullptr);                        // still live, still filed
  alloc.deallocate(p, 4096);
  CHECK(res.find(p) == nullptr);
  CHECK(alloc.refused_frees() == 2);
  const std::string again = captured_stderr([&] { copy.deallocate(p, 4096); });  // a second free
  CHECK(alloc.refused_frees() == 3);
  CHECK(again.empty());
  CHECK(rig.rt->stack().snapshot().of(AllocTag{5}).current_bytes == 0);
}

TEST_CASE("find_layer finds a layer of a stack whatever sits above it", "[interop]") {
  using S = Budget<Statistics<Logging<AsyncCuda<SimDriver>, FileSink>>>;
  static_assert(std::is_same_v<std::remove_pointer_t<decltype(find_layer<Statistics>(std::declval<S&>()))>,
                               Statistics<Logging<AsyncCuda<SimDriver>, FileSink>>>);
  static_assert(std::is_same_v<std::remove_pointer_t<decltype(find_layer<Logging>(std::declval<S&>()))>,
                               Logging<AsyncCuda<SimDriver>, FileSink>>);
  static_assert(std::is_same_v<std::remove_pointer_t<decltype(find_layer<Budget>(std::declval<S&>()))>, S>);
  // The default stack has both layers the bridges read, wherever they sit.
  using D = DefaultStackOn<SimDriver>;
  static_assert(detail::is_layer_v<std::remove_pointer_t<decltype(find_layer<Statistics>(std::declval<D&>()))>,
                                   Statistics>);
  static_assert(detail::is_layer_v<std::remove_pointer_t<decltype(find_layer<Logging>(std::declval<D&>()))>,
                                   Logging>);
  Rig rig;
  CHECK(find_layer<Statistics>(rig.rt->stack()) == &rig.rt->stack());
  CHECK(find_layer<AsyncCuda>(rig.rt->stack()) == &rig.rt->stack().upstream());
}

TEST_CASE("PointerResource over a caching stack: a free names the size asked for, not the block's class",
          "[interop]") {
  using CStack = Cached<AsyncCuda<SimDriver>>;
  SimDriver sim(SimConfig{.executor = SimExecutor::manual});
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  auto base = AsyncCuda<SimDriver>::create(*pool);
  REQUIRE(base.has_value());
  auto made = DeviceRuntime<CStack>::create(*pool, CStack(std::move(*base)));
  REQUIRE(made.has_value());
  auto& rt = *made;
  PointerResource<CStack> res(rt);
  auto s = (*pool)->at(StreamId{1});
  auto p = res.allocate(1000, s);  // served by a 1024-byte class
  REQUIRE(p.has_value());
  CHECK(res.find(*p)->bytes() == 1024);
  auto wrong = res.deallocate(*p, 1024, s);  // the block's size, not the one asked for
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code() == errc::invalid_argument);
  REQUIRE(res.deallocate(*p, 1000, s).has_value());
  auto again = res.allocate(1000, s);  // a cache hit: the same block
  REQUIRE(again.has_value());
  CHECK(*again == *p);
  REQUIRE(res.deallocate(*again, 1000, s).has_value());
}
