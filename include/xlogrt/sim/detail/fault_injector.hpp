// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: fault injection and call counting.
//
// Every entry point counts itself (count(), first thing under the lock) and then asks
// injected() whether it must fail before it has any effect. An injection is per entry
// point: a countdown armed by fail_nth (the n-th call from now fails once) and a status
// armed by fail_always (every call fails until clear()). fail_always wins over a
// countdown, and a countdown does not advance while fail_always holds.
//
// Misuse (an unknown entry point name, n < 1, status 0) is not an error the caller may
// ignore: it is remembered, and from then on every entry point fails with
// status::invalid_value and a message naming the mistake, until clear(). So a test that
// misspells a name fails loudly instead of passing because nothing was injected.
//
// Not thread-safe: guarded by its SimDriver's mutex (the driver's enter_locked and its
// fail_nth / fail_always / clear_failures / calls, each under the lock).

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "xlogrt/driver/status.hpp"
#include "xlogrt/sim/detail/objects.hpp"
#include "xlogrt/sim/report.hpp"

namespace xlogrt::detail::sim {

/// An injected failure: the status and why, a sentence that lives as long as the
/// injector is not changed (the driver copies it into its error at once).
struct Injected {
  int status = 0;
  std::string_view why;
};

class FaultInjector {
 public:
  void count(Call c) noexcept { ++calls_[static_cast<std::size_t>(c)]; }

  /// Whether this call of `c` fails, and how; advances a fail_nth countdown.
  std::optional<Injected> injected(Call c) noexcept {
    if (!misuse_.empty()) return Injected{status::invalid_value, misuse_};
    Injection& in = inject_[static_cast<std::size_t>(c)];
    if (in.always_status != 0)
      return Injected{in.always_status, "failing as SimDriver::fail_always asked"};
    if (in.countdown > 0 && --in.countdown == 0)
      return Injected{in.nth_status, "failing as SimDriver::fail_nth asked"};
    return std::nullopt;
  }

  SimInjection fail_nth(std::string_view call, int n, int status) {
    Call c{};
    if (!find_call(call, c)) {
      misuse_ = "obeying SimDriver::fail_nth(\"" + std::string(call) +
                "\"), which is no entry point (use the CUDA name, e.g. cuMemAllocFromPoolAsync)";
    } else if (n < 1 || status == 0) {
      misuse_ = "obeying SimDriver::fail_nth(\"" + std::string(call) + "\", " +
                std::to_string(n) + ", " + std::to_string(status) +
                "): n must be >= 1 and the status non-zero";
    } else {
      Injection& in = inject_[static_cast<std::size_t>(c)];
      in.countdown = n;
      in.nth_status = status;
      return SimInjection{true, {}};
    }
    return SimInjection{false, misuse_};
  }

  SimInjection fail_always(std::string_view call, int status) {
    Call c{};
    if (!find_call(call, c)) {
      misuse_ = "obeying SimDriver::fail_always(\"" + std::string(call) +
                "\"), which is no entry point (use the CUDA name, e.g. cuMemAllocFromPoolAsync)";
    } else if (status == 0) {
      misuse_ = "obeying SimDriver::fail_always(\"" + std::string(call) +
                "\", 0): the status must be non-zero";
    } else {
      inject_[static_cast<std::size_t>(c)].always_status = status;
      return SimInjection{true, {}};
    }
    return SimInjection{false, misuse_};
  }

  /// Disarms every injection and forgets misuse; the call counts stay.
  void clear() noexcept {
    inject_.fill(Injection{});
    misuse_.clear();
  }

  /// Calls of `c` since construction, failed ones included.
  std::uint64_t calls(Call c) const noexcept { return calls_[static_cast<std::size_t>(c)]; }

 private:
  struct Injection {
    std::int64_t countdown = 0;
    int nth_status = 0;
    int always_status = 0;
  };

  std::array<std::uint64_t, call_count> calls_{};
  std::array<Injection, call_count> inject_{};
  std::string misuse_;  // non-empty: every entry point fails with it
};

}  // namespace xlogrt::detail::sim
