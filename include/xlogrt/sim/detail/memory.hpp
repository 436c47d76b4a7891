// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: where simulated memory lives.
//
// Device addresses are reserved, never backed, host address space (PROT_NONE), exactly
// as CUDA reserves a range of the host's virtual address space for unified addressing:
// a device pointer is a plausible 64-bit address, and host code that dereferences one by
// mistake crashes on the simulator as it would on a GPU. The bytes themselves live in a
// separate lazily committed mapping per device; the simulator translates addresses when
// an operation runs.

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

namespace xlogrt::detail::sim {

/// One anonymous mapping, unmapped on destruction. `accessible` false reserves address
/// space only. Pages are committed on first touch (MAP_NORESERVE).
///
/// Not thread-safe: owned by one SimDriver, built and destroyed with it.
class Mapping {
 public:
  Mapping() noexcept = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~Mapping() { reset(); }

  /// Maps `bytes`; nullopt when the kernel refuses.
  static std::optional<Mapping> create(std::size_t bytes, bool accessible) noexcept {
    void* p = ::mmap(nullptr, bytes, accessible ? PROT_READ | PROT_WRITE : PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return std::nullopt;
    Mapping m;
    m.p_ = static_cast<std::byte*>(p);
    m.n_ = bytes;
    return m;
  }

  /// Maps `bytes` of the file `fd` from its start, shared (writes reach the file, and
  /// every other mapping of the same range sees them); nullopt when the kernel refuses.
  static std::optional<Mapping> create_shared(int fd, std::size_t bytes) noexcept {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) return std::nullopt;
    Mapping m;
    m.p_ = static_cast<std::byte*>(p);
    m.n_ = bytes;
    return m;
  }

  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  std::uint64_t address() const noexcept { return reinterpret_cast<std::uintptr_t>(p_); }

 private:
  void reset() noexcept {
    if (p_ != nullptr) ::munmap(p_, n_);
    p_ = nullptr;
    n_ = 0;
  }

  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

/// First-fit allocator of offsets in [0, capacity), with coalescing of free ranges.
/// Lowest address first, so a test sees the same addresses run after run.
///
/// Not thread-safe: guarded by its SimDriver's mutex.
class RangeAllocator {
 public:
  RangeAllocator() = default;
  explicit RangeAllocator(std::uint64_t capacity) : capacity_(capacity) { reset(); }

  /// Every range free again.
  void reset() {
    free_.clear();
    if (capacity_ > 0) free_.emplace(0, capacity_);
    free_bytes_ = capacity_;
  }

  std::optional<std::uint64_t> allocate(std::uint64_t bytes) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      std::uint64_t off = it->first;
      std::uint64_t left = it->second - bytes;
      free_.erase(it);
      if (left > 0) free_.emplace(off + bytes, left);
      free_bytes_ -= bytes;
      return off;
    }
    return std::nullopt;
  }

  /// The first free range of `bytes` whose address `base` + offset is a multiple of
  /// `align` (a power of two), lowest first; the free space cut off before it stays free.
  std::optional<std::uint64_t> allocate_aligned(std::uint64_t bytes, std::uint64_t align,
                                                std::uint64_t base = 0) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const std::uint64_t off = it->first;
      const std::uint64_t len = it->second;
      const std::uint64_t start = ((base + off + align - 1) & ~(align - 1)) - base;
      if (start - off > len || len - (start - off) < bytes) continue;
      free_.erase(it);
      if (start > off) free_.emplace(off, start - off);
      if (off + len > start + bytes) free_.emplace(start + bytes, off + len - (start + bytes));
      free_bytes_ -= bytes;
      return start;
    }
    return std::nullopt;
  }

  /// Takes [off, off + bytes), which must lie in one free range, out of the free list.
  /// @pre it is free.
  void take(std::uint64_t off, std::uint64_t bytes) {
    auto it = std::prev(free_.upper_bound(off));
    const std::uint64_t start = it->first;
    const std::uint64_t len = it->second;
    free_.erase(it);
    if (off > start) free_.emplace(start, off - start);
    if (start + len > off + bytes) free_.emplace(off + bytes, start + len - (off + bytes));
    free_bytes_ -= bytes;
  }

  /// @pre [off, off + bytes) was allocated and is not free.
  void release(std::uint64_t off, std::uint64_t bytes) {
    free_bytes_ += bytes;
    auto next = free_.lower_bound(off);
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        bytes += prev->second;
        free_.erase(prev);
      }
    }
    if (next != free_.end() && off + bytes == next->first) {
      bytes += next->second;
      free_.erase(next);
    }
    free_.emplace(off, bytes);
  }

  std::uint64_t free_bytes() const noexcept { return free_bytes_; }
  std::uint64_t capacity() const noexcept { return capacity_; }

 private:
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> length
  std::uint64_t capacity_ = 0;
  std::uint64_t free_bytes_ = 0;
};

}  // namespace xlogrt::detail::sim
