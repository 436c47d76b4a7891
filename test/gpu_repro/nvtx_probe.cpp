// SPDX-License-Identifier: Apache-2.0
// Under which conditions compute-sanitizer accepts an NVTX heap registration, and then
// reports a read of the heap where no region is: the question of issue 28, finding 7.
//
// The caching layer's marks (resource/detail/cache_nvtx.hpp) register each block it takes
// from its upstream as a heap of its own, right after the upstream's stream-ordered
// allocation (cuMemAllocFromPoolAsync), and the part a user holds as a region of it. In
// the single-threaded memcheck test (cache_memcheck.cpp) the heap is accepted and the read
// of a cached block reported; in the soak under memcheck every heap registration was
// refused ("nvtxMemHeapRegister failed: One or more of the parameters is invalid"). Each
// case here registers heaps in one of the situations that differ between the two, through
// the library's own NVTX calls (resource/nvtx_marks.hpp), so that the descriptors are the
// ones the marks pass:
//
//   runtime-late            the first NVTX calls and a heap, before the CUDA runtime is
//                           initialised (the tool's manual asks for it to be first);
//                           meaningful only as a process's first case
//   alloc                   a heap over exactly one cuMemAlloc allocation: the manual's
//                           own pattern, the control
//   pool-default            one cuMemAllocFromPoolAsync block from the device's default
//                           pool, on an idle stream, registered right after the call (as
//                           the marks do; cache_memcheck's situation)
//   pool-default-pending    the same with the stream held behind a host function, so
//                           that the allocation has not executed when the heap is
//                           registered (hypothesis a)
//   pool-created            as pool-default, from a pool made with cuMemPoolCreate (the
//                           default stack's small pool, AsyncCudaOptions::small_pool_bytes)
//                           (hypothesis b)
//   pool-created-pending    both: the default stack under a busy soak
//   small-blocks            16 blocks of 256 B .. 64 KiB, adjacent in the pool's memory,
//                           each its own heap, as the cache registers the soak's sizes
//   sub-range               a heap over 64 KiB inside a 1 MiB pool block (hypothesis d)
//   other-thread            the domain created on the main thread, the block allocated and
//                           its heap registered on another (context current, runtime device
//                           set, as the soak's workers) (hypothesis c)
//   own-thread-domain       another thread creates its own domain and registers there: a
//                           thread apart from the domain's creator, or apart from the main
//                           thread
//   other-thread-no-context another thread, with no current context, registers a block the
//                           main thread allocated
//   threads                 4 threads at once, each 8 blocks of 256 B .. 1 MiB on its own
//                           held stream: the soak in small
//
// Every case then reads one word of a heap where no region is (memcheck should report
// it: "expect reported"), and, as the control, one word inside a region (it should not:
// "expect clean"). With no tool attached every read is of memory the program holds, and
// the program runs clean. The pool of the cases that do not name theirs is the device's
// default pool (the stack's pool when finding 7 was seen), or a pool of its own with
// --created-pool.
//
// Each case prints its label before it runs and, at its end, one line
//   nvtx_probe: case=NAME heaps=N null_heaps=K expect_reported=R expect_clean=C
// (null_heaps: registrations that gave no handle: no tool attached, or the tool refused).
// nvtx_probe.sh runs each case in a process of its own under memcheck and sets these
// beside what the tool printed.
//
// usage: gpu_nvtx_probe [--created-pool] [CASE...]   (no CASE: every case, in the order above)
//        gpu_nvtx_probe --list | --probe
// Exit status: 0 when every case ran (whatever the tool made of it); 1 when a CUDA call
// failed; 2 for a bad argument; 77 (SKIP) without a driver, a device, memory pools or a
// GPU that runs the sm_90 kernels.
//
// The reading kernel is uaf_kernels.cu's checksum kernel (one word, one thread); this file
// is plain C++.

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <xlogrt/driver/cuda_driver.hpp>
#include <xlogrt/resource/nvtx_marks.hpp>

#include "uaf_kernels.hpp"

using namespace xlogrt;

namespace {

constexpr int SKIP = 77;
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

struct Env {
  CudaDriver* drv = nullptr;
  CUdevice dev{};
  CUcontext ctx = nullptr;
  std::uint64_t sums = 0;     // the reading kernel's output: plain cuMemAlloc, never a heap
  bool runtime = false;       // the CUDA runtime initialised (ensure_runtime)
  bool created_pool = false;  // --created-pool
};

template <class T>
T take(result<T> r, const char* what) {
  if (!r) {
    std::printf("FAIL: %s: %s\n", what, r.error().what().c_str());
    std::exit(1);
  }
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}

/// The CUDA runtime (cudaSetDevice), which the reading kernel needs; its first call
/// initialises it. Exits 77 where it finds no driver or the sm_90 kernels cannot run.
void ensure_runtime(Env& env) {
  if (env.runtime) return;
  take(env.drv->ctx_make_current(env.ctx), "making the primary context current");
  if (const int e = uaf::select_device(0); e != 0) {
    if (!uaf::runtime_without_driver(e)) {
      std::printf("FAIL: cudaSetDevice(0): %s\n", uaf::error_name(e));
      std::exit(1);
    }
    std::printf("SKIP: the CUDA runtime API finds no usable driver or device (cudaSetDevice: %s)\n",
                uaf::error_name(e));
    std::exit(SKIP);
  }
  if (const int e = uaf::kernels_loadable(); e != 0) {
    std::printf("SKIP: the kernels, built for sm_90, cannot run here: %s\n", uaf::error_name(e));
    std::exit(SKIP);
  }
  env.runtime = true;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Holds a stream at a host function until opened, or for 5 s at most: the work enqueued
/// behind it (the allocation) has not executed while the gate is shut. The bound keeps a
/// tool that waits for the stream inside an NVTX call from hanging the probe; a
/// registration that took the whole bound says the tool waited.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> timed_out{false};

  static void hold(void* p) noexcept {
    auto* g = static_cast<Gate*>(p);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!g->open.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() > until) {
        g->timed_out.store(true, std::memory_order_relaxed);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void shut_on(Env& env, CUstream s) { take(env.drv->launch_host_func(s, &Gate::hold, this), "cuLaunchHostFunc"); }
};

/// One case's NVTX domain and counts. The heap and region calls are the caching layer's
/// (detail::nvtx_*), called the way NvtxMarks calls them.
class Probe {
 public:
  Probe(Env& env, std::string name) : env_(env), name_(std::move(name)) {}
  ~Probe() {
    std::printf("nvtx_probe: case=%s heaps=%d null_heaps=%d expect_reported=%d expect_clean=%d\n", name_.c_str(),
                heaps_.load(), null_heaps_.load(), expect_reported_, expect_clean_);
  }

  /// Creates the domain on the calling thread.
  void make_domain() {
    const std::string d = "xlogrt-probe-" + name_;
    domain_ = detail::nvtx_create_domain(d.c_str());
    std::printf("  domain \"%s\" created on this case's %s thread\n", d.c_str(),
                std::this_thread::get_id() == main_ ? "main" : "other");
  }
  /// nvtxMemHeapRegister over [ptr, ptr + bytes). Thread-safe.
  void* heap(std::uint64_t ptr, std::size_t bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    void* h = detail::nvtx_register_heap(domain_, ptr, bytes);
    const double ms = ms_since(t0);
    heaps_.fetch_add(1);
    if (h == nullptr) null_heaps_.fetch_add(1);
    std::printf("  heap [0x%" PRIx64 ", +%zu) on the %s thread: handle %p (%.3f ms)%s\n", ptr, bytes,
                std::this_thread::get_id() == main_ ? "main" : "other", h, ms,
                h == nullptr ? ": none (no tool, or the tool refused it)" : "");
    return h;
  }

  /// A region over [ptr, ptr + bytes) of `heap`, as NvtxMarks::handed; none without a heap.
  void region(void* heap, std::uint64_t ptr, std::size_t bytes) {
    if (heap == nullptr) {
      std::printf("  region [0x%" PRIx64 ", +%zu): not registered, no heap (as the marks do)\n", ptr, bytes);
      return;
    }
    detail::nvtx_register_region(domain_, heap, ptr, bytes);
    std::printf("  region [0x%" PRIx64 ", +%zu) registered\n", ptr, bytes);
  }
  void unregister_region(void* heap, std::uint64_t ptr) {
    if (heap != nullptr) detail::nvtx_unregister_region(domain_, ptr);
  }
  void unregister_heap(void* heap) {
    if (heap != nullptr) detail::nvtx_unregister_heap(domain_, heap);
  }

  /// One word at `ptr` read by one thread of a kernel on `s`, then `s` synchronised.
  void read(std::uint64_t ptr, CUstream s, bool expect_reported, const char* what) {
    ensure_runtime(env_);
    (expect_reported ? expect_reported_ : expect_clean_) += 1;
    std::printf("  read 0x%" PRIx64 " (%s): memcheck should %s\n", ptr, what,
                expect_reported ? "report it (a heap, no region)" : "not report it");
    std::fflush(stdout);
    const int e = uaf::enqueue_checksum(s, reinterpret_cast<const std::uint32_t*>(ptr), 1, 1, 0,
                                        reinterpret_cast<unsigned long long*>(env_.sums));
    auto synced = env_.drv->stream_synchronize(s);
    // A kernel memcheck stopped may fail its launch or the synchronisation; that is the
    // tool's verdict, not a failure of the probe.
    std::printf("  read done: launch %s, synchronise %s\n", e == 0 ? "ok" : uaf::error_name(e),
                synced ? "ok" : synced.error().what().c_str());
  }

 private:
  Env& env_;
  std::string name_;
  void* domain_ = nullptr;
  std::thread::id main_ = std::this_thread::get_id();
  std::atomic<int> heaps_{0};
  std::atomic<int> null_heaps_{0};
  int expect_reported_ = 0;
  int expect_clean_ = 0;
};

// --- Pools and blocks ---------------------------------------------------------------

/// The pool a case allocates from: the device's default pool, or one made for the case
/// (destroyed with it).
class Pool {
 public:
  Pool(Env& env, bool created) : env_(env), created_(created) {
    pool_ = created ? take(env.drv->mempool_create(env.dev), "cuMemPoolCreate")
                    : take(env.drv->device_default_mempool(env.dev), "cuDeviceGetDefaultMemPool");
    std::printf("  pool: %s\n", created ? "made with cuMemPoolCreate" : "the device's default pool");
  }
  ~Pool() {
    if (created_) take(env_.drv->mempool_destroy(pool_), "cuMemPoolDestroy");
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  std::uint64_t alloc(std::size_t bytes, CUstream s) {
    return take(env_.drv->mem_alloc_async(bytes, pool_, s), "cuMemAllocFromPoolAsync");
  }

 private:
  Env& env_;
  bool created_;
  CUmemoryPool pool_{};
};

/// A stream of the primary context, destroyed with the object.
class Stream {
 public:
  explicit Stream(Env& env) : s(take(env.drv->stream_create(), "cuStreamCreate")), env_(env) {}
  ~Stream() { take(env_.drv->stream_destroy(s), "cuStreamDestroy"); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const CUstream s;

 private:
  Env& env_;
};

void free_block(Env& env, std::uint64_t p, CUstream s) {
  take(env.drv->mem_free_async(p, s), "cuMemFreeAsync");
  take(env.drv->stream_synchronize(s), "cuStreamSynchronize");
}

/// The common tail: a read of the heap (no region), then a region over the first 64 KiB
/// and a read inside it, then the marks undone as the cache undoes them.
void read_both_ways(Probe& pr, void* h, std::uint64_t p, CUstream s) {
  pr.read(p + 256, s, true, "inside the heap, no region");
  pr.region(h, p, 64 * KiB);
  pr.read(p + 256, s, false, "inside a region");
  pr.unregister_region(h, p);
  pr.unregister_heap(h);
}

// --- The cases ----------------------------------------------------------------------

void case_runtime_late(Env& env, Probe& pr) {
  if (env.runtime) {
    std::printf("  NOTE: the runtime is already initialised in this process: run this case first, alone\n");
  }
  pr.make_domain();
  Stream st(env);
  Pool pool(env, env.created_pool);
  const std::uint64_t p = pool.alloc(MiB, st.s);
  void* h = pr.heap(p, MiB);
  std::printf("  the CUDA runtime is initialised only now\n");
  ensure_runtime(env);
  read_both_ways(pr, h, p, st.s);
  free_block(env, p, st.s);
}

void case_alloc(Env& env, Probe& pr) {
  ensure_runtime(env);
  pr.make_domain();
  Stream st(env);
  const std::uint64_t p = take(env.drv->mem_alloc(MiB), "cuMemAlloc");
  void* h = pr.heap(p, MiB);
  read_both_ways(pr, h, p, st.s);
  take(env.drv->mem_free(p), "cuMemFree");
}

/// One 1 MiB block from `created` or the default pool, registered right after the call;
/// with `pending`, while the stream is held so that the allocation has not executed.
void pool_block(Env& env, Probe& pr, bool created, bool pending) {
  ensure_runtime(env);
  pr.make_domain();
  Stream st(env);
  Pool pool(env, created);
  Gate gate;
  if (pending) gate.shut_on(env, st.s);
  const std::uint64_t p = pool.alloc(MiB, st.s);
  void* h = pr.heap(p, MiB);
  if (pending) {
    const bool idle = take(env.drv->stream_query(st.s), "cuStreamQuery");
    std::printf("  at the registration the allocation had %s (stream %s)%s\n", idle ? "executed" : "not executed",
                idle ? "idle" : "held", gate.timed_out.load() ? "; the gate timed out: the tool waited" : "");
    gate.open.store(true, std::memory_order_release);
  }
  take(env.drv->stream_synchronize(st.s), "cuStreamSynchronize");
  read_both_ways(pr, h, p, st.s);
  free_block(env, p, st.s);
}

void case_pool_default(Env& env, Probe& pr) { pool_block(env, pr, false, false); }
void case_pool_default_pending(Env& env, Probe& pr) { pool_block(env, pr, false, true); }
void case_pool_created(Env& env, Probe& pr) { pool_block(env, pr, true, false); }
void case_pool_created_pending(Env& env, Probe& pr) { pool_block(env, pr, true, true); }

void case_small_blocks(Env& env, Probe& pr) {
  ensure_runtime(env);
  pr.make_domain();
  Stream st(env);
  Pool pool(env, env.created_pool);
  constexpr int n = 16;
  std::uint64_t p[n];
  std::size_t bytes[n];
  void* h[n];
  for (int i = 0; i < n; ++i) {
    bytes[i] = std::size_t{256} << (i % 9);  // 256 B .. 64 KiB
    p[i] = pool.alloc(bytes[i], st.s);
    h[i] = pr.heap(p[i], bytes[i]);
  }
  take(env.drv->stream_synchronize(st.s), "cuStreamSynchronize");
  // Every block but one handed out (a region over it); the one left is a cached block.
  constexpr int cached = 8;
  for (int i = 0; i < n; ++i) {
    if (i != cached) pr.region(h[i], p[i], bytes[i]);
  }
  pr.read(p[cached], st.s, true, "a block with a heap and no region");
  pr.read(p[cached - 1], st.s, false, "a block with a region");
  for (int i = 0; i < n; ++i) {
    if (i != cached) pr.unregister_region(h[i], p[i]);
    pr.unregister_heap(h[i]);
    take(env.drv->mem_free_async(p[i], st.s), "cuMemFreeAsync");
  }
  take(env.drv->stream_synchronize(st.s), "cuStreamSynchronize");
}

void case_sub_range(Env& env, Probe& pr) {
  ensure_runtime(env);
  pr.make_domain();
  Stream st(env);
  Pool pool(env, env.created_pool);
  const std::uint64_t p = pool.alloc(MiB, st.s);
  const std::uint64_t q = p + 64 * KiB;  // the heap: [64 KiB, 128 KiB) of the block
  void* h = pr.heap(q, 64 * KiB);
  take(env.drv->stream_synchronize(st.s), "cuStreamSynchronize");
  read_both_ways(pr, h, q, st.s);
  free_block(env, p, st.s);
}

/// A block allocated and its heap registered on another thread, which makes the primary
/// context current and sets the runtime's device first, as the soak's workers do;
/// `own_domain`: that thread also creates the domain it registers in.
void other_thread(Env& env, Probe& pr, bool own_domain) {
  ensure_runtime(env);
  if (!own_domain) pr.make_domain();
  Stream st(env);
  Pool pool(env, env.created_pool);
  std::uint64_t p = 0;
  void* h = nullptr;
  std::thread t([&] {
    take(env.drv->ctx_make_current(env.ctx), "making the primary context current (thread)");
    if (const int e = uaf::select_device(0); e != 0) {
      std::printf("FAIL: cudaSetDevice(0) on the thread: %s\n", uaf::error_name(e));
      std::exit(1);
    }
    if (own_domain) pr.make_domain();
    p = pool.alloc(MiB, st.s);
    h = pr.heap(p, MiB);
  });
  t.join();
  take(env.drv->stream_synchronize(st.s), "cuStreamSynchronize");
  read_both_ways(pr, h, p, st.s);
  free_block(env, p, st.s);
}

void case_other_thread(Env& env, Probe& pr) { other_thread(env, pr, false); }
void case_own_thread_domain(Env& env, Probe& pr) { other_thread(env, pr, true); }

void case_other_thread_no_context(Env& env, Probe& pr) {
  ensure_runtime(env);
  pr.make_domain();
  Stream st(env);
  Pool pool(env, env.created_pool);
  const std::uint64_t p = pool.alloc(MiB, st.s);
  take(env.drv->stream_synchronize(st.s), "cuStreamSynchronize");
  void* h = nullptr;
  std::thread t([&] { h = pr.heap(p, MiB); });  // a fresh thread: no current context
  t.join();
  read_both_ways(pr, h, p, st.s);
  free_block(env, p, st.s);
}

void case_threads(Env& env, Probe& pr) {
  ensure_runtime(env);
  pr.make_domain();
  Pool pool(env, env.created_pool);
  constexpr int T = 4, B = 8;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int t = 0; t < T; ++t) streams.push_back(std::make_unique<Stream>(env));
  Gate gates[T];
  for (int t = 0; t < T; ++t) gates[t].shut_on(env, streams[t]->s);
  std::uint64_t p[T][B];
  std::size_t bytes[T][B];
  void* h[T][B];
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < T; ++t) {
    workers.emplace_back([&, t] {
      take(env.drv->ctx_make_current(env.ctx), "making the primary context current (thread)");
      if (const int e = uaf::select_device(0); e != 0) {
        std::printf("FAIL: cudaSetDevice(0) on thread %d: %s\n", t, uaf::error_name(e));
        std::exit(1);
      }
      ready.fetch_add(1);
      while (ready.load() < T) std::this_thread::yield();  // register at the same time
      for (int i = 0; i < B; ++i) {
        bytes[t][i] = std::size_t{256} << ((t + 3 * i) % 13);  // 256 B .. 1 MiB
        p[t][i] = pool.alloc(bytes[t][i], streams[t]->s);
        h[t][i] = pr.heap(p[t][i], bytes[t][i]);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (int t = 0; t < T; ++t) gates[t].open.store(true, std::memory_order_release);
  for (int t = 0; t < T; ++t) take(env.drv->stream_synchronize(streams[t]->s), "cuStreamSynchronize");
  for (int t = 0; t < T; ++t) pr.read(p[t][0], streams[t]->s, true, "a thread's block, a heap and no region");
  pr.region(h[0][1], p[0][1], bytes[0][1]);
  pr.read(p[0][1], streams[0]->s, false, "a thread's block inside a region");
  pr.unregister_region(h[0][1], p[0][1]);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < B; ++i) {
      pr.unregister_heap(h[t][i]);
      take(env.drv->mem_free_async(p[t][i], streams[t]->s), "cuMemFreeAsync");
    }
    take(env.drv->stream_synchronize(streams[t]->s), "cuStreamSynchronize");
  }
}

struct Case {
  const char* name;
  void (*run)(Env&, Probe&);
  const char* what;
};

// runtime-late first: with no CASE given, its NVTX calls are then the process's first.
constexpr Case cases[] = {
    {"runtime-late", case_runtime_late, "a heap registered before the CUDA runtime is initialised"},
    {"alloc", case_alloc, "a heap over exactly one cuMemAlloc allocation (the control)"},
    {"pool-default", case_pool_default, "a default-pool block on an idle stream, registered at once"},
    {"pool-default-pending", case_pool_default_pending, "a default-pool block registered before it executed"},
    {"pool-created", case_pool_created, "a cuMemPoolCreate block on an idle stream, registered at once"},
    {"pool-created-pending", case_pool_created_pending, "a cuMemPoolCreate block registered before it executed"},
    {"small-blocks", case_small_blocks, "16 adjacent pool blocks of 256 B .. 64 KiB, a heap each"},
    {"sub-range", case_sub_range, "a heap over 64 KiB inside a 1 MiB pool block"},
    {"other-thread", case_other_thread, "a heap registered on a thread other than the domain's creator"},
    {"own-thread-domain", case_own_thread_domain, "a heap registered on another thread, in its own domain"},
    {"other-thread-no-context", case_other_thread_no_context, "a heap registered on a thread with no context"},
    {"threads", case_threads, "4 threads, 8 pool blocks each on held streams, registered at once"},
};

const Case* find_case(std::string_view name) {
  for (const Case& c : cases) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the tool writes to the same stream
  Env env;
  bool probe = false;
  std::vector<const Case*> selected;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--list") {
      for (const Case& c : cases) std::printf("%s\n", c.name);
      return 0;
    }
    if (a == "--probe") {
      probe = true;
    } else if (a == "--created-pool") {
      env.created_pool = true;
    } else if (const Case* c = find_case(a)) {
      selected.push_back(c);
    } else {
      std::fprintf(stderr, "gpu_nvtx_probe: unknown argument '%s' (--list names the cases)\n", argv[i]);
      return 2;
    }
  }
  if (selected.empty()) {
    for (const Case& c : cases) selected.push_back(&c);
  }

  auto drv = CudaDriver::open();
  if (!drv) return std::printf("SKIP: no usable CUDA driver: %s\n", drv.error().what().c_str()), SKIP;
  env.drv = *drv;
  env.dev = take(env.drv->device_get(0), "cuDeviceGet(0)");
  if (take(env.drv->device_attribute(env.dev, DeviceAttr::memory_pools_supported), "cuDeviceGetAttribute") == 0) {
    return std::printf("SKIP: device 0 has no stream-ordered memory pools\n"), SKIP;
  }
  if (take(env.drv->device_attribute(env.dev, DeviceAttr::compute_capability_major), "cuDeviceGetAttribute") != 9) {
    return std::printf("SKIP: the kernels are built for sm_90 only\n"), SKIP;
  }
  env.ctx = take(env.drv->primary_ctx_retain(env.dev), "cuDevicePrimaryCtxRetain");
  take(env.drv->ctx_make_current(env.ctx), "making the primary context current");
  if (probe) {
    ensure_runtime(env);
    std::printf("probe: device 0 runs the kernels\n");
    return 0;
  }
  env.sums = take(env.drv->mem_alloc(sizeof(unsigned long long)), "cuMemAlloc");
  std::printf("# NVTX heap registrations under compute-sanitizer; driver %d; other cases' pool: %s\n",
              env.drv->driver_version(), env.created_pool ? "cuMemPoolCreate" : "the device's default pool");
  for (const Case* c : selected) {
    std::printf("=== case %s: %s\n", c->name, c->what);
    Probe pr(env, c->name);
    c->run(env, pr);
  }
  take(env.drv->mem_free(env.sums), "cuMemFree");
  return 0;
}
