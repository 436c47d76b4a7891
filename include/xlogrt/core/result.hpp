// SPDX-License-Identifier: Apache-2.0
#pragma once

// result<T>: the value of a fallible call, or the error that says why it failed.
// Errors are values in xlogrt: nothing on a hot path throws, nothing aborts on bad
// input. An error carries a code (what kind of failure), a sentence a person can act
// on (what failed, with which ordinal / stream / tag / bytes), and the driver status
// when a driver call was the cause.

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace xlogrt {

/// What went wrong. Every public fallible call documents which of these it returns.
enum class errc : std::uint8_t {
  invalid_argument = 1,  ///< a parameter outside its documented range
  zero_bytes,            ///< an allocation of zero bytes
  too_large,             ///< a request larger than the device could ever hold
  out_of_memory,         ///< the device (or its pool) has no room right now
  out_of_budget,         ///< the per-device budget refused the request
  empty_block,           ///< a moved-from or default-constructed DeviceBlock
  double_free,           ///< a block that was already freed
  stale_block,           ///< a BlockId whose block has been freed
  foreign_block,         ///< a block of another resource, runtime or ordinal
  stream_misuse,         ///< a stream call the stack cannot honour (e.g. no tracking)
  unknown_stream,        ///< a StreamId the pool does not have
  invalid_ordinal,       ///< a device ordinal out of range
  no_driver,             ///< libcuda could not be loaded
  driver_too_old,        ///< libcuda lacks an entry point or version xlogrt needs
  no_device,             ///< the driver works but the device does not exist / open
  driver_error,          ///< any other driver status (see driver_status())
  guard_corrupted,       ///< DebugGuard found an overwritten guard byte
  stream_fault,          ///< the stream's context faulted before the point was reached
  cancelled,             ///< the waiter was cancelled (reactor shut down)
  shutting_down,         ///< the process is exiting; no driver call is made
  sink_failure,          ///< a log sink could not write
};

/// Stable, snake_case name of a code ("double_free").
constexpr std::string_view to_string(errc c) noexcept {
  switch (c) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::zero_bytes: return "zero_bytes";
    case errc::too_large: return "too_large";
    case errc::out_of_memory: return "out_of_memory";
    case errc::out_of_budget: return "out_of_budget";
    case errc::empty_block: return "empty_block";
    case errc::double_free: return "double_free";
    case errc::stale_block: return "stale_block";
    case errc::foreign_block: return "foreign_block";
    case errc::stream_misuse: return "stream_misuse";
    case errc::unknown_stream: return "unknown_stream";
    case errc::invalid_ordinal: return "invalid_ordinal";
    case errc::no_driver: return "no_driver";
    case errc::driver_too_old: return "driver_too_old";
    case errc::no_device: return "no_device";
    case errc::driver_error: return "driver_error";
    case errc::guard_corrupted: return "guard_corrupted";
    case errc::stream_fault: return "stream_fault";
    case errc::cancelled: return "cancelled";
    case errc::shutting_down: return "shutting_down";
    case errc::sink_failure: return "sink_failure";
  }
  return "unknown";
}

/// A failure: code, human sentence, and the driver status when a driver call failed
/// (0 otherwise). Copyable; cheap to move.
class error {
 public:
  error(errc code, std::string message, int driver_status = 0) noexcept
      : message_(std::move(message)), driver_status_(driver_status), code_(code) {}

  errc code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  int driver_status() const noexcept { return driver_status_; }

  /// "double_free: block 3#7 of ordinal 0 was already freed"
  std::string what() const {
    std::string s(to_string(code_));
    s += ": ";
    s += message_;
    return s;
  }

 private:
  std::string message_;
  int driver_status_;
  errc code_;
};

/// Either a T or an error. Converts implicitly from both, so a function returns
/// `value` or `error{...}` alike; `if (!r) return r.error();` propagates.
template <class T>
class [[nodiscard]] result {
  static_assert(!std::is_reference_v<T>, "result<T&> is not supported; use T*");

 public:
  using value_type = T;

  template <class U = T>
    requires std::is_constructible_v<T, U&&> &&
             (!std::is_same_v<std::remove_cvref_t<U>, result>) &&
             (!std::is_same_v<std::remove_cvref_t<U>, xlogrt::error>)
  result(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>)  // NOLINT: implicit by design
      : v_(std::in_place_index<0>, std::forward<U>(v)) {}
  result(xlogrt::error e) noexcept : v_(std::in_place_index<1>, std::move(e)) {}  // NOLINT

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// @pre has_value()
  T& value() & noexcept { return *std::get_if<0>(&v_); }
  const T& value() const& noexcept { return *std::get_if<0>(&v_); }
  T&& value() && noexcept { return std::move(*std::get_if<0>(&v_)); }
  T& operator*() & noexcept { return value(); }
  const T& operator*() const& noexcept { return value(); }
  T&& operator*() && noexcept { return std::move(*this).value(); }
  T* operator->() noexcept { return &value(); }
  const T* operator->() const noexcept { return &value(); }

  /// @pre !has_value()
  const xlogrt::error& error() const& noexcept { return *std::get_if<1>(&v_); }
  xlogrt::error&& error() && noexcept { return std::move(*std::get_if<1>(&v_)); }

 private:
  std::variant<T, xlogrt::error> v_;
};

/// The value-less result: success, or an error.
template <>
class [[nodiscard]] result<void> {
 public:
  using value_type = void;
  result() noexcept = default;
  result(xlogrt::error e) noexcept : e_(std::in_place_index<1>, std::move(e)) {}  // NOLINT

  bool has_value() const noexcept { return e_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }
  const xlogrt::error& error() const& noexcept { return *std::get_if<1>(&e_); }
  xlogrt::error&& error() && noexcept { return std::move(*std::get_if<1>(&e_)); }

 private:
  std::variant<std::monostate, xlogrt::error> e_;
};

/// The success value of result<void>, for readability: `return ok();`.
inline result<void> ok() noexcept { return {}; }

}  // namespace xlogrt
