// SPDX-License-Identifier: Apache-2.0
#pragma once

// DeviceRuntime<Stack>: one runtime per GPU ordinal, owning the device, its stream pool
// and a resource stack; StackBuilder, which builds a Stack for DeviceRuntime::try_get.
// The Stack is a compile-time stack, or AnyResource for one chosen at run time.

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/device.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/cuda_driver.hpp"
#include "xlogrt/resource/concepts.hpp"

namespace xlogrt {

namespace detail {
/// The driver of a runtime over Stack: the stack's own (a DriverResource names it), else
/// the real driver (a stack without one, such as AnyResource, whose held stack may
/// run on any driver).
template <class Stack>
struct runtime_driver {
  using type = CudaDriver;
};
template <class Stack>
  requires requires { typename Stack::driver_type; }
struct runtime_driver<Stack> {
  using type = typename Stack::driver_type;
};

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
    static_assert(detail::check_movable_layer<Stack>());  // a result<Stack> moves it out
    if constexpr (requires { { Stack::create(streams) } -> std::same_as<result<Stack>>; }) {
      return Stack::create(streams);
    } else if constexpr (std::is_constructible_v<Stack, std::shared_ptr<StreamPool<D>>>) {
      return Stack(streams);
    } else if constexpr (requires(Stack& s) { s.upstream(); }) {
      using Up = std::remove_cvref_t<decltype(std::declval<Stack&>().upstream())>;
      static_assert(std::is_constructible_v<Stack, Up&&>,
                    "StackBuilder cannot build this stack: specialise xlogrt::StackBuilder<Stack>");
      auto up = StackBuilder<Up>::build(streams);
      if (!up) return std::move(up).error();
      return Stack(std::move(*up));
    } else {
      static_assert(sizeof(Stack) == 0,
                    "StackBuilder cannot build this stack (no create(streams), no constructor from the "
                    "pool, no upstream()): specialise xlogrt::StackBuilder<Stack>, as a "
                    "DeviceRuntime<AnyResource>::try_get needs");
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
/// - `DeviceRuntime<Stack>::create(streams, stack)` around a stream pool and a stack you
///   built: an owned runtime, never stored in (nor looked up from) the singleton table.
///
/// create() is the only public way in: the constructor that takes the parts unchecked is
/// private. A runtime whose stack allocates on another driver, ordinal or stream pool
/// than its own pool's accepts StreamIds that name one device's streams and hands them to
/// a stack that resolves them on another, which enqueues on the wrong device (issue #28,
/// finding 6: stack on ordinal 0, pool on ordinal 1, hazards). The check is a handful of
/// comparisons once per runtime, so it runs in every build: a check in debug builds
/// alone would let a release build make the same mistake silently.
///
/// Lifetime: singletons are leaked on purpose. A runtime outlives every user of it, and
/// destroying one at exit would issue driver calls while libcuda is being torn down.
///
/// Two shared libraries of one process that both include xlogrt share the singletons:
/// the table is an inline variable template, which the toolchain emits
/// as one (vague-linkage, STB_GNU_UNIQUE) object per process as long as the libraries
/// export it, as they do by default. A library built with -fvisibility=hidden gets its
/// own table, hence its own runtime per ordinal (test/runtime/two_lib_main.cpp shows both).
///
/// The driver, D, is the stack's own driver_type. A stack chosen at run time,
/// `DeviceRuntime<AnyResource>`, runs on the real driver unless D names another
/// (`DeviceRuntime<AnyResource, SimDriver>`); the stack it holds must allocate from the
/// runtime's device, which an owned runtime's caller and StackBuilder<AnyResource> see to.
///
/// Thread-safe: every member may be called from any thread (the Stack is thread-safe).
template <DeviceMemoryResource Stack, Driver D = typename detail::runtime_driver<Stack>::type>
class DeviceRuntime {
  static_assert(std::is_same_v<D, typename detail::runtime_driver<Stack>::type> ||
                    !requires { typename Stack::driver_type; },
                "DeviceRuntime<Stack, D>: D must be the stack's own driver_type");
  static_assert(detail::check_movable_layer<Stack>());  // the runtime holds its stack by value

 public:
  using stack_type = Stack;
  using driver_type = D;
  static constexpr std::uint32_t MAX_DEVICE_ORDINALS = 16;
  static constexpr std::size_t DEFAULT_STREAMS = 8;
  static constexpr bool supports_block_use_tracking = Stack::supports_block_use_tracking;

  /// An owned runtime around `stack`: the only public constructor (see the class
  /// comment). `stack` must run on `streams`' driver, device and streams (a runtime's
  /// StreamIds name its pool's streams, and the stack resolves them in its own).
  /// Errors: invalid_argument for a null pool; foreign_block when the stack's driver,
  /// device ordinal or streams are not the pool's (a stack without driver() and
  /// stream_handle(), such as AnyResource, is checked on its ordinal alone).
  static result<DeviceRuntime> create(std::shared_ptr<StreamPool<D>> streams, Stack stack) noexcept {
    if (!streams) return error{errc::invalid_argument, "DeviceRuntime::create: no stream pool"};
    const auto mismatch = [&](const std::string& what) {
      return error{errc::foreign_block, "DeviceRuntime::create: the stack " + what + " (the pool is ordinal " +
                                            std::to_string(streams->device()->ordinal()) + "'s)"};
    };
    if constexpr (DriverResource<Stack>) {
      if (&stack.driver() != &streams->driver()) return mismatch("runs on another driver instance");
    }
    if (stack.device_ordinal() != streams->device()->ordinal()) {
      return mismatch("allocates on ordinal " + std::to_string(stack.device_ordinal()));
    }
    // A stack that does not reach its driver (AnyResource erases it) is checked on its
    // ordinal alone: that its held stack uses this pool is its builder's to see to.
    if constexpr (DriverResource<Stack>) {
      for (std::uint32_t i = 0; i < streams->size(); ++i) {
        auto mine = stack.stream_handle(StreamId{i});
        if (!mine || !(*mine == streams->at(StreamId{i}))) {
          return mismatch("names another stream pool (its stream " + std::to_string(i) + " is not the pool's)");
        }
      }
    }
    return DeviceRuntime(std::move(streams), std::move(stack));
  }

  /// An owned runtime in one call: opens `ordinal` on `driver`, creates `streams` streams,
  /// builds the stack with `make(streams)` (a callable returning result<Stack>; by
  /// default StackBuilder<Stack>::build, which the default stack reads the environment
  /// in) and checks the parts as create() does. Errors: each step's, as it returned it.
  template <class Make>
    requires std::is_invocable_r_v<result<Stack>, Make&, const std::shared_ptr<StreamPool<D>>&>
  static result<DeviceRuntime> open(D& driver, std::uint32_t ordinal, std::size_t streams, Make&& make) noexcept {
    XLOGRT_TRY_ASSIGN(auto pool, StreamPool<D>::open(driver, ordinal, streams));
    XLOGRT_TRY_ASSIGN(auto stack, make(std::as_const(pool)));
    return create(std::move(pool), std::move(stack));
  }
  static result<DeviceRuntime> open(D& driver, std::uint32_t ordinal, std::size_t streams = DEFAULT_STREAMS) noexcept {
    return open(driver, ordinal, streams,
                [](const std::shared_ptr<StreamPool<D>>& pool) { return StackBuilder<Stack>::build(pool); });
  }

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
  /// The parts, unchecked: for create() alone, once it has checked them.
  DeviceRuntime(std::shared_ptr<StreamPool<D>> streams, Stack stack) noexcept
      : streams_(std::move(streams)), stack_(std::move(stack)) {}

  static result<DeviceRuntime*> build(std::uint32_t ordinal) noexcept {
    XLOGRT_TRY_ASSIGN(D* drv, D::open());
    // Checked as an owned runtime is: a StackBuilder specialisation may build its stack
    // on another pool than the one it was given.
    XLOGRT_TRY_ASSIGN(auto checked, open(*drv, ordinal));
    auto* rt = new (std::nothrow) DeviceRuntime(std::move(checked));
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

}  // namespace xlogrt
