// SPDX-License-Identifier: Apache-2.0
// The cross-stream use-after-free, reproduced on a real GPU, and shown prevented by
// cross-stream use tracking.
//
// Each iteration: the owner allocates a block on stream A and fills it; a slow kernel on
// stream B reads it again and again and adds what it reads into a checksum (kept in a
// separate result buffer); meanwhile the owner frees the block on A, allocates the same
// size again on A (the pool hands back the same memory) and a fast kernel on A
// overwrites it with another pattern. The checksum is right only if B finished reading
// before the memory was reused.
//
//   untracked        the same runtime calls, but no prepare / finish: the owner orders
//                    B's read after its fill with an event of its own (as any correct
//                    program must), and the free waits for nothing. The bug.
//   tracked          every kernel through launch(rt, s, [&](CUstream cs) { k<<<..., cs>>>(); },
//                    read(buf) / write(buf)): the free on A waits for B's read.
//   tracked-kernel   the same through launch(rt, s, KernelLaunch{CUfunction, ...}, ...),
//                    with the handles cudaGetFuncBySymbol gives.
//
// Exit status: 77 (SKIP) without a driver, a device, memory pools or a GPU that runs
// sm_90 code; 1 if a tracked variant ever computes a wrong checksum or a call fails; 0
// otherwise. How often the untracked variant goes wrong is reported, not asserted: it
// depends on timing (the output says whether the bug reproduced).
//
// With --other-stream the new owner allocates on stream C instead of A: the caching layer
// of the default stack then moves blocks freed on A to C, which it may do only once their
// frees are complete on the GPU (with tracking, after the reader on B).
//
// usage: gpu_uaf_repro [--iterations N] [--short] [--probe] [--other-stream]
//                      [--variant all|untracked|tracked|tracked-kernel]
//                      [--bytes B] [--passes P] [--spin-us U]
//   --short   50 iterations, for compute-sanitizer (which slows every launch down)
//   --probe   only check that the GPU can run the kernels (exit 0 or 77)
//
// The kernels are in uaf_kernels.cu (nvcc); this file is plain C++.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <xlogrt/memory/launch_kernel.hpp>
#include <xlogrt/runtime.hpp>

#include "uaf_kernels.hpp"

using namespace xlogrt;

namespace {

constexpr int SKIP = 77;
using Rt = DeviceRuntime<DefaultStack>;
constexpr StreamId A{0};  // the owner's stream
constexpr StreamId B{1};  // the reader's stream
constexpr StreamId C{2};  // the new owner's, with --other-stream

enum class Variant { untracked, tracked, tracked_kernel };

const char* name_of(Variant v) {
  switch (v) {
    case Variant::untracked: return "untracked: no prepare/finish, own event for the read";
    case Variant::tracked: return "tracked: launch(rt, s, [](CUstream){ k<<<>>>(); }, ...)";
    case Variant::tracked_kernel: return "tracked: launch(rt, s, KernelLaunch{CUfunction}, ...)";
  }
  return "?";
}

struct Options {
  std::uint32_t iterations = 1000;
  std::vector<Variant> variants{Variant::untracked, Variant::tracked, Variant::tracked_kernel};
  std::size_t bytes = std::size_t{1} << 20;
  std::uint32_t passes = 8;
  std::uint32_t spin_us = 20;
  bool probe = false;
  StreamId again = A;  // where the new owner allocates
};

struct Outcome {
  std::uint32_t wrong = 0;
  std::uint32_t reused = 0;  // iterations where the second allocation got the same address
  double ms = 0;             // per iteration
};

/// Prints what failed and ends the program with status 1.
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gpu_uaf_repro: FAIL: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T take(result<T>&& r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().what());
  return std::move(*r);
}
void take(result<void>&& r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().what());
}
void take_cuda(int e, const char* what) {
  if (e != 0) die(std::string(what) + ": " + uaf::error_name(e));
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Repro {
 public:
  Repro(Rt& rt, const Options& o, const uaf::KernelHandles& k) : rt_(rt), o_(o), k_(k) {
    n_ = static_cast<std::uint32_t>(o.bytes / sizeof(std::uint32_t));
    spin_ns_ = std::uint64_t{o.spin_us} * 1000;
    sa_ = take(rt.stream(A), "stream A");
    sb_ = take(rt.stream(B), "stream B");
    sn_ = take(rt.stream(o.again), "the new owner's stream");
    ev_ = take(rt.driver().event_create(), "cuEventCreate");
  }
  Repro(const Repro&) = delete;
  Repro& operator=(const Repro&) = delete;
  ~Repro() { (void)rt_.driver().event_destroy(ev_); }

  Outcome run(Variant v) {
    // One checksum per iteration, written by the reader on B: allocated on B, so it
    // needs no tracking.
    const std::size_t result_bytes = sizeof(unsigned long long) * o_.iterations;
    DeviceBlock results = take(rt_.allocate(result_bytes, B), "allocating the checksums");
    take(rt_.driver().memset_d8_async(results.ptr(), 0, result_bytes, sb_), "clearing the checksums");
    auto* sums = reinterpret_cast<unsigned long long*>(results.ptr());

    Outcome out;
    const double t0 = now_ms();
    for (std::uint32_t i = 0; i < o_.iterations; ++i) out.reused += iteration(v, i, sums + i) ? 1 : 0;
    out.ms = (now_ms() - t0) / o_.iterations;

    std::vector<unsigned long long> got(o_.iterations);
    take(rt_.driver().memcpy_dtoh_async(got.data(), results.ptr(), result_bytes, sb_), "reading the checksums");
    take(rt_.driver().stream_synchronize(sb_), "synchronising stream B");
    take(rt_.deallocate(std::move(results)), "freeing the checksums");
    take(rt_.reap_pending(), "reap_pending");
    for (std::uint32_t i = 0; i < o_.iterations; ++i) out.wrong += got[i] != expected(i) ? 1 : 0;
    return out;
  }

 private:
  unsigned long long expected(std::uint32_t iteration) const {
    unsigned long long s = 0;
    for (std::uint32_t j = 0; j < n_; ++j) s += uaf::pattern(iteration, j);
    return s * o_.passes;
  }

  /// One iteration; true when the pool handed the same address back.
  bool iteration(Variant v, std::uint32_t i, unsigned long long* sum) {
    DeviceBlock block = take(rt_.allocate(o_.bytes, A), "allocating the block on A");
    auto* p = reinterpret_cast<std::uint32_t*>(block.ptr());
    const std::uint64_t first = block.ptr();

    // 1. The owner fills the block on A.  2. The reader on B reads it, slowly.
    switch (v) {
      case Variant::untracked:
        take_cuda(uaf::enqueue_fill(sa_, p, n_, i), "fill on A");
        // A correct program orders the read after the fill; this one does it by
        // itself, and tells the runtime nothing.
        take(rt_.driver().event_record(ev_, sa_), "cuEventRecord on A");
        take(rt_.driver().stream_wait_event(sb_, ev_), "cuStreamWaitEvent on B");
        take_cuda(uaf::enqueue_checksum(sb_, p, n_, o_.passes, spin_ns_, sum), "reader on B");
        break;
      case Variant::tracked:
        take(launch(rt_, A, [&](CUstream s) { return uaf::enqueue_fill(s, p, n_, i); }, write(block)),
             "fill on A");
        take(launch(rt_, B, [&](CUstream s) { return uaf::enqueue_checksum(s, p, n_, o_.passes, spin_ns_, sum); },
                    read(block)),
             "reader on B");
        break;
      case Variant::tracked_kernel: {
        void* fill_args[] = {&p, &n_, &i};
        take(launch(rt_, A, KernelLaunch{k_.fill, {uaf::fill_grid}, {uaf::block_threads}, 0, fill_args},
                    write(block)),
             "fill on A");
        const std::uint32_t* cp = p;
        std::uint32_t passes = o_.passes;
        void* read_args[] = {&cp, &n_, &passes, &spin_ns_, &sum};
        take(launch(rt_, B, KernelLaunch{k_.checksum, {uaf::reader_grid}, {uaf::block_threads}, 0, read_args},
                    read(block)),
             "reader on B");
        break;
      }
    }

    // 3. The owner frees the block on A and at once allocates again on A (or C): stream
    //    order lets the pool or the cache hand back the same memory on A; on C the cache
    //    hands back memory whose free is complete.
    take(rt_.deallocate(std::move(block)), "freeing the block on A");
    DeviceBlock next = take(rt_.allocate(o_.bytes, o_.again), "allocating again");
    auto* q = reinterpret_cast<std::uint32_t*>(next.ptr());
    const bool reused = next.ptr() == first;

    // 4. The new owner overwrites it on A, quickly.
    switch (v) {
      case Variant::untracked:
        take_cuda(uaf::enqueue_overwrite(sn_, q, n_), "overwrite");
        break;
      case Variant::tracked:
        take(launch(rt_, o_.again, [&](CUstream s) { return uaf::enqueue_overwrite(s, q, n_); }, write(next)),
             "overwrite");
        break;
      case Variant::tracked_kernel: {
        void* args[] = {&q, &n_};
        take(launch(rt_, o_.again, KernelLaunch{k_.overwrite, {uaf::fill_grid}, {uaf::block_threads}, 0, args},
                    write(next)),
             "overwrite");
        break;
      }
    }
    take(rt_.deallocate(std::move(next)), "freeing the second block");

    // 5. Each iteration is a trial of its own: drain both streams.
    take(rt_.driver().stream_synchronize(sb_), "synchronising stream B");
    take(rt_.reap_pending(), "reap_pending");
    return reused;
  }

  Rt& rt_;
  const Options& o_;
  const uaf::KernelHandles& k_;
  std::uint32_t n_ = 0;
  std::uint64_t spin_ns_ = 0;
  CUstream sa_ = nullptr;
  CUstream sb_ = nullptr;
  CUstream sn_ = nullptr;
  CUevent ev_ = nullptr;
};

Options parse(int argc, char** argv) {
  Options o;
  auto number = [&](int& i) -> unsigned long long {
    if (i + 1 >= argc) die(std::string(argv[i]) + " needs a value");
    char* end = nullptr;
    const unsigned long long v = std::strtoull(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0' || v == 0 || v > 0xFFFFFFFFull) {
      die(std::string(argv[i - 1]) + " needs an integer from 1 to 4294967295");
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--iterations") {
      o.iterations = static_cast<std::uint32_t>(number(i));
    } else if (a == "--short") {
      o.iterations = 50;
    } else if (a == "--probe") {
      o.probe = true;
    } else if (a == "--other-stream") {
      o.again = C;
    } else if (a == "--bytes") {
      o.bytes = static_cast<std::size_t>(number(i));
      if (o.bytes % 4 != 0 || o.bytes > (std::size_t{1} << 30)) {
        die("--bytes must be a multiple of 4, at most 1 GiB");
      }
    } else if (a == "--passes") {
      o.passes = static_cast<std::uint32_t>(number(i));
    } else if (a == "--spin-us") {
      o.spin_us = static_cast<std::uint32_t>(number(i));
    } else if (a == "--variant") {
      if (i + 1 >= argc) die("--variant needs a value");
      const std::string_view v = argv[++i];
      if (v == "all") {
        o.variants = {Variant::untracked, Variant::tracked, Variant::tracked_kernel};
      } else if (v == "untracked") {
        o.variants = {Variant::untracked};
      } else if (v == "tracked") {
        o.variants = {Variant::tracked, Variant::tracked_kernel};
      } else if (v == "tracked-kernel") {
        o.variants = {Variant::tracked_kernel};
      } else {
        die("--variant is one of all, untracked, tracked, tracked-kernel");
      }
    } else {
      die("unknown argument " + std::string(a) +
          " (usage: gpu_uaf_repro [--iterations N] [--short] [--probe] [--other-stream]"
          " [--variant all|untracked|tracked|tracked-kernel] [--bytes B] [--passes P] [--spin-us U])");
    }
  }
  return o;
}

/// Errors that mean "no GPU to run on here", not "the library is wrong".
bool is_skip(const error& e) {
  return e.code() == errc::no_driver || e.code() == errc::driver_too_old || e.code() == errc::no_device ||
         e.code() == errc::invalid_ordinal || e.driver_status() == status::not_supported;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);

  auto drv = CudaDriver::open();
  if (!drv) {
    std::printf("SKIP: no usable CUDA driver: %s\n", drv.error().what().c_str());
    return SKIP;
  }
  auto got = Rt::try_get(0);
  if (!got) {
    const bool skip = is_skip(got.error());
    std::printf("%s: cannot open ordinal 0: %s\n", skip ? "SKIP" : "FAIL", got.error().what().c_str());
    return skip ? SKIP : 1;
  }
  Rt& rt = **got;
  const DeviceInfo& info = rt.device()->info();
  take(rt.device()->make_current(), "making the primary context current");
  // The runtime API then works in the primary context xlogrt made current.
  if (const int e = uaf::select_device(0); e != 0) {
    if (!uaf::runtime_without_driver(e)) take_cuda(e, "cudaSetDevice(0)");
    std::printf("SKIP: the CUDA runtime API finds no usable driver or device (cudaSetDevice: %s), though "
                "xlogrt opened %s\n",
                uaf::error_name(e), (*drv)->library().c_str());
    return SKIP;
  }
  if (const int e = uaf::kernels_loadable(); e != 0) {
    std::printf("SKIP: the kernels, built for sm_90, cannot run on %s (sm_%d%d): %s\n", info.name.c_str(),
                info.cc_major, info.cc_minor, uaf::error_name(e));
    return SKIP;
  }
  if (o.probe) {
    std::printf("probe: %s (sm_%d%d) runs the kernels\n", info.name.c_str(), info.cc_major, info.cc_minor);
    return 0;
  }
  uaf::KernelHandles handles;
  take_cuda(uaf::kernel_handles(&handles), "cudaGetFuncBySymbol");

  std::printf("# cross-stream use-after-free on %s (ordinal 0, sm_%d%d, %d SMs), driver %d, "
              "DeviceRuntime<DefaultStack>\n",
              info.name.c_str(), info.cc_major, info.cc_minor, info.multiprocessors, (*drv)->driver_version());
  std::printf("# %zu-byte block allocated on stream %u (A), read on stream %u (B) by %u x %u threads: %u passes, "
              "each after a %u us spin; the next owner allocates on stream %u; %u iterations per variant\n",
              o.bytes, A.value, B.value, uaf::reader_grid, uaf::block_threads, o.passes, o.spin_us, o.again.value,
              o.iterations);
  auto& cache = *find_layer<Cached>(rt.stack());
  std::printf("# caching layer %s\n\n", cache.options().enabled ? "on" : "off (XLOGRT_CACHE=0)");
  std::printf("| variant | iterations | wrong checksums | same address handed back | ms/iteration | cache hits "
              "| cache moves across streams |\n|---|---|---|---|---|---|---|\n");

  Repro repro(rt, o, handles);
  std::uint32_t untracked_wrong = 0;
  std::uint32_t untracked_reused = 0;
  std::uint32_t tracked_wrong = 0;
  std::uint32_t tracked_runs = 0;
  bool ran_untracked = false;
  for (Variant v : o.variants) {
    const CacheStats before = cache.stats();
    const Outcome out = repro.run(v);
    const CacheStats after = cache.stats();
    std::printf("| %s | %u | %u | %u | %.3f | %llu | %llu |\n", name_of(v), o.iterations, out.wrong, out.reused, out.ms,
                static_cast<unsigned long long>(after.hits - before.hits),
                static_cast<unsigned long long>(after.cross_stream_moves - before.cross_stream_moves));
    std::fflush(stdout);
    if (v == Variant::untracked) {
      ran_untracked = true;
      untracked_wrong = out.wrong;
      untracked_reused = out.reused;
    } else {
      tracked_wrong += out.wrong;
      tracked_runs += o.iterations;
    }
  }
  std::printf("\n");
  if (ran_untracked) {
    if (untracked_wrong > 0) {
      std::printf("bug reproduced without tracking: yes, %u of %u checksums wrong\n", untracked_wrong,
                  o.iterations);
    } else {
      std::printf("bug reproduced without tracking: no (the same address came back in %u of %u iterations, "
                  "yet the reader always finished first): raise --spin-us or --passes\n",
                  untracked_reused, o.iterations);
    }
  }
  if (tracked_runs > 0) {
    if (tracked_wrong > 0) {
      std::printf("FAIL: with tracking, %u of %u checksums wrong\n", tracked_wrong, tracked_runs);
      return 1;
    }
    std::printf("with tracking: every checksum right (%u of %u)\n", tracked_runs, tracked_runs);
  }
  return 0;
}
