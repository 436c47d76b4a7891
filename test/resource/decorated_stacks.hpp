// SPDX-License-Identifier: Apache-2.0
#pragma once

// Stack factories for the conformance suite (conformance.hpp) over the
// decorators: each decorated stack must honour the same contract as the base resource
// it wraps. A new decorator adds a factory here and a line in the type list of
// test_sim_stacks.cpp.

#include <memory>
#include <utility>

#include <xlogrt/resource/any_resource.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/debug_guard.hpp>
#include <xlogrt/resource/direct_cuda.hpp>
#include <xlogrt/resource/live_blocks.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/statistics.hpp>

#include "stacks.hpp"

namespace xlogrt::testing {

template <class D>
struct BudgetAsync : OverAsync<D> {
  using type = Budget<AsyncCuda<D>>;
  static constexpr const char* name = "Budget<AsyncCuda>";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    return OverAsync<D>::wrap(s, [](AsyncCuda<D>&& a) -> type { return type{std::move(a)}; });
  }
};

template <class D>
struct BudgetDirect : OverDirect<D> {
  using type = Budget<DirectCuda<D>>;
  static constexpr const char* name = "Budget<DirectCuda>";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return type{DirectCuda<D>(s)}; }
};

template <class D>
struct StatisticsAsync : OverAsync<D> {
  using type = Statistics<AsyncCuda<D>>;
  static constexpr const char* name = "Statistics<AsyncCuda>";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    return OverAsync<D>::wrap(s, [](AsyncCuda<D>&& a) -> type { return type{std::move(a)}; });
  }
};

template <class D>
struct LoggingAsync : OverAsync<D> {
  using type = Logging<AsyncCuda<D>, RingSink>;
  static constexpr const char* name = "Logging<AsyncCuda, RingSink>";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    return OverAsync<D>::wrap(s, [](AsyncCuda<D>&& a) -> type { return type{std::move(a), RingSink(1024)}; });
  }
};

template <class D>
struct LiveBlocksAsync : OverAsync<D> {
  using type = LiveBlocks<AsyncCuda<D>>;
  static constexpr const char* name = "LiveBlocks<AsyncCuda>";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    return OverAsync<D>::wrap(s, [](AsyncCuda<D>&& a) -> type { return type{std::move(a)}; });
  }
};

template <class D>
struct DebugGuardAsync : OverAsync<D> {
  using type = DebugGuard<AsyncCuda<D>>;
  static constexpr const char* name = "DebugGuard<AsyncCuda>";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    return OverAsync<D>::wrap(s, [](AsyncCuda<D>&& a) -> type { return type{std::move(a)}; });
  }
};

/// The stack the decorator overhead benchmark measures.
template <class D>
struct FullAsync : OverAsync<D> {
  using type = Budget<Statistics<Logging<AsyncCuda<D>, NullSink>>>;
  static constexpr const char* name = "Budget<Statistics<Logging<AsyncCuda, NullSink>>>";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    using Logged = Logging<AsyncCuda<D>, NullSink>;
    return OverAsync<D>::wrap(s, [](AsyncCuda<D>&& a) -> type { return type{Statistics<Logged>{Logged{std::move(a)}}}; });
  }
};

template <class D>
struct AnyAsync : OverAsync<D> {
  using type = AnyResource;
  static constexpr const char* name = "AnyResource{AsyncCuda}";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) {
    return OverAsync<D>::wrap(s, [](AsyncCuda<D>&& a) -> type { return AnyResource{std::move(a)}; });
  }
};

template <class D>
struct AnyDirect : OverDirect<D> {
  using type = AnyResource;
  static constexpr const char* name = "AnyResource{DirectCuda}";
  static result<type> make(const std::shared_ptr<StreamPool<D>>& s) { return AnyResource{DirectCuda<D>(s)}; }
};

}  // namespace xlogrt::testing
