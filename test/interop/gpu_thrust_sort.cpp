// SPDX-License-Identifier: Apache-2.0
// thrust::sort of 100 M keys on a non-default stream, CUB's temporary storage taken from
// the default stack through ThrustAllocator (thrust_sort.cu). Checks: the keys end up
// sorted with their sum unchanged; the temporary allocations are counted in Statistics
// under the bridge's tag (at least the radix sort's second key buffer: n keys) and
// appear in the XLOGRT_LOG_FILE log, one line each, on the sort's stream; every one is
// freed, and after the reap the stack's bytes are back to their start.
//
// A plain program (no Catch2 on the GPU machine): exit 0 passed, 1 failed, 77 (SKIP)
// without a driver or device. `--keys N` sorts N keys instead of 100 M.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/runtime.hpp>

#include "thrust_sort.hpp"

namespace {
int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

struct LogCounts {
  std::uint64_t allocs = 0, frees = 0, other_stream = 0;
};

/// Lines of the CSV log (Thread,Time,Action,Pointer,Size,Stream,Tag) with tag `tag`.
LogCounts count_log(const std::string& path, std::uint32_t tag, std::uint32_t stream) {
  LogCounts c;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    if (f.size() != 7 || f[6] != std::to_string(tag)) continue;
    if (f[2] == "allocate") ++c.allocs;
    if (f[2] == "free") ++c.frees;
    if (f[5] != std::to_string(stream)) ++c.other_stream;
  }
  return c;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace xlogrt;
  std::size_t n = 100'000'000;
  if (argc == 3 && std::string(argv[1]) == "--keys") n = std::strtoull(argv[2], nullptr, 10);

  std::string log_path;
  if (const char* p = std::getenv("XLOGRT_LOG_FILE")) {
    log_path = p;
  } else {
    log_path = "/tmp/xlogrt_thrust_sort_" + std::to_string(::getpid()) + ".csv";
    ::setenv("XLOGRT_LOG_FILE", log_path.c_str(), 1);
  }

  auto drv = CudaDriver::open();
  if (!drv) {
    std::printf("%s\n", drv.error().what().c_str());
    const errc c = drv.error().code();
    return (c == errc::no_driver || c == errc::no_device) ? (std::puts("SKIP: no CUDA driver or device"), 77) : 1;
  }
  if (auto d = (*drv)->device_count(); !d || *d == 0) return std::puts("SKIP: no CUDA device"), 77;
  auto rt = DeviceRuntime<DefaultStack>::try_get(0);
  if (!rt) return std::printf("FAIL: %s\n", rt.error().what().c_str()), 1;
  auto& runtime = **rt;
  auto& stats = *find_layer<Statistics>(runtime.stack());
  auto& logging = *find_layer<Logging>(runtime.stack());  // to flush the log
  constexpr AllocTag TEMP{31}, KEYS{32};
  const std::size_t start_bytes = runtime.bytes_outstanding();

  thrust_test::Resource res(runtime, {.tag = TEMP});
  if (auto r = runtime.stack().make_current(); !r) return std::printf("FAIL: %s\n", r.error().what().c_str()), 1;
  auto s = runtime.driver().stream_create();  // non-blocking, not the legacy stream
  if (!s) return std::printf("FAIL: %s\n", s.error().what().c_str()), 1;
  auto sid = res.stream_id(*s);
  if (!sid) return std::printf("FAIL: %s\n", sid.error().what().c_str()), 1;
  auto keys = runtime.allocate(n * sizeof(std::uint32_t), *sid, KEYS);
  if (!keys) return std::printf("FAIL: %s\n", keys.error().what().c_str()), 1;
  auto* k = keys->as<std::uint32_t>();

  std::uint64_t expected_sum = 0;
  for (std::size_t i = 0; i < n; ++i) expected_sum += thrust_test::key(i);

  check(thrust_test::fill_keys(*s, k, n) == 0, "fill kernel launched");
  const auto t0 = std::chrono::steady_clock::now();
  check(thrust_test::sort_keys(res, *s, k, n) == 0, "thrust::sort enqueued with the xlogrt allocator");
  check(runtime.driver().stream_synchronize(*s).has_value(), "the sort's stream completes");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sorted %zu keys in %.1f ms\n", n, ms);
  const auto after_sort = stats.snapshot().of(TEMP);
  std::printf("temporary storage: %llu allocations, %zu bytes in total, peak %zu\n",
              static_cast<unsigned long long>(after_sort.allocations), after_sort.total_bytes, after_sort.peak_bytes);
  check(after_sort.allocations >= 1, "the sort's temporary storage came from the stack (Statistics)");
  check(after_sort.total_bytes >= n * sizeof(std::uint32_t),
        "at least the radix sort's second key buffer (n keys) came from the stack");
  check(after_sort.current_bytes == 0 && after_sort.frees == after_sort.allocations,
        "every temporary block was freed");

  bool sorted = false;
  std::uint64_t sum = 0;
  check(thrust_test::check_keys(res, *s, k, n, &sorted, &sum) == 0, "is_sorted and the sum ran");
  check(sorted, "the keys are sorted");
  check(sum == expected_sum, "the keys' sum is unchanged (" + std::to_string(sum) + " vs " +
                                 std::to_string(expected_sum) + ")");

  check(runtime.deallocate(std::move(*keys)).has_value(), "the key buffer is freed");
  check(runtime.reap_pending().has_value() && runtime.bytes_outstanding() == start_bytes,
        "after the reap the stack's bytes are back to their start");
  const auto total = stats.snapshot().of(TEMP);
  check(total.current_bytes == 0, "Statistics: 0 bytes of the bridge's tag live");

  check(logging.flush().has_value(), "the log flushes");
  const LogCounts lc = count_log(log_path, TEMP.value, sid->value);
  std::printf("log %s: %llu allocate and %llu free lines of tag %u\n", log_path.c_str(),
              static_cast<unsigned long long>(lc.allocs), static_cast<unsigned long long>(lc.frees), TEMP.value);
  check(lc.allocs == total.allocations && lc.frees == total.frees,
        "the log has one allocate and one free line per temporary block");
  check(lc.other_stream == 0, "every temporary block is on the sort's stream in the log");

  (void)runtime.driver().stream_destroy(*s);
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
