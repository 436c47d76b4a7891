// SPDX-License-Identifier: Apache-2.0
#pragma once

// AnyResource: an owning, type-erased holder of any resource stack, for callers that
// choose the stack at run time. The one place in xlogrt with virtual calls.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"

namespace xlogrt {

/// Holds one stack of any type: `AnyResource any{Budget<AsyncCuda<D>>{...}};`.
///
/// It always has the tracking members (its `supports_block_use_tracking` is true: the
/// members exist, so stacks above it and DeviceRuntime<AnyResource> have them too).
/// Whether the held stack honours them is `tracks_block_uses()`; on a stack that does not
/// track, record_block_use / prepare_block_use / finish_block_use return
/// errc::stream_misuse ("... unsupported ..."), never ok, so a caller that relies on
/// tracking fails loudly instead of racing a free.
///
/// A moved-from AnyResource holds nothing: every call returns invalid_argument and
/// bytes_outstanding() is 0.
///
/// Thread-safe. (As the held stack is; every shipped one is.) Move-only; construction
/// and moves happen-before use.
class AnyResource {
 public:
  static constexpr bool supports_block_use_tracking = true;

  template <DeviceMemoryResource R>
    requires(!std::is_same_v<std::remove_cvref_t<R>, AnyResource>)
  AnyResource(R stack)  // NOLINT: implicit, as std::function is
      : impl_(std::make_unique<Model<R>>(std::move(stack))) {
    static_assert(detail::check_movable_layer<R>());  // the stack is moved into the holder
  }

  AnyResource(AnyResource&&) noexcept = default;
  AnyResource& operator=(AnyResource&&) noexcept = default;

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    if (!impl_) return empty();
    return impl_->allocate(bytes, stream, tag);
  }
  result<void> deallocate(DeviceBlock&& b) noexcept {
    if (!impl_) return empty();
    return impl_->deallocate(std::move(b));
  }
  std::size_t bytes_outstanding() const noexcept { return impl_ ? impl_->bytes_outstanding() : 0; }
  result<void> reap_pending() noexcept {
    if (!impl_) return empty();
    return impl_->reap_pending();
  }
  std::uint32_t device_ordinal() const noexcept { return impl_ ? impl_->device_ordinal() : 0; }

  /// Whether the held stack tracks cross-stream uses (checked before enqueuing work).
  bool tracks_block_uses() const noexcept { return impl_ && impl_->tracks(); }

  /// Errors: stream_misuse when the held stack does not track; the stack's errors.
  result<void> record_block_use(const DeviceBlock& b, StreamId use) noexcept {
    if (!impl_) return empty();
    return impl_->record_block_use(b, use);
  }
  result<void> prepare_block_use(BlockId id, StreamId use, Access a) noexcept {
    if (!impl_) return empty();
    return impl_->prepare_block_use(id, use, a);
  }
  result<void> finish_block_use(BlockId id, StreamId use, Access a) noexcept {
    if (!impl_) return empty();
    return impl_->finish_block_use(id, use, a);
  }

  /// The held stack when it is an R, else nullptr (as std::function::target).
  template <class R>
  R* target() noexcept {
    return impl_ && impl_->type() == typeid(R) ? static_cast<R*>(impl_->get()) : nullptr;
  }
  template <class R>
  const R* target() const noexcept {
    return impl_ && impl_->type() == typeid(R) ? static_cast<const R*>(impl_->get()) : nullptr;
  }

  explicit operator bool() const noexcept { return impl_ != nullptr; }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual result<DeviceBlock> allocate(std::size_t, StreamId, AllocTag) noexcept = 0;
    virtual result<void> deallocate(DeviceBlock&&) noexcept = 0;
    virtual std::size_t bytes_outstanding() const noexcept = 0;
    virtual result<void> reap_pending() noexcept = 0;
    virtual std::uint32_t device_ordinal() const noexcept = 0;
    virtual bool tracks() const noexcept = 0;
    virtual result<void> record_block_use(const DeviceBlock&, StreamId) noexcept = 0;
    virtual result<void> prepare_block_use(BlockId, StreamId, Access) noexcept = 0;
    virtual result<void> finish_block_use(BlockId, StreamId, Access) noexcept = 0;
    virtual const std::type_info& type() const noexcept = 0;
    virtual void* get() noexcept = 0;
  };

  template <class R>
  struct Model final : Concept {
    explicit Model(R&& r) : stack(std::move(r)) {}
    result<DeviceBlock> allocate(std::size_t n, StreamId s, AllocTag t) noexcept override {
      return stack.allocate(n, s, t);
    }
    result<void> deallocate(DeviceBlock&& b) noexcept override { return stack.deallocate(std::move(b)); }
    std::size_t bytes_outstanding() const noexcept override { return stack.bytes_outstanding(); }
    result<void> reap_pending() noexcept override { return stack.reap_pending(); }
    std::uint32_t device_ordinal() const noexcept override { return stack.device_ordinal(); }
    bool tracks() const noexcept override {
      if constexpr (std::is_same_v<R, AnyResource>) {
        return stack.tracks_block_uses();
      } else {
        return TrackingResource<R>;
      }
    }
    result<void> record_block_use(const DeviceBlock& b, StreamId use) noexcept override {
      if constexpr (TrackingResource<R>) {
        return stack.record_block_use(b, use);
      } else {
        return unsupported("record_block_use", use);
      }
    }
    result<void> prepare_block_use(BlockId id, StreamId use, Access a) noexcept override {
      if constexpr (TrackingResource<R>) {
        return stack.prepare_block_use(id, use, a);
      } else {
        return unsupported("prepare_block_use", use);
      }
    }
    result<void> finish_block_use(BlockId id, StreamId use, Access a) noexcept override {
      if constexpr (TrackingResource<R>) {
        return stack.finish_block_use(id, use, a);
      } else {
        return unsupported("finish_block_use", use);
      }
    }
    const std::type_info& type() const noexcept override { return typeid(R); }
    void* get() noexcept override { return &stack; }

    error unsupported(const char* call, StreamId use) const {
      return error{errc::stream_misuse,
                   std::string(call) + " on stream " + std::to_string(use.value) + " of ordinal " +
                       std::to_string(stack.device_ordinal()) +
                       " is unsupported: the stack held by this AnyResource does not track cross-stream "
                       "uses (build it on AsyncCuda), so nothing would keep the block alive for that stream"};
    }

    R stack;
  };

  static error empty() {
    return error{errc::invalid_argument, "this AnyResource holds no stack (it was moved from)"};
  }

  std::unique_ptr<Concept> impl_;
};

static_assert(TrackingResource<AnyResource>);

}  // namespace xlogrt
