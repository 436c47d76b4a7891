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
// How it is built. This header is the face: the class, its public API and the state it
// guards. The entry points, handle validation, the address layout (the reservation of
// device windows and their translation) and the executor (running a head operation,
// waiting for targets, the worker threads) need the driver's lock, condition variables
// and host clock all at once, so they are SimDriver's members, not parts of their own;
// their definitions are in sim/detail/sim_*.hpp, by kind, included at the end of this
// header:
// - sim_machine.hpp: construction, the address layout, handle validation, translation;
// - sim_enqueue.hpp: the enqueue path and the checks made at enqueue;
// - sim_executor.hpp: the executor, waits, device drain and reset, the worker threads;
// - sim_entry_devices.hpp, sim_entry_streams.hpp, sim_entry_memory.hpp,
//   sim_entry_capture.hpp, sim_entry_vmm.hpp: the Driver, CapturingDriver and
//   VirtualMemoryDriver entry points;
// - sim_entry_controls.hpp: the simulator controls.
// The parts it composes have a header each:
// - sim/config.hpp and sim/report.hpp: what a test hands in and gets back;
// - sim/detail/hazard_checker.hpp: the checker (shadow memory, findings, reports);
// - sim/detail/fault_injector.hpp: call counts and injected failures;
// - sim/detail/device_memory.hpp: a device's arena, blocks, pending frees, quarantine;
// - sim/detail/host_window.hpp: mapped host memory and its device addresses;
// - sim/detail/virtual_memory.hpp: reservations, physical allocations, their mappings;
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
#include "xlogrt/sim/detail/virtual_memory.hpp"
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
/// Virtual memory (VirtualMemoryDriver). Reservations come from a window of
/// SimConfig::vmm_address_bytes, aligned to the granularity (SimConfig::vmm_granularity,
/// 2 MiB by default, which mem_granularity reports). A physical allocation is counted
/// against its device's memory from mem_create until it is released and unmapped, so
/// mem_get_info's free memory falls and rises with it, and the pool allocations share the
/// remainder. Physical allocations mapped side by side read as one contiguous range, and one
/// mapped twice shows the same bytes at both places. The CUDA rules are enforced with
/// CUDA_ERROR_INVALID_VALUE: sizes and addresses multiples of the granularity (a
/// reservation's size, of the host page size; its alignment a power of two), a mapping
/// inside one reservation, over nothing mapped, at most as large as its allocation (from
/// whose start it maps); unmapping one whole mapping; setting access on whole mappings with no gap;
/// freeing a whole reservation, as reserved; a released handle is dead (release while
/// mapped is legal: the memory goes when the last mapping does). Where the documentation
/// is silent the simulator refuses: freeing a reservation that still has mappings, and
/// unmapping several mappings in one call. Access is what the checker sees: mem_set_access
/// makes a mapping live for it (a host operation every later enqueue is ordered after),
/// mem_unmap of an accessible mapping frees it there without waiting for the streams, so
/// an unmap not ordered after the work that touched the range is a free_race (CUDA calls
/// cuMemUnmap synchronous only "for most use cases"), and an access to a mapping without
/// access is unallocated (use_after_free after an earlier unmap). When it runs, an
/// operation whose stream's device has no access to every byte it touches faults its
/// stream with CUDA_ERROR_ILLEGAL_ADDRESS; host_view needs the bytes mapped only. Not
/// modelled: the calls during a stream capture (they are not refused), peer access rules
/// (any device may be granted access to any device's memory), shareable handles.
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
  using phys_t = detail::sim::PhysHandle;

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
  /// free = total minus allocated, pending-free, graph-reserved and physical (mem_create)
  /// bytes of the current device.
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

  // --- VirtualMemoryDriver concept (see "Virtual memory" above) ---------------------------

  result<AllocationGranularity> mem_granularity(device_t dev) noexcept;
  result<std::uint64_t> mem_address_reserve(std::size_t bytes, std::size_t alignment) noexcept;
  result<void> mem_address_free(std::uint64_t va, std::size_t bytes) noexcept;
  /// Fresh memory holds SimConfig::uninit_byte (when fill_memory).
  result<phys_t> mem_create(std::size_t bytes, device_t dev) noexcept;
  result<void> mem_release(phys_t h) noexcept;
  result<void> mem_map(std::uint64_t va, std::size_t bytes, phys_t h) noexcept;
  result<void> mem_unmap(std::uint64_t va, std::size_t bytes) noexcept;
  result<void> mem_set_access(std::uint64_t va, std::size_t bytes, device_t dev) noexcept;

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
  /// Calls refused because they named a destroyed stream's handle: undefined behaviour in
  /// CUDA (a crash, or work on whatever stream the handle names now), so a library's
  /// tests expect none of their own.
  std::uint64_t dead_stream_calls() const noexcept { return dead_stream_calls_.load(std::memory_order_relaxed); }

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
  /// Bytes the device cannot hand to an unrelated allocation: allocated, pending frees,
  /// graph reservations and physical allocations (the quarantine is excluded: it empties
  /// under pressure).
  result<std::size_t> bytes_reserved(device_t dev) const noexcept;
  result<std::uint64_t> release_threshold(mempool_t pool) const noexcept;
  /// The id reports use for `s` (a null handle: the current context's legacy stream).
  result<std::uint32_t> stream_id(stream_t s) const noexcept;
  /// The simulated bytes behind [ptr, ptr + bytes) of device or mapped host memory, or
  /// of virtual memory mapped without a gap (access or not), for tests: bypasses stream
  /// order and the checker.
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
  // `accessor` >= 0: the device whose stream touches the bytes, which needs access to
  // virtual memory there; -1: the bytes need only be mapped.
  std::byte* translate_locked(std::uint64_t addr, std::uint64_t bytes,
                              int accessor = -1) const noexcept;
  int ordinal_of(std::uint64_t addr) const noexcept;

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

  std::optional<error> vmm_enter_locked(Call c);
  void free_physical_locked(std::uint64_t id);

  bool propagate_faults_locked();
  Stream* pick_locked(const Needed* needed, bool& changed);
  void run_head_locked(Stream& s, Lock& lk);
  int execute_locked(Stream& s, Op& op, Lock& lk);
  result<void> wait_locked(Call c, std::span<const Target> targets, Lock& lk);
  result<void> sync_device_locked(Call c, Device& dev, Lock& lk);
  void reset_device_locked(Device& dev, Lock& lk);
  bool idle_locked() const noexcept;
  void worker() noexcept;

  // mu_ guards every member below, the components (host_, vm_, sched_, checker_, faults_,
  // each device's memory) included, except what the constructor sets and nothing
  // changes afterwards: cfg_, serial_, memory_bytes_, stride_, init_error_, page_bytes_,
  // the reservation_ mapping, and workers_ (joined by the destructor).
  SimConfig cfg_;
  std::uint64_t serial_;
  std::uint64_t memory_bytes_ = 0;  // per device, rounded
  std::uint64_t stride_ = 0;        // device windows' spacing in the reservation
  std::optional<error> init_error_;
  std::uint64_t page_bytes_ = 4096;  // the host's page size
  detail::sim::Mapping reservation_;
  detail::sim::HostWindow host_;  // mapped host memory, above the device windows
  detail::sim::VirtualMemory vm_;  // the virtual memory calls' ranges, mappings, bytes
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
  mutable std::atomic<std::uint64_t> dead_stream_calls_{0};
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
};

static_assert(Driver<SimDriver>);
static_assert(CapturingDriver<SimDriver>);
static_assert(VirtualMemoryDriver<SimDriver>);

}  // namespace xlogrt

// SimDriver's member definitions, by kind (see "How it is built" above).
#include "xlogrt/sim/detail/sim_machine.hpp"
#include "xlogrt/sim/detail/sim_enqueue.hpp"
#include "xlogrt/sim/detail/sim_executor.hpp"
#include "xlogrt/sim/detail/sim_entry_devices.hpp"
#include "xlogrt/sim/detail/sim_entry_streams.hpp"
#include "xlogrt/sim/detail/sim_entry_memory.hpp"
#include "xlogrt/sim/detail/sim_entry_capture.hpp"
#include "xlogrt/sim/detail/sim_entry_vmm.hpp"
#include "xlogrt/sim/detail/sim_entry_controls.hpp"
