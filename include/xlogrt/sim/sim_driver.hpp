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

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
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
#include "xlogrt/sim/detail/clock.hpp"
#include "xlogrt/sim/detail/memory.hpp"
#include "xlogrt/sim/detail/objects.hpp"
#include "xlogrt/sim/detail/shadow.hpp"
#include "xlogrt/driver/lifetime.hpp"
#include "xlogrt/driver/status.hpp"

namespace xlogrt {

/// How a SimDriver runs stream operations.
enum class SimExecutor : std::uint8_t {
  /// Background threads run ready operations as soon as they can (what a reactor that
  /// spins on flags written by the device needs).
  threaded,
  /// Nothing runs until step() / run_until_idle() or a synchronising call (which runs
  /// just the operations it waits for). A scheduler seeded by SimConfig::seed picks
  /// which ready stream advances, so a single-threaded test is deterministic and can
  /// explore many legal orders by varying the seed.
  manual,
};

/// What a SimDriver simulates. The defaults model two 1 GiB devices with memory pools
/// and stream memory operations, run by two executor threads.
///
/// Not thread-safe: a value, copied into the driver at construction.
struct SimConfig {
  int devices = 2;                                  ///< 1..64
  std::size_t memory_bytes = std::size_t{1} << 30;  ///< per device, rounded up to 256
  SimExecutor executor = SimExecutor::threaded;
  std::uint64_t seed = 1;                ///< of the scheduler's choices
  unsigned worker_threads = 2;           ///< executor threads (threaded mode)
  bool memory_pools_supported = true;    ///< mem_alloc_async and pools
  bool stream_mem_ops_supported = true;  ///< stream_write_value32
  bool can_map_host_memory = true;       ///< mem_host_alloc_mapped
  bool check_hazards = true;             ///< run the hazard checker
  /// stream_create hands out the handle of a destroyed stream whose work has all run (the
  /// most recent such one of the device), as CUDA may: the new stream has a new
  /// stream_get_id, and keeps the old one's place in stream order (it is ordered after
  /// the old stream's work, which had all run anyway). Off: handles are never reused, so
  /// a destroyed stream's handle is always refused.
  bool reuse_stream_handles = false;
  /// Executed frees stay out of reuse (except by allocations ordered after them) until
  /// this many bytes are quarantined per device; an allocation that would otherwise
  /// fail empties the quarantine first.
  std::size_t quarantine_bytes = std::size_t{64} << 20;
  std::size_t quarantine_blocks = 1024;                    ///< same, counted in blocks
  std::size_t host_mapped_bytes = std::size_t{256} << 20;  ///< room for mapped host memory
  std::size_t max_hazards = 4096;                          ///< reports kept; later ones are counted
  std::uint8_t poison_byte = 0xDD;                         ///< fills freed memory
  std::uint8_t uninit_byte = 0xA5;                         ///< fills fresh allocations
  /// Fill fresh device allocations with uninit_byte and freed ones with poison_byte.
  /// false: device bytes change only when an operation writes them, for runs that
  /// never read what they did not write (the fuzzer: the fills touch every page of
  /// every block, and are most of what such a run costs). The checker's verdicts do not
  /// depend on it.
  bool fill_memory = true;
  int compute_capability_major = 9;
  int compute_capability_minor = 0;
  int multiprocessor_count = 132;
};

/// A byte range a simulated kernel declares it touches, and how.
///
/// Not thread-safe: a value.
struct SimAccess {
  std::uint64_t ptr = 0;
  std::size_t bytes = 0;
  Access access = Access::Read;
};

/// The host body of a simulated kernel: receives one host pointer per declared access,
/// in declaration order, through which it reads and writes the simulated bytes. It runs
/// with no driver lock held and must not throw (a throwing body faults its stream with
/// status::launch_failed).
using SimKernelBody = detail::sim::KernelBody;

/// Kinds of simulated operations and of hazards (see sim/detail/clock.hpp for the
/// list); `to_string` names them.
using SimOpKind = detail::sim::OpKind;
using SimHazardKind = detail::sim::HazardKind;
using detail::sim::to_string;

/// What SimDriver::fail_nth / fail_always return: whether the injection is armed, and
/// if not, why. Deliberately not [[nodiscard]]: misuse also makes every later driver
/// call fail, so a test that ignores this still cannot miss a misspelt name.
///
/// Not thread-safe: a value.
struct SimInjection {
  bool armed = false;
  std::string problem;
  bool has_value() const noexcept { return armed; }
  explicit operator bool() const noexcept { return armed; }
};

/// One simulated operation, as a hazard report names it.
///
/// Not thread-safe: a value.
struct SimOp {
  SimOpKind kind = SimOpKind::none;
  detail::sim::Stream* stream = nullptr;  ///< its SimDriver::stream_t; null for the host
  std::uint32_t stream_id = 0;            ///< SimDriver::stream_id; 0 is the host
  int device = -1;                        ///< the stream's device; -1 for the host
  std::uint64_t seq = 0;                  ///< 1-based position in its stream
  Access access = Access::Read;
  std::string label;  ///< a kernel's label
};

/// One hazard the checker found. `second` is the operation whose enqueue revealed it;
/// `first` the earlier operation it conflicts with (kind none for unallocated memory).
///
/// Not thread-safe: a value (SimDriver::hazards() hands out copies).
struct SimHazard {
  SimHazardKind kind = SimHazardKind::race;
  int device = -1;  ///< owner of `address`; -1 for mapped host memory or no device
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  SimOp first;
  SimOp second;
};

/// Per-device memory accounting, in bytes rounded to SimDriver::alloc_granularity.
///
/// Not thread-safe: a value (a snapshot).
struct SimMemoryStats {
  std::size_t total = 0;
  std::size_t allocated = 0;     ///< handed out and not freed (free not yet enqueued)
  std::size_t free_pending = 0;  ///< freed by an enqueued free that has not run
  std::size_t quarantined = 0;   ///< freed, run, and not yet back in general reuse
  std::size_t peak_allocated = 0;
  std::size_t live_blocks = 0;
};

namespace detail::sim {
inline std::string hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), digits[v & 0xF]);
    v >>= 4;
  } while (v != 0);
  return "0x" + s;
}
}  // namespace detail::sim

/// "kernel 'scale' (stream 3 of device 0, op #5, read)", "mem_free (host, op #2, write)".
inline std::string to_string(const SimOp& op) {
  std::string s(to_string(op.kind));
  if (!op.label.empty()) s += " '" + op.label + "'";
  if (op.kind == SimOpKind::none) return s;
  if (op.stream_id == 0) {
    s += " (host";
  } else {
    s += " (stream " + std::to_string(op.stream_id) + " of device " + std::to_string(op.device);
  }
  s += ", op #" + std::to_string(op.seq) + ", ";
  s += op.access == Access::Read ? "read" : op.access == Access::Write ? "write" : "read-write";
  s += ")";
  return s;
}

/// One sentence naming the hazard, the memory and both operations.
inline std::string to_string(const SimHazard& h) {
  std::string s(to_string(h.kind));
  s += " on ";
  s += h.device < 0 ? std::string("host-mapped or unmapped memory")
                    : "device " + std::to_string(h.device);
  s += ", " + std::to_string(h.bytes) + " bytes at " + detail::sim::hex(h.address) + ": ";
  switch (h.kind) {
    case SimHazardKind::race:
      s += to_string(h.second) + " and " + to_string(h.first) +
           " touch the same bytes, at least one writes, and no event wait or "
           "synchronisation orders them";
      break;
    case SimHazardKind::free_race:
      s += to_string(h.second) + " and " + to_string(h.first) +
           " are not ordered, so the memory can be freed and reused while it is still "
           "accessed; make the freeing stream wait on an event recorded after the access";
      break;
    case SimHazardKind::use_after_free:
      s += to_string(h.second) + " accesses memory already freed by " + to_string(h.first);
      break;
    case SimHazardKind::unallocated:
      s += to_string(h.second) + " accesses memory that no allocation covers";
      break;
    case SimHazardKind::unordered_alloc:
      s += to_string(h.second) + " is not ordered after " + to_string(h.first) +
           ", which allocates the memory";
      break;
  }
  return s;
}

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
  /// free = total minus allocated and pending-free bytes of the current device.
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
  /// Bytes the device cannot hand to an unrelated allocation: allocated plus pending
  /// frees (the quarantine is excluded: it empties under pressure).
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
  using Needed = std::unordered_map<Stream*, std::uint64_t>;

  struct Injection {
    std::int64_t countdown = 0;
    int nth_status = 0;
    int always_status = 0;
  };

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
  bool in_host_window(std::uint64_t addr) const noexcept {
    return addr >= host_base_ && addr < host_base_ + host_window_;
  }

  void join_host_locked(Stream& s);
  OpRef begin_op_locked(Stream& s, OpKind k, Access a, std::uint32_t label = 0);
  OpRef host_op_locked(OpKind k);
  void publish_locked(const VectorClock& vc);
  void push_locked(Stream& s, Op op);
  std::uint32_t intern_locked(std::string_view label);
  void check_locked(const OpRef& op, const VectorClock& vc, std::uint64_t addr, std::uint64_t n);
  void record_locked();
  SimOp describe_locked(const OpRef& r) const;
  result<void> enqueue_simple_locked(Call c, stream_t s, Op op, Access a,
                                     std::span<const SimAccess> checks);
  result<void> enqueue_transfer_locked(Call c, stream_t s, Op op, Access a,
                                       std::span<const SimAccess> checks);

  std::optional<std::uint64_t> allocate_locked(Device& dev, std::uint64_t need,
                                               const VectorClock& vc);
  void register_block_locked(Device& dev, std::uint64_t addr, std::uint64_t requested,
                             std::uint64_t rounded, bool pooled);
  void trim_quarantine_locked(Device& dev, std::uint64_t bytes_limit, std::uint64_t blocks_limit);
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

  SimConfig cfg_;
  std::uint64_t serial_;
  std::uint64_t memory_bytes_ = 0;  // per device, rounded
  std::uint64_t stride_ = 0;        // device windows' spacing in the reservation
  std::optional<error> init_error_;
  detail::sim::Mapping reservation_;
  std::uint64_t host_base_ = 0;
  std::uint64_t host_window_ = 0;
  detail::sim::RangeAllocator host_space_;
  std::map<std::uint64_t, detail::sim::HostMap> host_maps_;  // device address -> map
  std::map<std::uintptr_t, std::uint64_t> host_index_;       // host address -> device address
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Stream>> streams_;  // index = stream id; [0] is the host
  std::uint64_t next_reused_id_ = std::uint64_t{1} << 32;  // stream_get_id of a reused handle
  std::vector<std::unique_ptr<Event>> events_;
  std::vector<Stream*> active_;  // streams with queued operations, in activation order
  std::vector<Stream*> candidates_;
  VectorClock host_vc_;
  std::uint64_t host_seq_ = 0;
  std::uint64_t host_version_ = 1;
  std::uint64_t next_free_id_ = 1;
  std::uint64_t executed_ = 0;
  std::size_t busy_ = 0;
  detail::sim::Shadow shadow_;
  std::vector<detail::sim::Finding> findings_;
  std::vector<SimHazard> hazards_;
  std::uint64_t hazards_dropped_ = 0;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, std::uint32_t> label_ids_;
  std::array<std::uint64_t, detail::sim::call_count> calls_{};
  std::array<Injection, detail::sim::call_count> inject_{};
  std::string inject_misuse_;  // non-empty: every entry point fails with it
  std::mt19937_64 rng_;
  bool stop_ = false;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
};

static_assert(Driver<SimDriver>);

// --- construction ----------------------------------------------------------------------

inline SimDriver::SimDriver(SimConfig config) noexcept
    : cfg_(config), serial_(detail::sim::next_driver_serial()), rng_(config.seed) {
  detail::arm_exit_guard();
  labels_.emplace_back();
  label_ids_.emplace(std::string(), 0);
  streams_.emplace_back();  // id 0: the host pseudo-stream
  auto refuse = [&](int s, const std::string& why) {
    init_error_ = status::driver_failure(s, "cuInit", status_name(s), why);
  };
  if (cfg_.devices < 1 || cfg_.devices > 64) {
    refuse(status::invalid_value,
           "configuring the simulator: SimConfig::devices must be 1..64, got " +
               std::to_string(cfg_.devices));
    return;
  }
  if (cfg_.memory_bytes == 0 || cfg_.memory_bytes > (std::uint64_t{1} << 46)) {
    refuse(status::invalid_value,
           "configuring the simulator: SimConfig::memory_bytes must be 1 byte to 64 TiB, got " +
               std::to_string(cfg_.memory_bytes));
    return;
  }
  if (cfg_.executor == SimExecutor::threaded && cfg_.worker_threads == 0) {
    refuse(status::invalid_value,
           "configuring the simulator: threaded mode needs SimConfig::worker_threads >= 1");
    return;
  }
  memory_bytes_ = round_up(cfg_.memory_bytes, alloc_granularity);
  // Each device window is followed by an unbacked guard gap, so running off the end of
  // one device faults instead of landing in the next.
  stride_ = round_up(memory_bytes_, window_align) + window_align;
  host_window_ =
      round_up(std::max<std::uint64_t>(cfg_.host_mapped_bytes, alloc_granularity), window_align);
  const std::uint64_t total = stride_ * static_cast<std::uint64_t>(cfg_.devices) + host_window_;
  auto res = detail::sim::Mapping::create(total, false);
  if (!res) {
    refuse(status::out_of_memory, "reserving " + std::to_string(total) +
                                      " bytes of address space for the simulated devices");
    return;
  }
  reservation_ = std::move(*res);
  host_base_ = reservation_.address() + stride_ * static_cast<std::uint64_t>(cfg_.devices);
  host_space_ = detail::sim::RangeAllocator(host_window_);
  for (int d = 0; d < cfg_.devices; ++d) {
    auto dev = std::make_unique<Device>();
    auto storage = detail::sim::Mapping::create(memory_bytes_, true);
    if (!storage) {
      refuse(status::out_of_memory, "mapping " + std::to_string(memory_bytes_) +
                                        " bytes for simulated device " + std::to_string(d));
      devices_.clear();
      return;
    }
    dev->ordinal = d;
    dev->storage = std::move(*storage);
    dev->base = reservation_.address() + stride_ * static_cast<std::uint64_t>(d);
    dev->ctx.device = dev.get();
    dev->pool.device = dev.get();
    dev->space = detail::sim::RangeAllocator(memory_bytes_);
    auto legacy = std::make_unique<Stream>();
    legacy->owner = this;
    legacy->device = dev.get();
    legacy->id = static_cast<std::uint32_t>(streams_.size());
    legacy->api_id = legacy->id;
    legacy->legacy = true;
    dev->legacy = legacy.get();
    streams_.push_back(std::move(legacy));
    devices_.push_back(std::move(dev));
  }
  if (cfg_.executor == SimExecutor::threaded) {
    try {
      for (unsigned i = 0; i < cfg_.worker_threads; ++i)
        workers_.emplace_back([this] { worker(); });
    } catch (...) {
      {
        Lock lk(mu_);
        stop_ = true;
      }
      work_cv_.notify_all();
      for (auto& t : workers_) t.join();
      workers_.clear();
      refuse(status::out_of_memory, "starting the simulator's executor threads");
    }
  }
}

inline SimDriver::~SimDriver() {
  {
    Lock lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  for (auto& [addr, m] : host_maps_) ::operator delete (m.host, std::align_val_t{4096});
}

inline result<SimDriver*> SimDriver::open() noexcept {
  detail::arm_exit_guard();
  // Leaked on purpose, like every process-wide runtime object: runtimes built on it
  // are leaked too and may still be used by static destructors and atexit handlers,
  // and its executor threads must not be joined while the process exits.
  static SimDriver* const instance = new (std::nothrow) SimDriver(SimConfig{});
  if (instance == nullptr) {
    return status::driver_failure(status::out_of_memory, "cuInit", {},
                                  "allocating the process-wide simulator");
  }
  if (instance->init_error_) return *instance->init_error_;
  return instance;
}

// --- small helpers -----------------------------------------------------------------------

inline std::string SimDriver::status_name(int s) const {
  std::string_view n = status::name(s);
  if (!n.empty()) return std::string(n);
  return "CUDA_ERROR_" + std::to_string(s);
}

inline std::optional<error> SimDriver::enter_locked(Call c) {
  const auto i = static_cast<std::size_t>(c);
  ++calls_[i];
  if (detail::process_exiting()) {
    return fail(c, status::deinitialized,
                "the process is exiting: the simulator makes no further call");
  }
  if (init_error_) return *init_error_;
  if (!inject_misuse_.empty()) return fail(c, status::invalid_value, inject_misuse_);
  Injection& in = inject_[i];
  if (in.always_status != 0)
    return fail(c, in.always_status, "failing as SimDriver::fail_always asked");
  if (in.countdown > 0 && --in.countdown == 0) {
    return fail(c, in.nth_status, "failing as SimDriver::fail_nth asked");
  }
  return std::nullopt;
}

inline result<SimDriver::Device*> SimDriver::device_locked(Call c, device_t d) const {
  if (d < 0 || d >= static_cast<int>(devices_.size())) {
    return fail(c, status::invalid_device,
                "looking up device " + std::to_string(d) + ": the simulator has " +
                    std::to_string(devices_.size()) + " devices");
  }
  return devices_[static_cast<std::size_t>(d)].get();
}

inline result<SimDriver::Device*> SimDriver::current_device_locked(Call c) const {
  const detail::sim::Current& cur = detail::sim::current();
  if (cur.driver != serial_ || cur.ctx == nullptr) {
    return fail(c, status::invalid_context,
                "looking for the calling thread's current context: none of this simulator is "
                "current; call ctx_make_current first");
  }
  if (cur.ctx->retains == 0 || cur.generation != cur.ctx->generation) {
    return fail(c, status::invalid_context,
                "using the current context of device " + std::to_string(cur.ctx->device->ordinal) +
                    ", which has been released since it was made current");
  }
  return cur.ctx->device;
}

inline result<SimDriver::Stream*> SimDriver::stream_locked(Call c, stream_t s) const {
  if (s == nullptr) {
    auto d = current_device_locked(c);
    if (!d) return std::move(d).error();
    return (*d)->legacy;
  }
  if (s->owner != this)
    return fail(c, status::invalid_handle, "using a stream of another SimDriver");
  if (!s->alive) {
    return fail(c, status::invalid_handle,
                "using stream " + std::to_string(s->id) + ", which was destroyed");
  }
  if (s->generation != s->device->ctx.generation) {
    return fail(c, status::invalid_context,
                "using stream " + std::to_string(s->id) + " of device " +
                    std::to_string(s->device->ordinal) +
                    ", whose primary context was released after the stream was created");
  }
  return s;
}

inline result<SimDriver::Event*> SimDriver::event_locked(Call c, event_t e) const {
  if (e == nullptr || e->owner != this) {
    return fail(c, status::invalid_handle,
                "using an event handle that is not an event of this simulator");
  }
  if (!e->alive) return fail(c, status::invalid_handle, "using an event that was destroyed");
  if (e->generation != e->device->ctx.generation) {
    return fail(c, status::invalid_context,
                "using an event of device " + std::to_string(e->device->ordinal) +
                    ", whose primary context was released after the event was created");
  }
  return e;
}

inline error SimDriver::fault_error(Call c, const Stream& s) const {
  return fail(c, s.fault,
              "using stream " + std::to_string(s.id) + " of device " +
                  std::to_string(s.device->ordinal) + ", which has faulted");
}

inline bool SimDriver::owns_pool(mempool_t p) const noexcept {
  for (const auto& d : devices_) {
    if (&d->pool == p) return true;
  }
  return false;
}

inline SimDriver::Device* SimDriver::device_of(std::uint64_t addr) const noexcept {
  if (devices_.empty() || addr < reservation_.address() || addr >= host_base_) return nullptr;
  const std::uint64_t rel = addr - reservation_.address();
  const std::uint64_t d = rel / stride_;
  if (rel % stride_ >= memory_bytes_ || d >= devices_.size()) return nullptr;
  return devices_[d].get();
}

inline std::byte* SimDriver::translate_locked(std::uint64_t addr,
                                              std::uint64_t bytes) const noexcept {
  if (Device* d = device_of(addr)) {
    const std::uint64_t off = addr - d->base;
    if (bytes > memory_bytes_ - off) return nullptr;
    return d->storage.data() + off;
  }
  if (!in_host_window(addr)) return nullptr;
  auto it = host_maps_.upper_bound(addr);
  if (it == host_maps_.begin()) return nullptr;
  --it;
  const std::uint64_t off = addr - it->first;
  if (off > it->second.bytes || bytes > it->second.bytes - off) return nullptr;
  return static_cast<std::byte*>(it->second.host) + off;
}

// --- enqueue and the checker ---------------------------------------------------------------

inline void SimDriver::join_host_locked(Stream& s) {
  if (s.host_version != host_version_) {
    s.vc.join(host_vc_);
    s.host_version = host_version_;
  }
}

inline SimDriver::OpRef SimDriver::begin_op_locked(Stream& s, OpKind k, Access a,
                                                   std::uint32_t label) {
  join_host_locked(s);
  const std::uint64_t seq = ++s.enqueued;
  s.vc.set(s.id, seq);
  return OpRef{seq, s.id, label, k, a};
}

inline SimDriver::OpRef SimDriver::host_op_locked(OpKind k) {
  host_vc_.set(0, ++host_seq_);
  ++host_version_;
  return OpRef{host_seq_, 0, 0, k, Access::Write};
}

inline void SimDriver::publish_locked(const VectorClock& vc) {
  host_vc_.join(vc);
  ++host_version_;
}

inline void SimDriver::push_locked(Stream& s, Op op) {
  s.queue.push_back(std::move(op));
  if (!s.active) {
    s.active = true;
    active_.push_back(&s);
  }
  if (cfg_.executor == SimExecutor::threaded) work_cv_.notify_one();
}

inline std::uint32_t SimDriver::intern_locked(std::string_view label) {
  std::string key(label);
  auto it = label_ids_.find(key);
  if (it != label_ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(labels_.size());
  labels_.push_back(key);
  label_ids_.emplace(std::move(key), id);
  return id;
}

inline void SimDriver::check_locked(const OpRef& op, const VectorClock& vc, std::uint64_t addr,
                                    std::uint64_t n) {
  if (!cfg_.check_hazards || n == 0) return;
  findings_.clear();
  if (in_host_window(addr)) {
    if (translate_locked(addr, n) == nullptr) {
      findings_.push_back(detail::sim::Finding{SimHazardKind::unallocated, addr, n, OpRef{}, op});
    }
  } else {
    shadow_.access(addr, n, op, vc, findings_);
  }
  record_locked();
}

inline SimOp SimDriver::describe_locked(const OpRef& r) const {
  SimOp o;
  o.kind = r.kind;
  o.seq = r.seq;
  o.access = r.access;
  o.stream_id = r.stream;
  if (r.stream != 0 && r.stream < streams_.size()) {
    o.stream = streams_[r.stream].get();
    o.device = o.stream->device->ordinal;
  }
  if (r.label < labels_.size()) o.label = labels_[r.label];
  return o;
}

inline void SimDriver::record_locked() {
  for (const auto& f : findings_) {
    if (hazards_.size() >= cfg_.max_hazards) {
      ++hazards_dropped_;
      continue;
    }
    SimHazard h;
    h.kind = f.kind;
    const Device* d = device_of(f.address);
    h.device = d != nullptr ? d->ordinal : -1;
    h.address = f.address;
    h.bytes = f.bytes;
    h.first = describe_locked(f.first);
    h.second = describe_locked(f.second);
    hazards_.push_back(std::move(h));
  }
  findings_.clear();
}

// Validates the stream, assigns the operation its place, checks `checks` (each with
// its own access mode) and queues it.
/// A memset or memcpy: as CUDA, one of 0 bytes only checks its stream and enqueues nothing.
inline result<void> SimDriver::enqueue_transfer_locked(Call c, stream_t s, Op op, Access a,
                                                       std::span<const SimAccess> checks) {
  if (op.bytes == 0) {
    auto sr = stream_locked(c, s);
    return sr ? ok() : result<void>(std::move(sr).error());
  }
  return enqueue_simple_locked(c, s, std::move(op), a, checks);
}

inline result<void> SimDriver::enqueue_simple_locked(Call c, stream_t s, Op op, Access a,
                                                     std::span<const SimAccess> checks) {
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  OpRef ref = begin_op_locked(st, op.kind, a);
  op.seq = ref.seq;
  for (const SimAccess& x : checks) {
    OpRef r = ref;
    r.access = x.access;
    check_locked(r, st.vc, x.ptr, x.bytes);
  }
  if (op.kind == OpKind::write_value32 || op.kind == OpKind::host_func) {
    op.release = std::make_unique<VectorClock>(st.vc);
  }
  push_locked(st, std::move(op));
  return ok();
}

// --- memory bookkeeping ----------------------------------------------------------------------

// Where a new block of `need` bytes goes, for an allocation whose clock is `vc`:
// first a recycled range whose free is ordered before it (newest first: the least
// forgiving choice), then the free list, then the free list after the quarantine has
// been emptied.
inline std::optional<std::uint64_t> SimDriver::allocate_locked(Device& dev, std::uint64_t need,
                                                               const VectorClock& vc) {
  for (std::size_t i = dev.recycled.size(); i-- > 0;) {
    detail::sim::Recycled& r = dev.recycled[i];
    if (r.bytes < need || !vc.covers(r.free)) continue;
    const std::uint64_t off = r.offset;
    r.offset += need;
    r.bytes -= need;
    (r.executed ? dev.quarantined : dev.pending) -= need;
    if (r.bytes == 0) {
      if (r.executed) --dev.quarantined_blocks;
      dev.recycled.erase(dev.recycled.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return off;
  }
  if (auto off = dev.space.allocate(need)) return off;
  trim_quarantine_locked(dev, 0, 0);
  return dev.space.allocate(need);
}

inline void SimDriver::register_block_locked(Device& dev, std::uint64_t addr,
                                             std::uint64_t requested, std::uint64_t rounded,
                                             bool pooled) {
  dev.blocks.emplace(addr, detail::sim::Block{requested, rounded, pooled});
  dev.allocated += rounded;
  dev.peak = std::max(dev.peak, dev.allocated);
}

inline void SimDriver::trim_quarantine_locked(Device& dev, std::uint64_t bytes_limit,
                                              std::uint64_t blocks_limit) {
  auto it = dev.recycled.begin();
  while (it != dev.recycled.end() &&
         (dev.quarantined > bytes_limit || dev.quarantined_blocks > blocks_limit)) {
    if (!it->executed) {
      ++it;
      continue;
    }
    dev.space.release(it->offset, it->bytes);
    dev.quarantined -= it->bytes;
    --dev.quarantined_blocks;
    it = dev.recycled.erase(it);
  }
}

inline error SimDriver::oom_locked(Call c, const Device& dev, std::uint64_t bytes) const {
  return fail(c, status::out_of_memory,
              "allocating " + std::to_string(bytes) + " bytes on simulated device " +
                  std::to_string(dev.ordinal) + " (" + std::to_string(memory_bytes_) + " bytes, " +
                  std::to_string(dev.allocated) + " allocated, " + std::to_string(dev.pending) +
                  " held by frees that have not run yet)");
}

// --- the executor ----------------------------------------------------------------------------

// A stream whose head waits for a point its source stream will never reach (the source
// faulted) faults too, with the same status: a faulted context stops everything.
inline bool SimDriver::propagate_faults_locked() {
  bool any = false;
  for (bool changed = true; changed;) {
    changed = false;
    for (Stream* s : active_) {
      if (s->fault != 0 || s->busy || s->queue.empty()) continue;
      const Op& h = s->queue.front();
      if (h.kind == OpKind::stream_wait_event && h.wait_stream->fault != 0 &&
          h.wait_stream->completed < h.wait_seq) {
        s->fault = h.wait_stream->fault;
        changed = any = true;
      }
    }
  }
  if (any) done_cv_.notify_all();
  return any;
}

// The next stream to advance: among ready streams (restricted to `needed` when given),
// the scheduler prefers one whose head is a free (frees run as early as ordering
// allows), and otherwise picks at random.
inline SimDriver::Stream* SimDriver::pick_locked(const Needed* needed, bool& changed) {
  changed = propagate_faults_locked();
  candidates_.clear();
  bool frees = false;
  for (Stream* s : active_) {
    if (s->busy || s->fault != 0 || s->queue.empty()) continue;
    const Op& h = s->queue.front();
    if (needed != nullptr) {
      auto it = needed->find(s);
      if (it == needed->end() || h.seq > it->second) continue;
    }
    if (h.kind == OpKind::stream_wait_event && h.wait_stream->completed < h.wait_seq) continue;
    const bool is_free = h.kind == OpKind::mem_free_async;
    if (is_free && !frees) {
      candidates_.clear();
      frees = true;
    }
    if (is_free == frees) candidates_.push_back(s);
  }
  if (candidates_.empty()) return nullptr;
  if (candidates_.size() == 1) return candidates_.front();
  return candidates_[static_cast<std::size_t>(rng_() % candidates_.size())];
}

inline void SimDriver::run_head_locked(Stream& s, Lock& lk) {
  Op op = std::move(s.queue.front());
  s.queue.pop_front();
  s.busy = true;
  ++busy_;
  const int fault = execute_locked(s, op, lk);
  s.busy = false;
  --busy_;
  if (fault != 0) {
    s.fault = fault;
  } else {
    s.completed = op.seq;
  }
  if (s.queue.empty()) {
    s.active = false;
    active_.erase(std::find(active_.begin(), active_.end(), &s));
  }
  ++executed_;
  done_cv_.notify_all();
  if (cfg_.executor == SimExecutor::threaded) work_cv_.notify_all();
}

// Runs one operation; returns 0 or the status that faults the stream. Host functions
// and kernel bodies run with the lock released.
inline int SimDriver::execute_locked(Stream& s, Op& op, Lock& lk) {
  (void)s;
  switch (op.kind) {
    case OpKind::mem_alloc_async: {
      if (std::byte* p = translate_locked(op.dst, op.bytes); p != nullptr && cfg_.fill_memory)
        std::memset(p, cfg_.uninit_byte, op.bytes);
      return 0;
    }
    case OpKind::mem_free_async: {
      if (std::byte* p = translate_locked(op.dst, op.bytes); p != nullptr && cfg_.fill_memory)
        std::memset(p, cfg_.poison_byte, op.bytes);
      if (Device* dev = device_of(op.dst)) {
        for (auto& r : dev->recycled) {
          if (r.free_id == op.free_id && !r.executed) {
            r.executed = true;
            dev->pending -= r.bytes;
            dev->quarantined += r.bytes;
            ++dev->quarantined_blocks;
          }
        }
        trim_quarantine_locked(*dev, cfg_.quarantine_bytes, cfg_.quarantine_blocks);
      }
      return 0;
    }
    case OpKind::memset: {
      std::byte* p = translate_locked(op.dst, op.bytes);
      if (p == nullptr) return status::illegal_address;
      std::memset(p, static_cast<int>(op.value), op.bytes);
      return 0;
    }
    case OpKind::memcpy_htod: {
      std::byte* p = translate_locked(op.dst, op.bytes);
      if (p == nullptr) return status::illegal_address;
      std::memcpy(p, op.chost, op.bytes);
      return 0;
    }
    case OpKind::memcpy_dtoh: {
      std::byte* p = translate_locked(op.src, op.bytes);
      if (p == nullptr) return status::illegal_address;
      std::memcpy(op.host, p, op.bytes);
      return 0;
    }
    case OpKind::memcpy_dtod: {
      std::byte* d = translate_locked(op.dst, op.bytes);
      std::byte* p = translate_locked(op.src, op.bytes);
      if (d == nullptr || p == nullptr) return status::illegal_address;
      std::memmove(d, p, op.bytes);
      return 0;
    }
    case OpKind::write_value32: {
      publish_locked(*op.release);
      std::byte* p = translate_locked(op.dst, 4);
      if (p == nullptr) return status::illegal_address;
      std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(p))
          .store(op.value, std::memory_order_release);
      return 0;
    }
    case OpKind::kernel: {
      const detail::sim::Kernel& k = *op.kernel;
      std::vector<std::byte*> ptrs(k.ptrs.size(), nullptr);
      for (std::size_t i = 0; i < ptrs.size(); ++i) {
        if (k.bytes[i] == 0) continue;
        ptrs[i] = translate_locked(k.ptrs[i], k.bytes[i]);
        if (ptrs[i] == nullptr) return status::illegal_address;
      }
      if (!k.body) return 0;
      bool threw = false;
      lk.unlock();
      try {
        k.body(std::span<std::byte* const>(ptrs));
      } catch (...) {
        threw = true;
      }
      lk.lock();
      return threw ? status::launch_failed : 0;
    }
    case OpKind::host_func: {
      publish_locked(*op.release);
      lk.unlock();
      op.fn(op.host);
      lk.lock();
      return 0;
    }
    default: return 0;
  }
}

// Waits until every target point is reached. In manual mode it runs the operations the
// targets depend on (and only those), picked by the scheduler.
inline result<void> SimDriver::wait_locked(Call c, std::span<const Target> targets, Lock& lk) {
  Needed needed;
  const bool manual = cfg_.executor == SimExecutor::manual;
  if (manual) {
    std::vector<Target> work(targets.begin(), targets.end());
    while (!work.empty()) {
      const Target t = work.back();
      work.pop_back();
      auto [it, inserted] = needed.try_emplace(t.stream, 0);
      const std::uint64_t old = it->second;
      if (t.seq <= old) continue;
      it->second = t.seq;
      for (const Op& op : t.stream->queue) {
        if (op.seq > t.seq) break;
        if (op.seq <= old) continue;
        if (op.kind == OpKind::stream_wait_event && op.wait_stream->completed < op.wait_seq) {
          work.push_back(Target{op.wait_stream, op.wait_seq});
        }
      }
    }
  }
  for (;;) {
    bool done = true;
    for (const Target& t : targets) {
      if (t.stream->completed >= t.seq) continue;
      if (t.stream->fault != 0) return fault_error(c, *t.stream);
      done = false;
    }
    if (done) return ok();
    if (manual) {
      bool changed = false;
      if (Stream* s = pick_locked(&needed, changed)) {
        run_head_locked(*s, lk);
        continue;
      }
      if (changed) continue;
      if (busy_ == 0) {
        return fail(c, status::unknown,
                    "waiting in manual mode: no operation the wait depends on can run "
                    "(a simulator bug: please report it)");
      }
    }
    done_cv_.wait(lk);
  }
}

// Waits for every stream of `dev` that has not faulted, and orders the host after them.
inline result<void> SimDriver::sync_device_locked(Call c, Device& dev, Lock& lk) {
  std::vector<Target> targets;
  VectorClock seen;
  for (const auto& sp : streams_) {
    if (!sp || sp->device != &dev || sp->fault != 0) continue;
    seen.join(sp->vc);
    if (sp->completed < sp->enqueued) targets.push_back(Target{sp.get(), sp->enqueued});
  }
  auto r = wait_locked(c, targets, lk);
  if (!r) return r;
  publish_locked(seen);
  return ok();
}

// The primary context's last release: drain the device, free all its memory, and
// invalidate its streams and events.
inline void SimDriver::reset_device_locked(Device& dev, Lock& lk) {
  (void)sync_device_locked(Call::primary_ctx_release, dev, lk);
  if (dev.ctx.retains != 0) return;  // retained again while draining
  const OpRef ref = host_op_locked(OpKind::context_reset);
  for (const auto& [addr, b] : dev.blocks) {
    if (std::byte* p = translate_locked(addr, b.rounded); p != nullptr && cfg_.fill_memory)
      std::memset(p, cfg_.poison_byte, b.rounded);
    if (cfg_.check_hazards) shadow_.free(addr, b.requested, ref, host_vc_, findings_);
  }
  record_locked();
  dev.blocks.clear();
  dev.recycled.clear();
  dev.space.reset();
  dev.allocated = dev.pending = dev.quarantined = dev.quarantined_blocks = 0;
  ++dev.ctx.generation;
  Stream& legacy = *dev.legacy;
  legacy.generation = dev.ctx.generation;
  legacy.queue.clear();
  legacy.fault = 0;
  legacy.completed = legacy.enqueued;
  if (legacy.active && !legacy.busy) {
    legacy.active = false;
    active_.erase(std::find(active_.begin(), active_.end(), &legacy));
  }
}

inline bool SimDriver::idle_locked() const noexcept {
  if (busy_ != 0) return false;
  for (const Stream* s : active_) {
    if (s->fault == 0 && !s->queue.empty()) return false;
  }
  return true;
}

inline void SimDriver::worker() noexcept {
  Lock lk(mu_);
  while (!stop_) {
    bool changed = false;
    Stream* s = pick_locked(nullptr, changed);
    if (s != nullptr) {
      run_head_locked(*s, lk);
    } else if (!changed) {
      if (busy_ == 0 && idle_locked()) done_cv_.notify_all();
      work_cv_.wait(lk);
    }
  }
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
  return MemInfo{static_cast<std::size_t>(memory_bytes_ - dev.allocated - dev.pending),
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
  return (*sr)->api_id;
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
  join_host_locked(st);
  auto off = allocate_locked(dev, need, st.vc);
  if (!off) return oom_locked(c, dev, bytes);
  const OpRef ref = begin_op_locked(st, OpKind::mem_alloc_async, Access::Write);
  const std::uint64_t addr = dev.base + *off;
  register_block_locked(dev, addr, bytes, need, true);
  if (cfg_.check_hazards) shadow_.allocate(addr, bytes, ref);
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
  Device* dev = device_of(ptr);
  if (dev == nullptr) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) + ": not a simulated device address");
  }
  auto it = dev->blocks.find(ptr);
  if (it == dev->blocks.end()) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) + " on device " + std::to_string(dev->ordinal) +
                    ": not the start of a live allocation (freed already, or never allocated)");
  }
  if (!it->second.pooled) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    " with mem_free_async: it was allocated by mem_alloc; free it with mem_free");
  }
  const detail::sim::Block b = it->second;
  const OpRef ref = begin_op_locked(st, OpKind::mem_free_async, Access::Write);
  if (cfg_.check_hazards) {
    shadow_.free(ptr, b.requested, ref, st.vc, findings_);
    record_locked();
  }
  const std::uint64_t id = next_free_id_++;
  dev->recycled.push_back(detail::sim::Recycled{ptr - dev->base, b.rounded, ref, id, false});
  dev->pending += b.rounded;
  dev->allocated -= b.rounded;
  dev->blocks.erase(it);
  Op op;
  op.kind = OpKind::mem_free_async;
  op.seq = ref.seq;
  op.dst = ptr;
  op.bytes = b.rounded;
  op.free_id = id;
  push_locked(st, std::move(op));
  return ok();
}

inline result<std::uint64_t> SimDriver::mem_alloc(std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_alloc;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  Device& dev = **d;
  if (bytes == 0) return fail(c, status::invalid_value, "allocating 0 bytes");
  if (bytes > memory_bytes_) return oom_locked(c, dev, bytes);
  const std::uint64_t need = round_up(bytes, alloc_granularity);
  auto off = allocate_locked(dev, need, host_vc_);
  if (!off) return oom_locked(c, dev, bytes);
  const OpRef ref = host_op_locked(OpKind::mem_alloc);
  const std::uint64_t addr = dev.base + *off;
  register_block_locked(dev, addr, bytes, need, false);
  if (cfg_.fill_memory) std::memset(translate_locked(addr, need), cfg_.uninit_byte, need);
  if (cfg_.check_hazards) shadow_.allocate(addr, bytes, ref);
  return addr;
}

inline result<void> SimDriver::mem_free(std::uint64_t ptr) noexcept {
  constexpr Call c = Call::mem_free;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  Device* dev = device_of(ptr);
  auto missing = [&] {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    ": not the start of a live allocation of this simulator (freed already, or "
                    "never allocated)");
  };
  if (dev == nullptr || dev->blocks.find(ptr) == dev->blocks.end()) return missing();
  auto synced = sync_device_locked(c, *dev, lk);
  if (!synced) return synced;
  auto it = dev->blocks.find(ptr);  // the lock was released while draining
  if (it == dev->blocks.end()) return missing();
  const detail::sim::Block b = it->second;
  const OpRef ref = host_op_locked(OpKind::mem_free);
  if (cfg_.check_hazards) {
    shadow_.free(ptr, b.requested, ref, host_vc_, findings_);
    record_locked();
  }
  if (cfg_.fill_memory) std::memset(translate_locked(ptr, b.rounded), cfg_.poison_byte, b.rounded);
  dev->recycled.push_back(
      detail::sim::Recycled{ptr - dev->base, b.rounded, ref, next_free_id_++, true});
  dev->allocated -= b.rounded;
  dev->quarantined += b.rounded;
  ++dev->quarantined_blocks;
  dev->blocks.erase(it);
  trim_quarantine_locked(*dev, cfg_.quarantine_bytes, cfg_.quarantine_blocks);
  return ok();
}

inline result<void*> SimDriver::mem_host_alloc_mapped(std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_host_alloc_mapped;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
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
                    std::to_string(host_space_.free_bytes()) + " bytes of the mapped window free)");
  };
  if (bytes > host_window_) return nomem();
  const std::uint64_t span = round_up(bytes, alloc_granularity);
  auto off = host_space_.allocate(span);
  if (!off) return nomem();
  void* host = ::operator new (span, std::align_val_t{4096}, std::nothrow);
  if (host == nullptr) {
    host_space_.release(*off, span);
    return nomem();
  }
  std::memset(host, cfg_.uninit_byte, span);
  const std::uint64_t addr = host_base_ + *off;
  host_maps_.emplace(addr, detail::sim::HostMap{host, bytes, span});
  host_index_.emplace(reinterpret_cast<std::uintptr_t>(host), addr);
  return host;
}

inline result<std::uint64_t> SimDriver::mem_host_device_pointer(void* host) noexcept {
  constexpr Call c = Call::mem_host_device_pointer;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  const auto h = reinterpret_cast<std::uintptr_t>(host);
  auto it = host_index_.upper_bound(h);
  if (it != host_index_.begin()) {
    --it;
    auto m = host_maps_.find(it->second);
    if (m != host_maps_.end() && h - it->first < m->second.bytes)
      return it->second + (h - it->first);
  }
  return fail(c, status::invalid_value,
              "translating host pointer " + detail::sim::hex(h) +
                  ": it is not inside memory from mem_host_alloc_mapped");
}

inline result<void> SimDriver::mem_host_free(void* host) noexcept {
  constexpr Call c = Call::mem_host_free;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  auto it = host_index_.find(reinterpret_cast<std::uintptr_t>(host));
  if (it == host_index_.end()) {
    return fail(c, status::invalid_value,
                "freeing host pointer " + detail::sim::hex(reinterpret_cast<std::uintptr_t>(host)) +
                    ": not the start of memory from mem_host_alloc_mapped (freed already?)");
  }
  auto m = host_maps_.find(it->second);
  host_space_.release(m->first - host_base_, m->second.span);
  ::operator delete (m->second.host, std::align_val_t{4096});
  host_maps_.erase(m);
  host_index_.erase(it);
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
  const std::uint32_t id = intern_locked(label);
  const OpRef ref = begin_op_locked(st, OpKind::kernel, Access::ReadWrite, id);
  auto k = std::make_unique<detail::sim::Kernel>();
  k->ptrs.reserve(accesses.size());
  k->bytes.reserve(accesses.size());
  for (const SimAccess& a : accesses) {
    OpRef r = ref;
    r.access = a.access;
    check_locked(r, st.vc, a.ptr, a.bytes);
    k->ptrs.push_back(a.ptr);
    k->bytes.push_back(a.bytes);
  }
  k->body = std::move(body);
  Op op;
  op.kind = OpKind::kernel;
  op.seq = ref.seq;
  op.kernel = std::move(k);
  push_locked(st, std::move(op));
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
  std::size_t n = 0;
  for (const Stream* s : active_) n += s->queue.size();
  return n;
}

inline std::vector<SimHazard> SimDriver::hazards() const {
  Lock lk(mu_);
  return hazards_;
}

inline void SimDriver::clear_hazards() noexcept {
  Lock lk(mu_);
  hazards_.clear();
  hazards_dropped_ = 0;
}

inline std::uint64_t SimDriver::hazards_dropped() const noexcept {
  Lock lk(mu_);
  return hazards_dropped_;
}

inline SimInjection SimDriver::fail_nth(std::string_view call, int n, int status) noexcept {
  Call c{};
  const bool known = detail::sim::find_call(call, c);
  Lock lk(mu_);
  if (!known) {
    inject_misuse_ =
        "obeying SimDriver::fail_nth(\"" + std::string(call) +
        "\"), which is no entry point (use the CUDA name, e.g. cuMemAllocFromPoolAsync)";
  } else if (n < 1 || status == 0) {
    inject_misuse_ = "obeying SimDriver::fail_nth(\"" + std::string(call) + "\", " +
                     std::to_string(n) + ", " + std::to_string(status) +
                     "): n must be >= 1 and the status non-zero";
  } else {
    Injection& in = inject_[static_cast<std::size_t>(c)];
    in.countdown = n;
    in.nth_status = status;
    return SimInjection{true, {}};
  }
  return SimInjection{false, inject_misuse_};
}

inline SimInjection SimDriver::fail_always(std::string_view call, int status) noexcept {
  Call c{};
  const bool known = detail::sim::find_call(call, c);
  Lock lk(mu_);
  if (!known) {
    inject_misuse_ =
        "obeying SimDriver::fail_always(\"" + std::string(call) +
        "\"), which is no entry point (use the CUDA name, e.g. cuMemAllocFromPoolAsync)";
  } else if (status == 0) {
    inject_misuse_ = "obeying SimDriver::fail_always(\"" + std::string(call) +
                     "\", 0): the status must be non-zero";
  } else {
    inject_[static_cast<std::size_t>(c)].always_status = status;
    return SimInjection{true, {}};
  }
  return SimInjection{false, inject_misuse_};
}

inline void SimDriver::clear_failures() noexcept {
  Lock lk(mu_);
  inject_.fill(Injection{});
  inject_misuse_.clear();
}

inline std::int64_t SimDriver::calls(std::string_view call) const noexcept {
  Call c{};
  if (!detail::sim::find_call(call, c)) return -1;
  Lock lk(mu_);
  return static_cast<std::int64_t>(calls_[static_cast<std::size_t>(c)]);
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
      static_cast<std::size_t>(memory_bytes_), static_cast<std::size_t>(x.allocated),
      static_cast<std::size_t>(x.pending),     static_cast<std::size_t>(x.quarantined),
      static_cast<std::size_t>(x.peak),        x.blocks.size()};
}

inline result<std::size_t> SimDriver::bytes_reserved(device_t dev) const noexcept {
  auto st = memory_stats(dev);
  if (!st) return std::move(st).error();
  return st->allocated + st->free_pending;
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
