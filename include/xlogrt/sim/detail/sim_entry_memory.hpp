// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's Driver-concept entry points for memory: pools, stream-ordered and
// synchronous allocation and free, mapped host memory, and stream-ordered data movement
// (memset, memcpy, write-value, host functions and simulated kernels).
//
// Part of SimDriver's implementation: sim/sim_driver.hpp includes it after the class. It
// includes the face first, so including it alone brings the whole driver and no less.

#include "xlogrt/sim/sim_driver.hpp"

namespace xlogrt {

// --- memory bookkeeping ----------------------------------------------------------------------

inline error SimDriver::oom_locked(Call c, const Device& dev, std::uint64_t bytes) const {
  return fail(c, status::out_of_memory,
              "allocating " + std::to_string(bytes) + " bytes on simulated device " +
                  std::to_string(dev.ordinal) + " (" + std::to_string(memory_bytes_) + " bytes, " +
                  std::to_string(dev.mem.allocated) + " allocated, " + std::to_string(dev.mem.pending) +
                  " held by frees that have not run yet" +
                  (dev.mem.physical != 0
                       ? ", " + std::to_string(dev.mem.physical) + " held by physical allocations"
                       : std::string()) +
                  ")");
}

// --- Driver concept: memory --------------------------------------------------------------------

inline result<SimDriver::mempool_t> SimDriver::device_default_mempool(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::device_default_mempool)) return *e;
  auto d = device_locked(Call::device_default_mempool, dev);
  if (!d) return std::move(d).error();
  if (!cfg_.memory_pools_supported) {
    return fail(Call::device_default_mempool, status::not_supported,
                "getting the memory pool of device " + std::to_string(dev) +
                    ": the simulator was configured without memory pools");
  }
  return &(*d)->pool;
}

inline result<SimDriver::mempool_t> SimDriver::mempool_create(device_t dev) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mempool_create)) return *e;
  auto d = device_locked(Call::mempool_create, dev);
  if (!d) return std::move(d).error();
  if (!cfg_.memory_pools_supported) {
    return fail(Call::mempool_create, status::not_supported,
                "creating a memory pool on device " + std::to_string(dev) +
                    ": the simulator was configured without memory pools");
  }
  try {
    detail::sim::Pool& p = (*d)->created_pools.emplace_back();
    p.device = *d;
    return &p;
  } catch (...) {
    return fail(Call::mempool_create, status::out_of_memory, "no host memory for another simulated pool");
  }
}

inline result<void> SimDriver::mempool_destroy(mempool_t pool) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mempool_destroy)) return *e;
  if (!owns_pool(pool) || pool == &pool->device->pool) {
    return fail(Call::mempool_destroy, status::invalid_value,
                "destroying a pool that is not a created pool of this simulator");
  }
  pool->destroyed = true;
  return ok();
}

inline result<void> SimDriver::mempool_set_release_threshold(mempool_t pool,
                                                             std::uint64_t bytes) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::mempool_set_release_threshold)) return *e;
  if (!owns_pool(pool)) {
    return fail(Call::mempool_set_release_threshold, status::invalid_value,
                "setting the release threshold of a pool that is not a pool of this simulator");
  }
  pool->release_threshold = bytes;
  return ok();
}

inline result<std::uint64_t> SimDriver::mem_alloc_async(std::size_t bytes, mempool_t pool,
                                                        stream_t s) noexcept {
  constexpr Call c = Call::mem_alloc_async;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (!cfg_.memory_pools_supported) {
    return fail(c, status::not_supported,
                "allocating " + std::to_string(bytes) +
                    " bytes: the simulator was configured without memory pools");
  }
  if (!owns_pool(pool)) {
    return fail(c, status::invalid_value,
                "allocating from a pool that is not a pool of this simulator");
  }
  if (bytes == 0) return fail(c, status::invalid_value, "allocating 0 bytes");
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  Device& dev = *pool->device;
  if (bytes > memory_bytes_) return oom_locked(c, dev, bytes);
  const std::uint64_t need = round_up(bytes, alloc_granularity);
  if (st.capture != nullptr) [[unlikely]] {  // a graph allocation node
    Capture& cap = *st.capture;
    if (cap.invalidated != 0) return invalidated_error(c, st);
    auto off = dev.mem.reserve(need);
    if (!off) return oom_locked(c, dev, bytes);
    const std::uint64_t addr = dev.mem.base + *off;
    cap.data->allocs.push_back(
        detail::sim::GraphAlloc{&dev, dev.ctx.generation, addr, bytes, need, false});
    detail::sim::Node n;
    n.kind = OpKind::mem_alloc_async;
    n.access = Access::Write;
    n.dst = addr;
    n.bytes = need;
    n.alloc = static_cast<int>(cap.data->allocs.size() - 1);
    record_node_locked(st, std::move(n));
    ++capture_stats_.graph_alloc_nodes;
    return addr;
  }
  join_host_locked(st);
  auto off = dev.mem.allocate(need, st.vc);
  if (!off) return oom_locked(c, dev, bytes);
  const OpRef ref = begin_op_locked(st, OpKind::mem_alloc_async, Access::Write);
  const std::uint64_t addr = dev.mem.base + *off;
  dev.mem.add_block(addr, bytes, need, true);
  if (cfg_.check_hazards) checker_.allocate(addr, bytes, ref);
  Op op;
  op.kind = OpKind::mem_alloc_async;
  op.seq = ref.seq;
  op.dst = addr;
  op.bytes = need;
  push_locked(st, std::move(op));
  return addr;
}

inline result<void> SimDriver::mem_free_async(std::uint64_t ptr, stream_t s) noexcept {
  constexpr Call c = Call::mem_free_async;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  if (st.capture != nullptr) [[unlikely]] {  // a graph free node of this capture's allocation?
    Capture& cap = *st.capture;
    if (cap.invalidated != 0) return invalidated_error(c, st);
    auto& allocs = cap.data->allocs;
    for (std::size_t i = 0; i < allocs.size(); ++i) {
      if (allocs[i].addr != ptr || allocs[i].freed_in_graph) continue;
      allocs[i].freed_in_graph = true;
      detail::sim::Node n;
      n.kind = OpKind::mem_free_async;
      n.access = Access::Write;
      n.dst = ptr;
      n.bytes = allocs[i].rounded;
      n.alloc = static_cast<int>(i);
      record_node_locked(st, std::move(n));
      ++capture_stats_.graph_free_nodes;
      return ok();
    }
  }
  Device* dev = device_of(ptr);
  if (dev == nullptr) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) + ": not a simulated device address");
  }
  auto it = dev->mem.blocks.find(ptr);
  if (it == dev->mem.blocks.end()) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) + " on device " + std::to_string(dev->ordinal) +
                    ": not the start of a live allocation (freed already, or never allocated)");
  }
  if (!it->second.pooled) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    " with mem_free_async: it was allocated by mem_alloc; free it with mem_free");
  }
  if (st.capture != nullptr) [[unlikely]] {
    // Memory allocated outside the capture: the node frees it at every launch.
    for (const detail::sim::Node& n : st.capture->data->nodes) {
      if (n.kind == OpKind::mem_free_async && n.alloc < 0 && n.dst == ptr) {
        return fail(c, status::invalid_value,
                    "freeing " + detail::sim::hex(ptr) + " twice in capture " +
                        std::to_string(st.capture->id));
      }
    }
    detail::sim::Node n;
    n.kind = OpKind::mem_free_async;
    n.access = Access::Write;
    n.dst = ptr;
    n.bytes = it->second.rounded;
    record_node_locked(st, std::move(n));
    ++capture_stats_.graph_free_nodes;
    ++capture_stats_.graph_frees_of_outside_memory;
    return ok();
  }
  free_async_locked(st, *dev, it);
  return ok();
}

// Enqueues the free of the live pooled block `it` of `dev` on `st`. A graph allocation's
// block leaves the live set, and its range stays the graph's.
inline void SimDriver::free_async_locked(Stream& st, Device& dev,
                                         detail::sim::DeviceMemory::Blocks::iterator it) {
  const std::uint64_t ptr = it->first;
  const detail::sim::Block b = it->second;
  const OpRef ref = begin_op_locked(st, OpKind::mem_free_async, Access::Write);
  if (cfg_.check_hazards) {
    checker_.free(ptr, b.requested, ref, st.vc);
    record_locked();
  }
  std::uint64_t id = 0;  // names no recycled range
  if (b.graph) {
    dev.mem.blocks.erase(it);
  } else {
    id = next_free_id_++;
    dev.mem.free_enqueued(it, ref, id);
  }
  Op op;
  op.kind = OpKind::mem_free_async;
  op.seq = ref.seq;
  op.dst = ptr;
  op.bytes = b.rounded;
  op.free_id = id;
  push_locked(st, std::move(op));
}

inline result<std::uint64_t> SimDriver::mem_alloc(std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_alloc;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "allocating device memory synchronously")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  Device& dev = **d;
  if (bytes == 0) return fail(c, status::invalid_value, "allocating 0 bytes");
  if (bytes > memory_bytes_) return oom_locked(c, dev, bytes);
  const std::uint64_t need = round_up(bytes, alloc_granularity);
  auto off = dev.mem.allocate(need, host_vc_);
  if (!off) return oom_locked(c, dev, bytes);
  const OpRef ref = host_op_locked(OpKind::mem_alloc);
  const std::uint64_t addr = dev.mem.base + *off;
  dev.mem.add_block(addr, bytes, need, false);
  if (cfg_.fill_memory) std::memset(translate_locked(addr, need), cfg_.uninit_byte, need);
  if (cfg_.check_hazards) checker_.allocate(addr, bytes, ref);
  return addr;
}

inline result<void> SimDriver::mem_free(std::uint64_t ptr) noexcept {
  constexpr Call c = Call::mem_free;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "freeing device memory synchronously")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  Device* dev = device_of(ptr);
  auto missing = [&] {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    ": not the start of a live allocation of this simulator (freed already, or "
                    "never allocated)");
  };
  if (dev == nullptr || dev->mem.blocks.find(ptr) == dev->mem.blocks.end()) return missing();
  if (dev->mem.blocks.find(ptr)->second.graph) {
    return fail(c, status::invalid_value,
                "freeing " + detail::sim::hex(ptr) +
                    " with mem_free: it was allocated by a graph launch; free it with "
                    "mem_free_async");
  }
  auto synced = sync_device_locked(c, *dev, lk);
  if (!synced) return synced;
  auto it = dev->mem.blocks.find(ptr);  // the lock was released while draining
  if (it == dev->mem.blocks.end()) return missing();
  const detail::sim::Block b = it->second;
  const OpRef ref = host_op_locked(OpKind::mem_free);
  if (cfg_.check_hazards) {
    checker_.free(ptr, b.requested, ref, host_vc_);
    record_locked();
  }
  if (cfg_.fill_memory) std::memset(translate_locked(ptr, b.rounded), cfg_.poison_byte, b.rounded);
  dev->mem.free_now(it, ref, next_free_id_++);
  dev->mem.trim_quarantine(cfg_.quarantine_bytes, cfg_.quarantine_blocks);
  return ok();
}

inline result<void*> SimDriver::mem_host_alloc_mapped(std::size_t bytes) noexcept {
  constexpr Call c = Call::mem_host_alloc_mapped;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "allocating mapped host memory")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  if (!cfg_.can_map_host_memory) {
    return fail(c, status::not_supported,
                "allocating mapped host memory: the simulator was configured without it");
  }
  if (bytes == 0) return fail(c, status::invalid_value, "allocating 0 bytes of mapped host memory");
  auto nomem = [&] {
    return fail(c, status::out_of_memory,
                "allocating " + std::to_string(bytes) + " bytes of mapped host memory (" +
                    std::to_string(host_.free_bytes()) + " bytes of the mapped window free)");
  };
  if (bytes > host_.size()) return nomem();
  void* host = host_.allocate(bytes, round_up(bytes, alloc_granularity), cfg_.uninit_byte);
  if (host == nullptr) return nomem();
  return host;
}

inline result<std::uint64_t> SimDriver::mem_host_device_pointer(void* host) noexcept {
  constexpr Call c = Call::mem_host_device_pointer;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  const auto h = reinterpret_cast<std::uintptr_t>(host);
  if (auto addr = host_.device_pointer(h)) return *addr;
  return fail(c, status::invalid_value,
              "translating host pointer " + detail::sim::hex(h) +
                  ": it is not inside memory from mem_host_alloc_mapped");
}

inline result<void> SimDriver::mem_host_free(void* host) noexcept {
  constexpr Call c = Call::mem_host_free;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (auto e = unsafe_call_locked(c, "freeing mapped host memory")) return *e;
  auto d = current_device_locked(c);
  if (!d) return std::move(d).error();
  if (!host_.free(host)) {
    return fail(c, status::invalid_value,
                "freeing host pointer " + detail::sim::hex(reinterpret_cast<std::uintptr_t>(host)) +
                    ": not the start of memory from mem_host_alloc_mapped (freed already?)");
  }
  return ok();
}

// --- Driver concept: stream-ordered data movement --------------------------------------------

inline result<void> SimDriver::memset_d8_async(std::uint64_t dst, std::uint8_t value,
                                               std::size_t bytes, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memset_d8_async)) return *e;
  Op op;
  op.kind = OpKind::memset;
  op.dst = dst;
  op.bytes = bytes;
  op.value = value;
  const SimAccess a{dst, bytes, Access::Write};
  return enqueue_transfer_locked(Call::memset_d8_async, s, std::move(op), Access::Write,
                                 std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::memcpy_htod_async(std::uint64_t dst, const void* src,
                                                 std::size_t bytes, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memcpy_htod_async)) return *e;
  if (bytes != 0 && src == nullptr) {
    return fail(Call::memcpy_htod_async, status::invalid_value, "copying from a null host pointer");
  }
  Op op;
  op.kind = OpKind::memcpy_htod;
  op.dst = dst;
  op.chost = src;
  op.bytes = bytes;
  const SimAccess a{dst, bytes, Access::Write};
  return enqueue_transfer_locked(Call::memcpy_htod_async, s, std::move(op), Access::Write,
                                 std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::memcpy_dtoh_async(void* dst, std::uint64_t src, std::size_t bytes,
                                                 stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memcpy_dtoh_async)) return *e;
  if (bytes != 0 && dst == nullptr) {
    return fail(Call::memcpy_dtoh_async, status::invalid_value, "copying to a null host pointer");
  }
  Op op;
  op.kind = OpKind::memcpy_dtoh;
  op.src = src;
  op.host = dst;
  op.bytes = bytes;
  const SimAccess a{src, bytes, Access::Read};
  return enqueue_transfer_locked(Call::memcpy_dtoh_async, s, std::move(op), Access::Read,
                                 std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::memcpy_dtod_async(std::uint64_t dst, std::uint64_t src,
                                                 std::size_t bytes, stream_t s) noexcept {
  Lock lk(mu_);
  if (auto e = enter_locked(Call::memcpy_dtod_async)) return *e;
  Op op;
  op.kind = OpKind::memcpy_dtod;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  const SimAccess a[2] = {{src, bytes, Access::Read}, {dst, bytes, Access::Write}};
  return enqueue_transfer_locked(Call::memcpy_dtod_async, s, std::move(op), Access::ReadWrite,
                                 std::span<const SimAccess>(a, 2));
}

inline result<void> SimDriver::stream_write_value32(stream_t s, std::uint64_t dst,
                                                    std::uint32_t value) noexcept {
  constexpr Call c = Call::stream_write_value32;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (!cfg_.stream_mem_ops_supported) {
    return fail(c, status::not_supported,
                "writing a flag: the simulator was configured without stream memory operations");
  }
  if (dst % 4 != 0) {
    return fail(c, status::invalid_value,
                "writing 4 bytes at " + detail::sim::hex(dst) + ": not 4-byte aligned");
  }
  Op op;
  op.kind = OpKind::write_value32;
  op.dst = dst;
  op.value = value;
  const SimAccess a{dst, 4, Access::Write};
  return enqueue_simple_locked(c, s, std::move(op), Access::Write,
                               std::span<const SimAccess>(&a, 1));
}

inline result<void> SimDriver::launch_host_func(stream_t s, HostFn fn, void* arg) noexcept {
  constexpr Call c = Call::launch_host_func;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  if (fn == nullptr) return fail(c, status::invalid_value, "launching a null host function");
  Op op;
  op.kind = OpKind::host_func;
  op.fn = fn;
  op.host = arg;
  return enqueue_simple_locked(c, s, std::move(op), Access::Read, {});
}

inline result<void> SimDriver::launch_kernel(stream_t s, std::span<const SimAccess> accesses,
                                             SimKernelBody body, std::string_view label) noexcept {
  constexpr Call c = Call::launch_kernel;
  Lock lk(mu_);
  if (auto e = enter_locked(c)) return *e;
  auto sr = stream_locked(c, s);
  if (!sr) return std::move(sr).error();
  Stream& st = **sr;
  if (st.fault != 0) return fault_error(c, st);
  const std::uint32_t id = checker_.intern(label);
  auto k = std::make_unique<detail::sim::Kernel>();
  k->ptrs.reserve(accesses.size());
  k->bytes.reserve(accesses.size());
  for (const SimAccess& a : accesses) {
    k->ptrs.push_back(a.ptr);
    k->bytes.push_back(a.bytes);
  }
  k->body = std::move(body);
  Op op;
  op.kind = OpKind::kernel;
  op.kernel = std::move(k);
  if (st.capture != nullptr) [[unlikely]] {
    return capture_op_locked(c, st, std::move(op), Access::ReadWrite, accesses, id);
  }
  enqueue_on_locked(st, std::move(op), Access::ReadWrite, accesses, id);
  return ok();
}

}  // namespace xlogrt
