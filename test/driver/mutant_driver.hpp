// SPDX-License-Identifier: Apache-2.0
#pragma once

// Test-only drivers that break one promise of the Driver concept each, so that the
// conformance suite can be shown to catch it (test_driver_conformance_sim.cpp).
//
// MutantDriver<B> forwards every member to SimDriver::open()'s instance, except the one
// that breakage B changes. MutantDriver<Break::none> changes nothing: it passes the
// whole suite, which shows that what the suite catches in a mutant is the breakage and
// not the wrapper. Each breakage is a plausible driver bug, kept legal in every other
// respect (it returns results of the right shape, and frees what it creates).

#include <cstddef>
#include <cstdint>
#include <string>

#include <xlogrt/driver/concept.hpp>
#include <xlogrt/sim/sim_driver.hpp>

namespace xlogrt::drvtest {

enum class Break : std::uint8_t {
  none,
  /// event_record marks the event on an idle stream of its own: reached at once, not
  /// when the recording stream gets there.
  event_record_early,
  /// stream_wait_event returns success and orders nothing.
  wait_ignored,
  /// memcpy_dtoh_async copies at once, ahead of the stream's earlier work.
  dtoh_ignores_stream_order,
  /// mem_free_async frees at once (on a stream of its own, synchronised) instead of when
  /// its stream gets there.
  free_not_stream_ordered,
  /// event_query of a null event handle answers "reached" instead of refusing it.
  null_event_accepted,
  /// stream_get_id returns one id for every stream.
  constant_stream_id,
  /// device_attribute answers 0 for an attribute it does not know.
  unknown_attribute_is_zero,
  /// ctx_synchronize returns success at once, waiting for nothing.
  ctx_synchronize_ignored,
  /// mem_set_access returns success and grants nothing.
  set_access_ignored,
  /// mem_unmap returns success and leaves the mapping (and the memory it holds) in place.
  unmap_ignored,
};

template <Break B>
class MutantDriver {
 public:
  using S = SimDriver;
  using device_t = S::device_t;
  using context_t = S::context_t;
  using stream_t = S::stream_t;
  using event_t = S::event_t;
  using mempool_t = S::mempool_t;
  using phys_t = S::phys_t;
  static constexpr const char* kind = "sim";

  static result<MutantDriver*> open() noexcept {
    auto sim = SimDriver::open();
    if (!sim) return std::move(sim).error();
    static MutantDriver instance(**sim);
    return &instance;
  }

  result<int> device_count() noexcept { return d_.device_count(); }
  result<device_t> device_get(int i) noexcept { return d_.device_get(i); }
  result<std::string> device_name(device_t dev) noexcept { return d_.device_name(dev); }
  result<std::size_t> device_total_mem(device_t dev) noexcept { return d_.device_total_mem(dev); }
  result<int> device_attribute(device_t dev, DeviceAttr a) noexcept {
    if constexpr (B == Break::unknown_attribute_is_zero) {
      if (static_cast<int>(a) > static_cast<int>(DeviceAttr::multiprocessor_count)) return 0;
    }
    return d_.device_attribute(dev, a);
  }
  result<context_t> primary_ctx_retain(device_t dev) noexcept { return d_.primary_ctx_retain(dev); }
  result<void> primary_ctx_release(device_t dev) noexcept { return d_.primary_ctx_release(dev); }
  result<void> ctx_make_current(context_t c) noexcept { return d_.ctx_make_current(c); }
  result<MemInfo> mem_get_info() noexcept { return d_.mem_get_info(); }

  result<stream_t> stream_create() noexcept { return d_.stream_create(); }
  result<void> stream_destroy(stream_t s) noexcept { return d_.stream_destroy(s); }
  result<void> stream_synchronize(stream_t s) noexcept { return d_.stream_synchronize(s); }
  result<bool> stream_query(stream_t s) noexcept { return d_.stream_query(s); }
  result<std::uint64_t> stream_get_id(stream_t s) noexcept {
    if constexpr (B == Break::constant_stream_id) {
      auto id = d_.stream_get_id(s);
      if (!id) return id;
      return std::uint64_t{7};
    }
    return d_.stream_get_id(s);
  }
  result<void> stream_wait_event(stream_t s, event_t e) noexcept {
    if constexpr (B == Break::wait_ignored) return ok();
    return d_.stream_wait_event(s, e);
  }
  result<event_t> event_create() noexcept { return d_.event_create(); }
  result<void> event_destroy(event_t e) noexcept { return d_.event_destroy(e); }
  result<void> event_record(event_t e, stream_t s) noexcept {
    if constexpr (B == Break::event_record_early) {
      return on_own_stream([&](stream_t own) { return d_.event_record(e, own); });
    }
    return d_.event_record(e, s);
  }
  result<bool> event_query(event_t e) noexcept {
    if constexpr (B == Break::null_event_accepted) {
      if (e == nullptr) return true;
    }
    return d_.event_query(e);
  }
  result<void> event_synchronize(event_t e) noexcept { return d_.event_synchronize(e); }

  result<mempool_t> device_default_mempool(device_t dev) noexcept {
    return d_.device_default_mempool(dev);
  }
  result<void> mempool_set_release_threshold(mempool_t p, std::uint64_t v) noexcept {
    return d_.mempool_set_release_threshold(p, v);
  }
  result<std::uint64_t> mem_alloc_async(std::size_t n, mempool_t p, stream_t s) noexcept {
    return d_.mem_alloc_async(n, p, s);
  }
  result<void> mem_free_async(std::uint64_t ptr, stream_t s) noexcept {
    if constexpr (B == Break::free_not_stream_ordered) {
      return on_own_stream([&](stream_t own) { return d_.mem_free_async(ptr, own); });
    }
    return d_.mem_free_async(ptr, s);
  }
  result<std::uint64_t> mem_alloc(std::size_t n) noexcept { return d_.mem_alloc(n); }
  result<void> mem_free(std::uint64_t ptr) noexcept { return d_.mem_free(ptr); }
  result<void*> mem_host_alloc_mapped(std::size_t n) noexcept { return d_.mem_host_alloc_mapped(n); }
  result<std::uint64_t> mem_host_device_pointer(void* h) noexcept {
    return d_.mem_host_device_pointer(h);
  }
  result<void> mem_host_free(void* h) noexcept { return d_.mem_host_free(h); }

  result<void> memset_d8_async(std::uint64_t dst, std::uint8_t v, std::size_t n, stream_t s) noexcept {
    return d_.memset_d8_async(dst, v, n, s);
  }
  result<void> memcpy_htod_async(std::uint64_t dst, const void* src, std::size_t n,
                                 stream_t s) noexcept {
    return d_.memcpy_htod_async(dst, src, n, s);
  }
  result<void> memcpy_dtoh_async(void* dst, std::uint64_t src, std::size_t n, stream_t s) noexcept {
    if constexpr (B == Break::dtoh_ignores_stream_order) {
      return on_own_stream([&](stream_t own) { return d_.memcpy_dtoh_async(dst, src, n, own); });
    }
    return d_.memcpy_dtoh_async(dst, src, n, s);
  }
  result<void> memcpy_dtod_async(std::uint64_t dst, std::uint64_t src, std::size_t n,
                                 stream_t s) noexcept {
    return d_.memcpy_dtod_async(dst, src, n, s);
  }
  result<void> stream_write_value32(stream_t s, std::uint64_t dst, std::uint32_t v) noexcept {
    return d_.stream_write_value32(s, dst, v);
  }
  result<void> launch_host_func(stream_t s, HostFn fn, void* arg) noexcept {
    return d_.launch_host_func(s, fn, arg);
  }
  result<CaptureInfo> stream_capture_info(stream_t s) noexcept { return d_.stream_capture_info(s); }
  result<CaptureMode> exchange_capture_mode(CaptureMode m) noexcept {
    return d_.exchange_capture_mode(m);
  }
  result<void> ctx_synchronize() noexcept {
    if constexpr (B == Break::ctx_synchronize_ignored) return ok();
    return d_.ctx_synchronize();
  }
  std::string status_name(int s) const { return d_.status_name(s); }

  result<AllocationGranularity> mem_granularity(device_t dev) noexcept {
    return d_.mem_granularity(dev);
  }
  result<std::uint64_t> mem_address_reserve(std::size_t n, std::size_t align) noexcept {
    return d_.mem_address_reserve(n, align);
  }
  result<void> mem_address_free(std::uint64_t va, std::size_t n) noexcept {
    return d_.mem_address_free(va, n);
  }
  result<phys_t> mem_create(std::size_t n, device_t dev) noexcept { return d_.mem_create(n, dev); }
  result<void> mem_release(phys_t h) noexcept { return d_.mem_release(h); }
  result<void> mem_map(std::uint64_t va, std::size_t n, phys_t h) noexcept {
    return d_.mem_map(va, n, h);
  }
  result<void> mem_unmap(std::uint64_t va, std::size_t n) noexcept {
    if constexpr (B == Break::unmap_ignored) return ok();
    return d_.mem_unmap(va, n);
  }
  result<void> mem_set_access(std::uint64_t va, std::size_t n, device_t dev) noexcept {
    if constexpr (B == Break::set_access_ignored) return ok();
    return d_.mem_set_access(va, n, dev);
  }

 private:
  explicit MutantDriver(SimDriver& d) noexcept : d_(d) {}

  // Runs `op` on a fresh stream of the current context, waits for it, destroys it.
  template <class Op>
  result<void> on_own_stream(Op op) noexcept {
    auto own = d_.stream_create();
    if (!own) return std::move(own).error();
    auto r = op(*own);
    auto synced = d_.stream_synchronize(*own);
    (void)d_.stream_destroy(*own);
    if (!r) return r;
    return synced;
  }

  SimDriver& d_;
};

static_assert(Driver<MutantDriver<Break::none>>);
static_assert(VirtualMemoryDriver<MutantDriver<Break::none>>);

}  // namespace xlogrt::drvtest
