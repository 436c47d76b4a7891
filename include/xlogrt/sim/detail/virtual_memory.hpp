// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: the virtual memory calls' state (VirtualMemoryDriver): reserved
// address ranges, physical allocations, the mappings between them, and where their bytes
// live.
//
// Addresses. A window of vmm_address_bytes of device addresses is reserved (PROT_NONE,
// like the device windows: the host cannot dereference a device pointer) on the first
// reservation, aligned to the granularity, and mem_address_reserve hands out ranges of it.
// A second window of the same size, the view, holds the bytes: device address
// `window + x` is host address `view + x`.
//
// Bytes. A physical allocation takes a range of its device's arena (DeviceMemory::
// take_physical, so it is counted against the device's memory) and keeps its bytes at the
// same offset of the device's backing file, an anonymous memory file (memfd) made on the
// device's first mem_create. Mapping it maps that part of the file into the view at the
// mapping's place (MAP_FIXED | MAP_SHARED), so that two physical allocations mapped side
// by side read as one contiguous range (a kernel or copy may cross from one to the next),
// and one allocation mapped at two addresses shows the same bytes at both, as on a GPU.
// Unmapping puts fresh private anonymous memory in its place rather than PROT_NONE: a
// kernel body that still runs there (the unmap raced it, which the checker reports) then
// writes to scratch instead of crashing the test, and no later operation translates the
// range any more. Freeing the memory (its last release or unmap) punches the range out of
// the file, so the host gets the pages back.
//
// Invariants: reservations are disjoint ranges of the window; every mapping lies inside
// one reservation, mappings are disjoint, and each names a physical allocation that is
// live (released or not) and whose `mappings` counts it; a physical allocation is erased
// exactly when it is released and has no mapping. A mapping's `access` is the set of
// devices granted access (bit = ordinal; SimConfig::devices <= 64), empty until
// mem_set_access.
//
// Not thread-safe: guarded by its SimDriver's mutex (the virtual memory entry points and
// the driver's address translation, all under the lock).

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "xlogrt/sim/detail/memory.hpp"

namespace xlogrt::detail::sim {

/// A physical allocation's handle (SimDriver::phys_t): a number never handed out twice,
/// so a released handle stays recognisably dead. Value-initialised (0): none.
enum class PhysHandle : std::uint64_t {};

/// A physical allocation (mem_create).
struct Physical {
  int device = 0;            // ordinal
  std::uint64_t offset = 0;  // in the device's arena and in its backing file
  std::uint64_t bytes = 0;
  std::uint32_t mappings = 0;  // live mappings of it
  bool released = false;       // the handle is gone; its mappings hold the memory
};

/// A mapping of the start of a physical allocation (mem_map), keyed by its address.
struct VirtualMapping {
  std::uint64_t bytes = 0;
  std::uint64_t phys = 0;    // PhysHandle's number
  std::uint64_t access = 0;  // devices granted read-write access, one bit per ordinal
};

class VirtualMemory {
 public:
  VirtualMemory() = default;
  VirtualMemory(const VirtualMemory&) = delete;
  VirtualMemory& operator=(const VirtualMemory&) = delete;
  ~VirtualMemory() {
    for (Backing& b : backing_) {
      if (b.fd >= 0) ::close(b.fd);
    }
  }

  /// Reserves the window and the view on first use: `bytes` of addresses aligned to
  /// `align` (the granularity, a multiple of the host page size). False when the host
  /// refuses the address space.
  bool open(std::uint64_t bytes, std::uint64_t align) {
    if (size_ != 0) return true;
    auto window = Mapping::create(bytes + align, false);
    auto view = Mapping::create(bytes, false);
    if (!window || !view) return false;
    window_ = std::move(*window);
    view_ = std::move(*view);
    base_ = (window_.address() + align - 1) & ~(align - 1);
    size_ = bytes;
    space_ = RangeAllocator(bytes);
    return true;
  }

  bool contains(std::uint64_t addr) const noexcept { return addr - base_ < size_ && size_ != 0; }
  std::uint64_t free_bytes() const noexcept { return space_.free_bytes(); }
  std::uint64_t size() const noexcept { return size_; }

  // --- reservations ---------------------------------------------------------------------

  /// A new range of `bytes` whose address is a multiple of `align`; nullopt when the
  /// window has no such room.
  std::optional<std::uint64_t> reserve(std::uint64_t bytes, std::uint64_t align) {
    auto off = space_.allocate_aligned(bytes, align, base_);
    if (!off) return std::nullopt;
    reserved_.emplace(base_ + *off, bytes);
    return base_ + *off;
  }

  /// The size of the reservation that starts at `va`; nullopt if none does.
  std::optional<std::uint64_t> reservation_at(std::uint64_t va) const {
    auto it = reserved_.find(va);
    if (it == reserved_.end()) return std::nullopt;
    return it->second;
  }

  /// Whether [va, va + bytes) lies inside one reservation.
  bool inside_one_reservation(std::uint64_t va, std::uint64_t bytes) const {
    auto it = reserved_.upper_bound(va);
    if (it == reserved_.begin()) return false;
    --it;
    return va - it->first < it->second && bytes <= it->second - (va - it->first);
  }

  /// Bytes mapped inside [va, va + bytes).
  std::uint64_t mapped_within(std::uint64_t va, std::uint64_t bytes) const {
    std::uint64_t n = 0;
    for (auto it = maps_.lower_bound(va); it != maps_.end() && it->first < va + bytes; ++it) {
      n += it->second.bytes;
    }
    return n;
  }

  /// Frees the reservation that starts at `va`. @pre there is one, with nothing mapped.
  void free_reservation(std::uint64_t va) {
    auto it = reserved_.find(va);
    space_.release(it->first - base_, it->second);
    reserved_.erase(it);
  }

  // --- physical allocations ---------------------------------------------------------------

  /// The backing file of device `device` (made on first use, `bytes` long) and its host
  /// mapping; null when the host refuses either.
  std::byte* backing(int device, std::uint64_t bytes) {
    if (backing_.size() <= static_cast<std::size_t>(device)) {
      backing_.resize(static_cast<std::size_t>(device) + 1);
    }
    Backing& b = backing_[static_cast<std::size_t>(device)];
    if (b.fd >= 0) return b.host.data();
    const std::string name = "xlogrt-sim-device-" + std::to_string(device);
    const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      ::close(fd);
      return nullptr;
    }
    auto host = Mapping::create_shared(fd, bytes);
    if (!host) {
      ::close(fd);
      return nullptr;
    }
    b.fd = fd;
    b.host = std::move(*host);
    return b.host.data();
  }

  /// Records a physical allocation; its handle.
  PhysHandle add_physical(const Physical& p) {
    const std::uint64_t id = next_phys_++;
    phys_.emplace(id, p);
    return PhysHandle{id};
  }

  /// The live (unreleased) physical allocation `h`, or null.
  Physical* handle(PhysHandle h) {
    auto it = phys_.find(static_cast<std::uint64_t>(h));
    return it == phys_.end() || it->second.released ? nullptr : &it->second;
  }

  Physical& physical(std::uint64_t id) { return phys_.at(id); }

  /// Forgets physical allocation `id` and gives its bytes in the backing file back to the
  /// host. The caller returns its arena range (DeviceMemory::release_physical).
  void erase_physical(std::uint64_t id) {
    auto it = phys_.find(id);
    const Physical& p = it->second;
    const Backing& b = backing_[static_cast<std::size_t>(p.device)];
    // Only the host's memory is at stake: if the kernel refuses, the pages stay committed
    // until they are written again.
    (void)::fallocate(b.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(p.offset), static_cast<off_t>(p.bytes));
    phys_.erase(it);
  }

  // --- mappings -----------------------------------------------------------------------------

  /// The mapping that starts at `va`, or null.
  const VirtualMapping* mapping_at(std::uint64_t va) const {
    auto it = maps_.find(va);
    return it == maps_.end() ? nullptr : &it->second;
  }

  /// The address of the first mapping that overlaps [va, va + bytes); nullopt if none.
  std::optional<std::uint64_t> first_overlap(std::uint64_t va, std::uint64_t bytes) const {
    auto it = maps_.upper_bound(va);
    if (it != maps_.begin()) {
      auto prev = std::prev(it);
      if (va - prev->first < prev->second.bytes) return prev->first;
    }
    if (it != maps_.end() && it->first < va + bytes) return it->first;
    return std::nullopt;
  }

  /// How [va, va + bytes) is covered by mappings.
  enum class Cover : std::uint8_t {
    whole,  ///< by whole mappings, side by side, with no gap
    cuts,   ///< it starts or ends inside a mapping
    gap,    ///< some of it is not mapped
  };
  Cover cover(std::uint64_t va, std::uint64_t bytes) const {
    const std::uint64_t end = va + bytes;
    auto it = maps_.lower_bound(va);
    if (it != maps_.begin() && va - std::prev(it)->first < std::prev(it)->second.bytes) {
      return Cover::cuts;  // a mapping starts before va and reaches into the range
    }
    std::uint64_t cur = va;
    for (; cur < end; ++it) {
      if (it == maps_.end() || it->first != cur) return Cover::gap;
      cur += it->second.bytes;
    }
    return cur == end ? Cover::whole : Cover::cuts;
  }

  /// Grants device `device` access to the mappings that make up [va, va + bytes) (whole,
  /// see cover()); calls `first_access(address, bytes)` for each mapping that had none.
  template <class F>
  void grant(std::uint64_t va, std::uint64_t bytes, int device, F&& first_access) {
    for (auto it = maps_.lower_bound(va); it != maps_.end() && it->first < va + bytes; ++it) {
      if (it->second.access == 0) first_access(it->first, it->second.bytes);
      it->second.access |= std::uint64_t{1} << device;
    }
  }

  /// Maps physical allocation `id` at [va, va + bytes): its bytes appear in the view.
  /// False when the host refuses the mapping (nothing is recorded then).
  bool map(std::uint64_t va, std::uint64_t bytes, std::uint64_t id) {
    Physical& p = phys_.at(id);
    const Backing& b = backing_[static_cast<std::size_t>(p.device)];
    void* at = view_.data() + (va - base_);
    if (::mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, b.fd,
               static_cast<off_t>(p.offset)) == MAP_FAILED) {
      return false;
    }
    maps_.emplace(va, VirtualMapping{bytes, id, 0});
    ++p.mappings;
    return true;
  }

  /// Removes the mapping that starts at `va`; the physical allocation it mapped, by number.
  /// @pre there is one.
  std::uint64_t unmap(std::uint64_t va) {
    auto it = maps_.find(va);
    void* at = view_.data() + (it->first - base_);
    // Scratch memory in its place (see the file comment); PROT_NONE if even that is refused.
    if (::mmap(at, it->second.bytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
      (void)::mprotect(at, it->second.bytes, PROT_NONE);
    }
    const std::uint64_t id = it->second.phys;
    --phys_.at(id).mappings;
    maps_.erase(it);
    return id;
  }

  // --- translation ----------------------------------------------------------------------------

  /// The host bytes behind [addr, addr + bytes) when mappings cover all of it without a
  /// gap (and, for `accessor` >= 0, each grants that device access); null otherwise.
  std::byte* translate(std::uint64_t addr, std::uint64_t bytes, int accessor) const noexcept {
    if (!contains(addr) || bytes > size_ - (addr - base_)) return nullptr;
    auto it = maps_.upper_bound(addr);
    if (it == maps_.begin()) return nullptr;
    --it;
    const std::uint64_t end = addr + (bytes == 0 ? 1 : bytes);
    std::uint64_t cur = addr;
    while (cur < end) {
      if (it == maps_.end() || it->first > cur || it->first + it->second.bytes <= cur) return nullptr;
      if (accessor >= 0 && ((it->second.access >> accessor) & 1) == 0) return nullptr;
      cur = it->first + it->second.bytes;
      ++it;
    }
    return view_.data() + (addr - base_);
  }

  /// The ordinal of the device whose memory is mapped at `addr`; -1 for none.
  int device_of(std::uint64_t addr) const noexcept {
    if (!contains(addr)) return -1;
    auto it = maps_.upper_bound(addr);
    if (it == maps_.begin()) return -1;
    --it;
    if (addr - it->first >= it->second.bytes) return -1;
    auto p = phys_.find(it->second.phys);
    return p == phys_.end() ? -1 : p->second.device;
  }

 private:
  /// A device's backing file: its descriptor and a host mapping of all of it.
  struct Backing {
    int fd = -1;
    Mapping host;
  };

  Mapping window_;  // the device addresses (never accessible)
  Mapping view_;    // the bytes, at the same offsets
  std::uint64_t base_ = 0;  // the window's first address, aligned
  std::uint64_t size_ = 0;  // 0: not reserved yet
  RangeAllocator space_;    // offsets of the window
  std::map<std::uint64_t, std::uint64_t> reserved_;  // address -> bytes
  std::map<std::uint64_t, VirtualMapping> maps_;     // address -> mapping
  std::unordered_map<std::uint64_t, Physical> phys_;
  std::uint64_t next_phys_ = 1;
  std::vector<Backing> backing_;  // by device ordinal
};

}  // namespace xlogrt::detail::sim
