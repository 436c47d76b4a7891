// SPDX-License-Identifier: Apache-2.0
// libxlogrt_torch's C functions without a GPU or torch: CudaDriver on test/driver's working
// fake libcuda (XLOGRT_LIBCUDA), budget 1 MiB (XLOGRT_BUDGET_BYTES), both set by
// meson.build. Streams are arbitrary handles: the fake gives each an id. What torch
// would do: allocate on its stream, record a side stream, free with the recorded size;
// what it must not get wrong: a refused free keeps the block, an allocation over the
// budget names the budget, and the failure handler's exception reaches the caller.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <dlfcn.h>
#include <limits>
#include <stdexcept>
#include <string>

#include "../../test/driver/fakecuda.hpp"
#include "xlogrt_torch.h"

namespace {

xlogrt_torch_stream handle(std::uintptr_t v) { return reinterpret_cast<xlogrt_torch_stream>(v); }

xlogrt_torch_stats stats() {
  xlogrt_torch_stats s{};
  REQUIRE(xlogrt_torch_get_stats(0, &s) == 0);
  return s;
}

}  // namespace

TEST_CASE("torch bridge: allocate, record a side stream, free, reap", "[torch_bridge]") {
  const auto s = handle(0x10000), side = handle(0x20000);
  const auto before = stats();
  void* p = xlogrt_torch_malloc(4096, 0, s);
  REQUIRE(p != nullptr);
  auto mid = stats();
  CHECK(mid.current_bytes == before.current_bytes + 4096);
  CHECK(mid.allocations == before.allocations + 1);
  CHECK(mid.budget_bytes == 1 << 20);
  CHECK(xlogrt_torch_record_stream(p, side) == 0);
  xlogrt_torch_free(p, 4096, 0, s);
  CHECK(stats().frees == before.frees + 1);
  CHECK(xlogrt_torch_reap(0) == 0);
  CHECK(stats().bytes_outstanding == before.bytes_outstanding);
  CHECK(xlogrt_torch_malloc(0, 0, s) == nullptr);  // torch's empty tensors: no block
  CHECK(stats().failed == before.failed);
}

TEST_CASE("torch bridge: bad input is refused by name and loses nothing", "[torch_bridge]") {
  const auto s = handle(0x10000);
  void* p = xlogrt_torch_malloc(1024, 0, s);
  REQUIRE(p != nullptr);
  const auto live = stats();
  xlogrt_torch_free(p, 1000, 0, s);  // the wrong size: refused, the block stays
  CHECK(stats().current_bytes == live.current_bytes);
  CHECK(std::string(xlogrt_torch_last_error()).find("1024") != std::string::npos);
  int host = 0;
  CHECK(xlogrt_torch_record_stream(&host, s) == -1);
  CHECK(std::string(xlogrt_torch_last_error()).find("foreign_block") != std::string::npos);
  CHECK(xlogrt_torch_malloc(64, 99, s) == nullptr);
  CHECK(std::string(xlogrt_torch_last_error()).find("invalid_ordinal") != std::string::npos);
  CHECK(xlogrt_torch_malloc(-5, 0, s) == nullptr);
  CHECK(std::string(xlogrt_torch_last_error()).find("invalid_argument") != std::string::npos);
  xlogrt_torch_free(p, -1, 0, s);  // a negative size: refused by name, the block stays
  CHECK(std::string(xlogrt_torch_last_error()).find("negative size") != std::string::npos);
  CHECK(stats().current_bytes == live.current_bytes);
  xlogrt_torch_free(p, 1024, 7, s);  // a device without this pointer: refused, nothing lost
  CHECK(stats().current_bytes == live.current_bytes);
  xlogrt_torch_free(&host, 4, 0, s);  // a foreign pointer
  CHECK(std::string(xlogrt_torch_last_error()).find("foreign_block") != std::string::npos);
  CHECK(xlogrt_torch_malloc(PTRDIFF_MAX, 0, s) == nullptr);  // far beyond the device
  xlogrt_torch_stats ignored{};
  CHECK(xlogrt_torch_get_stats(99, &ignored) == -1);
  CHECK(xlogrt_torch_get_stats(0, nullptr) == -1);
  xlogrt_torch_free(p, 1024, 0, s);
  CHECK(stats().current_bytes == live.current_bytes - 1024);
}

TEST_CASE("torch bridge: torch's figures, peak reset and empty_cache", "[torch_bridge]") {
  const auto s = handle(0x10000);
  CHECK(std::string(xlogrt_torch_version()).find('.') != std::string::npos);
  void* p = xlogrt_torch_malloc(256 << 10, 0, s);
  REQUIRE(p != nullptr);
  const auto mid = stats();
  CHECK(mid.current_count >= 1);
  CHECK(mid.peak_bytes >= mid.current_bytes);
  CHECK(mid.budget_in_use >= mid.current_bytes);
  xlogrt_torch_free(p, 256 << 10, 0, s);
  REQUIRE(xlogrt_torch_reset_peak(0) == 0);
  const auto after = stats();
  CHECK(after.peak_bytes < mid.peak_bytes);  // the 256 KiB block no longer counts
  CHECK(after.freed_bytes == mid.freed_bytes + (256 << 10));
  REQUIRE(xlogrt_torch_empty_cache(-1) == 0);  // every cached block back, every free retired
  const auto empty = stats();
  CHECK(empty.cached_bytes == 0);
  CHECK(empty.bytes_outstanding == empty.current_bytes);
  CHECK(empty.budget_in_use == empty.current_bytes);
  CHECK(xlogrt_torch_empty_cache(99) == -1);
}

TEST_CASE("torch bridge: over the budget, NULL and a message naming XLOGRT_BUDGET_BYTES, or the handler's exception",
          "[torch_bridge]") {
  const auto s = handle(0x10000);
  const auto before = stats();
  CHECK(xlogrt_torch_malloc(2 << 20, 0, s) == nullptr);
  const std::string m = xlogrt_torch_last_error();
  CHECK(m.find("out_of_budget") != std::string::npos);
  CHECK(m.find("XLOGRT_BUDGET_BYTES") != std::string::npos);
  CHECK(stats().current_bytes == before.current_bytes);  // (Budget refuses above Statistics: not a failed count)

  xlogrt_torch_set_failure_handler([](const char* message, size_t bytes, int device) {
    throw std::runtime_error(std::string(message) + " [" + std::to_string(bytes) + " on " +
                             std::to_string(device) + "]");
  });
  try {
    (void)xlogrt_torch_malloc(2 << 20, 0, s);
    FAIL("the failure handler did not throw");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("XLOGRT_BUDGET_BYTES") != std::string::npos);
    CHECK(std::string(e.what()).find("[2097152 on 0]") != std::string::npos);
  }
  xlogrt_torch_set_failure_handler(nullptr);
  void* p = xlogrt_torch_malloc(4096, 0, s);  // the budget still serves what fits
  REQUIRE(p != nullptr);
  xlogrt_torch_free(p, 4096, 0, s);
}

TEST_CASE("torch bridge: each framework's tag reaches Statistics; one free and one record_stream for all",
          "[torch_bridge]") {
  const auto s = handle(0x10000), side = handle(0x20000);
  auto tagged = [](uint32_t tag) {
    xlogrt_torch_stats t{};
    REQUIRE(xlogrt_torch_get_tag_stats(0, tag, &t) == 0);
    return t;
  };
  const auto torch0 = tagged(XLOGRT_TAG_TORCH), cupy0 = tagged(XLOGRT_TAG_CUPY), numba0 = tagged(XLOGRT_TAG_NUMBA);
  const auto all0 = stats();
  void* t = xlogrt_torch_malloc(1024, 0, s);
  void* c = xlogrt_torch_malloc_tagged(2048, 0, s, XLOGRT_TAG_CUPY);
  void* n = xlogrt_torch_malloc_tagged(4096, 0, side, XLOGRT_TAG_NUMBA);
  REQUIRE((t != nullptr && c != nullptr && n != nullptr));
  CHECK(tagged(XLOGRT_TAG_TORCH).current_bytes == torch0.current_bytes + 1024);
  CHECK(tagged(XLOGRT_TAG_CUPY).current_bytes == cupy0.current_bytes + 2048);
  CHECK(tagged(XLOGRT_TAG_NUMBA).current_bytes == numba0.current_bytes + 4096);
  CHECK(tagged(XLOGRT_TAG_CUPY).allocations == cupy0.allocations + 1);
  const auto all = stats();
  CHECK(all.current_bytes == all0.current_bytes + 1024 + 2048 + 4096);  // one Statistics for the three
  CHECK(tagged(XLOGRT_TAG_NUMBA).budget_bytes == all.budget_bytes);     // the device's fields as get_stats'
  CHECK(xlogrt_torch_record_stream(c, side) == 0);
  xlogrt_torch_free(c, 2048, 0, s);
  xlogrt_torch_free(n, 4096, 0, side);
  xlogrt_torch_free(t, 1024, 0, s);
  CHECK(tagged(XLOGRT_TAG_CUPY).frees == cupy0.frees + 1);
  CHECK(tagged(XLOGRT_TAG_CUPY).current_bytes == cupy0.current_bytes);
  CHECK(tagged(XLOGRT_TAG_NUMBA).current_bytes == numba0.current_bytes);
  CHECK(stats().current_bytes == all0.current_bytes);
  CHECK(xlogrt_torch_reap(0) == 0);
}

TEST_CASE("torch bridge: the tagged entry points refuse bad input by name and never call the failure handler",
          "[torch_bridge]") {
  const auto s = handle(0x10000);
  xlogrt_torch_set_failure_handler([](const char*, size_t, int) { throw std::runtime_error("handler called"); });
  const auto before = stats();
  CHECK(xlogrt_torch_malloc_tagged(0, 0, s, XLOGRT_TAG_CUPY) == nullptr);  // size 0: no block, no error
  CHECK(std::string(xlogrt_torch_last_error()).empty());
  CHECK(xlogrt_torch_malloc_tagged(-3, 0, s, XLOGRT_TAG_CUPY) == nullptr);
  CHECK(std::string(xlogrt_torch_last_error()).find("negative size") != std::string::npos);
  for (uint32_t bad : {0u, XLOGRT_TAG_MAX + 1, 0xffffffffu}) {
    CHECK(xlogrt_torch_malloc_tagged(64, 0, s, bad) == nullptr);
    CHECK(std::string(xlogrt_torch_last_error()).find("tag " + std::to_string(bad) + " is outside 1..63") !=
          std::string::npos);
  }
  CHECK(xlogrt_torch_malloc_tagged(64, 99, s, XLOGRT_TAG_NUMBA) == nullptr);
  CHECK(std::string(xlogrt_torch_last_error()).find("invalid_ordinal") != std::string::npos);
  CHECK(xlogrt_torch_malloc_tagged(2 << 20, 0, s, XLOGRT_TAG_CUPY) == nullptr);  // over the 1 MiB budget
  CHECK(std::string(xlogrt_torch_last_error()).find("XLOGRT_BUDGET_BYTES") != std::string::npos);
  CHECK(stats().current_bytes == before.current_bytes);
  xlogrt_torch_set_failure_handler(nullptr);
  xlogrt_torch_stats ignored{};
  CHECK(xlogrt_torch_get_tag_stats(0, XLOGRT_TAG_MAX + 1, &ignored) == -1);
  CHECK(std::string(xlogrt_torch_last_error()).find("tag 64") != std::string::npos);
  CHECK(xlogrt_torch_get_tag_stats(99, XLOGRT_TAG_CUPY, &ignored) == -1);
  CHECK(xlogrt_torch_get_tag_stats(0, XLOGRT_TAG_CUPY, nullptr) == -1);
}

TEST_CASE("torch bridge: mem_get_info is the driver's cuMemGetInfo", "[torch_bridge]") {
  uint64_t free_bytes = 0, total_bytes = 0;
  REQUIRE(xlogrt_torch_mem_get_info(0, &free_bytes, &total_bytes) == 0);
  CHECK(free_bytes == uint64_t{1} << 30);  // what the fake libcuda reports
  CHECK(total_bytes == uint64_t{2} << 30);
  CHECK(xlogrt_torch_mem_get_info(99, &free_bytes, &total_bytes) == -1);
  CHECK(std::string(xlogrt_torch_last_error()).find("invalid_ordinal") != std::string::npos);
  CHECK(xlogrt_torch_mem_get_info(0, nullptr, &total_bytes) == -1);
}

// Last: it replaces the budget the other cases run under.
TEST_CASE("torch bridge: the memory fraction sets the budget; a fraction out of range changes nothing",
          "[torch_bridge]") {
  const auto before = stats();
  for (double bad : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CHECK(xlogrt_torch_set_memory_fraction(bad, 0) == -1);
    CHECK(std::string(xlogrt_torch_last_error()).find("invalid_argument") != std::string::npos);
  }
  CHECK(stats().budget_bytes == before.budget_bytes);
  CHECK(xlogrt_torch_set_memory_fraction(0.5, 99) == -1);
  REQUIRE(xlogrt_torch_set_memory_fraction(1.0, 0) == 0);
  const auto all = stats().budget_bytes;
  CHECK(all > before.budget_bytes);
  REQUIRE(xlogrt_torch_set_memory_fraction(0.25, 0) == 0);
  CHECK(stats().budget_bytes == all / 4);
}

TEST_CASE("torch bridge: 1,000 streams that come and go through one reused handle keep the pool small",
          "[torch_bridge]") {
  // The fake's stream id is handle * 7 + salt: a new salt is a new stream behind the same
  // handle, as the driver hands a destroyed stream's handle to the next one it creates.
  void* fake = dlopen(std::getenv("XLOGRT_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(fake != nullptr);
  auto* state_of = reinterpret_cast<FakeCudaState* (*)()>(dlsym(fake, "fakecuda_state"));
  REQUIRE(state_of != nullptr);
  FakeCudaState& st = *state_of();
  const auto salt = st.stream_id_salt;
  const auto s = handle(0x50000);
  const auto before = stats();
  for (unsigned i = 1; i <= 1000; ++i) {
    st.stream_id_salt = salt + 1000 + i;
    void* p = xlogrt_torch_malloc(4096, 0, s);
    INFO("stream " << i << ": " << xlogrt_torch_last_error());
    REQUIRE(p != nullptr);
    xlogrt_torch_free(p, 4096, 0, s);
  }
  st.stream_id_salt = salt;
  const auto after = stats();
  CHECK(after.stream_ids <= before.stream_ids + 1);  // one id, recycled for each new stream
  CHECK(after.streams_recycled >= before.streams_recycled + 999);
  CHECK(after.current_bytes == before.current_bytes);
  dlclose(fake);
}
