// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver's configuration: how it runs stream operations (SimExecutor) and what it
// simulates (SimConfig). A plain value, copied into the driver when it is built; the
// driver validates it then (a configuration it cannot honour makes every entry point
// fail with the reason) and never reads the caller's copy again.

#include <cstddef>
#include <cstdint>

namespace xlogrt {

/// How a SimDriver runs stream operations.
enum class SimExecutor : std::uint8_t {
  /// Background threads run ready operations as soon as they can (what a reactor that
  /// spins on flags written by the device needs).
  threaded,
  /// Nothing runs until step() / run_until_idle() or a synchronising call (which runs
  /// just the operations it waits for). A scheduler seeded by SimConfig::seed picks
  /// which ready stream advances, so a single-threaded test is deterministic and can
  /// explore many legal orders by varying the seed.
  manual,
};

/// What a SimDriver simulates. The defaults model two 1 GiB devices with memory pools
/// and stream memory operations, run by two executor threads.
///
/// Not thread-safe: a value, copied into the driver at construction.
struct SimConfig {
  int devices = 2;                                  ///< 1..64
  std::size_t memory_bytes = std::size_t{1} << 30;  ///< per device, rounded up to 256
  SimExecutor executor = SimExecutor::threaded;
  std::uint64_t seed = 1;                ///< of the scheduler's choices
  unsigned worker_threads = 2;           ///< executor threads (threaded mode)
  bool memory_pools_supported = true;    ///< mem_alloc_async and pools
  bool stream_mem_ops_supported = true;  ///< stream_write_value32
  bool can_map_host_memory = true;       ///< mem_host_alloc_mapped
  bool check_hazards = true;             ///< run the hazard checker
  /// stream_create hands out the handle of a destroyed stream whose work has all run (the
  /// most recent such one of the device), as CUDA may: the new stream has a new
  /// stream_get_id, and keeps the old one's place in stream order (it is ordered after
  /// the old stream's work, which had all run anyway). Off: handles are never reused, so
  /// a destroyed stream's handle is always refused.
  bool reuse_stream_handles = false;
  /// Executed frees stay out of reuse (except by allocations ordered after them) until
  /// this many bytes are quarantined per device; an allocation that would otherwise
  /// fail empties the quarantine first.
  std::size_t quarantine_bytes = std::size_t{64} << 20;
  std::size_t quarantine_blocks = 1024;                    ///< same, counted in blocks
  std::size_t host_mapped_bytes = std::size_t{256} << 20;  ///< room for mapped host memory
  std::size_t max_hazards = 4096;                          ///< reports kept; later ones are counted
  std::uint8_t poison_byte = 0xDD;                         ///< fills freed memory
  std::uint8_t uninit_byte = 0xA5;                         ///< fills fresh allocations
  /// Fill fresh device allocations with uninit_byte and freed ones with poison_byte.
  /// false: device bytes change only when an operation writes them, for runs that
  /// never read what they did not write (the fuzzer: the fills touch every page of
  /// every block, and are most of what such a run costs). The checker's verdicts do not
  /// depend on it.
  bool fill_memory = true;
  /// The virtual memory calls (VirtualMemoryDriver). false: each fails with
  /// CUDA_ERROR_NOT_SUPPORTED, as on a device without virtual memory management.
  bool virtual_memory_supported = true;
  /// mem_granularity's minimum: what physical allocations, mappings and reservations are
  /// multiples of. A power of two, a multiple of the host page size, at most 1 GiB.
  std::size_t vmm_granularity = std::size_t{2} << 20;
  /// mem_granularity's recommended: a multiple of vmm_granularity.
  std::size_t vmm_recommended_granularity = std::size_t{2} << 20;
  /// The address space mem_address_reserve hands out ranges of, for all devices; reserved
  /// (unbacked) on the first reservation, so a run that reserves nothing pays nothing.
  std::size_t vmm_address_bytes = std::size_t{16} << 30;
  int compute_capability_major = 9;
  int compute_capability_minor = 0;
  int multiprocessor_count = 132;
};

}  // namespace xlogrt
