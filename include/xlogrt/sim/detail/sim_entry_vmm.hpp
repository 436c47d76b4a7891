// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's VirtualMemoryDriver entry points: the granularity, reserving and freeing
// address ranges, creating and releasing physical allocations, mapping and unmapping
// them, and granting access. The rules they enforce, and where the simulator chose, are
// in the class comment ("Virtual memory"); the state they keep is
// sim/detail/virtual_memory.hpp's, the arena ranges of physical memory the device's
// (sim/detail/device_memory.hpp).
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- helpers ---------------------------------------------------------------------------------

inline std::optional<error> SimDriver::vmm_enter_locked(Call c) {
  if (auto e = enter_locked(c)) return e;
  if (!cfg_.virtual_memory_supported) {
    return fail(c, status::not_supported,
                "using virtual memory: the simulator was configured without it "
                "(SimConfig::virtual_memory_supported)");
  }
  return std::nullopt;
}

// Physical allocation `id`, released and unmapped, goes: its arena range back to its
// device, its bytes back to the host.
inline void SimDriver::free_physical_locked(std::uint64_t id) {
  const detail::sim::Physical& p = vm_.physical(id);
  devices_[static_cast<std::size_t>(p.device)]->mem.release_physical(p.offset);
  vm_.erase_physical(id);
}

// --- VirtualMemoryDriver concept -------------------------------------------------------------

inline result<AllocationGranularity> SimDriver::mem_granularity(device_t dev) noexcept {
  constexpr Call c = Call::mem_granularity;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  auto d = device_locked(c, dev);
  if (!d) return std::move(d).error();
  return AllocationGranularity{cfg_.vmm_granularity, cfg_.vmm_recommended_granularity};
}

inline result<std::uint64_t> SimDriver::mem_address_reserve(std::size_t bytes,
                                                            std::size_t alignment) noexcept {
  constexpr Call c = Call::mem_address_reserve;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  const std::string what = "reserving " + std::to_string(bytes) + " bytes of address space";
  if (bytes == 0 || bytes % page_bytes_ != 0) {
    return fail(c, status::invalid_value,
                what + ": the size must be a positive multiple of the host page size (" +
                    std::to_string(page_bytes_) + ")");
  }
  if ((alignment & (alignment - 1)) != 0) {
    return fail(c, status::invalid_value,
                what + ": the alignment " + std::to_string(alignment) +
                    " is neither 0 nor a power of two");
  }
  if (!vm_.open(cfg_.vmm_address_bytes, cfg_.vmm_granularity)) {
    return fail(c, status::out_of_memory,
                what + ": the host refused the " + std::to_string(cfg_.vmm_address_bytes) +
                    " bytes of address space of the simulator's virtual memory window");
  }
  auto va = vm_.reserve(bytes, std::max<std::uint64_t>(alignment, cfg_.vmm_granularity));
  if (!va) {
    return fail(c, status::out_of_memory,
                what + ": the simulator's window of " + std::to_string(vm_.size()) + " bytes has " +
                    std::to_string(vm_.free_bytes()) +
                    " free, not that much in one aligned piece (SimConfig::vmm_address_bytes)");
  }
  return *va;
}

inline result<void> SimDriver::mem_address_free(std::uint64_t va, std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_address_free;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  const std::string what = "freeing the reservation at " + detail::sim::hex(va);
  const auto size = vm_.reservation_at(va);
  if (!size) {
    return fail(c, status::invalid_value,
                what + ": no reservation starts there (freed already, or never reserved)");
  }
  if (*size != bytes) {
    return fail(c, status::invalid_value,
                what + " with size " + std::to_string(bytes) + ": it was reserved with size " +
                    std::to_string(*size) + "; free it whole");
  }
  if (const std::uint64_t mapped = vm_.mapped_within(va, bytes); mapped != 0) {
    return fail(c, status::invalid_value,
                what + ": " + std::to_string(mapped) +
                    " bytes are still mapped in it; unmap them first");
  }
  vm_.free_reservation(va);
  return ok();
}

inline result<SimDriver::phys_t> SimDriver::mem_create(std::size_t bytes, device_t dev) noexcept {
  constexpr Call c = Call::mem_create;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  auto d = device_locked(c, dev);
  if (!d) return std::move(d).error();
  Device& device = **d;
  const std::string what = "creating " + std::to_string(bytes) +
                           " bytes of physical memory on simulated device " + std::to_string(dev);
  if (bytes == 0 || bytes % cfg_.vmm_granularity != 0) {
    return fail(c, status::invalid_value,
                what + ": the size must be a positive multiple of the granularity (" +
                    std::to_string(cfg_.vmm_granularity) + ", see mem_granularity)");
  }
  auto oom = [&](const std::string& why) { return fail(c, status::out_of_memory, what + ": " + why); };
  if (bytes > memory_bytes_) return oom("the device has " + std::to_string(memory_bytes_) + " bytes");
  std::byte* host = vm_.backing(dev, memory_bytes_);
  if (host == nullptr) return oom("the host refused a memory file to hold the device's physical memory");
  auto off = device.mem.take_physical(bytes, cfg_.vmm_granularity);
  if (!off) {
    return oom("the device has " + std::to_string(memory_bytes_) + " bytes, " +
               std::to_string(device.mem.allocated) + " allocated, " +
               std::to_string(device.mem.pending) + " held by frees that have not run yet, " +
               std::to_string(device.mem.graph_reserved) + " by graphs and " +
               std::to_string(device.mem.physical) + " by physical allocations");
  }
  if (cfg_.fill_memory) std::memset(host + *off, cfg_.uninit_byte, bytes);
  return vm_.add_physical(detail::sim::Physical{dev, *off, bytes, 0, false});
}

inline result<void> SimDriver::mem_release(phys_t h) noexcept {
  constexpr Call c = Call::mem_release;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  detail::sim::Physical* p = vm_.handle(h);
  if (p == nullptr) {
    return fail(c, status::invalid_value,
                "releasing physical allocation " + std::to_string(static_cast<std::uint64_t>(h)) +
                    ": not a live handle of this simulator (released already, or never created)");
  }
  p->released = true;
  if (p->mappings == 0) free_physical_locked(static_cast<std::uint64_t>(h));
  return ok();
}

inline result<void> SimDriver::mem_map(std::uint64_t va, std::size_t bytes, phys_t h) noexcept {
  constexpr Call c = Call::mem_map;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  const auto id = static_cast<std::uint64_t>(h);
  const std::string what = "mapping " + std::to_string(bytes) + " bytes of physical allocation " +
                           std::to_string(id) + " at " + detail::sim::hex(va);
  const detail::sim::Physical* p = vm_.handle(h);
  if (p == nullptr) {
    return fail(c, status::invalid_value,
                what + ": not a live handle of this simulator (released, or never created)");
  }
  const std::uint64_t g = cfg_.vmm_granularity;
  if (bytes == 0 || bytes % g != 0 || va % g != 0) {
    return fail(c, status::invalid_value,
                what + ": the address and size must be multiples of the granularity (" +
                    std::to_string(g) + "), the size positive");
  }
  if (bytes > p->bytes) {
    return fail(c, status::invalid_value,
                what + ": the allocation has " + std::to_string(p->bytes) + " bytes");
  }
  if (!vm_.inside_one_reservation(va, bytes)) {
    return fail(c, status::invalid_value,
                what + ": the range is not inside one reservation (mem_address_reserve)");
  }
  if (const auto other = vm_.first_overlap(va, bytes)) {
    return fail(c, status::invalid_value,
                what + ": the mapping at " + detail::sim::hex(*other) +
                    " overlaps it; unmap it first");
  }
  if (!vm_.map(va, bytes, id)) {
    return fail(c, status::out_of_memory, what + ": the host refused to map the bytes");
  }
  return ok();
}

inline result<void> SimDriver::mem_unmap(std::uint64_t va, std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_unmap;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  const std::string what = "unmapping [" + detail::sim::hex(va) + ", +" + std::to_string(bytes) + ")";
  const detail::sim::VirtualMapping* m = vm_.mapping_at(va);
  if (m == nullptr) {
    return fail(c, status::invalid_value,
                what + ": no mapping starts there; mem_unmap takes one whole mapping, as mapped");
  }
  if (m->bytes != bytes) {
    return fail(c, status::invalid_value,
                what + ": the mapping there is " + std::to_string(m->bytes) +
                    " bytes; mem_unmap takes one whole mapping, as mapped");
  }
  if (m->access != 0 && cfg_.check_hazards) {
    // The checker's free: every access not ordered before this call races it.
    const OpRef ref = host_op_locked(OpKind::mem_unmap);
    checker_.free(va, bytes, ref, host_vc_);
    record_locked();
  }
  const std::uint64_t id = vm_.unmap(va);
  const detail::sim::Physical& p = vm_.physical(id);
  if (p.released && p.mappings == 0) free_physical_locked(id);
  return ok();
}

inline result<void> SimDriver::mem_set_access(std::uint64_t va, std::size_t bytes,
                                              device_t dev) noexcept {
  constexpr Call c = Call::mem_set_access;
  Lock lk(mu_);
  if (auto e = vmm_enter_locked(c)) return *e;
  auto d = device_locked(c, dev);
  if (!d) return std::move(d).error();
  const std::string what = "setting access for device " + std::to_string(dev) + " to [" +
                           detail::sim::hex(va) + ", +" + std::to_string(bytes) + ")";
  const std::uint64_t g = cfg_.vmm_granularity;
  if (bytes == 0 || bytes % g != 0 || va % g != 0) {
    return fail(c, status::invalid_value,
                what + ": the address and size must be multiples of the granularity (" +
                    std::to_string(g) + "), the size positive");
  }
  switch (vm_.cover(va, bytes)) {
    case detail::sim::VirtualMemory::Cover::whole: break;
    case detail::sim::VirtualMemory::Cover::cuts:
      return fail(c, status::invalid_value,
                  what + ": the range cuts a mapping; give whole mappings");
    case detail::sim::VirtualMemory::Cover::gap:
      return fail(c, status::invalid_value, what + ": part of the range is not mapped");
  }
  // A mapping that had no access becomes live for the checker, allocated by this host
  // operation, which every later enqueue is ordered after.
  std::optional<OpRef> ref;
  vm_.grant(va, bytes, dev, [&](std::uint64_t at, std::uint64_t n) {
    if (!cfg_.check_hazards) return;
    if (!ref) ref = host_op_locked(OpKind::mem_set_access);
    checker_.allocate(at, n, *ref);
  });
  return ok();
}

}  // namespace xlogrt
