// SPDX-License-Identifier: Apache-2.0
// Streams that come and go, through the pointer bridge over a caching stack on SimDriver:
// a program that creates, uses once and destroys far more streams than a StreamPool has
// ids keeps working in constant memory; a gone stream's cached blocks go back to the
// device with no call on its dead handle; and the device synchronisation before an id is
// recycled is what keeps the id's next stream from running ahead of the old one's work
// (a driver whose ctx_synchronize waits for nothing is caught by the hazard checker).

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include <xlogrt/interop/pointer_resource.hpp>
#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/runtime.hpp>
#include <xlogrt/sim/sim_driver.hpp>

#include "../driver/mutant_driver.hpp"

using namespace xlogrt;

namespace {

template <class D>
using CachingStack = Statistics<Cached<AsyncCuda<D>>>;

std::uint64_t u(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// One block of `bytes` on `s`: allocated, written by a kernel, freed.
template <class Res>
void use_once(SimDriver& sim, Res& res, SimDriver::stream_t s, std::size_t bytes) {
  auto p = res.allocate(bytes, s);
  INFO(bytes << " bytes");
  REQUIRE(p.has_value());
  REQUIRE(sim.launch_kernel(s, {SimAccess{u(*p), bytes, Access::Write}}).has_value());
  REQUIRE(res.deallocate(*p, bytes, s).has_value());
}

/// `streams` streams, each created, used once (three sizes: two cached classes and one
/// the cache leaves to the pool, each written by a kernel) and destroyed; `forget` tells
/// the pool of each one after destroying it. Returns the pool's size at the end.
template <class Res>
std::size_t churn(SimDriver& sim, Res& res, StreamPool<SimDriver>& pool, int streams, bool forget) {
  constexpr std::size_t SIZES[] = {1000, 70'000, std::size_t{3} << 20};
  for (int i = 0; i < streams; ++i) {
    auto s = sim.stream_create();
    REQUIRE(s.has_value());
    for (std::size_t bytes : SIZES) {
      INFO("stream " << i);
      use_once(sim, res, *s, bytes);
    }
    // Half go with work still queued (the simulator reuses a handle once its stream's
    // work has run; a forgotten stream's id is recycled at once).
    if (!forget || i % 2 == 0) REQUIRE(sim.stream_synchronize(*s).has_value());
    REQUIRE(sim.stream_destroy(*s).has_value());
    if (forget) REQUIRE(pool.forget(*s).has_value());
  }
  return pool.size();
}

/// A caching stack on a simulator, opened with two streams, behind the pointer bridge.
struct Rig {
  using Rt = DeviceRuntime<CachingStack<SimDriver>>;
  SimDriver sim;
  Rt rt;
  PointerResource<CachingStack<SimDriver>> res;
  explicit Rig(SimConfig cfg) : sim(cfg), rt(open(sim)), res(rt) {}
  static Rt open(SimDriver& sim) {
    auto made = Rt::open(sim, 0, 2);
    REQUIRE(made.has_value());
    return std::move(*made);
  }
};

/// After trim and reap, the stack and the device hold nothing: every cached block of
/// every gone stream was freed, on a live stream (a free on a destroyed handle is refused
/// by the simulator, and the block would stay).
template <class Rt>
void gives_everything_back(SimDriver& sim, Rt& rt) {
  find_layer<Cached>(rt.stack())->trim();
  REQUIRE(rt.reap_pending().has_value());
  CHECK(find_layer<Cached>(rt.stack())->stats().cached_bytes == 0);
  CHECK(rt.bytes_outstanding() == 0);
  auto dev = sim.device_get(0);
  REQUIRE(dev.has_value());
  auto mem = sim.memory_stats(*dev);
  REQUIRE(mem.has_value());
  CHECK(mem->allocated == 0);
  CHECK(mem->live_blocks == 0);
  const auto hazards = sim.hazards();
  INFO((hazards.empty() ? std::string() : to_string(hazards.front())));
  CHECK(hazards.empty());
}

}  // namespace

TEST_CASE("1,000 streams used once and destroyed: a reused handle takes its old stream's id", "[interop][streams]") {
  Rig rig(SimConfig{.reuse_stream_handles = true});
  auto& [sim, rt, res] = rig;
  const auto syncs = sim.calls("cuCtxSynchronize");
  CHECK(churn(sim, res, *rt.streams(), 1000, false) == 3);  // one id, recycled 999 times
  CHECK(rt.streams()->recycled() == 999);
  CHECK(sim.calls("cuCtxSynchronize") - syncs == 999);
  // The last stream is known gone when its handle comes back.
  auto next = sim.stream_create();
  REQUIRE(next.has_value());
  CHECK(*rt.streams()->adopt(*next) == StreamId{2});
  gives_everything_back(sim, rt);
  REQUIRE(sim.stream_destroy(*next).has_value());
}

TEST_CASE("1,000 streams used once, destroyed and forgotten, with handles never reused", "[interop][streams]") {
  Rig rig(SimConfig{.reuse_stream_handles = false});
  auto& [sim, rt, res] = rig;
  CHECK(churn(sim, res, *rt.streams(), 1000, true) == 3);  // one id, recycled 999 times
  CHECK(rt.streams()->recycled() == 999);
  // A forgotten stream's id names the pool's first stream until it is reused.
  CHECK(*rt.streams()->get(StreamId{2}) == *rt.streams()->get(StreamId{0}));
  gives_everything_back(sim, rt);
}

TEST_CASE("streams neither destroyed-and-reused nor forgotten fill the pool, refused by name", "[interop][streams]") {
  Rig rig(SimConfig{.reuse_stream_handles = false});
  auto& [sim, rt, res] = rig;
  std::vector<SimDriver::stream_t> mine;
  for (std::size_t i = 2; i < StreamPool<SimDriver>::MAX_STREAMS; ++i) {
    auto s = sim.stream_create();
    REQUIRE(s.has_value());
    REQUIRE(rt.streams()->adopt(*s).has_value());
    mine.push_back(*s);
  }
  auto extra = sim.stream_create();
  REQUIRE(extra.has_value());
  auto refused = res.allocate(256, *extra);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::invalid_argument);
  CHECK(refused.error().message().find("StreamPool::forget") != std::string::npos);
  REQUIRE(rt.streams()->forget(mine.back()).has_value());  // one forgotten: the next stream gets its id
  auto p = res.allocate(256, *extra);
  REQUIRE(p.has_value());
  CHECK(res.find(*p)->alloc_stream() == StreamId{StreamPool<SimDriver>::MAX_STREAMS - 1});
  REQUIRE(res.deallocate(*p, 256, *extra).has_value());
  for (auto s : mine) REQUIRE(sim.stream_destroy(s).has_value());
  REQUIRE(sim.stream_destroy(*extra).has_value());
}

TEST_CASE("streams destroyed without a word: the stack makes no call on their handles", "[interop][streams]") {
  // Neither reused nor forgotten, a destroyed stream keeps its id; the stack then calls
  // on its handle only within a call that names it (none does, after its owner destroyed
  // it): the cache's hand-off to other streams, the poll of queued frees, reap and trim
  // reach its blocks and frees without one (the simulator counts every call that names a
  // destroyed stream).
  Rig rig(SimConfig{.reuse_stream_handles = false});
  auto& [sim, rt, res] = rig;
  const auto dead_before = sim.dead_stream_calls();
  constexpr std::size_t SIZES[] = {1000, 200'000};
  for (int i = 0; i < 200; ++i) {
    auto s = sim.stream_create();
    REQUIRE(s.has_value());
    for (int round = 0; round < 3; ++round) {
      for (std::size_t bytes : SIZES) {
        INFO("stream " << i);
        use_once(sim, res, *s, bytes);
      }
    }
    if (i % 2 == 0) REQUIRE(sim.stream_synchronize(*s).has_value());
    REQUIRE(sim.stream_destroy(*s).has_value());
  }
  CHECK(rt.streams()->size() == 202);
  gives_everything_back(sim, rt);  // the trim's blocks of gone streams freed on the pool's first stream
  CHECK(sim.dead_stream_calls() == dead_before);
}

TEST_CASE("an adopted stream's idle blocks reach another stream once a call on it has marked them",
          "[interop][streams]") {
  Rig rig(SimConfig{});
  auto& [sim, rt, res] = rig;
  auto a = sim.stream_create();
  auto b = sim.stream_create();
  REQUIRE((a.has_value() && b.has_value()));
  constexpr std::size_t BYTES = 200'000;  // a class the depots keep for every thread
  auto& cache = *find_layer<Cached>(rt.stack());
  auto p = res.allocate(BYTES, *a);
  REQUIRE(p.has_value());
  REQUIRE(res.deallocate(*p, BYTES, *a).has_value());  // idle in a's depot, unmarked
  auto q = res.allocate(BYTES, *b);  // wants a's block, but may not call on a: a new one
  REQUIRE(q.has_value());
  CHECK(*q != *p);
  CHECK(cache.stats().cross_stream_moves == 0);
  auto p2 = res.allocate(BYTES, *a);  // a's own block back
  REQUIRE(p2.has_value());
  auto p3 = res.allocate(BYTES, *a);
  REQUIRE(p3.has_value());
  REQUIRE(res.deallocate(*p2, BYTES, *a).has_value());  // a call on a: marks a's depot
  REQUIRE(res.deallocate(*p3, BYTES, *a).has_value());
  REQUIRE(sim.stream_synchronize(*a).has_value());
  auto r = res.allocate(BYTES, *b);  // a's marked block, its free complete
  REQUIRE(r.has_value());
  CHECK(cache.stats().cross_stream_moves == 1);
  CHECK((*r == *p2 || *r == *p3));
  for (void* x : {*q, *r}) REQUIRE(res.deallocate(x, BYTES, *b).has_value());
  REQUIRE(sim.stream_synchronize(*b).has_value());
  gives_everything_back(sim, rt);
  REQUIRE(sim.stream_destroy(*a).has_value());
  REQUIRE(sim.stream_destroy(*b).has_value());
}

namespace {

/// A block cached for a stream that goes with a write still queued, then handed to the
/// next stream that gets its id: the hazard checker's reports (none when the pool's
/// synchronisation before recycling the id waits for the old stream's write).
template <drvtest::Break B>
std::size_t handoff_hazards() {
  using M = drvtest::MutantDriver<B>;
  using Stack = Cached<AsyncCuda<M>>;
  auto m = M::open();
  REQUIRE(m.has_value());
  auto sim = SimDriver::open();  // the instance the mutant forwards to
  REQUIRE(sim.has_value());
  (*sim)->clear_hazards();
  std::size_t hazards = 0;
  {
    auto made = DeviceRuntime<Stack>::open(**m, 0, 1);
    REQUIRE(made.has_value());
    auto& rt = *made;
    PointerResource<Stack> res(rt);
    auto a = (*m)->stream_create();
    REQUIRE(a.has_value());
    auto p = res.allocate(4096, *a);
    REQUIRE(p.has_value());
    REQUIRE((*sim)->launch_kernel(*a, {SimAccess{u(*p), 4096, Access::Write}}).has_value());
    REQUIRE(res.deallocate(*p, 4096, *a).has_value());  // cached for a's id
    REQUIRE((*m)->stream_destroy(*a).has_value());
    REQUIRE(rt.streams()->forget(*a).has_value());
    auto b = (*m)->stream_create();
    REQUIRE(b.has_value());
    auto q = res.allocate(4096, *b);  // b gets a's id, and the cache hands it a's block
    REQUIRE(q.has_value());
    CHECK(*q == *p);
    REQUIRE((*sim)->launch_kernel(*b, {SimAccess{u(*q), 4096, Access::Write}}).has_value());
    REQUIRE(res.deallocate(*q, 4096, *b).has_value());
    REQUIRE((*m)->stream_synchronize(*b).has_value());
    hazards = (*sim)->hazards().size();
    find_layer<Cached>(rt.stack())->trim();
    REQUIRE((*m)->ctx_synchronize().has_value());
    REQUIRE((*m)->stream_destroy(*b).has_value());
  }
  (*sim)->clear_hazards();
  return hazards;
}

}  // namespace

TEST_CASE("a recycled id's next stream is ordered after the gone stream's work; without the synchronisation it is not",
          "[interop][streams][mutant]") {
  CHECK(handoff_hazards<drvtest::Break::none>() == 0);
  CHECK(handoff_hazards<drvtest::Break::ctx_synchronize_ignored>() > 0);
}
