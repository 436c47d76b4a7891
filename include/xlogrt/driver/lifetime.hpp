// SPDX-License-Identifier: Apache-2.0
#pragma once

// Process lifetime: once the process has begun to exit, xlogrt makes no driver call.
//
// At exit, libcuda may already be torn down (its own atexit handlers and static
// destructors run in an order nobody controls), so a cuStreamDestroy or cuMemFree
// issued from a static destructor can crash. The runtime singletons are therefore
// leaked on purpose, and every driver entry point asks process_exiting() first: after
// the flag is set, CudaDriver returns errc::shutting_down without touching libcuda.
// (CudaDriver reads a copy of the flag kept in its own first cache line, set by a
// handler it registers right after the one below.)
//
// The flag is set by an atexit handler registered the first time a driver is opened.
// atexit handlers and static destructors run in reverse order of registration, so
// objects built after the driver was opened are destroyed while the flag is still
// clear (libcuda is still alive then), and anything older sees the flag set.

#include <atomic>
#include <cstdlib>

namespace xlogrt::detail {

inline std::atomic<bool>& exiting_flag() noexcept {
  static std::atomic<bool> flag{false};  // trivially destructible: safe at exit
  return flag;
}

/// Registers the atexit handler once per process. Thread-safe.
inline void arm_exit_guard() noexcept {
  static const bool armed = [] {
    std::atexit([] { exiting_flag().store(true, std::memory_order_release); });
    return true;
  }();
  (void)armed;
}

/// True once exit() has begun (or main has returned). Thread-safe; lock-free.
inline bool process_exiting() noexcept {
  return exiting_flag().load(std::memory_order_acquire);
}

}  // namespace xlogrt::detail
