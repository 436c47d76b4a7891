// SPDX-License-Identifier: Apache-2.0
#pragma once

// Device<D>: one GPU ordinal opened through a driver, with its primary context held for
// the Device's life and the attributes the library needs read once.

#include <cstdint>
#include <memory>
#include <string>

#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/lifetime.hpp"

namespace xlogrt {

/// Attributes read when the device is opened.
struct DeviceInfo {
  std::string name;
  std::size_t total_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int multiprocessors = 0;
  bool memory_pools = false;    ///< stream-ordered allocation (cuMemAllocAsync) available
  bool stream_mem_ops = false;  ///< cuStreamWriteValue32 available
  bool map_host_memory = false;
};

/// An opened device ordinal: its handle, retained primary context, default memory pool
/// and attributes. Shared (std::shared_ptr) by the stream pool, the resources and the
/// runtime built on it, so that it outlives all of them.
///
/// Thread-safe: immutable after open(); make_current() may be called from any thread.
template <Driver D>
class Device {
 public:
  using driver_type = D;

  /// Opens `ordinal` on `driver`. Errors: invalid_ordinal (ordinal >= device count),
  /// no_device / driver errors from the driver, named with the ordinal.
  static result<std::shared_ptr<Device>> open(D& driver, std::uint32_t ordinal) noexcept {
    auto count = driver.device_count();
    if (!count) return std::move(count).error();
    if (ordinal >= static_cast<std::uint32_t>(*count)) {
      return error{errc::invalid_ordinal, "device ordinal " + std::to_string(ordinal) +
                                              " does not exist: the driver reports " +
                                              std::to_string(*count) + " device(s)"};
    }
    auto dev = driver.device_get(static_cast<int>(ordinal));
    if (!dev) return std::move(dev).error();
    auto ctx = driver.primary_ctx_retain(*dev);
    if (!ctx) return std::move(ctx).error();
    std::shared_ptr<Device> d(new (std::nothrow) Device(driver, ordinal, *dev, *ctx));
    if (!d) {
      (void)driver.primary_ctx_release(*dev);
      return error{errc::out_of_memory, "host allocation of a Device failed"};
    }
    if (auto r = d->read_attributes(); !r) return std::move(r).error();
    return d;
  }

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    if (!detail::process_exiting()) (void)driver_->primary_ctx_release(handle_);
  }

  D& driver() const noexcept { return *driver_; }
  std::uint32_t ordinal() const noexcept { return ordinal_; }
  typename D::device_t handle() const noexcept { return handle_; }
  typename D::context_t context() const noexcept { return ctx_; }
  /// The device's default memory pool (valid when info().memory_pools).
  typename D::mempool_t mempool() const noexcept { return pool_; }
  const DeviceInfo& info() const noexcept { return info_; }

  /// Makes the primary context current on the calling thread (cheap when it already is).
  result<void> make_current() const noexcept { return driver_->ctx_make_current(ctx_); }

 private:
  Device(D& driver, std::uint32_t ordinal, typename D::device_t h, typename D::context_t c)
      : driver_(&driver), handle_(h), ctx_(c), ordinal_(ordinal) {}

  result<void> read_attributes() noexcept {
    auto& d = *driver_;
    if (auto r = make_current(); !r) return r;
    auto name = d.device_name(handle_);
    if (!name) return std::move(name).error();
    info_.name = std::move(*name);
    auto total = d.device_total_mem(handle_);
    if (!total) return std::move(total).error();
    info_.total_bytes = *total;
    struct Want {
      DeviceAttr attr;
      int* out;
    };
    int pools = 0, memops = 0, maphost = 0;
    for (Want w : {Want{DeviceAttr::compute_capability_major, &info_.cc_major},
                   Want{DeviceAttr::compute_capability_minor, &info_.cc_minor},
                   Want{DeviceAttr::multiprocessor_count, &info_.multiprocessors},
                   Want{DeviceAttr::memory_pools_supported, &pools},
                   Want{DeviceAttr::stream_mem_ops_supported, &memops},
                   Want{DeviceAttr::can_map_host_memory, &maphost}}) {
      auto v = d.device_attribute(handle_, w.attr);
      if (!v) return std::move(v).error();
      *w.out = *v;
    }
    info_.memory_pools = pools != 0;
    info_.stream_mem_ops = memops != 0;
    info_.map_host_memory = maphost != 0;
    if (info_.memory_pools) {
      auto p = d.device_default_mempool(handle_);
      if (!p) return std::move(p).error();
      pool_ = *p;
    }
    return ok();
  }

  D* driver_;
  typename D::device_t handle_;
  typename D::context_t ctx_;
  typename D::mempool_t pool_{};
  std::uint32_t ordinal_;
  DeviceInfo info_;
};

}  // namespace xlogrt
