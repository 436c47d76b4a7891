// SPDX-License-Identifier: Apache-2.0
#pragma once

// A cache-line prefetch for the scanner: it pulls in, while a wait is armed, the lines
// that completing the wait will write, so that a completion does not wait for lines the
// arming thread wrote. Hints only: they change no value and no order, so the model
// checker (which cannot see them) checks the same protocol.

namespace xlogrt::detail {

/// Brings the line of `p` into this core's cache owned, ready for a write or a
/// read-modify-write (PREFETCHW on x86-64, which CPUs without it execute as a no-op).
inline void prefetch_write(const void* p) noexcept {
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

}  // namespace xlogrt::detail
