// SPDX-License-Identifier: Apache-2.0
#pragma once

// Stack factories for the conformance suite: each names a stack type over a driver D,
// how to build it on a stream pool, and the driver calls its allocate / deallocate make
// (for failure injection). Adding a stack to the suite adds one factory and one line in
// the type list of a TEMPLATE_LIST_TEST_CASE.

#include <memory>

#include <xlogrt/runtime.hpp>

namespace xlogrt::testing {

template <class D>
struct AsyncStack {
  using driver = D;
  using type = AsyncCuda<D>;
  static constexpr const char* name = "AsyncCuda";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return type::create(s); }
};

template <class D>
struct DirectStack {
  using driver = D;
  using type = DirectCuda<D>;
  static constexpr const char* name = "DirectCuda";
  static constexpr const char* alloc_call = "cuMemAlloc";
  static constexpr const char* free_call = "cuMemFree";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return type(s); }
};

/// The default stack (Budget<Statistics<Logging<AsyncCuda>>>), built as try_get builds it.
template <class D>
struct DefaultStackFactory {
  using driver = D;
  using type = DefaultStackOn<D>;
  static constexpr const char* name = "DefaultStack";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return StackBuilder<type>::build(s); }
};

}  // namespace xlogrt::testing
