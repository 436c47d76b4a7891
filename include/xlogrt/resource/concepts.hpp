// SPDX-License-Identifier: Apache-2.0
#pragma once

// The resource contract (see docs/architecture.md, "The resource contract").
//
// A resource hands out stream-ordered DeviceBlocks of one device ordinal. Resources are
// class templates over their upstream (`Budget<Logging<AsyncCuda<D>>>`): the stack is one
// concrete type, no virtual call, and optional capabilities are detected at compile time.
// Every resource is thread-safe: many threads allocate and free concurrently.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"

namespace xlogrt {

namespace detail {
/// The decorator contract's first rule, checked where a stack is held by value and moved
/// in (DeviceRuntime, Adaptor's upstream, StackBuilder, AnyResource): every layer is
/// move-constructible. One check with one sentence that says what to do, so that a
/// newcomer's decorator with an atomic member fails with it (issue #32) instead of pages
/// of template errors. Statistics and Cached keep their atomics and mutexes behind a
/// std::unique_ptr for this reason: the layer moves, its shared state stays put. (Budget
/// writes its own move constructor instead, which only a layer moved before use may do.)
template <class Layer>
consteval bool check_movable_layer() noexcept {
  static_assert(std::is_move_constructible_v<Layer>,
                "xlogrt: a resource stack layer must be move-constructible (DeviceRuntime, Adaptor and "
                "AnyResource hold the stack by value and move it in); a decorator whose state cannot move "
                "(std::atomic, std::mutex) must hold that state behind a std::unique_ptr, as Statistics does");
  return true;
}
}  // namespace detail

/// allocate(bytes, stream, tag) -> result<DeviceBlock>: the block may be used on `stream`
///   by work enqueued after the call. Errors: zero_bytes, too_large, out_of_memory,
///   unknown_stream, driver errors; an error leaves the accounting unchanged.
/// deallocate(DeviceBlock&&) -> result<void>: stream-ordered free on the block's
///   alloc_stream, after every tracked use. Errors: empty_block, double_free,
///   foreign_block; the block is not freed and the accounting is unchanged.
/// bytes_outstanding(): bytes allocated and not yet known to be freed (a queued async
///   free counts until reap_pending has seen it complete).
/// reap_pending(): waits for queued frees and retires them; no-op when synchronous.
/// device_ordinal(): the ordinal every block of this resource belongs to.
/// supports_block_use_tracking: whether the stack has the TrackingResource members.
template <class R>
concept DeviceMemoryResource =
    requires(R& r, const R& cr, std::size_t n, StreamId s, AllocTag t, DeviceBlock&& b) {
      { r.allocate(n, s, t) } -> std::same_as<result<DeviceBlock>>;
      { r.deallocate(std::move(b)) } -> std::same_as<result<void>>;
      { cr.bytes_outstanding() } -> std::same_as<std::size_t>;
      { r.reap_pending() } -> std::same_as<result<void>>;
      { cr.device_ordinal() } -> std::same_as<std::uint32_t>;
      { R::supports_block_use_tracking } -> std::convertible_to<bool>;
    };

/// A stack that keeps a block alive until every stream that used it is done.
/// record_block_use(block, use): work touching the block was enqueued on `use`.
/// prepare_block_use(id, use, access): call BEFORE enqueuing on `use`; makes `use` wait
///   for the hazards `access` implies on other streams.
/// finish_block_use(id, use, access): call AFTER enqueuing; records an event on `use`.
/// Errors: stale_block (the id's block was freed), foreign_block, unknown_stream.
template <class R>
concept TrackingResource =
    DeviceMemoryResource<R> && R::supports_block_use_tracking &&
    requires(R& r, const DeviceBlock& b, BlockId id, StreamId s, Access a) {
      { r.record_block_use(b, s) } -> std::same_as<result<void>>;
      { r.prepare_block_use(id, s, a) } -> std::same_as<result<void>>;
      { r.finish_block_use(id, s, a) } -> std::same_as<result<void>>;
    };

/// What a recycle starts from and leaves (RecyclingResource). A *parked* block is one a
/// caching layer holds between two owners: live upstream, but every use, free or recycle
/// of its id by anyone else is refused, as for a freed block, until the layer unparks it
/// for its next owner; so a free forged with the id the layer holds gives the block no
/// second owner.
enum class Recycle : std::uint8_t {
  live,    ///< a live block (the caller's) to a live block
  park,    ///< a live block (a user's, freed) to a parked one, which the caller holds
  parked,  ///< a parked block (the caller's) to a parked one (moved to another stream)
};

/// A stack whose blocks can be reused without a free and a new allocation, which a
/// caching layer needs (see AsyncCuda::recycle_block for the contract).
/// recycle_block(b, to, how): ends b's life as deallocate would (b checked as a free
///   checks it, uses on other streams ordered before its alloc stream, its id stale) and
///   returns the memory as a new block on `to`, under b's tag, parked or not as `how`
///   says. On error b stays with the caller, as it was.
/// unpark_block(id, tag): the parked block `id`, held by the caller, goes to its next
///   owner under `tag`: live again under the same id, to be freed or recycled under
///   `tag` (a free under any other tag is refused as forged). False, changing nothing,
///   when `id` names no parked block.
template <class R>
concept RecyclingResource =
    TrackingResource<R> && requires(R& r, DeviceBlock& b, StreamId s, BlockId id, AllocTag t, Recycle how) {
      { r.recycle_block(b, s, how) } -> std::same_as<result<DeviceBlock>>;
      { r.unpark_block(id, t) } noexcept -> std::same_as<bool>;
    };

/// A resource that reaches the driver: base resources (DirectCuda, AsyncCuda) have it,
/// and decorators forward it. DebugGuard needs it to write guard bytes on a stream.
/// driver(): the driver; stream_handle(id): the driver stream of a StreamId;
/// make_current(): makes the device's context current on the calling thread.
template <class R>
concept DriverResource =
    DeviceMemoryResource<R> && requires(R& r, StreamId s) {
      typename R::driver_type;
      { r.driver() } -> std::same_as<typename R::driver_type&>;
      { r.stream_handle(s) } -> std::same_as<result<typename R::driver_type::stream_t>>;
      { r.make_current() } -> std::same_as<result<void>>;
    };

/// A resource that retires queued frees without waiting (AsyncCuda): poll_pending()
/// retires what the device has been seen to reach and returns its bytes; retired_bytes()
/// is the running total of every retirement, reap_pending's included. Budget credits a
/// free when such an upstream retires it, so it never has to reap to see memory the
/// device already has back.
template <class R>
concept RetiringResource = requires(R& r, const R& cr) {
  { r.poll_pending() } -> std::same_as<result<std::size_t>>;
  { cr.retired_bytes() } -> std::same_as<std::uint64_t>;
};

/// An upstream whose deallocate returns only once the memory is back with the driver
/// (cuMemFree, not cuMemFreeAsync) may say so with
/// `static constexpr bool frees_synchronously = true;`. Budget then credits a free at
/// once instead of at the next reap_pending. Decorators forward the flag.
template <class R>
concept SynchronousFree = requires { requires static_cast<bool>(R::frees_synchronously); };

}  // namespace xlogrt
