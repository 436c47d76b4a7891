// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's Driver-concept entry points for devices and contexts: counting and naming
// devices, their attributes, retaining and releasing the primary context, making a
// context current, and mem_get_info.
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- Driver concept: devices and contexts -------------------------------------------------

inline result<int> SimDriver::device_count() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_count)) return *e;
  return static_cast<int>(devices_.size());
}

inline result<SimDriver::device_t> SimDriver::device_get(int ordinal) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_get)) return *e;
  auto d = device_locked(Call::device_get, ordinal);
  if (!d) return std::move(d).error();
  return ordinal;
}

inline result<std::string> SimDriver::device_name(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_name)) return *e;
  auto d = device_locked(Call::device_name, dev);
  if (!d) return std::move(d).error();
  return "xlogrt SimDriver device " + std::to_string(dev);
}

inline result<std::size_t> SimDriver::device_total_mem(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_total_mem)) return *e;
  auto d = device_locked(Call::device_total_mem, dev);
  if (!d) return std::move(d).error();
  return static_cast<std::size_t>(memory_bytes_);
}

inline result<int> SimDriver::device_attribute(device_t dev, DeviceAttr attr) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_attribute)) return *e;
  auto d = device_locked(Call::device_attribute, dev);
  if (!d) return std::move(d).error();
  switch (attr) {
    case DeviceAttr::memory_pools_supported: return cfg_.memory_pools_supported ? 1 : 0;
    case DeviceAttr::stream_mem_ops_supported: return cfg_.stream_mem_ops_supported ? 1 : 0;
    case DeviceAttr::can_map_host_memory: return cfg_.can_map_host_memory ? 1 : 0;
    case DeviceAttr::compute_capability_major: return cfg_.compute_capability_major;
    case DeviceAttr::compute_capability_minor: return cfg_.compute_capability_minor;
    case DeviceAttr::multiprocessor_count: return cfg_.multiprocessor_count;
  }
  // The caller's mistake, not a driver status: refused as CudaDriver refuses it.
  return error{errc::invalid_argument,
               "device_attribute: DeviceAttr value " + std::to_string(static_cast<int>(attr)) +
                   " is not one SimDriver knows; pass a named DeviceAttr"};
}

inline result<SimDriver::context_t> SimDriver::primary_ctx_retain(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::primary_ctx_retain)) return *e;
  auto d = device_locked(Call::primary_ctx_retain, dev);
  if (!d) return std::move(d).error();
  ++(*d)->ctx.retains;
  return &(*d)->ctx;
}

inline result<void> SimDriver::primary_ctx_release(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::primary_ctx_release)) return *e;
  auto d = device_locked(Call::primary_ctx_release, dev);
  if (!d) return std::move(d).error();
  Device& device = **d;
  if (device.ctx.retains == 0) {
    return fail(Call::primary_ctx_release, status::invalid_context,
                "releasing the primary context of device " + std::to_string(dev) +
                    " more often than it was retained");
  }
  if (--device.ctx.retains == 0) reset_device_locked(device, lk);
  return ok();
}

inline result<void> SimDriver::ctx_make_current(context_t ctx) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::ctx_make_current)) return *e;
  detail::sim::Current& cur = detail::sim::current();
  if (ctx == nullptr) {
    if (cur.driver == serial_) cur = detail::sim::Current{};
    return ok();
  }
  bool ours = false;
  for (const auto& d : devices_) ours = ours || &d->ctx == ctx;
  if (!ours) {
    return fail(Call::ctx_make_current, status::invalid_context,
                "making current a context that is not a primary context of this simulator");
  }
  if (ctx->retains == 0) {
    return fail(Call::ctx_make_current, status::invalid_context,
                "making current the primary context of device " +
                    std::to_string(ctx->device->ordinal) + ", which is not retained");
  }
  cur = detail::sim::Current{serial_, ctx, ctx->generation};
  return ok();
}

inline result<MemInfo> SimDriver::mem_get_info() noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mem_get_info)) return *e;
  auto d = current_device_locked(Call::mem_get_info);
  if (!d) return std::move(d).error();
  const Device& dev = **d;
  return MemInfo{static_cast<std::size_t>(memory_bytes_ - dev.mem.allocated - dev.mem.pending -
                                          dev.mem.graph_reserved - dev.mem.physical),
                 static_cast<std::size_t>(memory_bytes_)};
}

}  // namespace xlogrt
