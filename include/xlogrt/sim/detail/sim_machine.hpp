// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's machine: construction (the address layout: one reservation that holds each
// device's window with an unbacked guard gap after it, and the mapped host window above
// them; the virtual memory window is reserved apart, on first use), destruction, the
// process-wide instance, and what every entry point starts with:
// entering a call (counting it, failing an injected one), validating handles against
// this driver and their context's generation, and translating simulated addresses to
// the host bytes behind them.
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- construction ----------------------------------------------------------------------

inline SimDriver::SimDriver(SimConfig config) noexcept
    : cfg_(config),
      serial_(detail::sim::next_driver_serial()),
      sched_(config.seed),
      checker_(config.max_hazards) {
  detail::arm_exit_guard();
  streams_.emplace_back();  // id 0: the host pseudo-stream
  auto refuse = [&](int s, const std::string& why) {
    init_error_ = status::driver_failure(s, "cuInit", status_name(s), why);
  };
  if (cfg_.devices < 1 || cfg_.devices > 64) {
    refuse(status::invalid_value,
           "configuring the simulator: SimConfig::devices must be 1..64, got " +
               std::to_string(cfg_.devices));
    return;
  }
  if (cfg_.memory_bytes == 0 || cfg_.memory_bytes > (std::uint64_t{1} << 46)) {
    refuse(status::invalid_value,
           "configuring the simulator: SimConfig::memory_bytes must be 1 byte to 64 TiB, got " +
               std::to_string(cfg_.memory_bytes));
    return;
  }
  if (cfg_.executor == SimExecutor::threaded && cfg_.worker_threads == 0) {
    refuse(status::invalid_value,
           "configuring the simulator: threaded mode needs SimConfig::worker_threads >= 1");
    return;
  }
  if (const long page = ::sysconf(_SC_PAGESIZE); page > 0) {
    page_bytes_ = static_cast<std::uint64_t>(page);
  }
  const std::uint64_t g = cfg_.vmm_granularity;
  if (g < page_bytes_ || g > (std::uint64_t{1} << 30) || (g & (g - 1)) != 0) {
    refuse(status::invalid_value,
           "configuring the simulator: SimConfig::vmm_granularity must be a power of two from "
           "the host page size (" + std::to_string(page_bytes_) + ") to 1 GiB, got " +
               std::to_string(g));
    return;
  }
  if (cfg_.vmm_recommended_granularity == 0 || cfg_.vmm_recommended_granularity % g != 0) {
    refuse(status::invalid_value,
           "configuring the simulator: SimConfig::vmm_recommended_granularity must be a "
           "multiple of vmm_granularity (" + std::to_string(g) + "), got " +
               std::to_string(cfg_.vmm_recommended_granularity));
    return;
  }
  if (cfg_.vmm_address_bytes % g != 0 || cfg_.vmm_address_bytes > (std::uint64_t{1} << 46)) {
    refuse(status::invalid_value,
           "configuring the simulator: SimConfig::vmm_address_bytes must be a multiple of "
           "vmm_granularity (" + std::to_string(g) + ") up to 64 TiB, got " +
               std::to_string(cfg_.vmm_address_bytes));
    return;
  }
  memory_bytes_ = round_up(cfg_.memory_bytes, alloc_granularity);
  // Each device window is followed by an unbacked guard gap, so running off the end of
  // one device faults instead of landing in the next.
  stride_ = round_up(memory_bytes_, window_align) + window_align;
  const std::uint64_t host_window =
      round_up(std::max<std::uint64_t>(cfg_.host_mapped_bytes, alloc_granularity), window_align);
  const std::uint64_t total = stride_ * static_cast<std::uint64_t>(cfg_.devices) + host_window;
  auto res = detail::sim::Mapping::create(total, false);
  if (!res) {
    refuse(status::out_of_memory, "reserving " + std::to_string(total) +
                                      " bytes of address space for the simulated devices");
    return;
  }
  reservation_ = std::move(*res);
  host_.open(reservation_.address() + stride_ * static_cast<std::uint64_t>(cfg_.devices),
             host_window);
  for (int d = 0; d < cfg_.devices; ++d) {
    auto dev = std::make_unique<Device>();
    auto storage = detail::sim::Mapping::create(memory_bytes_, true);
    if (!storage) {
      refuse(status::out_of_memory, "mapping " + std::to_string(memory_bytes_) +
                                        " bytes for simulated device " + std::to_string(d));
      devices_.clear();
      return;
    }
    dev->ordinal = d;
    dev->mem.storage = std::move(*storage);
    dev->mem.base = reservation_.address() + stride_ * static_cast<std::uint64_t>(d);
    dev->mem.space = detail::sim::RangeAllocator(memory_bytes_);
    dev->ctx.device = dev.get();
    dev->pool.device = dev.get();
    auto legacy = std::make_unique<Stream>();
    legacy->owner = this;
    legacy->device = dev.get();
    legacy->id = static_cast<std::uint32_t>(streams_.size());
    legacy->api_id = legacy->id;
    legacy->legacy = true;
    dev->legacy = legacy.get();
    streams_.push_back(std::move(legacy));
    devices_.push_back(std::move(dev));
  }
  if (cfg_.executor == SimExecutor::threaded) {
    try {
      for (unsigned i = 0; i < cfg_.worker_threads; ++i)
        workers_.emplace_back([this] { worker(); });
    } catch (...) {
      {
        Lock lk(mu_);
        stop_ = true;
      }
      work_cv_.notify_all();
      for (auto& t : workers_) t.join();
      workers_.clear();
      refuse(status::out_of_memory, "starting the simulator's executor threads");
    }
  }
}

inline SimDriver::~SimDriver() {
  {
    Lock lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

inline result<SimDriver*> SimDriver::open() noexcept {
  detail::arm_exit_guard();
  // Leaked on purpose, like every process-wide runtime object: runtimes built on it
  // are leaked too and may still be used by static destructors and atexit handlers,
  // and its executor threads must not be joined while the process exits.
  static SimDriver* const instance = new (std::nothrow) SimDriver(SimConfig{});
  if (instance == nullptr) {
    return status::driver_failure(status::out_of_memory, "cuInit", {},
                                  "allocating the process-wide simulator");
  }
  if (instance->init_error_) return *instance->init_error_;
  return instance;
}

// --- small helpers -----------------------------------------------------------------------

inline std::string SimDriver::status_name(int s) const {
  std::string_view n = status::name(s);
  if (!n.empty()) return std::string(n);
  return "CUDA_ERROR_" + std::to_string(s);
}

inline std::optional<error> SimDriver::enter_locked(Call c) {
  faults_.count(c);
  if (detail::process_exiting()) {
    return fail(c, status::deinitialized,
                "the process is exiting: the simulator makes no further call");
  }
  if (init_error_) return *init_error_;
  if (auto in = faults_.injected(c)) return fail(c, in->status, in->why);
  return std::nullopt;
}

inline result<SimDriver::Device*> SimDriver::device_locked(Call c, device_t d) const {
  if (d < 0 || d >= static_cast<int>(devices_.size())) {
    return fail(c, status::invalid_device,
                "looking up device " + std::to_string(d) + ": the simulator has " +
                    std::to_string(devices_.size()) + " devices");
  }
  return devices_[static_cast<std::size_t>(d)].get();
}

inline result<SimDriver::Device*> SimDriver::current_device_locked(Call c) const {
  const detail::sim::Current& cur = detail::sim::current();
  if (cur.driver != serial_ || cur.ctx == nullptr) {
    return fail(c, status::invalid_context,
                "looking for the calling thread's current context: none of this simulator is "
                "current; call ctx_make_current first");
  }
  if (cur.ctx->retains == 0 || cur.generation != cur.ctx->generation) {
    return fail(c, status::invalid_context,
                "using the current context of device " + std::to_string(cur.ctx->device->ordinal) +
                    ", which has been released since it was made current");
  }
  return cur.ctx->device;
}

inline result<SimDriver::Stream*> SimDriver::stream_locked(Call c, stream_t s) const {
  if (s == nullptr) {
    auto d = current_device_locked(c);
    if (!d) return std::move(d).error();
    return (*d)->legacy;
  }
  if (s->owner != this)
    return fail(c, status::invalid_handle, "using a stream of another SimDriver");
  if (!s->alive) {
    dead_stream_calls_.fetch_add(1, std::memory_order_relaxed);
    return fail(c, status::invalid_handle,
                "using stream " + std::to_string(s->id) + ", which was destroyed");
  }
  if (s->generation != s->device->ctx.generation) {
    return fail(c, status::invalid_context,
                "using stream " + std::to_string(s->id) + " of device " +
                    std::to_string(s->device->ordinal) +
                    ", whose primary context was released after the stream was created");
  }
  return s;
}

inline result<SimDriver::Event*> SimDriver::event_locked(Call c, event_t e) const {
  if (e == nullptr || e->owner != this) {
    return fail(c, status::invalid_handle,
                "using an event handle that is not an event of this simulator");
  }
  if (!e->alive) return fail(c, status::invalid_handle, "using an event that was destroyed");
  if (e->generation != e->device->ctx.generation) {
    return fail(c, status::invalid_context,
                "using an event of device " + std::to_string(e->device->ordinal) +
                    ", whose primary context was released after the event was created");
  }
  return e;
}

inline error SimDriver::fault_error(Call c, const Stream& s) const {
  return fail(c, s.fault,
              "using stream " + std::to_string(s.id) + " of device " +
                  std::to_string(s.device->ordinal) + ", which has faulted");
}

inline bool SimDriver::owns_pool(mempool_t p) const noexcept {
  for (const auto& d : devices_) {
    if (&d->pool == p) return true;
    for (const auto& c : d->created_pools) {
      if (&c == p) return !c.destroyed;
    }
  }
  return false;
}

inline SimDriver::Device* SimDriver::device_of(std::uint64_t addr) const noexcept {
  if (devices_.empty() || addr < reservation_.address() ||
      addr >= reservation_.address() + stride_ * devices_.size())
    return nullptr;
  const std::uint64_t rel = addr - reservation_.address();
  const std::uint64_t d = rel / stride_;
  if (rel % stride_ >= memory_bytes_ || d >= devices_.size()) return nullptr;
  return devices_[d].get();
}

inline std::byte* SimDriver::translate_locked(std::uint64_t addr, std::uint64_t bytes,
                                              int accessor) const noexcept {
  if (Device* d = device_of(addr)) {
    const std::uint64_t off = addr - d->mem.base;
    if (bytes > memory_bytes_ - off) return nullptr;
    return d->mem.storage.data() + off;
  }
  if (vm_.contains(addr)) return vm_.translate(addr, bytes, accessor);
  return host_.translate(addr, bytes);
}

// The device that owns `addr` (its arena, or the physical memory mapped there); -1 for none.
inline int SimDriver::ordinal_of(std::uint64_t addr) const noexcept {
  if (const Device* d = device_of(addr)) return d->ordinal;
  return vm_.device_of(addr);
}

}  // namespace xlogrt
