// SPDX-License-Identifier: Apache-2.0
#pragma once

// The registry of the stacks the tests run: the conformance suite on SimDriver
// (test_conformance_sim.cpp) and on CudaDriver (test_conformance_gpu.cpp) runs every
// stack of AllStacks<D>, and the fuzzer and fault matrix (test/fuzz/stack_harness.hpp)
// name entries of it. A stack is one line, `Entry<Budget<Statistics<AsyncCuda<D>>>>`;
// everything a test needs is derived from the type:
// - `type`, the stack (AnyResource for `Entry<Any<S>>`, which erases an S);
// - `driver` and the driver calls its allocate and deallocate make (`alloc_call`,
//   `free_call`, for failure injection), from the base resource at the bottom;
// - `caches`, whether a caching layer is in the stack (its deallocate then keeps the
//   block, and reaches the driver only to make the stream wait for other streams' uses);
// - `name`, built from the per-layer names below, e.g. "Budget<Statistics<AsyncCuda>>";
// - `make(streams)`, which builds the stack on a stream pool by composing its layers:
//   xlogrt's StackBuilder, as DeviceRuntime::try_get builds a stack (so DefaultStackOn<D>
//   is configured from the environment, as a program's is), unless a layer of the stack
//   needs arguments of its own (Logging's RingSink, AnyResource's erasure): such a layer
//   says here how it is built around its upstream, and every stack containing it is then
//   built layer by layer with it.
// A new layer adds a Layer<> specialisation (its name; its build when it needs
// arguments); a new stack adds one line to AllStacks.

#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include <xlogrt/core/result.hpp>
#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/any_resource.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/cached.hpp>
#include <xlogrt/resource/debug_guard.hpp>
#include <xlogrt/resource/direct_cuda.hpp>
#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/resource/graph_pools.hpp>
#include <xlogrt/resource/live_blocks.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/pool_or_virtual.hpp>
#include <xlogrt/resource/statistics.hpp>
#include <xlogrt/resource/virtual_cuda.hpp>
#include <xlogrt/runtime/default_stack.hpp>
#include <xlogrt/runtime/device_runtime.hpp>

namespace xlogrt::testing {

/// A stack of the registry that erases S behind AnyResource.
template <class S>
struct Any {};

/// A name known at compile time (the fault matrix keeps the names in a constexpr table).
template <std::size_t N>
struct Name {
  char text[N]{};
  constexpr Name() = default;
  constexpr Name(const char (&s)[N]) {  // NOLINT: implicit, from a literal
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

template <std::size_t Out, std::size_t N>
constexpr void append(Name<Out>& out, std::size_t& k, const Name<N>& part) {
  for (std::size_t i = 0; i + 1 < N; ++i) out.text[k++] = part.text[i];
}

/// The parts one after the other.
template <std::size_t... N>
constexpr auto join(const Name<N>&... parts) {
  Name<(N + ... + 0) - sizeof...(N) + 1> out;
  std::size_t k = 0;
  (append(out, k, parts), ...);
  return out;
}

/// What the registry knows of one layer, by specialisation. A decorator names its
/// `upstream` and its `name`; a base resource its `driver`, its driver calls and its name.
/// A layer that cannot be built from its upstream alone also has `wrap(Upstream&&)`.
template <class S>
struct Layer {
  static_assert(sizeof(S) == 0, "stack_registry.hpp: this layer has no Layer<> specialisation (its name)");
};

template <class D>
struct Layer<AsyncCuda<D>> {
  using type = AsyncCuda<D>;
  using driver = D;
  static constexpr Name name{"AsyncCuda"};
  static constexpr const char* alloc_call = "cuMemAllocFromPoolAsync";
  static constexpr const char* free_call = "cuMemFreeAsync";
};

/// Over the virtual memory base, an allocation maps pages (the first one's failure is
/// the allocation's) and a free makes no driver call but the waits for other streams.
template <class D>
struct Layer<VirtualCuda<D>> {
  using type = VirtualCuda<D>;
  using driver = D;
  static constexpr Name name{"VirtualCuda"};
  static constexpr const char* alloc_call = "cuMemMap";
  static constexpr const char* free_call = "cuStreamWaitEvent";
};

/// The default stack's base: its calls are the virtual base's in the default mode
/// (XLOGRT_BACKEND unset, over a driver with virtual memory), which the tests run.
template <class D>
struct Layer<PoolOrVirtual<D>> {
  using type = PoolOrVirtual<D>;
  using driver = D;
  static constexpr Name name{"PoolOrVirtual"};
  static constexpr const char* alloc_call = "cuMemMap";
  static constexpr const char* free_call = "cuStreamWaitEvent";
};

template <class D>
struct Layer<DirectCuda<D>> {
  using type = DirectCuda<D>;
  using driver = D;
  static constexpr Name name{"DirectCuda"};
  static constexpr const char* alloc_call = "cuMemAlloc";
  static constexpr const char* free_call = "cuMemFree";
};

/// A decorator `L<...>` over Up, named `L<` + Up's name + `>` (`close`: what follows
/// Up's name, for layers with more parameters).
template <class S, class Up, Name open, Name close = Name{">"}>
struct Decorator {
  using type = S;
  using upstream = Up;
  static constexpr auto name = join(open, Layer<Up>::name, close);
};

template <class Up>
struct Layer<Budget<Up>> : Decorator<Budget<Up>, Up, Name{"Budget<"}> {};
template <class Up>
struct Layer<Statistics<Up>> : Decorator<Statistics<Up>, Up, Name{"Statistics<"}> {};
template <class Up>
struct Layer<LiveBlocks<Up>> : Decorator<LiveBlocks<Up>, Up, Name{"LiveBlocks<"}> {};
template <class Up>
struct Layer<DebugGuard<Up>> : Decorator<DebugGuard<Up>, Up, Name{"DebugGuard<"}> {};
template <class Up>
struct Layer<Cached<Up>> : Decorator<Cached<Up>, Up, Name{"Cached<"}> {};
template <class Up>
struct Layer<Logging<Up, NullSink>> : Decorator<Logging<Up, NullSink>, Up, Name{"Logging<"}, Name{", NullSink>"}> {};
template <class Up>
struct Layer<Logging<Up, FileSink>> : Decorator<Logging<Up, FileSink>, Up, Name{"Logging<"}, Name{", FileSink>"}> {};

template <class Up>
struct Layer<GraphPools<Up>> : Decorator<GraphPools<Up>, Up, Name{"GraphPools<"}> {};

/// Logging into a ring of 1024 records, which a test can read back.
template <class Up>
struct Layer<Logging<Up, RingSink>> : Decorator<Logging<Up, RingSink>, Up, Name{"Logging<"}, Name{", RingSink>"}> {
  static Logging<Up, RingSink> wrap(Up&& up) { return Logging<Up, RingSink>{std::move(up), RingSink(1024)}; }
};

/// AnyResource erasing a stack S.
template <class S>
struct Layer<Any<S>> {
  using type = AnyResource;
  using upstream = S;
  static constexpr auto name = join(Name{"AnyResource{"}, Layer<S>::name, Name{"}"});
  static AnyResource wrap(S&& s) { return AnyResource{std::move(s)}; }
};

namespace registry {

template <class S>
concept decorator_layer = requires { typename Layer<S>::upstream; };

/// The base resource at the bottom of S.
template <class S>
struct base_of {
  using type = S;
};
template <decorator_layer S>
struct base_of<S> {
  using type = typename base_of<typename Layer<S>::upstream>::type;
};

/// Whether S or a layer below it is a Cached<...>.
template <class S>
constexpr bool caches() {
  if constexpr (xlogrt::detail::is_layer_v<S, Cached>) {
    return true;
  } else if constexpr (decorator_layer<S>) {
    return caches<typename Layer<S>::upstream>();
  } else {
    return false;
  }
}

/// Whether S or a layer below it has its own wrap (and so cannot be left to StackBuilder).
template <class S>
constexpr bool custom() {
  if constexpr (requires { &Layer<S>::wrap; }) {
    return true;
  } else if constexpr (decorator_layer<S>) {
    return custom<typename Layer<S>::upstream>();
  } else {
    return false;
  }
}

template <class S, class D>
result<typename Layer<S>::type> build(const std::shared_ptr<StreamPool<D>>& streams) {
  using T = typename Layer<S>::type;
  if constexpr (!custom<S>()) {
    return StackBuilder<T>::build(streams);
  } else {
    using Up = typename Layer<S>::upstream;
    auto up = build<Up>(streams);
    if (!up) return std::move(up).error();
    if constexpr (requires { &Layer<S>::wrap; }) {
      return Layer<S>::wrap(std::move(*up));
    } else {
      return T(std::move(*up));
    }
  }
}

}  // namespace registry

/// One stack of the registry: S is the stack's type, or Any<S> for S behind AnyResource.
template <class S>
struct Entry {
  using type = typename Layer<S>::type;
  using base = typename registry::base_of<S>::type;
  using driver = typename Layer<base>::driver;
  static constexpr const char* alloc_call = Layer<base>::alloc_call;
  static constexpr const char* free_call = Layer<base>::free_call;
  static constexpr bool caches = registry::caches<S>();
  static constexpr auto name_text = Layer<S>::name;
  static constexpr const char* name = name_text.text;

  static result<type> make(const std::shared_ptr<StreamPool<driver>>& streams) {
    return registry::build<S>(streams);
  }
};

/// Every stack the conformance suite runs, over driver D: the base resources, the
/// caching layer, each decorator over a base, the decorator overhead benchmark's stack,
/// the erased stacks, and the default stack.
template <class D>
using AllStacks = std::tuple<
    Entry<AsyncCuda<D>>,
    Entry<DirectCuda<D>>,
    Entry<Cached<AsyncCuda<D>>>,
    Entry<DefaultStackOn<D>>,
    Entry<Budget<AsyncCuda<D>>>,
    Entry<Budget<DirectCuda<D>>>,
    Entry<Statistics<AsyncCuda<D>>>,
    Entry<Logging<AsyncCuda<D>, RingSink>>,
    Entry<LiveBlocks<AsyncCuda<D>>>,
    Entry<GraphPools<AsyncCuda<D>>>,
    Entry<DebugGuard<AsyncCuda<D>>>,
    Entry<DebugGuard<DirectCuda<D>>>,
    Entry<Budget<Statistics<Logging<AsyncCuda<D>, NullSink>>>>,
    Entry<Any<AsyncCuda<D>>>,
    Entry<Any<DirectCuda<D>>>>;

template <class E, class... All>
constexpr bool registered_in(std::tuple<All...>*) {
  return (std::is_same_v<E, All> || ...);
}

/// Whether every entry of the tuple List is an entry of AllStacks<D>.
template <class List, class D>
inline constexpr bool all_registered = false;
template <class... E, class D>
inline constexpr bool all_registered<std::tuple<E...>, D> =
    (registered_in<E>(static_cast<AllStacks<D>*>(nullptr)) && ...);

}  // namespace xlogrt::testing
