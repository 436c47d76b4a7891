// SPDX-License-Identifier: Apache-2.0
#pragma once

// The size classes of the caching layer.
//
// A request of n bytes is served by a block of class_bytes(class_of(n)) bytes:
// - n <= 256: one class of 256 bytes (the driver's own allocation granularity);
// - above: each power of two 2^e (e >= 8) is split into four steps, so the classes of
//   (2^e, 2^(e+1)] are 1.25, 1.5, 1.75 and 2 times 2^e.
// Bound on internal waste: a block is less than 1.25 times its request (the worst case
// is a request just above a class, e.g. 2^e + 1 served by 1.25 * 2^e), so at most 20 % of
// a block's bytes are unused; powers of two and their 1.25 / 1.5 / 1.75 multiples (the
// usual tensor and page sizes) waste nothing. PyTorch's allocator rounds small requests
// to 512 bytes and, by default, large ones to 2 MiB boundaries; four steps per power of
// two keeps the bound independent of the size.

#include <bit>
#include <cstddef>
#include <cstdint>

namespace xlogrt::detail {

inline constexpr std::size_t SMALLEST_CLASS = 256;
inline constexpr unsigned SMALLEST_CLASS_BITS = 8;

/// The class serving a request of `n` bytes (n >= 1).
[[gnu::always_inline]] constexpr std::uint32_t class_of(std::size_t n) noexcept {
  if (n <= SMALLEST_CLASS) return 0;
  const std::size_t m = n - 1;
  const unsigned e = static_cast<unsigned>(std::bit_width(m)) - 1;  // 2^e <= m < 2^(e+1)
  const auto step = static_cast<std::uint32_t>((m >> (e - 2)) & 3u);
  return (e - SMALLEST_CLASS_BITS) * 4 + step + 1;
}

/// The bytes of a block of class `c`.
[[gnu::always_inline]] constexpr std::size_t class_bytes(std::uint32_t c) noexcept {
  if (c == 0) return SMALLEST_CLASS;
  const unsigned e = (c - 1) / 4 + SMALLEST_CLASS_BITS;
  const std::size_t step = (c - 1) % 4;
  return (4 + step + 1) << (e - 2);
}

static_assert(class_bytes(class_of(1)) == 256 && class_bytes(class_of(257)) == 320);
static_assert(class_bytes(class_of(512)) == 512 && class_bytes(class_of(513)) == 640);
static_assert(class_bytes(class_of(std::size_t{64} << 20)) == std::size_t{64} << 20);

}  // namespace xlogrt::detail
