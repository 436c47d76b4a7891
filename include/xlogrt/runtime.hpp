// SPDX-License-Identifier: Apache-2.0
#pragma once

// The umbrella header, and DeviceRuntime<Stack>: one runtime per GPU ordinal, owning the
// device, its stream pool and a resource stack.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/device.hpp"
#include "xlogrt/device/event_pool.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/cuda_driver.hpp"
#include "xlogrt/driver/sim_driver.hpp"
#include "xlogrt/memory/device_buffer.hpp"
#include "xlogrt/memory/launch.hpp"
#include "xlogrt/memory/launch_kernel.hpp"
#include "xlogrt/resource/any_resource.hpp"
#include "xlogrt/resource/async_cuda.hpp"
#include "xlogrt/resource/budget.hpp"
#include "xlogrt/resource/cached.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/debug_guard.hpp"
#include "xlogrt/resource/direct_cuda.hpp"
#include "xlogrt/resource/env_config.hpp"
#include "xlogrt/resource/find_layer.hpp"
#include "xlogrt/resource/live_blocks.hpp"
#include "xlogrt/resource/logging.hpp"
#include "xlogrt/resource/statistics.hpp"

namespace xlogrt {

namespace detail {
/// The singleton table of one runtime type: a variable template rather than a static
/// data member, because nvcc rejects an inline static member of the class's own
/// (incomplete) type. Constant-initialised and trivially destructible, so it is readable
/// at any point of the process.
template <class Runtime>
inline std::array<std::atomic<Runtime*>, 16> runtime_table{};
}  // namespace detail

/// Builds a Stack on a stream pool, for DeviceRuntime::try_get. The primary template
/// handles the shipped types: a base resource with `create(streams)` (AsyncCuda) or a
/// constructor from the pool (DirectCuda), and any decorator constructible from its
/// upstream alone (its options defaulted; the upstream's type is what `upstream()`
/// returns), recursively. Specialise it to give
/// try_get a stack with other options.
template <class Stack>
struct StackBuilder {
  template <class D>
  static result<Stack> build(const std::shared_ptr<StreamPool<D>>& streams) noexcept {
    if constexpr (requires { { Stack::create(streams) } -> std::same_as<result<Stack>>; }) {
      return Stack::create(streams);
    } else if constexpr (std::is_constructible_v<Stack, std::shared_ptr<StreamPool<D>>>) {
      return Stack(streams);
    } else {
      using Up = std::remove_cvref_t<decltype(std::declval<Stack&>().upstream())>;
      static_assert(std::is_constructible_v<Stack, Up&&>,
                    "StackBuilder cannot build this stack: specialise xlogrt::StackBuilder<Stack>");
      auto up = StackBuilder<Up>::build(streams);
      if (!up) return std::move(up).error();
      return Stack(std::move(*up));
    }
  }
};

/// The device runtime: a Device, its StreamPool and a resource Stack, for one ordinal.
///
/// Two ways to get one:
/// - `DeviceRuntime<Stack>::try_get(ordinal)`: the process-wide runtime of that ordinal
///   for that Stack type, built on first use with `Stack::driver_type::open()` and
///   StackBuilder<Stack>. At most one thread builds it; concurrent first callers wait and
///   get the same object; a failed build leaves the slot empty so that a later call
///   retries. After the first build a call is one acquire load: no lock.
/// - constructing it directly around a stream pool and a stack you built: an owned
///   runtime, never stored in (nor looked up from) the singleton table.
///
/// Lifetime: singletons are leaked on purpose. A runtime outlives every user of it, and
/// destroying one at exit would issue driver calls while libcuda is being torn down.
///
/// Two shared libraries of one process that both include xlogrt share the singletons:
/// the table is an inline variable template, which the toolchain emits
/// as one (vague-linkage, STB_GNU_UNIQUE) object per process as long as the libraries
/// export it, as they do by default. A library built with -fvisibility=hidden gets its
/// own table, hence its own runtime per ordinal (see docs/architecture.md, "Invariants").
///
/// Thread-safe: every member may be called from any thread (the Stack is thread-safe).
template <DriverResource Stack>
class DeviceRuntime {
 public:
  using stack_type = Stack;
  using driver_type = typename Stack::driver_type;
  using D = driver_type;
  static constexpr std::uint32_t MAX_DEVICE_ORDINALS = 16;
  static constexpr std::size_t DEFAULT_STREAMS = 8;
  static constexpr bool supports_block_use_tracking = Stack::supports_block_use_tracking;

  /// An owned runtime around `stack`, which must allocate from `streams`' device.
  DeviceRuntime(std::shared_ptr<StreamPool<D>> streams, Stack stack) noexcept
      : streams_(std::move(streams)), stack_(std::move(stack)) {}

  /// The process-wide runtime of `ordinal` for this Stack type.
  /// Errors: invalid_ordinal (ordinal >= MAX_DEVICE_ORDINALS, or beyond the driver's
  /// devices), no_driver / no_device / driver errors from opening the device.
  static result<DeviceRuntime*> try_get(std::uint32_t ordinal) noexcept {
    if (ordinal >= MAX_DEVICE_ORDINALS) {
      return error{errc::invalid_ordinal, "device ordinal " + std::to_string(ordinal) +
                                              " exceeds MAX_DEVICE_ORDINALS (" +
                                              std::to_string(MAX_DEVICE_ORDINALS) + ")"};
    }
    // Acquire pairs with the release store below: a non-null pointer comes with the
    // fully built runtime.
    if (DeviceRuntime* rt = table_[ordinal].load(std::memory_order_acquire)) return rt;
    std::lock_guard lock(build_locks()[ordinal]);
    if (DeviceRuntime* rt = table_[ordinal].load(std::memory_order_relaxed)) return rt;
    auto built = build(ordinal);
    if (!built) return std::move(built).error();
    table_[ordinal].store(*built, std::memory_order_release);
    return *built;
  }

  std::uint32_t device_ordinal() const noexcept { return streams_->device()->ordinal(); }
  const std::shared_ptr<Device<D>>& device() const noexcept { return streams_->device(); }
  const std::shared_ptr<StreamPool<D>>& streams() const noexcept { return streams_; }
  D& driver() const noexcept { return streams_->driver(); }
  Stack& stack() noexcept { return stack_; }
  const Stack& stack() const noexcept { return stack_; }

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream = StreamId::DEFAULT,
                               AllocTag tag = AllocTag::UNTAGGED) noexcept {
    return stack_.allocate(bytes, stream, tag);
  }
  result<void> deallocate(DeviceBlock&& block) noexcept { return stack_.deallocate(std::move(block)); }
  std::size_t bytes_outstanding() const noexcept { return stack_.bytes_outstanding(); }
  result<void> reap_pending() noexcept { return stack_.reap_pending(); }

  /// The driver stream of `id`. Errors: unknown_stream.
  result<typename D::stream_t> stream(StreamId id) const noexcept { return streams_->get(id); }

  // Tracking: present on every runtime, but compiling a call needs a tracking stack.

  template <class S = Stack>
  result<void> record_block_use(const DeviceBlock& block, StreamId use) noexcept {
    static_assert(TrackingResource<S>,
                  "record_block_use needs a stack that tracks cross-stream uses: this stack's "
                  "base resource does not (use AsyncCuda as the base, not DirectCuda)");
    return stack_.record_block_use(block, use);
  }
  template <class S = Stack>
  result<void> prepare_block_use(BlockId id, StreamId use, Access access) noexcept {
    static_assert(TrackingResource<S>,
                  "prepare_block_use needs a stack that tracks cross-stream uses: this stack's "
                  "base resource does not (use AsyncCuda as the base, not DirectCuda)");
    return stack_.prepare_block_use(id, use, access);
  }
  template <class S = Stack>
  result<void> finish_block_use(BlockId id, StreamId use, Access access) noexcept {
    static_assert(TrackingResource<S>,
                  "finish_block_use needs a stack that tracks cross-stream uses: this stack's "
                  "base resource does not (use AsyncCuda as the base, not DirectCuda)");
    return stack_.finish_block_use(id, use, access);
  }

 private:
  static result<DeviceRuntime*> build(std::uint32_t ordinal) noexcept {
    auto drv = D::open();
    if (!drv) return std::move(drv).error();
    auto dev = Device<D>::open(**drv, ordinal);
    if (!dev) return std::move(dev).error();
    auto streams = StreamPool<D>::create(std::move(*dev), DEFAULT_STREAMS);
    if (!streams) return std::move(streams).error();
    auto stack = StackBuilder<Stack>::build(*streams);
    if (!stack) return std::move(stack).error();
    auto* rt = new (std::nothrow) DeviceRuntime(std::move(*streams), std::move(*stack));
    if (!rt) return error{errc::out_of_memory, "host allocation of a DeviceRuntime failed"};
    return rt;  // leaked on purpose: see the class comment
  }

  static std::array<std::mutex, MAX_DEVICE_ORDINALS>& build_locks() noexcept {
    static auto* locks = new std::array<std::mutex, MAX_DEVICE_ORDINALS>;  // leaked, as the runtimes
    return *locks;
  }

  static constexpr auto& table_ = detail::runtime_table<DeviceRuntime>;
  static_assert(std::tuple_size_v<std::remove_reference_t<decltype(table_)>> == MAX_DEVICE_ORDINALS);

  std::shared_ptr<StreamPool<D>> streams_;
  Stack stack_;
};

/// The default stack over driver D, outermost first:
/// - Statistics: per-tag current / peak / cumulative bytes and counts of what the users
///   hold (always on: a few relaxed atomic additions per call);
/// - Logging to a CSV file in RMM's layout, from XLOGRT_LOG_FILE (unset: off, and a
///   disabled FileSink costs one predictable branch), every user allocation and free;
/// - Cached: freed blocks kept on the host and handed out again without a driver call
///   (XLOGRT_CACHE=0: off, every call goes to the pool);
/// - Budget: the per-ordinal byte budget, from XLOGRT_BUDGET_BYTES (unset: no limit),
///   charging every byte the stack holds, cached ones included;
/// - AsyncCuda: stream-ordered allocation from the device's pool with cross-stream use
///   tracking, its release threshold at the maximum (the pool keeps what the cache gives
///   back, as RMM's and PyTorch's caching allocators keep theirs).
template <Driver D>
using DefaultStackOn = Statistics<Logging<Cached<Budget<AsyncCuda<D>>>, FileSink>>;

/// The stack `DeviceRuntime<DefaultStack>::try_get(ordinal)` builds, on the real driver.
using DefaultStack = DefaultStackOn<CudaDriver>;

/// Builds the default stack from the environment. Errors: invalid_argument for a
/// malformed XLOGRT_BUDGET_BYTES or XLOGRT_CACHE, the log file's open error, the base
/// resource's errors.
template <Driver D>
struct StackBuilder<DefaultStackOn<D>> {
  static result<DefaultStackOn<D>> build(const std::shared_ptr<StreamPool<D>>& streams) noexcept {
    auto env = read_env_config();
    if (!env) return std::move(env).error();
    auto base = AsyncCuda<D>::create(streams);
    if (!base) return std::move(base).error();
    FileSink sink;
    if (env->log_file) {
      auto opened = FileSink::open(*env->log_file);
      if (!opened) return std::move(opened).error();
      sink = std::move(*opened);
    }
    BudgetOptions budget;
    budget.limit_bytes = env->budget_bytes;
    CachedOptions cache;
    cache.enabled = env->cache;
    cache.nvtx_marks = env->cache_nvtx;
    using Base = Cached<Budget<AsyncCuda<D>>>;
    return DefaultStackOn<D>(Logging<Base, FileSink>(Base(Budget<AsyncCuda<D>>(std::move(*base), budget), cache),
                                                     std::move(sink)));
  }
};

}  // namespace xlogrt
