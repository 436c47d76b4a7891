// SPDX-License-Identifier: Apache-2.0
#pragma once

// sample_stack(stack): what a resource stack holds at one moment, by the layer that holds
// it: the base resource's bytes from the device, the idle blocks a caching layer keeps,
// the frees queued on streams and not yet known complete, and the device pools' own
// counters. Logging writes it as sample lines (detail/log_record.hpp), and LiveBlocks
// puts one in its snapshots, so that a log or a dump shows the gap between what the
// users hold and what the device gives the process.
//
// Each figure is found by what a layer can report, not by the layer's name, walking down
// through upstream(): a stack without a cache, or with a base of another kind, reports
// the figures it has and leaves the others out. A figure a layer does not report is
// absent (not zero), so a reader never takes "no cache" for "an empty cache".
//
// - held: the base resource's (the last layer's) bytes_outstanding(). Every resource has
//   it (the DeviceMemoryResource contract); at the base it counts every block the stack
//   has from the device: the users' live blocks, the blocks a cache above keeps, and
//   frees queued until they are known complete.
// - cached: the sum of `stats().cached_bytes` over the layers that have it (Cached).
//   stats() takes the layer's registry lock and walks its caches: a sample costs what a
//   stats() call costs, which is why Logging samples on a clock, not per record.
// - queued: the base's queued_free_bytes() (AsyncCuda); a base whose frees are
//   synchronous (DirectCuda) has none to report.
// - pool_reserved, pool_used: the sums over the base's distinct pools (pool() and
//   small_pool()) of the driver's mempool_usage (CudaDriver: cuMemPoolGetAttribute).
//   Left out while a capture window is open (a global-mode capture may forbid the call).
// - A base that holds a virtual memory base in use (PoolOrVirtual with XLOGRT_BACKEND=vmm:
//   virtual_base() not null) is sampled there instead of through upstream(), the idle
//   pool: held is that base's bytes_outstanding(), pool_reserved its physical pages
//   (mapped and spare), pool_used the bytes its blocks occupy; queued is left out.
//
// The figures are read one after another, not at one instant: under concurrent
// allocation they can disagree by the blocks that moved between the reads. At a quiet
// point (no call in flight) held = live + cached + queued exactly, for a base that
// counts as AsyncCuda does.

#include <concepts>
#include <cstddef>
#include <optional>
#include <utility>

#include "xlogrt/device/capture_windows.hpp"
#include "xlogrt/resource/detail/log_record.hpp"

namespace xlogrt {

/// What a stack held at one moment (see the header comment). Not thread-safe: a value,
/// owned by one thread at a time.
struct StackSample {
  std::optional<std::size_t> held;
  std::optional<std::size_t> cached;
  std::optional<std::size_t> queued;
  std::optional<std::size_t> pool_reserved;
  std::optional<std::size_t> pool_used;
};

namespace detail {

template <class L>
concept ReportsCachedBytes = requires(const L& l) {
  { l.stats().cached_bytes } -> std::convertible_to<std::size_t>;
};

template <class L>
concept ReportsQueuedFrees = requires(const L& l) {
  { l.queued_free_bytes() } -> std::convertible_to<std::size_t>;
};

template <class L>
concept ReportsPoolUsage = requires(const L& l) {
  l.small_pool();
  { l.driver().mempool_usage(l.pool())->reserved } -> std::convertible_to<std::size_t>;
  { l.driver().mempool_usage(l.pool())->used } -> std::convertible_to<std::size_t>;
};

inline void add_to(std::optional<std::size_t>& to, std::size_t v) noexcept { to = to.value_or(0) + v; }

template <class L>
void sample_layer(const L& layer, StackSample& out) noexcept {
  if constexpr (ReportsCachedBytes<L>) {
    try {
      add_to(out.cached, layer.stats().cached_bytes);
    } catch (...) {  // stats() ran out of host memory: this sample goes without the figure
    }
  }
  if constexpr (requires { layer.virtual_base(); }) {
    if (const auto* v = layer.virtual_base()) {
      out.held = v->bytes_outstanding();
      try {
        const auto st = v->stats();
        out.pool_reserved = static_cast<std::size_t>(st.physical_bytes);
        out.pool_used = static_cast<std::size_t>(st.used_bytes);
      } catch (...) {  // its lock failed: this sample goes without the two figures
      }
      return;
    }
  }
  if constexpr (requires { layer.upstream(); }) {
    sample_layer(layer.upstream(), out);
  } else {
    out.held = layer.bytes_outstanding();
    if constexpr (ReportsQueuedFrees<L>) out.queued = layer.queued_free_bytes();
    if constexpr (ReportsPoolUsage<L>) {
      if (!capture_windows_open()) {
        const auto read = [&](auto pool) {
          if (auto u = layer.driver().mempool_usage(pool)) {
            add_to(out.pool_reserved, static_cast<std::size_t>(u->reserved));
            add_to(out.pool_used, static_cast<std::size_t>(u->used));
          }
        };
        read(layer.pool());
        if (layer.small_pool() != layer.pool()) read(layer.small_pool());
      }
    }
  }
}

}  // namespace detail

/// Calls f(action, bytes) for each figure `s` has, in the order of the sample lines:
/// held, cached, queued, pool reserved, pool used.
template <class F>
void for_each_figure(const StackSample& s, F&& f) {
  const std::pair<LogAction, const std::optional<std::size_t>*> figures[] = {
      {LogAction::sample_held, &s.held},
      {LogAction::sample_cached, &s.cached},
      {LogAction::sample_queued, &s.queued},
      {LogAction::sample_pool_reserved, &s.pool_reserved},
      {LogAction::sample_pool_used, &s.pool_used},
  };
  for (const auto& [a, v] : figures) {
    if (*v) f(a, **v);
  }
}

/// The figures `stack` (a resource, or a layer of one: the walk starts there) reports
/// now. Thread-safe as the layers' own readers are; never fails: a figure that cannot be
/// read is left out.
template <class Stack>
StackSample sample_stack(const Stack& stack) noexcept {
  StackSample s;
  detail::sample_layer(stack, s);
  return s;
}

}  // namespace xlogrt
