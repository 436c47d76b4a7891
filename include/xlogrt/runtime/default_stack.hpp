// SPDX-License-Identifier: Apache-2.0
#pragma once

// The default stack, DefaultStackOn<D> (Statistics over GraphPools over Logging over
// Cached over Budget over PoolOrVirtual: AsyncCuda or VirtualCuda), DefaultStack on the real driver, and the StackBuilder that configures
// it from the environment. `DefaultStackOn<SimDriver>` is nameable once
// <xlogrt/sim/sim_driver.hpp> is included too.

#include <memory>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/cuda_driver.hpp"
#include "xlogrt/resource/async_cuda.hpp"
#include "xlogrt/resource/budget.hpp"
#include "xlogrt/resource/cached.hpp"
#include "xlogrt/runtime/env_config.hpp"
#include "xlogrt/resource/graph_pools.hpp"
#include "xlogrt/resource/logging.hpp"
#include "xlogrt/resource/pool_or_virtual.hpp"
#include "xlogrt/resource/statistics.hpp"
#include "xlogrt/runtime/device_runtime.hpp"

namespace xlogrt {

/// The default stack over driver D, outermost first:
/// - Statistics: per-tag current / peak / cumulative bytes and counts of what the users
///   hold (always on: a few relaxed atomic additions per call);
/// - GraphPools: what a CUDA graph capture allocates comes from a graph pool, never from
///   or back to the cache, and nothing below breaks a capture (outside capture windows: a
///   relaxed load per call);
/// - Logging to a CSV file in RMM's layout, from XLOGRT_LOG_FILE (unset: off, and a
///   disabled FileSink costs one predictable branch), every user allocation and free
///   (a graph pool's: the blocks it takes and gives back);
/// - Cached: freed blocks kept on the host and handed out again without a driver call
///   (XLOGRT_CACHE=0: off, every call goes to the base);
/// - Budget: the device's byte budget, from XLOGRT_BUDGET_BYTES (unset: no limit),
///   charging every byte the stack holds, cached ones included;
/// - PoolOrVirtual, the base, one predictable branch per call at the bottom of the
///   stack choosing between
///   - VirtualCuda, where the driver and the device have virtual memory management
///     (XLOGRT_BACKEND unset, auto or vmm): blocks carved from one reserved address range
///     over physical pages mapped on demand, idle pages given back by trim; the sizes
///     the cache keeps from a region of the range of their own (with the cache off, one
///     region);
///   - AsyncCuda, elsewhere or with XLOGRT_BACKEND=pool: stream-ordered allocation from
///     the device's pool with cross-stream use tracking, its release threshold at the
///     maximum (the pool keeps what the cache gives back, as RMM's and PyTorch's caching
///     allocators keep theirs); the sizes the cache keeps (up to its max_block_bytes)
///     from a second pool of their own, the rest from the device's pool
///     (XLOGRT_CACHE=small_pool_bytes=SIZE sets the bound, 0: one pool; with the cache
///     off, one pool).
template <Driver D>
using DefaultStackOn = Statistics<GraphPools<Logging<Cached<Budget<PoolOrVirtual<D>>>, FileSink>>>;

/// The stack `DeviceRuntime<DefaultStack>::try_get(ordinal)` builds, on the real driver.
using DefaultStack = DefaultStackOn<CudaDriver>;

/// Builds the default stack from the environment. Errors: invalid_argument for a
/// malformed XLOGRT_BUDGET_BYTES, XLOGRT_CACHE or XLOGRT_BACKEND (or vmm over a driver
/// without virtual memory: auto then takes the pool), for cache sizes the layer refuses
/// (CachedOptions), for small_pool_bytes without XLOGRT_BACKEND=pool, or for
/// XLOGRT_CACHE=nvtx in a program that does not include <xlogrt/resource/nvtx_marks.hpp>;
/// the log file's open error; the base resource's errors.
template <Driver D>
struct StackBuilder<DefaultStackOn<D>> {
  static result<DefaultStackOn<D>> build(const std::shared_ptr<StreamPool<D>>& streams) noexcept {
    auto env = read_env_config();
    if (!env) return std::move(env).error();
    CachedOptions cache;
    cache.enabled = env->cache;
    cache.nvtx_marks = env->cache_nvtx;
    const auto& sizes = env->cache_sizes;
    cache.max_block_bytes = sizes.max_block_bytes.value_or(cache.max_block_bytes);
    cache.thread_block_bytes = sizes.thread_block_bytes.value_or(cache.thread_block_bytes);
    cache.bin_bytes = sizes.bin_bytes.value_or(cache.bin_bytes);
    cache.thread_bytes = sizes.thread_bytes.value_or(cache.thread_bytes);
    cache.depot_bytes = sizes.depot_bytes.value_or(cache.depot_bytes);
    auto base = make_base(streams, *env, cache);
    if (!base) return std::move(base).error();
    FileSink sink;
    if (env->log_file) {
      LogSinkOptions options;
      if (env->log_sample_ms) options.sample_every = std::chrono::milliseconds(*env->log_sample_ms);
      auto opened = FileSink::open(*env->log_file, options);  // its messages escape the path
      if (!opened) {
        return error{opened.error().code(), std::string(ENV_LOG_FILE) + ": " + opened.error().message(),
                     opened.error().driver_status()};
      }
      sink = std::move(*opened);
    }
    BudgetOptions budget;
    budget.limit_bytes = env->budget_bytes;
    using Base = Cached<Budget<PoolOrVirtual<D>>>;
    auto cached = Base::create(Budget<PoolOrVirtual<D>>(std::move(*base), budget), cache);
    if (!cached) {
      if (cached.error().code() != errc::invalid_argument) return std::move(cached).error();
      return error{errc::invalid_argument, std::string(ENV_CACHE) + ": " + cached.error().message()};
    }
    using Logged = Logging<Base, FileSink>;
    return DefaultStackOn<D>(GraphPools<Logged>(Logged(std::move(*cached), std::move(sink))));
  }

 private:
  /// The base resource XLOGRT_BACKEND names.
  static result<PoolOrVirtual<D>> make_base(const std::shared_ptr<StreamPool<D>>& streams, const EnvConfig& env,
                                            const CachedOptions& cache) noexcept {
    const auto& sizes = env.cache_sizes;
    if (env.backend != Backend::pool) {
      if (sizes.small_pool_bytes.has_value()) {
        return error{errc::invalid_argument, std::string(ENV_CACHE) +
                                                 ": small_pool_bytes sizes the pool base's second pool; set "
                                                 "XLOGRT_BACKEND=pool with it (the virtual memory base keeps the "
                                                 "cache's sizes in a region of its own)"};
      }
      if constexpr (PoolOrVirtual<D>::has_virtual) {
        // The blocks the cache may keep get a region of their own (their pages apart from
        // the large blocks'); with the cache off, one region.
        VirtualCudaOptions options;
        options.small_block_bytes = cache.enabled ? cache.max_block_bytes : 0;
        auto virt = VirtualCuda<D>::create(streams, options);
        if (virt) {
          // The pool resource stays idle (PoolOrVirtual::upstream), with no pool of its own.
          auto idle = AsyncCuda<D>::create(streams, AsyncCudaOptions{.reserve_events = 0});
          if (!idle) return std::move(idle).error();
          return PoolOrVirtual<D>(std::move(*idle), std::move(*virt));
        }
        // auto: a device without virtual memory management (or an address range it
        // refuses) gets the pool; vmm, named, reports why not.
        if (env.backend == Backend::vmm) return std::move(virt).error();
      } else if (env.backend == Backend::vmm) {
        return error{errc::invalid_argument, std::string(ENV_BACKEND) +
                                                 "=vmm needs a driver with the virtual memory calls "
                                                 "(VirtualMemoryDriver); use pool with this one"};
      }
    }
    // The blocks the cache may keep come from a pool of their own, where they split no
    // free range of the large blocks' pool (design notes, "The caching layer's memory").
    // XLOGRT_CACHE=small_pool_bytes=SIZE names the bound (0: one pool), and a driver that
    // cannot create pools refuses a named one (AsyncCuda::create); the default falls back
    // to one pool where there is no second one to be had.
    AsyncCudaOptions pools;
    const bool named = sizes.small_pool_bytes.has_value();
    if (named) {
      pools.small_pool_bytes = *sizes.small_pool_bytes;
    } else if (cache.enabled && AsyncCuda<D>::creates_pools) {
      pools.small_pool_bytes = cache.max_block_bytes;
    }
    auto base = AsyncCuda<D>::create(streams, pools);
    if (!base && !named && pools.small_pool_bytes != 0) base = AsyncCuda<D>::create(streams, AsyncCudaOptions{});
    if (!base) return std::move(base).error();
    return PoolOrVirtual<D>(std::move(*base));
  }
};

}  // namespace xlogrt
