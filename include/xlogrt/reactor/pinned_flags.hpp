// SPDX-License-Identifier: Apache-2.0
#pragma once

// PinnedFlags<Driver>: the reactor's completion flags in page-locked host memory that is
// mapped into the device's address space, so that a stream can write a flag
// (cuStreamWriteValue32 at device_address(slot)) and the host sees it without any driver
// call. The host reads and writes the words as atomics, through the Atomics policy
// (StdAtomics: std::atomic_ref over the plain 32-bit words); this type only places and
// owns them.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/lifetime.hpp"

namespace xlogrt {

/// `size()` 32-bit flags in mapped, page-locked host memory, each 0 when created. Models
/// SlotFlags<PinnedFlags<D>, StdAtomics>. Move-only; frees the memory when destroyed
/// (unless leak() was called, or the process is exiting).
///
/// Thread-safe. The words are read and written only through an Atomics policy; the object
/// itself is not modified after creation, except by move, leak() and destruction, which
/// must happen-after every other use.
template <Driver D>
class PinnedFlags {
 public:
  using word_type = std::uint32_t;

  /// Allocates `size` (>= 1) flags on `driver`. Errors: invalid_argument for 0, or a size
  /// whose bytes overflow; the driver's (mem_host_alloc_mapped, mem_host_device_pointer),
  /// with the size named. @pre a context of the device that will write the flags is
  /// current on the calling thread (the device pointer is that context's).
  static result<PinnedFlags> create(D& driver, std::size_t size) noexcept {
    if (size == 0 || size > SIZE_MAX / sizeof(word_type)) {
      return error{errc::invalid_argument,
                   "PinnedFlags needs 1 to " + std::to_string(SIZE_MAX / sizeof(word_type)) +
                       " flags, not " + std::to_string(size)};
    }
    auto host = driver.mem_host_alloc_mapped(size * sizeof(word_type));
    if (!host) return annotate(std::move(host).error(), size);
    auto dev = driver.mem_host_device_pointer(*host);
    if (!dev) {
      (void)driver.mem_host_free(*host);
      return annotate(std::move(dev).error(), size);
    }
    // Plain writes: creation happens-before every use of the flags.
    std::memset(*host, 0, size * sizeof(word_type));
    return PinnedFlags(driver, static_cast<word_type*>(*host), *dev, size);
  }

  PinnedFlags(PinnedFlags&& o) noexcept
      : driver_(o.driver_),
        words_(std::exchange(o.words_, nullptr)),
        device_base_(o.device_base_),
        size_(std::exchange(o.size_, 0)) {}
  PinnedFlags& operator=(PinnedFlags&& o) noexcept {
    if (this != &o) {
      free_storage();
      driver_ = o.driver_;
      words_ = std::exchange(o.words_, nullptr);
      device_base_ = o.device_base_;
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  PinnedFlags(const PinnedFlags&) = delete;
  PinnedFlags& operator=(const PinnedFlags&) = delete;
  ~PinnedFlags() { free_storage(); }

  std::size_t size() const noexcept { return size_; }

  /// The host view of flag `slot`. @pre slot < size()
  word_type& word(std::size_t slot) noexcept { return words_[slot]; }
  const word_type& word(std::size_t slot) const noexcept { return words_[slot]; }

  /// The address a stream writes to set flag `slot` (4-byte aligned). @pre slot < size()
  std::uint64_t device_address(std::size_t slot) const noexcept {
    return device_base_ + slot * sizeof(word_type);
  }

  /// Gives the memory up without freeing it: for an owner that cannot prove the device has
  /// no flag write still queued (freeing would let a late write land in reused memory).
  void leak() noexcept {
    words_ = nullptr;
    size_ = 0;
  }

 private:
  PinnedFlags(D& driver, word_type* words, std::uint64_t device_base, std::size_t size) noexcept
      : driver_(&driver), words_(words), device_base_(device_base), size_(size) {}

  static error annotate(error e, std::size_t size) {
    std::string m = e.message();
    m += " (allocating " + std::to_string(size) + " pinned completion flags)";
    return error{e.code(), std::move(m), e.driver_status()};
  }

  void free_storage() noexcept {
    if (words_ != nullptr && !detail::process_exiting()) (void)driver_->mem_host_free(words_);
    words_ = nullptr;
  }

  D* driver_;
  word_type* words_;
  std::uint64_t device_base_;
  std::size_t size_;
};

}  // namespace xlogrt
