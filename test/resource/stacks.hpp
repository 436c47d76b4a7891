// SPDX-License-Identifier: Apache-2.0
#pragma once

// Stack factories for the conformance suite: each names a stack type over a driver D,
// how to build it on a stream pool, and the driver calls its allocate / deallocate make
// (for failure injection). Adding a stack to the suite adds one factory and one line in
// the type list of a TEMPLATE_LIST_TEST_CASE.

#include <memory>
#include <utility>

#include <xlogrt/runtime.hpp>

namespace xlogrt::testing {

template <class D>
result<AsyncCuda<D>> make_async(const std::shared_ptr<StreamPool<D>>& s) {
  return AsyncCuda<D>::create(s);
}

/// What the stacks over DirectCuda share: the driver and the calls a failure is injected into.
template <class D>
struct OverDirect {
  using driver = D;
  static constexpr const char* alloc_call = "cuMemAlloc";
  static constexpr const char* free_call = "cuMemFree";
  static constexpr bool caches = false;
};

/// What the stacks over AsyncCuda share: the driver, the calls a failure is injected
/// into, and building the stack from a new AsyncCuda with `f`.
template <class D>
struct OverAsync {
  using driver = D;
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  /// Whether deallocate keeps the block (a caching layer): its free then reaches the
  /// driver only to make the stream wait for uses on other streams.
  static constexpr bool caches = false;
  template <class F>
  static auto wrap(const std::shared_ptr<StreamPool<D>>& s, F&& f) -> result<decltype(f(std::declval<AsyncCuda<D>>()))> {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return f(std::move(*a));
  }
};

template <class D>
struct AsyncStack : OverAsync<D> {
  using type = AsyncCuda<D>;
  static constexpr const char* name = "AsyncCuda";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return type::create(s); }
};

template <class D>
struct DirectStack : OverDirect<D> {
  using type = DirectCuda<D>;
  static constexpr const char* name = "DirectCuda";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return type(s); }
};

/// The caching layer bare, over AsyncCuda.
template <class D>
struct CachedStack : OverAsync<D> {
  using type = Cached<AsyncCuda<D>>;
  static constexpr const char* name = "Cached<AsyncCuda>";
  static constexpr bool caches = true;
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return type(std::move(*a));
  }
};

/// The default stack (Statistics<Logging<Cached<Budget<AsyncCuda>>>>), built as try_get
/// builds it.
template <class D>
struct DefaultStackFactory : OverAsync<D> {
  static constexpr bool caches = true;
  using type = DefaultStackOn<D>;
  static constexpr const char* name = "DefaultStack";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return StackBuilder<type>::build(s); }
};

}  // namespace xlogrt::testing
