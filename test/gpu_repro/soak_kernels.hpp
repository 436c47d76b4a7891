// SPDX-License-Identifier: Apache-2.0
#pragma once

// The kernels of the soak (soak_kernels.cu, built by nvcc) and the host functions that
// enqueue them with <<<>>> on a driver stream. The soak itself (soak.cpp) is plain C++:
// it includes xlogrt, and this header only.
//
// A block of `bytes` bytes filled with seed s holds, at word j < bytes/4, word(s, j), and
// in its last bytes % 4 bytes, at byte k, tail_byte(s, k). The check kernel compares every
// word and byte with what the fill wrote (counting mismatches and the first one) and adds
// them all up; the host knows the sum without reading the block (expected_sum).

#include <cuda.h>

#include <cstdint>

#if defined(__CUDACC__)
#define XLOGRT_SOAK_HD __host__ __device__
#else
#define XLOGRT_SOAK_HD
#endif

namespace soak {

XLOGRT_SOAK_HD inline std::uint32_t word(std::uint32_t seed, std::uint32_t j) { return j ^ seed; }
XLOGRT_SOAK_HD inline std::uint8_t tail_byte(std::uint32_t seed, std::uint64_t k) {
  return static_cast<std::uint8_t>((seed >> 11) ^ (static_cast<std::uint32_t>(k) * 0x9Du));
}

/// What one check kernel writes (added to a zeroed record).
struct CheckResult {
  unsigned long long sum;         ///< every word and tail byte, added up
  unsigned long long mismatches;  ///< words and bytes that differ from the fill
  unsigned long long first_bad;   ///< ~(index of the first bad word or byte), 0 if none
};

/// The sum a check of a block of `bytes` bytes filled with `seed` finds, in closed form:
/// per bit b of the word index, how many j < n have it set (flipped where the seed's bit
/// is set), plus the tail bytes.
inline unsigned long long expected_sum(std::uint32_t seed, std::uint64_t bytes) {
  const std::uint64_t n = bytes / 4;
  unsigned long long s = 0;
  for (unsigned b = 0; b < 32; ++b) {
    const std::uint64_t period = std::uint64_t{1} << (b + 1);
    const std::uint64_t half = std::uint64_t{1} << b;
    const std::uint64_t rest = n % period;
    std::uint64_t set = (n / period) * half + (rest > half ? rest - half : 0);
    if ((seed >> b) & 1u) set = n - set;
    s += static_cast<unsigned long long>(set) << b;
  }
  for (std::uint64_t k = n * 4; k < bytes; ++k) s += tail_byte(seed, k);
  return s;
}

inline constexpr unsigned block_threads = 256;
inline constexpr unsigned max_grid = 264;  // 2 blocks per SM of an H200

// Each returns the cudaError_t of the launch (cudaGetLastError), as an int: 0 on success.
// `p` must be 4-byte aligned.

/// Fills p[0..bytes) for `seed`, on stream `s`.
int enqueue_fill(CUstream s, std::uint64_t p, std::uint64_t bytes, std::uint32_t seed);
/// Checks p[0..bytes) against the fill for `seed` and adds the findings into *out, on `s`.
/// A block reduction in shared memory, then one atomic addition per thread block.
int enqueue_check(CUstream s, std::uint64_t p, std::uint64_t bytes, std::uint32_t seed, CheckResult* out);

/// 0 when the kernels can run on the current device (they are built for sm_90 only).
int kernels_loadable();

/// Turns off two of the pool's reuse policies (cudaMemPoolReuseAllowOpportunistic and
/// cudaMemPoolReuseAllowInternalDependencies), so that it reuses memory freed on another
/// stream only after an event dependency on the free. Returns the first cudaError_t.
int strict_pool_reuse(CUmemoryPool pool);

}  // namespace soak
