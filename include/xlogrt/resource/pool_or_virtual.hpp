// SPDX-License-Identifier: Apache-2.0
#pragma once

// PoolOrVirtual<D>: the default stack's base resource, chosen when the stack is built:
// AsyncCuda (the device's memory pool) or VirtualCuda (virtual memory, pages mapped on
// demand). XLOGRT_BACKEND=auto|pool|vmm picks it (runtime/env_config.hpp; auto, the
// default: VirtualCuda where it can be had).

#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/resource/async_cuda.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/virtual_cuda.hpp"

namespace xlogrt {

namespace detail {
/// What PoolOrVirtual holds for the virtual memory base over a driver without virtual
/// memory: nothing, never constructed.
struct NoVirtualBase {};
template <class D>
struct virtual_base_of {
  using type = NoVirtualBase;
};
template <VirtualMemoryDriver D>
struct virtual_base_of<D> {
  using type = VirtualCuda<D>;
};
}  // namespace detail

/// A base resource that is AsyncCuda or VirtualCuda, as its factory chose, with the
/// contract both have (DriverResource, RecyclingResource, RetiringResource), so the
/// layers above are one type whichever serves them. The stack type of DeviceRuntime is
/// fixed at compile time while the backend is read from the environment: this is the
/// point where the run-time choice enters, at the bottom of the stack, where calls come
/// only on a cache's misses and on tracking.
///
/// Cost: one branch per call on a flag that never changes (predicted), then the chosen
/// base's inlined member. The pool resource is always
/// there: in the virtual memory mode it serves nothing, but it is what upstream() gives,
/// so code written for the pool base (find_layer<AsyncCuda>, its pool() handles) keeps
/// compiling; read the figures of the stack from this layer (bytes_outstanding), which
/// answers for the base that serves.
///
/// Thread-safe, as each of its bases. Move-only.
template <Driver D>
class PoolOrVirtual {
 public:
  using driver_type = D;
  using stream_t = typename D::stream_t;
  using Pool = AsyncCuda<D>;
  using Virtual = typename detail::virtual_base_of<D>::type;
  static constexpr bool supports_block_use_tracking = true;
  /// Whether the driver has the virtual memory calls VirtualCuda needs.
  static constexpr bool has_virtual = VirtualMemoryDriver<D>;

  /// The pool base alone.
  explicit PoolOrVirtual(Pool pool) : pool_(std::move(pool)) {}
  /// The virtual memory base; `idle_pool` is there for upstream() (see the class comment).
  PoolOrVirtual(Pool idle_pool, Virtual virt) requires has_virtual
      : pool_(std::move(idle_pool)), virtual_(std::move(virt)), is_virtual_(true) {}

  bool is_virtual() const noexcept { return is_virtual_; }
  /// The virtual memory base, or null in the pool mode.
  Virtual* virtual_base() noexcept { return is_virtual_ ? &*virtual_ : nullptr; }
  const Virtual* virtual_base() const noexcept { return is_virtual_ ? &*virtual_ : nullptr; }
  /// The pool resource (serving only in the pool mode).
  Pool& upstream() noexcept { return pool_; }
  const Pool& upstream() const noexcept { return pool_; }

#define XLOGRT_POOL_OR_VIRTUAL(call)                        \
  if constexpr (has_virtual) {                              \
    if (is_virtual_) return virtual_->call;                 \
  }                                                         \
  return pool_.call

  [[gnu::always_inline]] result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    XLOGRT_POOL_OR_VIRTUAL(allocate(bytes, stream, tag));
  }
  [[gnu::always_inline]] result<void> deallocate(DeviceBlock&& b) noexcept {
    XLOGRT_POOL_OR_VIRTUAL(deallocate(std::move(b)));
  }
  [[gnu::always_inline]] result<DeviceBlock> recycle_block(DeviceBlock& b, StreamId to,
                                                           Recycle how = Recycle::live) noexcept {
    XLOGRT_POOL_OR_VIRTUAL(recycle_block(b, to, how));
  }
  [[gnu::always_inline]] bool unpark_block(BlockId id, AllocTag tag) noexcept {
    XLOGRT_POOL_OR_VIRTUAL(unpark_block(id, tag));
  }
  std::size_t bytes_outstanding() const noexcept { XLOGRT_POOL_OR_VIRTUAL(bytes_outstanding()); }
  result<void> reap_pending() noexcept { XLOGRT_POOL_OR_VIRTUAL(reap_pending()); }
  result<std::size_t> poll_pending() noexcept { XLOGRT_POOL_OR_VIRTUAL(poll_pending()); }
  std::uint64_t retired_bytes() const noexcept { XLOGRT_POOL_OR_VIRTUAL(retired_bytes()); }
  std::uint32_t device_ordinal() const noexcept { return pool_.device_ordinal(); }

  result<void> record_block_use(const DeviceBlock& block, StreamId use) noexcept {
    XLOGRT_POOL_OR_VIRTUAL(record_block_use(block, use));
  }
  [[gnu::always_inline]] result<void> prepare_block_use(BlockId id, StreamId use, Access access) noexcept {
    XLOGRT_POOL_OR_VIRTUAL(prepare_block_use(id, use, access));
  }
  [[gnu::always_inline]] result<void> finish_block_use(BlockId id, StreamId use, Access access) noexcept {
    XLOGRT_POOL_OR_VIRTUAL(finish_block_use(id, use, access));
  }
#undef XLOGRT_POOL_OR_VIRTUAL

  /// The virtual memory base's trim (its idle physical pages back to the device); the
  /// pool mode reaps and returns 0 (its pool gives memory back by its release threshold).
  result<std::size_t> trim() noexcept {
    if constexpr (has_virtual) {
      if (is_virtual_) return virtual_->trim();
    }
    if (auto r = pool_.reap_pending(); !r) return std::move(r).error();
    return std::size_t{0};
  }

  /// Frees deferred by a capture, not yet queued (tests).
  std::size_t deferred_frees() const {
    if constexpr (has_virtual) {
      if (is_virtual_) return virtual_->deferred_frees();
    }
    return pool_.deferred_frees();
  }
  /// Live blocks of the base that serves (diagnostics and tests).
  std::size_t live_blocks() const {
    if constexpr (has_virtual) {
      if (is_virtual_) return virtual_->live_blocks();
    }
    return pool_.live_blocks();
  }

  D& driver() const noexcept { return pool_.driver(); }
  result<stream_t> stream_handle(StreamId s) const noexcept { return pool_.stream_handle(s); }
  result<void> make_current() const noexcept { return pool_.make_current(); }
  const std::shared_ptr<StreamPool<D>>& streams() const noexcept { return pool_.streams(); }

 private:
  Pool pool_;
  std::optional<Virtual> virtual_;
  bool is_virtual_ = false;
};

}  // namespace xlogrt
