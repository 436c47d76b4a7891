// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver: a small model of a GPU that implements the Driver concept on the host.
//
// It is the driver the whole library runs on in CI, and the place where stream-ordering
// bugs become visible. It is not a mock that returns success:
// - device memory is real host memory behind plausible device addresses; memset and
//   memcpy move bytes, freed ranges are poisoned and quarantined;
// - each stream is a FIFO of operations run by an executor, either freely on
//   background threads or one operation at a time under a seeded scheduler;
// - events, waits and host synchronisation carry happens-before as vector clocks, and
//   a checker reports unordered cross-stream accesses and accesses to memory that is
//   not live;
// - every entry point can be made to fail on its N-th call with a CUDA status.
//
// Where CUDA's documented semantics leave a choice, the simulator takes the least
// forgiving legal one: a freed range is handed to a later allocation on the same stream
// (or on any stream ordered after the free) before the free has run, the scheduler
// runs a ready free before any other ready operation, fresh memory is filled with
// garbage, and a host-to-device copy reads its source when it runs, not when enqueued.
//
// How it is built. This header keeps the entry points, handle validation, the address
// layout (the reservation of device windows and their translation) and the executor
// (running a head operation, waiting for targets, the worker threads), which need the
// driver's lock, condition variables and host clock all at once and so stay here. The
// parts it composes have a header each:
// - sim/config.hpp and sim/report.hpp: what a test hands in and gets back;
// - sim/detail/hazard_checker.hpp: the checker (shadow memory, findings, reports);
// - sim/detail/fault_injector.hpp: call counts and injected failures;
// - sim/detail/device_memory.hpp: a device's arena, blocks, pending frees, quarantine;
// - sim/detail/host_window.hpp: mapped host memory and its device addresses;
// - sim/detail/scheduler.hpp: which ready stream advances next;
// - sim/detail/capture.hpp: capture sequences, recorded nodes and graphs;
// - sim/detail/objects.hpp, clock.hpp, memory.hpp, shadow.hpp: the objects behind the
//   handles, the checker's vocabulary, mappings and range allocation, shadow segments.
// Every part is guarded by the driver's one mutex and is only used under it.

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/lifetime.hpp"
#include "xlogrt/driver/status.hpp"
#include "xlogrt/sim/config.hpp"
#include "xlogrt/sim/detail/capture.hpp"
#include "xlogrt/sim/detail/clock.hpp"
#include "xlogrt/sim/detail/device_memory.hpp"
#include "xlogrt/sim/detail/fault_injector.hpp"
#include "xlogrt/sim/detail/hazard_checker.hpp"
#include "xlogrt/sim/detail/host_window.hpp"
#include "xlogrt/sim/detail/memory.hpp"
#include "xlogrt/sim/detail/objects.hpp"
#include "xlogrt/sim/detail/scheduler.hpp"
#include "xlogrt/sim/report.hpp"

namespace xlogrt {

/// A simulated GPU that models the Driver concept (see driver/concept.hpp and
/// docs/architecture.md, "The Driver contract").
///
/// Handles are pointers to simulated objects; a value-initialised stream_t is the
/// legacy default stream of the calling thread's current context. Streams are created
/// non-blocking, so the legacy stream is ordered with no other stream.
///
/// Memory. Each device has an arena of SimConfig::memory_bytes; device pointers are
/// reserved host addresses that the host cannot dereference (use memcpy, a kernel body
/// or host_view). Allocations are rounded to alloc_granularity; only the requested
/// bytes are live for the checker. mem_alloc_async returns the address at enqueue and
/// the memory is live once the allocation runs; mem_free_async frees when it runs.
/// mem_free synchronises the device first (as cuMemFree does). Mapped host memory has
/// a device address distinct from its host address, in a window of its own.
///
/// Ordering and the hazard checker. Each stream keeps a vector clock; an event captures
/// its stream's clock; a wait joins it. Host synchronisation (a successful stream or
/// event synchronize, or a query that returns true) joins the clocks it observed into
/// a host clock that every later enqueued operation joins; so do a host function and a
/// write-value when they run, since the host observes those. Checks run at enqueue
/// time, so in manual mode the reports do not depend on the scheduler; in threaded
/// mode a host function or write-value that has already run can order later work, so
/// write race tests in manual mode.
///
/// Faults. fault_stream() and an access outside simulated memory fault a stream:
/// its later operations never run, enqueues on it and waits for it fail with the
/// status, and a stream that waits on an event it never reaches faults too.
///
/// Stream capture. stream_begin_capture makes a stream record instead of run: every
/// operation enqueued on it (and on the streams that join it by waiting on an event
/// recorded in it) is kept as a graph node, unchecked and unrun, and graph_launch replays
/// the nodes on its stream, in the order recorded, checked as if enqueued then (forked
/// branches run one after another there: a legal order of the graph, one a GPU may not
/// choose). The rules the CUDA driver enforces are enforced with its statuses: a second
/// begin (ILLEGAL_STATE) or one on the legacy stream (STREAM_CAPTURE_UNSUPPORTED); an end
/// on another thread unless the capture is relaxed (WRONG_THREAD), on a joined stream
/// (UNMATCHED), with a fork not joined back (UNJOINED); and these, which also invalidate
/// the capture, so that its end fails with STREAM_CAPTURE_INVALIDATED: querying or
/// synchronising a capturing stream (UNSUPPORTED), querying or synchronising an event
/// last recorded in a capture (CAPTURED_EVENT), a capturing stream waiting on an event
/// recorded outside its capture (ISOLATION) or in another one (MERGE), and a
/// potentially unsafe call (mem_alloc, mem_free, mem_host_alloc_mapped, mem_host_free,
/// ctx_synchronize, synchronising or querying the legacy stream) that the calling
/// thread's mode forbids (UNSUPPORTED: see exchange_capture_mode). mem_alloc_async and
/// mem_free_async on a capturing stream make graph memory nodes, counted in
/// capture_stats(). Not modelled: the legacy stream's implicit synchronisation with
/// capturing streams (every stream here is non-blocking, so there is none), and launching
/// a graph into a capturing stream (refused with NOT_SUPPORTED).
///
/// Thread-safe. One mutex guards the whole simulated machine (the checker needs one
/// consistent view of every stream's clock); it is released while a host function or
/// a kernel body runs, and those may call the driver. A host function must not
/// synchronise its own stream (CUDA forbids it; here it deadlocks). Destruction
/// happens-after every other use.
class SimDriver {
 public:
  using device_t = int;
  using context_t = detail::sim::Context*;
  using stream_t = detail::sim::Stream*;
  using event_t = detail::sim::Event*;
  using mempool_t = detail::sim::Pool*;
  using graph_t = detail::sim::Graph*;
  using graph_exec_t = detail::sim::GraphExec*;

  static constexpr const char* kind = "sim";
  /// Allocation sizes and alignment, as cudaMalloc's.
  static constexpr std::uint64_t alloc_granularity = 256;

  /// Builds the machine. A configuration that cannot be honoured (out of range, or
  /// address space refused) makes every entry point fail with the reason.
  explicit SimDriver(SimConfig config = {}) noexcept;
  SimDriver(const SimDriver&) = delete;
  SimDriver& operator=(const SimDriver&) = delete;
  ~SimDriver();

  /// The process-wide simulator with the default configuration, used by
  /// DeviceRuntime::try_get for stacks over SimDriver. Thread-safe.
  static result<SimDriver*> open() noexcept;

  /// This machine's number: unique in the process, never reused (a SimDriver built
  /// later, at the same address or not, gets another) and never 0. State kept per
  /// machine above the driver, the budget ledger's, is keyed by it, so a new machine
  /// never inherits an old one's.
  std::uint64_t machine_serial() const noexcept { return serial_; }

  // --- Driver concept ----------------------------------------------------------------

  result<int> device_count() noexcept;
  result<device_t> device_get(int ordinal) noexcept;
  result<std::string> device_name(device_t dev) noexcept;
  result<std::size_t> device_total_mem(device_t dev) noexcept;
  result<int> device_attribute(device_t dev, DeviceAttr attr) noexcept;
  result<context_t> primary_ctx_retain(device_t dev) noexcept;
  /// The last release destroys the context: its streams and events become invalid and
  /// its device memory is freed (after the device has drained).
  result<void> primary_ctx_release(device_t dev) noexcept;
  /// A null context makes none current.
  result<void> ctx_make_current(context_t ctx) noexcept;
  /// free = total minus allocated, pending-free and graph-reserved bytes of the current
  /// device.
  result<MemInfo> mem_get_info() noexcept;

  result<stream_t> stream_create() noexcept;
  result<void> stream_destroy(stream_t s) noexcept;
  result<void> stream_synchronize(stream_t s) noexcept;
  /// Does not run anything in manual mode: a polling loop must call step().
  result<bool> stream_query(stream_t s) noexcept;
  /// The stream's id, unique over the driver's life: its index in the driver's stream
  /// table, or, for a stream that reuses a destroyed stream's handle
  /// (SimConfig::reuse_stream_handles), a new number above every index.
  result<std::uint64_t> stream_get_id(stream_t s) noexcept;
  /// The context the stream belongs to (cuStreamGetCtx): what StreamPool::adopt compares
  /// with its device's, when a driver offers it. Counted as a cuStreamGetId call.
  result<context_t> stream_context(stream_t s) noexcept;
  result<void> stream_wait_event(stream_t s, event_t e) noexcept;
  result<event_t> event_create() noexcept;
  result<void> event_destroy(event_t e) noexcept;
  result<void> event_record(event_t e, stream_t s) noexcept;
  /// An event never recorded is complete. Does not run anything in manual mode.
  result<bool> event_query(event_t e) noexcept;
  result<void> event_synchronize(event_t e) noexcept;

  result<mempool_t> device_default_mempool(device_t dev) noexcept;
  /// cuMemPoolCreate: a pool beside the device's default one. The simulated pools of a
  /// device share its arena; a pool is a handle to allocate from, with its own release
  /// threshold.
  result<mempool_t> mempool_create(device_t dev) noexcept;
  /// cuMemPoolDestroy. Blocks still allocated from it stay valid until freed, as CUDA's.
  result<void> mempool_destroy(mempool_t pool) noexcept;
  /// Stored (see release_threshold()); the simulated pool never returns memory.
  result<void> mempool_set_release_threshold(mempool_t pool, std::uint64_t bytes) noexcept;
  result<std::uint64_t> mem_alloc_async(std::size_t bytes, mempool_t pool, stream_t s) noexcept;
  result<void> mem_free_async(std::uint64_t ptr, stream_t s) noexcept;
  result<std::uint64_t> mem_alloc(std::size_t bytes) noexcept;
  result<void> mem_free(std::uint64_t ptr) noexcept;
  result<void*> mem_host_alloc_mapped(std::size_t bytes) noexcept;
  result<std::uint64_t> mem_host_device_pointer(void* host) noexcept;
  result<void> mem_host_free(void* host) noexcept;

  result<void> memset_d8_async(std::uint64_t dst, std::uint8_t value, std::size_t bytes,
                               stream_t s) noexcept;
  /// Reads `src` when the copy runs, not when it is enqueued.
  result<void> memcpy_htod_async(std::uint64_t dst, const void* src, std::size_t bytes,
                                 stream_t s) noexcept;
  result<void> memcpy_dtoh_async(void* dst, std::uint64_t src, std::size_t bytes,
                                 stream_t s) noexcept;
  result<void> memcpy_dtod_async(std::uint64_t dst, std::uint64_t src, std::size_t bytes,
                                 stream_t s) noexcept;
  /// Stores `value` with release ordering when it runs (an atomic store: the host may
  /// read the word concurrently). `dst` must be 4-byte aligned.
  result<void> stream_write_value32(stream_t s, std::uint64_t dst, std::uint32_t value) noexcept;
  /// `fn(arg)` runs in stream order, with no driver lock held.
  result<void> launch_host_func(stream_t s, HostFn fn, void* arg) noexcept;

  /// cuStreamGetCaptureInfo: none for a stream outside every capture (the legacy
  /// stream included); active or invalidated, with the capture's id, for a member.
  result<CaptureInfo> stream_capture_info(stream_t s) noexcept;
  /// The calling thread's mode on this simulator (each SimDriver keeps its own, per
  /// thread, as the CUDA driver keeps one per thread; a thread starts in global mode).
  result<CaptureMode> exchange_capture_mode(CaptureMode mode) noexcept;
  /// Synchronises every stream of the current context's device, as mem_free does.
  /// Potentially unsafe during a capture.
  result<void> ctx_synchronize() noexcept;

  // --- CapturingDriver concept ---------------------------------------------------------

  /// The capture remembers `mode` and the calling thread.
  result<void> stream_begin_capture(stream_t s, CaptureMode mode) noexcept;
  /// Every member stream leaves the capture, whether it ends with a graph or fails.
  result<graph_t> stream_end_capture(stream_t s) noexcept;
  result<graph_exec_t> graph_instantiate(graph_t g) noexcept;
  /// Refused (INVALID_VALUE) before anything is enqueued when the launch would free
  /// memory twice: a graph allocation not freed in the graph and still live from the
  /// previous launch, or memory from outside the graph that a captured free already
  /// freed at an earlier launch.
  result<void> graph_launch(graph_exec_t x, stream_t s) noexcept;
  /// The graph's allocations stay reserved while an executable graph made from it lives.
  result<void> graph_destroy(graph_t g) noexcept;
  result<void> graph_exec_destroy(graph_exec_t x) noexcept;

  std::string status_name(int s) const;

  // --- Simulator controls --------------------------------------------------------------

  /// Enqueues a simulated kernel that touches `accesses` (checked like any access) and,
  /// when it runs, calls `body` with a host pointer per access. Entry point
  /// "cuLaunchKernel". Errors as for any stream operation.
  result<void> launch_kernel(stream_t s, std::span<const SimAccess> accesses,
                             SimKernelBody body = {}, std::string_view label = "kernel") noexcept;
  result<void> launch_kernel(stream_t s, std::initializer_list<SimAccess> accesses,
                             SimKernelBody body = {}, std::string_view label = "kernel") noexcept {
    return launch_kernel(s, std::span<const SimAccess>(accesses.begin(), accesses.size()),
                         std::move(body), label);
  }

  /// Manual mode: runs one ready operation chosen by the scheduler; false when none is
  /// ready. Threaded mode: returns false.
  bool step() noexcept;
  /// Manual mode: steps until nothing is ready. Threaded mode: waits until every stream
  /// is drained or faulted. Returns the number of operations run meanwhile.
  std::size_t run_until_idle() noexcept;
  /// Operations enqueued and not yet run (faulted streams' included).
  std::size_t pending_ops() const noexcept;

  /// Copies of the hazard reports so far, in the order found.
  std::vector<SimHazard> hazards() const;
  void clear_hazards() noexcept;
  /// Reports not kept because max_hazards was reached.
  std::uint64_t hazards_dropped() const noexcept;

  /// The n-th call (1-based, counted from now) of entry point `call` (its CUDA name,
  /// e.g. "cuMemAllocFromPoolAsync", also accepted as "cuMemAllocAsync") fails
  /// with `status`, before it has any effect. Misuse (an unknown name, n < 1, status 0)
  /// cannot pass unnoticed: every later entry point fails with status::invalid_value
  /// and a message naming the mistake, until clear_failures().
  SimInjection fail_nth(std::string_view call, int n, int status) noexcept;
  /// Every later call of `call` fails with `status` until clear_failures(). Misuse as
  /// for fail_nth.
  SimInjection fail_always(std::string_view call, int status) noexcept;
  /// Disarms every injection and forgets injection misuse.
  void clear_failures() noexcept;
  /// Calls of `call` since construction (failed ones included); -1 for a name that is
  /// no entry point, so a misspelt name never matches an expected count.
  std::int64_t calls(std::string_view call) const noexcept;

  /// Faults `s` with `status` (as a faulted context would): its pending and later
  /// operations never run; queries, synchronisation and enqueues return the status.
  /// Errors: invalid_argument for status 0, invalid handles.
  result<void> fault_stream(stream_t s, int status) noexcept;

  result<SimMemoryStats> memory_stats(device_t dev) const noexcept;
  /// What the driver has seen of stream capture (graph memory nodes among it).
  SimCaptureStats capture_stats() const noexcept;
  /// Bytes the device cannot hand to an unrelated allocation: allocated, pending frees
  /// and graph reservations (the quarantine is excluded: it empties under pressure).
  result<std::size_t> bytes_reserved(device_t dev) const noexcept;
  result<std::uint64_t> release_threshold(mempool_t pool) const noexcept;
  /// The id reports use for `s` (a null handle: the current context's legacy stream).
  result<std::uint32_t> stream_id(stream_t s) const noexcept;
  /// The simulated bytes behind [ptr, ptr + bytes) of device or mapped host memory,
  /// for tests: bypasses stream order and the checker.
  result<std::span<std::byte>> host_view(std::uint64_t ptr, std::size_t bytes) noexcept;

  const SimConfig& config() const noexcept { return cfg_; }

 private:
  using Call = detail::sim::Call;
  using Lock = std::unique_lock<std::mutex>;
  using Stream = detail::sim::Stream;
  using Device = detail::sim::Device;
  using Event = detail::sim::Event;
  using Op = detail::sim::Op;
  using OpKind = detail::sim::OpKind;
  using OpRef = detail::sim::OpRef;
  using VectorClock = detail::sim::VectorClock;

  struct Target {
    Stream* stream;
    std::uint64_t seq;
  };
  using Needed = detail::sim::Scheduler::Needed;

  static constexpr std::uint64_t window_align = std::uint64_t{2} << 20;

  static constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t to) noexcept {
    return (v + to - 1) / to * to;
  }

  error fail(Call c, int s, std::string_view context) const {
    return status::driver_failure(s, detail::sim::call_name(c), status_name(s), context);
  }
  std::optional<error> enter_locked(Call c);
  result<Device*> device_locked(Call c, device_t d) const;
  result<Device*> current_device_locked(Call c) const;
  result<Stream*> stream_locked(Call c, stream_t s) const;
  result<Event*> event_locked(Call c, event_t e) const;
  error fault_error(Call c, const Stream& s) const;
  bool owns_pool(mempool_t p) const noexcept;
  Device* device_of(std::uint64_t addr) const noexcept;
  std::byte* translate_locked(std::uint64_t addr, std::uint64_t bytes) const noexcept;

  void join_host_locked(Stream& s);
  OpRef begin_op_locked(Stream& s, OpKind k, Access a, std::uint32_t label = 0);
  OpRef host_op_locked(OpKind k);
  void publish_locked(const VectorClock& vc);
  void push_locked(Stream& s, Op op);
  void check_locked(const OpRef& op, const VectorClock& vc, std::uint64_t addr, std::uint64_t n);
  void record_locked();
  result<void> enqueue_simple_locked(Call c, stream_t s, Op op, Access a,
                                     std::span<const SimAccess> checks);
  result<void> enqueue_transfer_locked(Call c, stream_t s, Op op, Access a,
                                       std::span<const SimAccess> checks);
  void enqueue_on_locked(Stream& st, Op op, Access a, std::span<const SimAccess> checks,
                         std::uint32_t label = 0);
  void free_async_locked(Stream& st, Device& dev, detail::sim::DeviceMemory::Blocks::iterator it);

  using Capture = detail::sim::Capture;
  result<void> capture_op_locked(Call c, Stream& st, Op op, Access a,
                                 std::span<const SimAccess> checks, std::uint32_t label = 0);
  void record_node_locked(Stream& st, detail::sim::Node n);
  error invalidated_error(Call c, const Stream& st) const;
  void invalidate_locked(Capture& cap, int status);
  std::optional<error> unsafe_call_locked(Call c, std::string_view what);
  Capture* find_capture_locked(std::uint64_t id) const noexcept;
  void end_capture_locked(Capture& cap);
  void release_graph_locked(detail::sim::GraphData& g);
  void replay_locked(Stream& st, const detail::sim::GraphData& g);

  error oom_locked(Call c, const Device& dev, std::uint64_t bytes) const;

  bool propagate_faults_locked();
  Stream* pick_locked(const Needed* needed, bool& changed);
  void run_head_locked(Stream& s, Lock& lk);
  int execute_locked(Stream& s, Op& op, Lock& lk);
  result<void> wait_locked(Call c, std::span<const Target> targets, Lock& lk);
  result<void> sync_device_locked(Call c, Device& dev, Lock& lk);
  void reset_device_locked(Device& dev, Lock& lk);
  bool idle_locked() const noexcept;
  void worker() noexcept;

  // mu_ guards every member below, the components (host_, sched_, checker_, faults_,
  // each device's memory) included, except what the constructor sets and nothing
  // changes afterwards: cfg_, serial_, memory_bytes_, stride_, init_error_, the
  // reservation_ mapping, and workers_ (joined by the destructor).
  SimConfig cfg_;
  std::uint64_t serial_;
  std::uint64_t memory_bytes_ = 0;  // per device, rounded
  std::uint64_t stride_ = 0;        // device windows' spacing in the reservation
  std::optional<error> init_error_;
  detail::sim::Mapping reservation_;
  detail::sim::HostWindow host_;  // mapped host memory, above the device windows
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Stream>> streams_;  // index = stream id; [0] is the host
  std::uint64_t next_reused_id_ = std::uint64_t{1} << 32;  // stream_get_id of a reused handle
  std::vector<std::unique_ptr<Event>> events_;
  detail::sim::Scheduler sched_;
  VectorClock host_vc_;
  std::uint64_t host_seq_ = 0;
  std::uint64_t host_version_ = 1;
  std::uint64_t next_free_id_ = 1;
  std::uint64_t executed_ = 0;
  std::size_t busy_ = 0;
  detail::sim::HazardChecker checker_;
  detail::sim::FaultInjector faults_;
  std::vector<std::unique_ptr<Capture>> captures_;  // begun and not ended
  std::vector<std::unique_ptr<detail::sim::Graph>> graphs_;     // handles stay valid
  std::vector<std::unique_ptr<detail::sim::GraphExec>> graph_execs_;
  SimCaptureStats capture_stats_;
  bool stop_ = false;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
};

static_assert(Driver<SimDriver>);
static_assert(CapturingDriver<SimDriver>);

// --- memory bookkeeping ----------------------------------------------------------------------

inline error SimDriver::oom_locked(Call c, const Device& dev, std::uint64_t bytes) const {
  return fail(c, status::out_of_memory,
              "allocating " + std::to_string(bytes) + " bytes on simulated device " +
                  std::to_string(dev.ordinal) + " (" + std::to_string(memory_bytes_) + " bytes, " +
                  std::to_string(dev.mem.allocated) + " allocated, " + std::to_string(dev.mem.pending) +
                  " held by frees that have not run yet)");
}

// --- Driver concept: devices and contexts -------------------------------------------------

inline result<int> SimDriver::device_count() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_count)) return *e;
  return static_cast<int>(devices_.size());
}

inline result<SimDriver::device_t> SimDriver::device_get(int ordinal) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_get)) return *e;
  auto d = device_locked(Call::device_get, ordinal);
  if (!d) return std::move(d).error();
  return ordinal;
}

inline result<std::string> SimDriver::device_name(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_name)) return *e;
  auto d = device_locked(Call::device_name, dev);
  if (!d) return std::move(d).error();
  return "xlogrt SimDriver device " + std::to_string(dev);
}

inline result<std::size_t> SimDriver::device_total_mem(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_total_mem)) return *e;
  auto d = device_locked(Call::device_total_mem, dev);
  if (!d) return std::move(d).error();
  return static_cast<std::size_t>(memory_bytes_);
}

inline result<int> SimDriver::device_attribute(device_t dev, DeviceAttr attr) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_attribute)) return *e;
  auto d = device_locked(Call::device_attribute, dev);
  if (!d) return std::move(d).error();
  switch (attr) {
    case DeviceAttr::memory_pools_supported: return cfg_.memory_pools_supported ? 1 : 0;
    case DeviceAttr::stream_mem_ops_supported: return cfg_.stream_mem_ops_supported ? 1 : 0;
    case DeviceAttr::can_map_host_memory: return cfg_.can_map_host_memory ? 1 : 0;
    case DeviceAttr::compute_capability_major: return cfg_.compute_capability_major;
    case DeviceAttr::compute_capability_minor: return cfg_.compute_capability_minor;
    case DeviceAttr::multiprocessor_count: return cfg_.multiprocessor_count;
  }
  // The caller's mistake, not a driver status: refused as CudaDriver refuses it.
  return error{errc::invalid_argument,
               "device_attribute: DeviceAttr value " + std::to_string(static_cast<int>(attr)) +
                   " is not one SimDriver knows; pass a named DeviceAttr"};
}

inline result<SimDriver::context_t> SimDriver::primary_ctx_retain(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::primary_ctx_retain)) return *e;
  auto d = device_locked(Call::primary_ctx_retain, dev);
  if (!d) return std::move(d).error();
  ++(*d)->ctx.retains;
  return &(*d)->ctx;
}

inline result<void> SimDriver::primary_ctx_release(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::primary_ctx_release)) return *e;
  auto d = device_locked(Call::primary_ctx_release, dev);
  if (!d) return std::move(d).error();
  Device& device = **d;
  if (device.ctx.retains == 0) {
    return fail(Call::primary_ctx_release, status::invalid_context,
                "releasing the primary context of device " + std::to_string(dev) +
                    " more often than it was retained");
  }
  if (--device.ctx.retains == 0) reset_device_locked(device, lk);
  return ok();
}

inline result<void> SimDriver::ctx_make_current(context_t ctx) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::ctx_make_current)) return *e;
  detail::sim::Current& cur = detail::sim::current();
  if (ctx == nullptr) {
    if (cur.driver == serial_) cur = detail::sim::Current{};
    return ok();
  }
  bool ours = false;
  for (const auto& d : devices_) ours = ours || &d->ctx == ctx;
  if (!ours) {
    return fail(Call::ctx_make_current, status::invalid_context,
                "making current a context that is not a primary context of this simulator");
  }
  if (ctx->retains == 0) {
    return fail(Call::ctx_make_current, status::invalid_context,
                "making current the primary context of device " +
                    std::to_string(ctx->device->ordinal) + ", which is not retained");
  }
  cur = detail::sim::Current{serial_, ctx, ctx->generation};
  return ok();
}

inline result<MemInfo> SimDriver::mem_get_info() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mem_get_info)) return *e;
  auto d = current_device_locked(Call::mem_get_info);
  if (!d) return std::move(d).error();
  const Device& dev = **d;
  return MemInfo{static_cast<std::size_t>(memory_bytes_ - dev.mem.allocated - dev.mem.pending -
                                          dev.mem.graph_reserved),
                 static_cast<std::size_t>(memory_bytes_)};
}

// --- Driver concept: streams and events -----------------------------------------------------

inline result<SimDriver::stream_t> SimDriver::stream_create() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_create)) return *e;
  auto d = current_device_locked(Call::stream_create);
  if (!d) return std::move(d).error();
  if (cfg_.reuse_stream_handles) {
    for (auto it = streams_.rbegin(); it != streams_.rend(); ++it) {
      if (*it == nullptr) continue;  // the host's entry
      Stream& old = **it;
      if (old.alive || old.legacy || old.device != *d || old.busy || old.fault != 0 || !old.queue.empty() ||
          old.completed < old.enqueued) {
        continue;
      }
      old.alive = true;
      old.api_id = next_reused_id_++;
      old.generation = (*d)->ctx.generation;
      return &old;
    }
  }
  auto s = std::make_unique<Stream>();
  s->owner = this;
  s->device = *d;
  s->id = static_cast<std::uint32_t>(streams_.size());
  s->api_id = s->id;
  s->generation = (*d)->ctx.generation;
  Stream* raw = s.get();
  streams_.push_back(std::move(s));
  return raw;
}

inline result<void> SimDriver::stream_destroy(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_destroy)) return *e;
  if (s == nullptr) {
    return fail(Call::stream_destroy, status::invalid_handle,
                "destroying the legacy default stream");
  }
  auto sr = stream_locked(Call::stream_destroy, s);
  if (!sr) return std::move(sr).error();
  (*sr)->alive = false;  // queued work still runs, as in CUDA
  return ok();
}

inline result<void> SimDriver::stream_synchronize(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_synchronize)) return *e;
  auto sr = stream_locked(Call::stream_synchronize, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture != nullptr) [[unlikely]] {
    invalidate_locked(*st.capture, status::stream_capture_unsupported);
    return fail(Call::stream_synchronize, status::stream_capture_unsupported,
                "synchronising stream " + std::to_string(st.id) + ", which is capturing (capture " +
                    std::to_string(st.capture->id) + ", now invalidated); synchronise after stream_end_capture");
  }
  if (st.legacy && !captures_.empty()) [[unlikely]] {
    if (auto e = unsafe_call_locked(Call::stream_synchronize, "synchronising the legacy default stream"))
      return *e;
  }
  if (st.fault != 0) return fault_error(Call::stream_synchronize, st);
  const VectorClock seen = st.vc;
  const Target t{&st, st.enqueued};
  auto r = wait_locked(Call::stream_synchronize, std::span<const Target>(&t, 1), lk);
  if (!r) return r;
  publish_locked(seen);
  return ok();
}

inline result<bool> SimDriver::stream_query(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_query)) return *e;
  auto sr = stream_locked(Call::stream_query, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture != nullptr) [[unlikely]] {
    invalidate_locked(*st.capture, status::stream_capture_unsupported);
    return fail(Call::stream_query, status::stream_capture_unsupported,
                "querying stream " + std::to_string(st.id) + ", which is capturing (capture " +
                    std::to_string(st.capture->id) + ", now invalidated); query after stream_end_capture");
  }
  if (st.legacy && !captures_.empty()) [[unlikely]] {
    if (auto e = unsafe_call_locked(Call::stream_query, "querying the legacy default stream")) return *e;
  }
  if (st.fault != 0) return fault_error(Call::stream_query, st);
  if (st.completed < st.enqueued) return false;
  publish_locked(st.vc);
  return true;
}

inline result<std::uint64_t> SimDriver::stream_get_id(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_get_id)) return *e;
  auto sr = stream_locked(Call::stream_get_id, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture != nullptr) [[unlikely]] {  // as CUDA 13's driver does (seen on an H200)
    invalidate_locked(*st.capture, status::stream_capture_unsupported);
    return fail(Call::stream_get_id, status::stream_capture_unsupported,
                "reading the id of stream " + std::to_string(st.id) + ", which is capturing (capture " +
                    std::to_string(st.capture->id) + ", now invalidated); read it before the capture begins");
  }
  return st.api_id;
}

inline result<SimDriver::context_t> SimDriver::stream_context(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_get_id)) return *e;
  auto sr = stream_locked(Call::stream_get_id, s);
  if (!sr) return std::move(sr).error();
  return &(*sr)->device->ctx;
}

inline result<void> SimDriver::stream_wait_event(stream_t s, event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::stream_wait_event)) return *x;
  auto sr = stream_locked(Call::stream_wait_event, s);
  if (!sr) return std::move(sr).error();
  auto er = event_locked(Call::stream_wait_event, e);
  if (!er) return std::move(er).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(Call::stream_wait_event, st);
  const Event& ev = **er;
  if (ev.capture_id != 0 || st.capture != nullptr) [[unlikely]] {
    constexpr Call c = Call::stream_wait_event;
    Capture* from = ev.capture_id != 0 ? find_capture_locked(ev.capture_id) : nullptr;
    const std::string who = "stream " + std::to_string(st.id) + " waiting on an event ";
    if (st.capture != nullptr && st.capture->invalidated != 0) return invalidated_error(c, st);
    if (ev.capture_id == 0) {  // a capturing stream, an event recorded outside any capture
      if (ev.stream == nullptr) return ok();  // never recorded: nothing to wait for
      invalidate_locked(*st.capture, status::stream_capture_isolation);
      return fail(c, status::stream_capture_isolation,
                  who + "recorded outside its capture " + std::to_string(st.capture->id) +
                      " (now invalidated); record the event before the capture begins and wait "
                      "on it then, or record it inside the capture");
    }
    if (from == nullptr) {
      return fail(c, status::captured_event,
                  who + "last recorded in capture " + std::to_string(ev.capture_id) +
                      ", which has ended; record it again outside a capture");
    }
    if (st.capture == nullptr) {  // fork: the stream joins the capture
      if (from->invalidated != 0) {
        return fail(c, status::invalid_value,
                    who + "recorded in capture " + std::to_string(from->id) +
                        ", which was invalidated; end that capture");
      }
      st.capture = from;
      st.capture_vc = ev.capture_vc;
      from->members.push_back(&st);
      return ok();
    }
    if (st.capture != from) {
      invalidate_locked(*st.capture, status::stream_capture_merge);
      invalidate_locked(*from, status::stream_capture_merge);
      return fail(c, status::stream_capture_merge,
                  who + "recorded in capture " + std::to_string(from->id) + " while in capture " +
                      std::to_string(st.capture->id) + ": the two are now invalidated");
    }
    st.capture_vc.join(ev.capture_vc);  // a dependency inside the capture
    return ok();
  }
  if (ev.stream == nullptr) return ok();  // never recorded: nothing to wait for
  st.vc.join(ev.vc);
  if (ev.stream->completed >= ev.seq) return ok();
  OpRef ref = begin_op_locked(st, OpKind::stream_wait_event, Access::Read);
  Op op;
  op.kind = OpKind::stream_wait_event;
  op.seq = ref.seq;
  op.wait_stream = ev.stream;
  op.wait_seq = ev.seq;
  push_locked(st, std::move(op));
  return ok();
}

inline result<SimDriver::event_t> SimDriver::event_create() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::event_create)) return *e;
  auto d = current_device_locked(Call::event_create);
  if (!d) return std::move(d).error();
  auto ev = std::make_unique<Event>();
  ev->owner = this;
  ev->device = *d;
  ev->generation = (*d)->ctx.generation;
  Event* raw = ev.get();
  events_.push_back(std::move(ev));
  return raw;
}

inline result<void> SimDriver::event_destroy(event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_destroy)) return *x;
  auto er = event_locked(Call::event_destroy, e);
  if (!er) return std::move(er).error();
  (*er)->alive = false;  // a queued record still runs, and waits on it still hold
  return ok();
}

inline result<void> SimDriver::event_record(event_t e, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_record)) return *x;
  auto er = event_locked(Call::event_record, e);
  if (!er) return std::move(er).error();
  auto sr = stream_locked(Call::event_record, s);
  if (!sr) return std::move(sr).error();
  Event& ev = **er;
  Stream& st = **sr;
  if (ev.device != st.device) {
    return fail(Call::event_record, status::invalid_handle,
                "recording an event of device " + std::to_string(ev.device->ordinal) +
                    " on a stream of device " + std::to_string(st.device->ordinal));
  }
  if (st.fault != 0) return fault_error(Call::event_record, st);
  if (st.capture != nullptr) [[unlikely]] {  // marks a point of the capture, not of the stream
    if (st.capture->invalidated != 0) return invalidated_error(Call::event_record, st);
    ev.stream = nullptr;
    ev.seq = 0;
    ev.vc = VectorClock{};
    ev.capture_id = st.capture->id;
    ev.capture_vc = st.capture_vc;
    return ok();
  }
  ev.capture_id = 0;
  OpRef ref = begin_op_locked(st, OpKind::event_record, Access::Read);
  ev.stream = &st;
  ev.seq = ref.seq;
  ev.vc = st.vc;
  Op op;
  op.kind = OpKind::event_record;
  op.seq = ref.seq;
  push_locked(st, std::move(op));
  return ok();
}

inline result<bool> SimDriver::event_query(event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_query)) return *x;
  auto er = event_locked(Call::event_query, e);
  if (!er) return std::move(er).error();
  const Event& ev = **er;
  if (ev.capture_id != 0) [[unlikely]] {
    if (Capture* cap = find_capture_locked(ev.capture_id)) {
      invalidate_locked(*cap, status::captured_event);
    }
    return fail(Call::event_query, status::captured_event,
                "querying an event last recorded in capture " + std::to_string(ev.capture_id) +
                    "; the host cannot wait for a point of a graph: record the event on a stream "
                    "outside the capture");
  }
  if (ev.stream == nullptr) return true;
  if (ev.stream->completed >= ev.seq) {
    publish_locked(ev.vc);
    return true;
  }
  if (ev.stream->fault != 0) return fault_error(Call::event_query, *ev.stream);
  return false;
}

inline result<void> SimDriver::event_synchronize(event_t e) noexcept {
  Lock lk(mu_);
  if (auto x = enter_locked(Call::event_synchronize)) return *x;
  auto er = event_locked(Call::event_synchronize, e);
  if (!er) return std::move(er).error();
  const Event& ev = **er;
  if (ev.capture_id != 0) [[unlikely]] {
    if (Capture* cap = find_capture_locked(ev.capture_id)) {
      invalidate_locked(*cap, status::captured_event);
    }
    return fail(Call::event_synchronize, status::captured_event,
                "synchronising an event last recorded in capture " +
                    std::to_string(ev.capture_id) +
                    "; the host cannot wait for a point of a graph: record the event on a stream "
                    "outside the capture");
  }
  if (ev.stream == nullptr) return ok();
  const VectorClock seen = ev.vc;
  const Target t{ev.stream, ev.seq};
  auto r = wait_locked(Call::event_synchronize, std::span<const Target>(&t, 1), lk);
  if (!r) return r;
  publish_locked(seen);
  return ok();
}

// --- Driver concept: memory --------------------------------------------------------------------

inline result<SimDriver::mempool_t> SimDriver::device_default_mempool(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_default_mempool)) return *e;
  auto d = device_locked(Call::device_default_mempool, dev);
  if (!d) return std::move(d).error();
  if (!cfg_.memory_pools_supported) {
    return fail(Call::device_default_mempool, status::not_supported,
                "getting the memory pool of device " + std::to_string(dev) +
                    ": the simulator was configured without memory pools");
  }
  return &(*d)->pool;
}

inline result<SimDriver::mempool_t> SimDriver::mempool_create(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mempool_create)) return *e;
  auto d = device_locked(Call::mempool_create, dev);
  if (!d) return std::move(d).error();
  if (!cfg_.memory_pools_supported) {
    return fail(Call::mempool_create, status::not_supported,
                "creating a memory pool on device " + std::to_string(dev) +
                    ": the simulator was configured without memory pools");
  }
  try {
    detail::sim::Pool& p = (*d)->created_pools.emplace_back();
    p.device = *d;
    return &p;
  } catch (...) {
    return fail(Call::mempool_create, status::out_of_memory, "no host memory for another simulated pool");
  }
}

inline result<void> SimDriver::mempool_destroy(mempool_t pool) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mempool_destroy)) return *e;
  if (!owns_pool(pool) || pool == &pool->device->pool) {
    return fail(Call::mempool_destroy, status::invalid_value,
                "destroying a pool that is not a created pool of this simulator");
  }
  pool->destroyed = true;
  return ok();
}

inline result<void> SimDriver::mempool_set_release_threshold(mempool_t pool,
                                                             std::uint64_t bytes) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mempool_set_release_threshold)) return *e;
  if (!owns_pool(pool)) {
    return fail(Call::mempool_set_release_threshold, status::invalid_value,
                "setting the release threshold of a pool that is not a pool of this simulator");
  }
  pool->release_threshold = bytes;
  return ok();
}

inline result<std::uint64_t> SimDriver::mem_alloc_async(std::size_t bytes, mempool_t pool,
                                                        stream_t s) noexcept {
  constexpr Call c = Call::mem_alloc_async;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (!cfg_.memory_pools_supported) {
    return fail(c, status::not_supported,
                "allocating " + std::to_string(bytes) +
                    " bytes: the simulator was configured without memory pools");
  }
  if (!owns_pool(pool)) {
    return fail(c, status::invalid_value,
                "allocating from a pool that is not a pool of this simulator");
  }
  if (bytes == 0) return fail(c, status::invalid_value, "allocating 0 bytes");
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  Device& dev = *pool->device;
  if (bytes > memory_bytes_) return oom_locked(c, dev, bytes);
  const std::uint64_t need = round_up(bytes, alloc_granularity);
  if (st.capture != nullptr) [[unlikely]] {  // a graph allocation node
    Capture& cap = *st.capture;
    if (cap.invalidated != 0) return invalidated_error(c, st);
    auto off = dev.mem.reserve(need);
    if (!off) return oom_locked(c, dev, bytes);
    const std::uint64_t addr = dev.mem.base + *off;
    cap.data->allocs.push_back(
        detail::sim::GraphAlloc{&dev, dev.ctx.generation, addr, bytes, need, false});
    detail::sim::Node n;
    n.kind = OpKind::mem_alloc_async;
    n.access = Access::Write;
    n.dst = addr;
    n.bytes = need;
    n.alloc = static_cast<int>(cap.data->allocs.size() - 1);
    record_node_locked(st, std::move(n));
    ++capture_stats_.graph_alloc_nodes;
    return addr;
  }
  join_host_locked(st);
  auto off = dev.mem.allocate(need, st.vc);
  if (!off) return oom_locked(c, dev, bytes);
  const OpRef ref = begin_op_locked(st, OpKind::mem_alloc_async, Access::Write);
  const std::uint64_t addr = dev.mem.base + *off;
  dev.mem.add_block(addr, bytes, need, true);
  if (cfg_.check_hazards) checker_.allocate(addr, bytes, ref);
  Op op;
  op.kind = OpKind::mem_alloc_async;
  op.seq = ref.seq;
  op.dst = addr;
  op.bytes = need;
  push_locked(st, std::move(op));
  return addr;
}

inline result<void> SimDriver::mem_free_async(std::uint64_t ptr, stream_t s) noexcept {
  constexpr Call c = Call::mem_free_async;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  if (st.capture != nullptr) [[unlikely]] {  // a graph free node of this capture's allocation?
    Capture& cap = *st.capture;
    if (cap.invalidated != 0) return invalidated_error(c, st);
    auto& allocs = cap.data->allocs;
    for (std::size_t i = 0; i < allocs.size(); ++i) {
      if (allocs[i].addr != ptr || allocs[i].freed_in_graph) continue;
      allocs[i].freed_in_graph = true;
      detail::sim::Node n;
      n.kind = OpKind::mem_free_async;
      n.access = Access::Write;
      n.dst = ptr;
      n.bytes = allocs[i].rounded;
      n.alloc = static_cast<int>(i);
      record_node_locked(st, std::move(n));
      ++capture_stats_.graph_free_nodes;
      return ok();
    }
  }
  Device* dev = device_of(ptr);
  if (dev == nullptr) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) + ": not a simulated device address");
  }
  auto it = dev->mem.blocks.find(ptr);
  if (it == dev->mem.blocks.end()) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) + " on device " + std::to_string(dev->ordinal) +
                    ": not the start of a live allocation (freed already, or never allocated)");
  }
  if (!it->second.pooled) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    " with mem_free_async: it was allocated by mem_alloc; free it with mem_free");
  }
  if (st.capture != nullptr) [[unlikely]] {
    // Memory allocated outside the capture: the node frees it at every launch.
    for (const detail::sim::Node& n : st.capture->data->nodes) {
      if (n.kind == OpKind::mem_free_async && n.alloc < 0 && n.dst == ptr) {
        return fail(c, status::invalid_value,
                    "freeing " + detail::sim::hex(ptr) + " twice in capture " +
                        std::to_string(st.capture->id));
      }
    }
    detail::sim::Node n;
    n.kind = OpKind::mem_free_async;
    n.access = Access::Write;
    n.dst = ptr;
    n.bytes = it->second.rounded;
    record_node_locked(st, std::move(n));
    ++capture_stats_.graph_free_nodes;
    ++capture_stats_.graph_frees_of_outside_memory;
    return ok();
  }
  free_async_locked(st, *dev, it);
  return ok();
}

// Enqueues the free of the live pooled block `it` of `dev` on `st`. A graph allocation's
// block leaves the live set, and its range stays the graph's.
inline void SimDriver::free_async_locked(Stream& st, Device& dev,
                                         detail::sim::DeviceMemory::Blocks::iterator it) {
  const std::uint64_t ptr = it->first;
  const detail::sim::Block b = it->second;
  const OpRef ref = begin_op_locked(st, OpKind::mem_free_async, Access::Write);
  if (cfg_.check_hazards) {
    checker_.free(ptr, b.requested, ref, st.vc);
    record_locked();
  }
  std::uint64_t id = 0;  // names no recycled range
  if (b.graph) {
    dev.mem.blocks.erase(it);
  } else {
    id = next_free_id_++;
    dev.mem.free_enqueued(it, ref, id);
  }
  Op op;
  op.kind = OpKind::mem_free_async;
  op.seq = ref.seq;
  op.dst = ptr;
  op.bytes = b.rounded;
  op.free_id = id;
  push_locked(st, std::move(op));
}

inline result<std::uint64_t> SimDriver::mem_alloc(std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_alloc;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "allocating device memory synchronously")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  Device& dev = **d;
  if (bytes == 0) return fail(c, status::invalid_value, "allocating 0 bytes");
  if (bytes > memory_bytes_) return oom_locked(c, dev, bytes);
  const std::uint64_t need = round_up(bytes, alloc_granularity);
  auto off = dev.mem.allocate(need, host_vc_);
  if (!off) return oom_locked(c, dev, bytes);
  const OpRef ref = host_op_locked(OpKind::mem_alloc);
  const std::uint64_t addr = dev.mem.base + *off;
  dev.mem.add_block(addr, bytes, need, false);
  if (cfg_.fill_memory) std::memset(translate_locked(addr, need), cfg_.uninit_byte, need);
  if (cfg_.check_hazards) checker_.allocate(addr, bytes, ref);
  return addr;
}

inline result<void> SimDriver::mem_free(std::uint64_t ptr) noexcept {
  constexpr Call c = Call::mem_free;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "freeing device memory synchronously")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  Device* dev = device_of(ptr);
  auto missing = [&] {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    ": not the start of a live allocation of this simulator (freed already, or "
                    "never allocated)");
  };
  if (dev == nullptr || dev->mem.blocks.find(ptr) == dev->mem.blocks.end()) return missing();
  if (dev->mem.blocks.find(ptr)->second.graph) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    " with mem_free: it was allocated by a graph launch; free it with "
                    "mem_free_async");
  }
  auto synced = sync_device_locked(c, *dev, lk);
  if (!synced) return synced;
  auto it = dev->mem.blocks.find(ptr);  // the lock was released while draining
  if (it == dev->mem.blocks.end()) return missing();
  const detail::sim::Block b = it->second;
  const OpRef ref = host_op_locked(OpKind::mem_free);
  if (cfg_.check_hazards) {
    checker_.free(ptr, b.requested, ref, host_vc_);
    record_locked();
  }
  if (cfg_.fill_memory) std::memset(translate_locked(ptr, b.rounded), cfg_.poison_byte, b.rounded);
  dev->mem.free_now(it, ref, next_free_id_++);
  dev->mem.trim_quarantine(cfg_.quarantine_bytes, cfg_.quarantine_blocks);
  return ok();
}

inline result<void*> SimDriver::mem_host_alloc_mapped(std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_host_alloc_mapped;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "allocating mapped host memory")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  if (!cfg_.can_map_host_memory) {
    return fail(c, status::not_supported,
                "allocating mapped host memory: the simulator was configured without it");
  }
  if (bytes == 0) return fail(c, status::invalid_value, "allocating 0 bytes of mapped host memory");
  auto nomem = [&] {
    return fail(c, status::out_of_memory,
                "allocating " + std::to_string(bytes) + " bytes of mapped host memory (" +
                    std::to_string(host_.free_bytes()) + " bytes of the mapped window free)");
  };
  if (bytes > host_.size()) return nomem();
  void* host = host_.allocate(bytes, round_up(bytes, alloc_granularity), cfg_.uninit_byte);
  if (host == nullptr) return nomem();
  return host;
}

inline result<std::uint64_t> SimDriver::mem_host_device_pointer(void* host) noexcept {
  constexpr Call c = Call::mem_host_device_pointer;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  const auto h = reinterpret_cast<std::uintptr_t>(host);
  if (auto addr = host_.device_pointer(h)) return *addr;
  return fail(c, status::invalid_value,
              "translating host pointer " + detail::sim::hex(h) +
                  ": it is not inside memory from mem_host_alloc_mapped");
}

inline result<void> SimDriver::mem_host_free(void* host) noexcept {
  constexpr Call c = Call::mem_host_free;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "freeing mapped host memory")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  if (!host_.free(host)) {
    return fail(c, status::invalid_value,
                "freeing host pointer " + detail::sim::hex(reinterpret_cast<std::uintptr_t>(host)) +
                    ": not the start of memory from mem_host_alloc_mapped (freed already?)");
  }
  return ok();
}

// --- Driver concept: stream-ordered data movement --------------------------------------------

inline result<void> SimDriver::memset_d8_async(std::uint64_t dst, std::uint8_t value,
                                               std::size_t bytes, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memset_d8_async)) return *e;
  Op op;
  op.kind = OpKind::memset;
  op.dst = dst;
  op.bytes = bytes;
  op.value = value;
  const SimAccess a{dst, bytes, Access::Write};
  return enqueue_transfer_locked(Call::memset_d8_async, s, std::move(op), Access::Write,
                                 std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::memcpy_htod_async(std::uint64_t dst, const void* src,
                                                 std::size_t bytes, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memcpy_htod_async)) return *e;
  if (bytes != 0 && src == nullptr) {
    return fail(Call::memcpy_htod_async, status::invalid_value, "copying from a null host pointer");
  }
  Op op;
  op.kind = OpKind::memcpy_htod;
  op.dst = dst;
  op.chost = src;
  op.bytes = bytes;
  const SimAccess a{dst, bytes, Access::Write};
  return enqueue_transfer_locked(Call::memcpy_htod_async, s, std::move(op), Access::Write,
                                 std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::memcpy_dtoh_async(void* dst, std::uint64_t src, std::size_t bytes,
                                                 stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memcpy_dtoh_async)) return *e;
  if (bytes != 0 && dst == nullptr) {
    return fail(Call::memcpy_dtoh_async, status::invalid_value, "copying to a null host pointer");
  }
  Op op;
  op.kind = OpKind::memcpy_dtoh;
  op.src = src;
  op.host = dst;
  op.bytes = bytes;
  const SimAccess a{src, bytes, Access::Read};
  return enqueue_transfer_locked(Call::memcpy_dtoh_async, s, std::move(op), Access::Read,
                                 std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::memcpy_dtod_async(std::uint64_t dst, std::uint64_t src,
                                                 std::size_t bytes, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memcpy_dtod_async)) return *e;
  Op op;
  op.kind = OpKind::memcpy_dtod;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  const SimAccess a[2] = {{src, bytes, Access::Read}, {dst, bytes, Access::Write}};
  return enqueue_transfer_locked(Call::memcpy_dtod_async, s, std::move(op), Access::ReadWrite,
                                 std::span<const SimAccess>(a, 2));
}

inline result<void> SimDriver::stream_write_value32(stream_t s, std::uint64_t dst,
                                                    std::uint32_t value) noexcept {
  constexpr Call c = Call::stream_write_value32;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (!cfg_.stream_mem_ops_supported) {
    return fail(c, status::not_supported,
                "writing a flag: the simulator was configured without stream memory operations");
  }
  if (dst % 4 != 0) {
    return fail(c, status::invalid_value,
                "writing 4 bytes at " + detail::sim::hex(dst) + ": not 4-byte aligned");
  }
  Op op;
  op.kind = OpKind::write_value32;
  op.dst = dst;
  op.value = value;
  const SimAccess a{dst, 4, Access::Write};
  return enqueue_simple_locked(c, s, std::move(op), Access::Write,
                               std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::launch_host_func(stream_t s, HostFn fn, void* arg) noexcept {
  constexpr Call c = Call::launch_host_func;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (fn == nullptr) return fail(c, status::invalid_value, "launching a null host function");
  Op op;
  op.kind = OpKind::host_func;
  op.fn = fn;
  op.host = arg;
  return enqueue_simple_locked(c, s, std::move(op), Access::Read, {});
}

inline result<void> SimDriver::launch_kernel(stream_t s, std::span<const SimAccess> accesses,
                                             SimKernelBody body, std::string_view label) noexcept {
  constexpr Call c = Call::launch_kernel;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  const std::uint32_t id = checker_.intern(label);
  auto k = std::make_unique<detail::sim::Kernel>();
  k->ptrs.reserve(accesses.size());
  k->bytes.reserve(accesses.size());
  for (const SimAccess& a : accesses) {
    k->ptrs.push_back(a.ptr);
    k->bytes.push_back(a.bytes);
  }
  k->body = std::move(body);
  Op op;
  op.kind = OpKind::kernel;
  op.kernel = std::move(k);
  if (st.capture != nullptr) [[unlikely]] {
    return capture_op_locked(c, st, std::move(op), Access::ReadWrite, accesses, id);
  }
  enqueue_on_locked(st, std::move(op), Access::ReadWrite, accesses, id);
  return ok();
}

// --- stream capture: bookkeeping ----------------------------------------------------------

// Records a validated operation on a capturing stream as a node of its capture.
inline result<void> SimDriver::capture_op_locked(Call c, Stream& st, Op op, Access a,
                                                 std::span<const SimAccess> checks,
                                                 std::uint32_t label) {
  if (st.capture->invalidated != 0) return invalidated_error(c, st);
  detail::sim::Node n;
  n.kind = op.kind;
  n.access = a;
  n.label = label;
  n.value = op.value;
  n.dst = op.dst;
  n.src = op.src;
  n.bytes = op.bytes;
  n.host = op.host;
  n.chost = op.chost;
  n.fn = op.fn;
  n.kernel = std::move(op.kernel);
  n.checks.assign(checks.begin(), checks.end());
  record_node_locked(st, std::move(n));
  return ok();
}

// Appends `n` to the capture of `st`, one more node of `st` on its capture clock.
inline void SimDriver::record_node_locked(Stream& st, detail::sim::Node n) {
  st.capture->data->nodes.push_back(std::move(n));
  st.capture_vc.set(st.id, st.capture_vc.get(st.id) + 1);
}

inline error SimDriver::invalidated_error(Call c, const Stream& st) const {
  return fail(c, status::stream_capture_invalidated,
              "using stream " + std::to_string(st.id) + ", whose capture " +
                  std::to_string(st.capture->id) + " was invalidated by an earlier " +
                  status_name(st.capture->invalidated) +
                  "; end it with stream_end_capture and capture again");
}

inline void SimDriver::invalidate_locked(Capture& cap, int s) {
  if (cap.invalidated != 0) return;  // the first reason stands
  cap.invalidated = s;
  ++capture_stats_.captures_invalidated;
}

// A potentially unsafe call (cuThreadExchangeStreamCaptureMode's term): refused, with
// every capture that forbids it invalidated, when the calling thread's mode is global
// and a global-mode capture is underway on any thread, or its mode is not relaxed and a
// capture not begun in relaxed mode is underway on this thread.
inline std::optional<error> SimDriver::unsafe_call_locked(Call c, std::string_view what) {
  if (captures_.empty()) [[likely]] return std::nullopt;
  const CaptureMode mine = detail::sim::thread_capture_mode(serial_);
  if (mine == CaptureMode::relaxed) return std::nullopt;
  const std::thread::id me = std::this_thread::get_id();
  std::string which;
  for (const auto& cp : captures_) {
    Capture& cap = *cp;
    const bool own = cap.thread == me && cap.mode != CaptureMode::relaxed;
    const bool global = mine == CaptureMode::global && cap.mode == CaptureMode::global;
    if (!own && !global) continue;
    invalidate_locked(cap, status::stream_capture_unsupported);
    if (!which.empty()) which += ", ";
    which += std::to_string(cap.id) + (own ? " (this thread's)" : " (another thread's, global)");
  }
  if (which.empty()) return std::nullopt;
  return fail(c, status::stream_capture_unsupported,
              std::string(what) + " during capture " + which + ", which the calling thread's " +
                  std::string(detail::sim::to_string(mine)) +
                  " capture mode forbids (the capture is invalidated); make the call before or "
                  "after the capture, or between exchange_capture_mode(CaptureMode::relaxed) and "
                  "the restoring exchange");
}

inline SimDriver::Capture* SimDriver::find_capture_locked(std::uint64_t id) const noexcept {
  for (const auto& cp : captures_) {
    if (cp->id == id) return cp.get();
  }
  return nullptr;
}

// Every member leaves the capture, which is forgotten (its events keep its id, so they
// stay unusable to the host until recorded again).
inline void SimDriver::end_capture_locked(Capture& cap) {
  for (Stream* m : cap.members) {
    m->capture = nullptr;
    m->capture_vc = VectorClock{};
  }
  for (auto it = captures_.begin(); it != captures_.end(); ++it) {
    if (it->get() == &cap) {
      captures_.erase(it);
      return;
    }
  }
}

// One holder of `g` is gone; with the last, its reservations go back. A graph
// allocation that is live from the last launch keeps its range as an ordinary block.
inline void SimDriver::release_graph_locked(detail::sim::GraphData& g) {
  if (g.holders > 0 && --g.holders > 0) return;
  for (detail::sim::GraphAlloc& a : g.allocs) {
    if (a.rounded == 0) continue;
    Device& dev = *a.device;
    if (dev.ctx.generation == a.generation) {  // else the reset freed everything already
      auto it = dev.mem.blocks.find(a.addr);
      if (it != dev.mem.blocks.end() && it->second.graph) {
        dev.mem.adopt_reserved(it);
      } else {
        dev.mem.release_reserved(a.addr - dev.mem.base, a.rounded);
      }
    }
    a.rounded = 0;
  }
}

// Enqueues the graph's nodes on `st`, in the order recorded, each checked there.
inline void SimDriver::replay_locked(Stream& st, const detail::sim::GraphData& g) {
  for (const detail::sim::Node& n : g.nodes) {
    if (n.kind == OpKind::mem_alloc_async) {
      const detail::sim::GraphAlloc& a = g.allocs[static_cast<std::size_t>(n.alloc)];
      const OpRef ref = begin_op_locked(st, OpKind::mem_alloc_async, Access::Write);
      if (cfg_.check_hazards) checker_.allocate(a.addr, a.requested, ref);
      if (!a.freed_in_graph) {
        a.device->mem.blocks.emplace(a.addr, detail::sim::Block{a.requested, a.rounded, true, true});
      }
      Op op;
      op.kind = OpKind::mem_alloc_async;
      op.seq = ref.seq;
      op.dst = a.addr;
      op.bytes = a.rounded;
      push_locked(st, std::move(op));
    } else if (n.kind == OpKind::mem_free_async && n.alloc >= 0) {
      const detail::sim::GraphAlloc& a = g.allocs[static_cast<std::size_t>(n.alloc)];
      const OpRef ref = begin_op_locked(st, OpKind::mem_free_async, Access::Write);
      if (cfg_.check_hazards) {
        checker_.free(a.addr, a.requested, ref, st.vc);
        record_locked();
      }
      Op op;
      op.kind = OpKind::mem_free_async;
      op.seq = ref.seq;
      op.dst = a.addr;
      op.bytes = a.rounded;
      push_locked(st, std::move(op));
    } else if (n.kind == OpKind::mem_free_async) {  // memory from outside, live (checked)
      Device& dev = *device_of(n.dst);
      free_async_locked(st, dev, dev.mem.blocks.find(n.dst));
      ++capture_stats_.replayed_frees_of_outside_memory;
    } else {
      Op op;
      op.kind = n.kind;
      op.dst = n.dst;
      op.src = n.src;
      op.bytes = n.bytes;
      op.value = n.value;
      op.host = n.host;
      op.chost = n.chost;
      op.fn = n.fn;
      if (n.kernel) op.kernel = std::make_unique<detail::sim::Kernel>(*n.kernel);
      enqueue_on_locked(st, std::move(op), n.access, n.checks, n.label);
    }
  }
}

// --- Driver concept: stream capture ----------------------------------------------------------

inline result<CaptureInfo> SimDriver::stream_capture_info(stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::stream_capture_info)) return *e;
  auto sr = stream_locked(Call::stream_capture_info, s);
  if (!sr) return std::move(sr).error();
  const Capture* cap = (*sr)->capture;
  if (cap == nullptr) return CaptureInfo{};
  return CaptureInfo{cap->invalidated != 0 ? CaptureStatus::invalidated : CaptureStatus::active,
                     cap->id};
}

inline result<CaptureMode> SimDriver::exchange_capture_mode(CaptureMode mode) noexcept {
  constexpr Call c = Call::exchange_capture_mode;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (mode != CaptureMode::global && mode != CaptureMode::per_thread &&
      mode != CaptureMode::relaxed) {
    return fail(c, status::invalid_value,
                "setting capture mode " + std::to_string(static_cast<int>(mode)) +
                    ": pass a named CaptureMode");
  }
  try {
    return detail::sim::exchange_thread_capture_mode(serial_, mode);
  } catch (...) {
    return fail(c, status::out_of_memory, "no host memory to keep the thread's capture mode");
  }
}

inline result<void> SimDriver::ctx_synchronize() noexcept {
  constexpr Call c = Call::ctx_synchronize;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "synchronising the context")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  return sync_device_locked(c, **d, lk);
}

// --- CapturingDriver concept ---------------------------------------------------------------------

inline result<void> SimDriver::stream_begin_capture(stream_t s, CaptureMode mode) noexcept {
  constexpr Call c = Call::stream_begin_capture;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.legacy) {
    return fail(c, status::stream_capture_unsupported,
                "beginning a capture on the legacy default stream; capture on a stream from "
                "stream_create");
  }
  if (mode != CaptureMode::global && mode != CaptureMode::per_thread &&
      mode != CaptureMode::relaxed) {
    return fail(c, status::invalid_value,
                "beginning a capture in mode " + std::to_string(static_cast<int>(mode)) +
                    ": pass a named CaptureMode");
  }
  if (st.capture != nullptr) {
    return fail(c, status::illegal_state,
                "beginning a capture on stream " + std::to_string(st.id) +
                    ", which is already capturing (capture " + std::to_string(st.capture->id) +
                    "); end that capture first");
  }
  if (st.fault != 0) return fault_error(c, st);
  auto cap = std::make_unique<Capture>();
  cap->id = detail::sim::next_capture_id();
  cap->mode = mode;
  cap->thread = std::this_thread::get_id();
  cap->origin = &st;
  cap->members.push_back(&st);
  st.capture = cap.get();
  st.capture_vc = VectorClock{};
  captures_.push_back(std::move(cap));
  ++capture_stats_.captures_begun;
  return ok();
}

inline result<SimDriver::graph_t> SimDriver::stream_end_capture(stream_t s) noexcept {
  constexpr Call c = Call::stream_end_capture;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.capture == nullptr) {
    return fail(c, status::illegal_state,
                "ending a capture on stream " + std::to_string(st.id) + ", which is not capturing");
  }
  Capture& cap = *st.capture;
  if (&st != cap.origin) {
    invalidate_locked(cap, status::stream_capture_unmatched);
    return fail(c, status::stream_capture_unmatched,
                "ending capture " + std::to_string(cap.id) + " on stream " + std::to_string(st.id) +
                    ", which joined it (it began on stream " + std::to_string(cap.origin->id) +
                    ", where it must end; it is now invalidated)");
  }
  if (cap.mode != CaptureMode::relaxed && cap.thread != std::this_thread::get_id()) {
    return fail(c, status::stream_capture_wrong_thread,
                "ending capture " + std::to_string(cap.id) + " on another thread than the one that "
                    "began it in " + std::string(detail::sim::to_string(cap.mode)) +
                    " mode; end it there, or begin it in relaxed mode");
  }
  int failed = cap.invalidated != 0 ? status::stream_capture_invalidated : 0;
  std::string why = failed != 0 ? "capture " + std::to_string(cap.id) + " was invalidated by " +
                                      status_name(cap.invalidated)
                                : std::string();
  if (failed == 0) {
    for (const Stream* m : cap.members) {
      if (cap.origin->capture_vc.get(m->id) >= m->capture_vc.get(m->id)) continue;
      failed = status::stream_capture_unjoined;
      why = "stream " + std::to_string(m->id) + " joined capture " + std::to_string(cap.id) +
            " and recorded work the origin stream " + std::to_string(cap.origin->id) +
            " never waited for; record an event on it after its work and make the origin wait "
            "on that event before the end";
      break;
    }
  }
  std::shared_ptr<detail::sim::GraphData> data = cap.data;
  end_capture_locked(cap);
  if (failed != 0) {
    release_graph_locked(*data);  // no holder: its reservations go back now
    ++capture_stats_.captures_failed;
    return fail(c, failed, why);
  }
  auto g = std::make_unique<detail::sim::Graph>();
  g->owner = this;
  g->data = std::move(data);
  g->data->holders = 1;
  graphs_.push_back(std::move(g));
  ++capture_stats_.captures_ended;
  return graphs_.back().get();
}

inline result<SimDriver::graph_exec_t> SimDriver::graph_instantiate(graph_t g) noexcept {
  constexpr Call c = Call::graph_instantiate;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (g == nullptr || g->owner != this || !g->alive) {
    return fail(c, status::invalid_value,
                "instantiating a graph that is not a live graph of this simulator");
  }
  auto x = std::make_unique<detail::sim::GraphExec>();
  x->owner = this;
  x->data = g->data;
  ++x->data->holders;
  graph_execs_.push_back(std::move(x));
  return graph_execs_.back().get();
}

inline result<void> SimDriver::graph_launch(graph_exec_t x, stream_t s) noexcept {
  constexpr Call c = Call::graph_launch;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (x == nullptr || x->owner != this || !x->alive) {
    return fail(c, status::invalid_value,
                "launching an executable graph that is not a live one of this simulator");
  }
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  if (st.capture != nullptr) {
    return fail(c, status::not_supported,
                "launching a graph into capturing stream " + std::to_string(st.id) +
                    ": child graphs are not modelled by the simulator");
  }
  const detail::sim::GraphData& g = *x->data;
  for (const detail::sim::GraphAlloc& a : g.allocs) {
    if (a.device->ctx.generation != a.generation) {
      return fail(c, status::invalid_context,
                  "launching a graph whose allocation at " + detail::sim::hex(a.addr) +
                      " belonged to device " + std::to_string(a.device->ordinal) +
                      "'s primary context, released since");
    }
    if (!a.freed_in_graph && a.device->mem.blocks.count(a.addr) != 0) {
      return fail(c, status::invalid_value,
                  "launching a graph whose allocation at " + detail::sim::hex(a.addr) +
                      ", made by its previous launch, is still live; free it with "
                      "mem_free_async before launching again");
    }
  }
  for (const detail::sim::Node& n : g.nodes) {
    if (n.kind != OpKind::mem_free_async || n.alloc >= 0) continue;
    const Device* dev = device_of(n.dst);
    bool live = false;
    if (dev != nullptr) {
      auto it = dev->mem.blocks.find(n.dst);
      live = it != dev->mem.blocks.end() && it->second.pooled;
    }
    if (!live) {
      return fail(c, status::invalid_value,
                  "launching a graph that frees " + detail::sim::hex(n.dst) +
                      ", memory allocated outside the graph that is no longer live: a captured "
                      "free of outside memory frees it at every launch, and an earlier launch "
                      "(or another free) has freed it");
    }
  }
  replay_locked(st, g);
  ++capture_stats_.graph_launches;
  return ok();
}

inline result<void> SimDriver::graph_destroy(graph_t g) noexcept {
  constexpr Call c = Call::graph_destroy;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (g == nullptr || g->owner != this || !g->alive) {
    return fail(c, status::invalid_value,
                "destroying a graph that is not a live graph of this simulator (destroyed "
                "already?)");
  }
  g->alive = false;
  release_graph_locked(*g->data);
  return ok();
}

inline result<void> SimDriver::graph_exec_destroy(graph_exec_t x) noexcept {
  constexpr Call c = Call::graph_exec_destroy;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (x == nullptr || x->owner != this || !x->alive) {
    return fail(c, status::invalid_value,
                "destroying an executable graph that is not a live one of this simulator "
                "(destroyed already?)");
  }
  x->alive = false;
  release_graph_locked(*x->data);
  return ok();
}

// --- simulator controls ----------------------------------------------------------------------

inline bool SimDriver::step() noexcept {
  if (cfg_.executor != SimExecutor::manual) return false;
  Lock lk(mu_);
  for (;;) {
    bool changed = false;
    if (Stream* s = pick_locked(nullptr, changed)) {
      run_head_locked(*s, lk);
      return true;
    }
    if (!changed) return false;
  }
}

inline std::size_t SimDriver::run_until_idle() noexcept {
  if (cfg_.executor == SimExecutor::manual) {
    std::size_t n = 0;
    while (step()) ++n;
    return n;
  }
  Lock lk(mu_);
  const std::uint64_t before = executed_;
  work_cv_.notify_all();
  done_cv_.wait(lk, [&] {
    bool changed = propagate_faults_locked();
    (void)changed;
    return idle_locked();
  });
  return static_cast<std::size_t>(executed_ - before);
}

inline std::size_t SimDriver::pending_ops() const noexcept {
  Lock lk(mu_);
  return sched_.queued();
}

inline std::vector<SimHazard> SimDriver::hazards() const {
  Lock lk(mu_);
  return checker_.hazards();
}

inline void SimDriver::clear_hazards() noexcept {
  Lock lk(mu_);
  checker_.clear();
}

inline std::uint64_t SimDriver::hazards_dropped() const noexcept {
  Lock lk(mu_);
  return checker_.dropped();
}

inline SimInjection SimDriver::fail_nth(std::string_view call, int n, int status) noexcept {
  Lock lk(mu_);
  return faults_.fail_nth(call, n, status);
}

inline SimInjection SimDriver::fail_always(std::string_view call, int status) noexcept {
  Lock lk(mu_);
  return faults_.fail_always(call, status);
}

inline void SimDriver::clear_failures() noexcept {
  Lock lk(mu_);
  faults_.clear();
}

inline std::int64_t SimDriver::calls(std::string_view call) const noexcept {
  Call c{};
  if (!detail::sim::find_call(call, c)) return -1;
  Lock lk(mu_);
  return static_cast<std::int64_t>(faults_.calls(c));
}

inline result<void> SimDriver::fault_stream(stream_t s, int status) noexcept {
  if (status == 0) return error{errc::invalid_argument, "fault_stream: status must be non-zero"};
  Lock lk(mu_);
  auto sr = stream_locked(Call::stream_query, s);
  if (!sr) return std::move(sr).error();
  (*sr)->fault = status;
  propagate_faults_locked();
  done_cv_.notify_all();
  work_cv_.notify_all();
  return ok();
}

inline result<SimMemoryStats> SimDriver::memory_stats(device_t dev) const noexcept {
  Lock lk(mu_);
  auto d = device_locked(Call::device_get, dev);
  if (!d) return std::move(d).error();
  const Device& x = **d;
  return SimMemoryStats{
      static_cast<std::size_t>(memory_bytes_), static_cast<std::size_t>(x.mem.allocated),
      static_cast<std::size_t>(x.mem.pending), static_cast<std::size_t>(x.mem.quarantined),
      static_cast<std::size_t>(x.mem.peak),    x.mem.blocks.size(),
      static_cast<std::size_t>(x.mem.graph_reserved)};
}

inline SimCaptureStats SimDriver::capture_stats() const noexcept {
  Lock lk(mu_);
  return capture_stats_;
}

inline result<std::size_t> SimDriver::bytes_reserved(device_t dev) const noexcept {
  auto st = memory_stats(dev);
  if (!st) return std::move(st).error();
  return st->allocated + st->free_pending + st->graph_reserved;
}

inline result<std::uint64_t> SimDriver::release_threshold(mempool_t pool) const noexcept {
  Lock lk(mu_);
  if (!owns_pool(pool)) {
    return error{errc::invalid_argument, "release_threshold: not a pool of this simulator"};
  }
  return pool->release_threshold;
}

inline result<std::uint32_t> SimDriver::stream_id(stream_t s) const noexcept {
  Lock lk(mu_);
  auto sr = stream_locked(Call::stream_query, s);
  if (!sr) return std::move(sr).error();
  return (*sr)->id;
}

inline result<std::span<std::byte>> SimDriver::host_view(std::uint64_t ptr,
                                                         std::size_t bytes) noexcept {
  Lock lk(mu_);
  std::byte* p = translate_locked(ptr, bytes);
  if (p == nullptr) {
    return error{errc::invalid_argument,
                 "host_view: [" + detail::sim::hex(ptr) + ", +" + std::to_string(bytes) +
                     ") is not inside simulated device or mapped host memory"};
  }
  return std::span<std::byte>(p, bytes);
}

}  // namespace xlogrt

// SimDriver's construction, enqueue path and executor.
#include "xlogrt/sim/detail/sim_machine.hpp"
#include "xlogrt/sim/detail/sim_enqueue.hpp"
#include "xlogrt/sim/detail/sim_executor.hpp"
