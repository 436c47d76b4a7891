// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: mapped host memory (mem_host_alloc_mapped) and the device
// addresses it is seen at.
//
// The window is a range of the driver's reserved, unbacked address space, above the
// device windows; a mapping takes a range of it (first fit, rounded to the allocation
// granularity), so its device address is distinct from its host address as on a GPU
// without unified addressing of host memory, and a stream operation that runs off the
// end of a mapping is seen as touching memory no allocation covers. The host side is
// ordinary page-aligned heap memory, which the caller reads and writes directly.
//
// Invariants: `maps_` (device address -> mapping) and `index_` (host address -> device
// address) hold the same mappings; the ranges of `space_` in use are exactly theirs.
// The host memory of every mapping still held is freed on destruction.
//
// Not thread-safe: guarded by its SimDriver's mutex (the mapped-host entry points and
// the driver's address translation, all under the lock).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <new>
#include <optional>

#include "xlogrt/sim/detail/memory.hpp"

namespace xlogrt::detail::sim {

class HostWindow {
 public:
  HostWindow() = default;
  HostWindow(const HostWindow&) = delete;
  HostWindow& operator=(const HostWindow&) = delete;
  ~HostWindow() {
    for (auto& [addr, m] : maps_) ::operator delete (m.host, std::align_val_t{4096});
  }

  /// The window is [base, base + bytes) of device addresses. Called once, before use.
  void open(std::uint64_t base, std::uint64_t bytes) {
    base_ = base;
    size_ = bytes;
    space_ = RangeAllocator(bytes);
  }

  std::uint64_t size() const noexcept { return size_; }
  std::uint64_t free_bytes() const noexcept { return space_.free_bytes(); }
  bool contains(std::uint64_t addr) const noexcept { return addr >= base_ && addr < base_ + size_; }

  /// Maps `bytes` (`span` of the window, `span` >= `bytes`) filled with `fill`; null
  /// when the window has no room or the host has no memory.
  void* allocate(std::uint64_t bytes, std::uint64_t span, std::uint8_t fill) {
    auto off = space_.allocate(span);
    if (!off) return nullptr;
    void* host = ::operator new (span, std::align_val_t{4096}, std::nothrow);
    if (host == nullptr) {
      space_.release(*off, span);
      return nullptr;
    }
    std::memset(host, fill, span);
    const std::uint64_t addr = base_ + *off;
    maps_.emplace(addr, Map{host, bytes, span});
    index_.emplace(reinterpret_cast<std::uintptr_t>(host), addr);
    return host;
  }

  /// The device address of host address `h` inside a mapping's requested bytes.
  std::optional<std::uint64_t> device_pointer(std::uintptr_t h) const {
    auto it = index_.upper_bound(h);
    if (it != index_.begin()) {
      --it;
      auto m = maps_.find(it->second);
      if (m != maps_.end() && h - it->first < m->second.bytes) return it->second + (h - it->first);
    }
    return std::nullopt;
  }

  /// Unmaps the mapping that starts at host address `host`; false if none does.
  bool free(void* host) {
    auto it = index_.find(reinterpret_cast<std::uintptr_t>(host));
    if (it == index_.end()) return false;
    auto m = maps_.find(it->second);
    space_.release(m->first - base_, m->second.span);
    ::operator delete (m->second.host, std::align_val_t{4096});
    maps_.erase(m);
    index_.erase(it);
    return true;
  }

  /// The host bytes behind device addresses [addr, addr + bytes) of one mapping; null
  /// if they are not all inside one.
  std::byte* translate(std::uint64_t addr, std::uint64_t bytes) const noexcept {
    if (!contains(addr)) return nullptr;
    auto it = maps_.upper_bound(addr);
    if (it == maps_.begin()) return nullptr;
    --it;
    const std::uint64_t off = addr - it->first;
    if (off > it->second.bytes || bytes > it->second.bytes - off) return nullptr;
    return static_cast<std::byte*>(it->second.host) + off;
  }

 private:
  /// A mapping: `host` is what the caller sees; its device address is its key in maps_.
  struct Map {
    void* host = nullptr;
    std::uint64_t bytes = 0;  // requested
    std::uint64_t span = 0;   // reserved in the window
  };

  std::uint64_t base_ = 0;
  std::uint64_t size_ = 0;
  RangeAllocator space_;
  std::map<std::uint64_t, Map> maps_;           // device address -> mapping
  std::map<std::uintptr_t, std::uint64_t> index_;  // host address -> device address
};

}  // namespace xlogrt::detail::sim
