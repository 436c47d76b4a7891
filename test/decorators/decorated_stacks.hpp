// SPDX-License-Identifier: Apache-2.0
#pragma once

// Stack factories for the conformance suite (test/resource/conformance.hpp) over the
// decorators: each decorated stack must honour the same contract as the base resource
// it wraps. A new decorator adds a factory here and a line in the type list of
// test_sim_stacks.cpp.

#include <memory>

#include <xlogrt/resource/any_resource.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/debug_guard.hpp>
#include <xlogrt/resource/direct_cuda.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/statistics.hpp>

namespace xlogrt::testing {

template <class D>
result<AsyncCuda<D>> make_async(const std::shared_ptr<StreamPool<D>>& s) {
  return AsyncCuda<D>::create(s);
}

template <class D>
struct BudgetAsync {
  using driver = D;
  using type = Budget<AsyncCuda<D>>;
  static constexpr const char* name = "Budget<AsyncCuda>";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return type{std::move(*a)};
  }
};

template <class D>
struct BudgetDirect {
  using driver = D;
  using type = Budget<DirectCuda<D>>;
  static constexpr const char* name = "Budget<DirectCuda>";
  static constexpr const char* alloc_call = "cuMemAlloc";
  static constexpr const char* free_call = "cuMemFree";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return type{DirectCuda<D>(s)}; }
};

template <class D>
struct StatisticsAsync {
  using driver = D;
  using type = Statistics<AsyncCuda<D>>;
  static constexpr const char* name = "Statistics<AsyncCuda>";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return type{std::move(*a)};
  }
};

template <class D>
struct LoggingAsync {
  using driver = D;
  using type = Logging<AsyncCuda<D>, RingSink>;
  static constexpr const char* name = "Logging<AsyncCuda, RingSink>";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return type{std::move(*a), RingSink(1024)};
  }
};

template <class D>
struct DebugGuardAsync {
  using driver = D;
  using type = DebugGuard<AsyncCuda<D>>;
  static constexpr const char* name = "DebugGuard<AsyncCuda>";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return type{std::move(*a)};
  }
};

/// The stack the decorator overhead benchmark measures.
template <class D>
struct FullAsync {
  using driver = D;
  using type = Budget<Statistics<Logging<AsyncCuda<D>, NullSink>>>;
  static constexpr const char* name = "Budget<Statistics<Logging<AsyncCuda, NullSink>>>";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return type{Statistics<Logging<AsyncCuda<D>, NullSink>>{Logging<AsyncCuda<D>, NullSink>{std::move(*a)}}};
  }
};

template <class D>
struct AnyAsync {
  using driver = D;
  using type = AnyResource;
  static constexpr const char* name = "AnyResource{AsyncCuda}";
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    auto a = make_async(s);
    if (!a) return std::move(a).error();
    return AnyResource{std::move(*a)};
  }
};

template <class D>
struct AnyDirect {
  using driver = D;
  using type = AnyResource;
  static constexpr const char* name = "AnyResource{DirectCuda}";
  static constexpr const char* alloc_call = "cuMemAlloc";
  static constexpr const char* free_call = "cuMemFree";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return AnyResource{DirectCuda<D>(s)}; }
};

}  // namespace xlogrt::testing
