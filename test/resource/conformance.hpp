// SPDX-License-Identifier: Apache-2.0
#pragma once

// The resource conformance suite, written once over a registry entry F (stack_registry.hpp)
// and a driver instance, and instantiated per stack: on SimDriver in CI, and again on
// CudaDriver on a GPU. Every property here is part of the resource contract.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/concepts.hpp>

namespace xlogrt::testing {

/// A device opened on `drv` with a pool of 4 streams and one stack of factory F on it.
template <class F>
struct Rig {
  using D = typename F::driver;
  using Stack = typename F::type;

  explicit Rig(D& drv, std::uint32_t ordinal = 0) {
    auto pool = StreamPool<D>::open(drv, ordinal, 4);
    REQUIRE(pool.has_value());
    streams = *pool;
    auto s = F::make(streams);
    if (!s) FAIL(s.error().what());
    stack = std::make_unique<Stack>(std::move(*s));
  }
  D& driver() { return streams->driver(); }

  std::shared_ptr<StreamPool<D>> streams;
  std::unique_ptr<Stack> stack;
};

/// Copies the first `n` bytes of `b` to the host (stream-ordered on the block's stream,
/// then synchronised).
template <class Rg>
std::vector<std::uint8_t> read_back(Rg& rig, const DeviceBlock& b, std::size_t n) {
  std::vector<std::uint8_t> out(n);
  auto s = rig.streams->get(b.alloc_stream());
  REQUIRE(s.has_value());
  REQUIRE(rig.driver().memcpy_dtoh_async(out.data(), b.ptr(), n, *s).has_value());
  REQUIRE(rig.driver().stream_synchronize(*s).has_value());
  return out;
}

template <class F>
void conformance_suite(typename F::driver& drv) {
  using Stack = typename F::type;
  STATIC_REQUIRE(DeviceMemoryResource<Stack>);
  INFO("stack: " << F::name);  // Catch2 names a template list's cases by index only
  Rig<F> rig(drv);
  Stack& r = *rig.stack;
  const std::size_t start = r.bytes_outstanding();

  SECTION("allocate then deallocate returns bytes_outstanding to its start after reap_pending") {
    auto b = r.allocate(2048, StreamId{1}, AllocTag{5});
    REQUIRE(b.has_value());
    CHECK(b->bytes() == 2048);
    CHECK(b->ptr() != 0);
    CHECK(b->alloc_stream() == StreamId{1});
    CHECK(b->tag() == AllocTag{5});
    CHECK(b->device_ordinal() == 0);
    CHECK(r.bytes_outstanding() == start + 2048);
    REQUIRE(r.deallocate(std::move(*b)).has_value());
    CHECK(b->empty());  // consumed
    REQUIRE(r.reap_pending().has_value());
    CHECK(r.bytes_outstanding() == start);
  }

  SECTION("blocks are distinct and hold their bytes") {
    std::vector<DeviceBlock> blocks;
    for (int i = 0; i < 16; ++i) {
      auto b = r.allocate(4096, StreamId{static_cast<std::uint32_t>(i % 4)}, AllocTag::UNTAGGED);
      REQUIRE(b.has_value());
      auto s = rig.streams->get(b->alloc_stream());
      REQUIRE(rig.driver().memset_d8_async(b->ptr(), static_cast<std::uint8_t>(i), 4096, *s).has_value());
      blocks.push_back(std::move(*b));
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      for (std::size_t j = i + 1; j < blocks.size(); ++j) {
        const bool disjoint = blocks[i].ptr() + blocks[i].bytes() <= blocks[j].ptr() ||
                              blocks[j].ptr() + blocks[j].bytes() <= blocks[i].ptr();
        CHECK(disjoint);
        CHECK(blocks[i].id() != blocks[j].id());
      }
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      auto bytes = read_back(rig, blocks[i], 4096);
      CHECK(std::all_of(bytes.begin(), bytes.end(), [&](std::uint8_t v) { return v == i; }));
    }
    for (auto& b : blocks) REQUIRE(r.deallocate(std::move(b)).has_value());
    REQUIRE(r.reap_pending().has_value());
    CHECK(r.bytes_outstanding() == start);
  }

  SECTION("bad input is a named error and changes no accounting") {
    auto zero = r.allocate(0, StreamId::DEFAULT, AllocTag::UNTAGGED);
    REQUIRE_FALSE(zero);
    CHECK(zero.error().code() == errc::zero_bytes);

    auto huge = r.allocate(std::size_t{1} << 62, StreamId::DEFAULT, AllocTag::UNTAGGED);
    REQUIRE_FALSE(huge);
    CHECK(huge.error().code() == errc::too_large);

    auto nostream = r.allocate(64, StreamId{99}, AllocTag::UNTAGGED);
    REQUIRE_FALSE(nostream);
    CHECK(nostream.error().code() == errc::unknown_stream);
    CHECK(r.bytes_outstanding() == start);

    auto b = r.allocate(256, StreamId::DEFAULT, AllocTag::UNTAGGED);
    REQUIRE(b.has_value());
    const std::size_t held = r.bytes_outstanding();

    DeviceBlock moved = std::move(*b);
    auto e1 = r.deallocate(std::move(*b));  // the moved-from block
    REQUIRE_FALSE(e1);
    CHECK(e1.error().code() == errc::empty_block);

    // A forged copy of the block, freed after the real one: a double free.
    DeviceBlock forged{moved.ptr(), moved.bytes(), moved.alloc_stream(), moved.device_ordinal(),
                       moved.tag(), moved.id()};
    // A forged block with a wrong size: refused, the real block stays live.
    DeviceBlock wrong{moved.ptr(), moved.bytes() * 2, moved.alloc_stream(), moved.device_ordinal(),
                      moved.tag(), moved.id()};
    auto e2 = r.deallocate(std::move(wrong));
    REQUIRE_FALSE(e2);
    CHECK(e2.error().code() == errc::foreign_block);
    CHECK_FALSE(wrong.empty());  // an error leaves the block with the caller
    CHECK(r.bytes_outstanding() == held);

    // A block of another ordinal.
    DeviceBlock other{moved.ptr(), moved.bytes(), moved.alloc_stream(), 1, moved.tag(), moved.id()};
    auto e3 = r.deallocate(std::move(other));
    REQUIRE_FALSE(e3);
    CHECK(e3.error().code() == errc::foreign_block);

    REQUIRE(r.deallocate(std::move(moved)).has_value());
    auto e4 = r.deallocate(std::move(forged));
    REQUIRE_FALSE(e4);
    CHECK(e4.error().code() == errc::double_free);
    REQUIRE(r.reap_pending().has_value());
    CHECK(r.bytes_outstanding() == start);
  }

  SECTION("a block of another resource instance is foreign") {
    Rig<F> other(drv);
    auto b = other.stack->allocate(512, StreamId::DEFAULT, AllocTag::UNTAGGED);
    REQUIRE(b.has_value());
    auto e = r.deallocate(std::move(*b));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::foreign_block);
    CHECK(r.bytes_outstanding() == start);
    REQUIRE(other.stack->deallocate(std::move(*b)).has_value());
    REQUIRE(other.stack->reap_pending().has_value());
  }

  SECTION("8 threads on 4 streams allocate and free concurrently; accounting ends exact") {
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::vector<DeviceBlock> mine;
        for (int i = 0; i < 200; ++i) {
          auto b = r.allocate(64 + 64 * static_cast<std::size_t>(i % 7),
                              StreamId{static_cast<std::uint32_t>(t % 4)}, AllocTag{static_cast<std::uint32_t>(t)});
          if (!b) {
            ++failures;
            continue;
          }
          mine.push_back(std::move(*b));
          if (mine.size() > 4) {
            if (!r.deallocate(std::move(mine.front()))) ++failures;
            mine.erase(mine.begin());
          }
        }
        for (auto& b : mine) {
          if (!r.deallocate(std::move(b))) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(failures.load() == 0);
    REQUIRE(r.reap_pending().has_value());
    CHECK(r.bytes_outstanding() == start);
  }

  if constexpr (TrackingResource<Stack>) {
    // AnyResource has the tracking members whatever it holds; it honours them only over a
    // stack that tracks (over one that does not, they are refused: test_sim_stacks.cpp).
    bool tracks = true;
    if constexpr (requires { r.tracks_block_uses(); }) tracks = r.tracks_block_uses();
    if (tracks) SECTION("tracking: uses on other streams are recorded; a stale id is refused") {
      auto b = r.allocate(1024, StreamId{0}, AllocTag::UNTAGGED);
      REQUIRE(b.has_value());
      const BlockId id = b->id();
      REQUIRE(r.prepare_block_use(id, StreamId{1}, Access::Write).has_value());
      auto s1 = rig.streams->get(StreamId{1});
      REQUIRE(rig.driver().memset_d8_async(b->ptr(), 0xAB, 1024, *s1).has_value());
      REQUIRE(r.finish_block_use(id, StreamId{1}, Access::Write).has_value());
      REQUIRE(r.prepare_block_use(id, StreamId{0}, Access::Read).has_value());
      auto bytes = read_back(rig, *b, 1024);
      CHECK(std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t v) { return v == 0xAB; }));
      REQUIRE(r.finish_block_use(id, StreamId{0}, Access::Read).has_value());
      REQUIRE(r.record_block_use(*b, StreamId{2}).has_value());
      auto bad_stream = r.prepare_block_use(id, StreamId{77}, Access::Read);
      REQUIRE_FALSE(bad_stream);
      CHECK(bad_stream.error().code() == errc::unknown_stream);
      REQUIRE(r.deallocate(std::move(*b)).has_value());
      auto stale = r.prepare_block_use(id, StreamId{1}, Access::Read);
      REQUIRE_FALSE(stale);
      CHECK(stale.error().code() == errc::stale_block);
      auto stale2 = r.finish_block_use(id, StreamId{1}, Access::Read);
      REQUIRE_FALSE(stale2);
      CHECK(stale2.error().code() == errc::stale_block);
      REQUIRE(r.reap_pending().has_value());
      CHECK(r.bytes_outstanding() == start);
    }
  }
}

}  // namespace xlogrt::testing
