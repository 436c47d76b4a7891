// SPDX-License-Identifier: Apache-2.0
#pragma once

// error: why a fallible call failed. An error carries a code (what kind of failure), a
// sentence a person can act on (what failed, with which ordinal / stream / tag / bytes),
// and the driver status when a driver call was the cause.
//
// Codes are open, in the manner of std::error_code: a code is an int within an
// error_category, and the category names the code. xlogrt's own codes are the enum
// `errc`, in xlogrt_category(); a library or a user decorator that refuses for reasons
// of its own defines a category (and, for convenience, an enum that names it through
// `error_category_of`) and returns `error{its_code, "sentence"}` exactly as xlogrt does.

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace xlogrt {

/// What went wrong, for xlogrt's own errors. Every public fallible call documents which
/// of these it returns. An error of another category answers `user_defined` to code().
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
  user_defined,          ///< the code of another category (see error::category())
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
    case errc::user_defined: return "user_defined";
  }
  return "unknown";
}

/// A family of error codes: a name, and a name for each of its codes.
///
/// A category is identified by its address, as std::error_category is: define one
/// object of each category for the whole program, an `inline constexpr` variable or a
/// function-local static, never one per call. Categories are immutable: thread-safe.
///
///     struct QuotaCategory final : xlogrt::error_category {
///       std::string_view name() const noexcept override { return "quota"; }
///       std::string_view message(int code) const noexcept override {
///         return code == 1 ? "over_quota" : "unknown";
///       }
///     };
///     inline constexpr QuotaCategory quota_category;
///     enum class quota_errc { over_quota = 1 };
///     // Found by argument-dependent lookup: makes error{quota_errc::over_quota, "..."} work.
///     constexpr const xlogrt::error_category& error_category_of(quota_errc) noexcept {
///       return quota_category;
///     }
class error_category {
 public:
  error_category(const error_category&) = delete;
  error_category& operator=(const error_category&) = delete;

  /// The category's stable name ("xlogrt", "quota"): the prefix of a foreign error's what().
  virtual std::string_view name() const noexcept = 0;
  /// The stable, snake_case name of `code` in this category ("double_free"). The
  /// returned text must outlive the program's errors (a string literal, say).
  virtual std::string_view message(int code) const noexcept = 0;

  friend bool operator==(const error_category& a, const error_category& b) noexcept { return &a == &b; }

 protected:
  constexpr error_category() noexcept = default;
  // Not virtual: a category is never destroyed through a pointer to this base, and a
  // trivial destructor lets categories be constexpr objects.
  ~error_category() = default;
};

namespace detail {
class XlogrtCategory final : public error_category {
 public:
  constexpr XlogrtCategory() noexcept = default;
  std::string_view name() const noexcept override { return "xlogrt"; }
  std::string_view message(int code) const noexcept override { return to_string(static_cast<errc>(code)); }
};
inline constexpr XlogrtCategory xlogrt_category_object;
}  // namespace detail

/// The category of xlogrt's own codes, `errc`. One object per program (an inline
/// variable; shared libraries that export it, as by default, share it).
constexpr const error_category& xlogrt_category() noexcept { return detail::xlogrt_category_object; }

/// The category of an `errc`, as of every error_code_enum.
constexpr const error_category& error_category_of(errc) noexcept { return xlogrt_category(); }

/// An enum whose values are codes of one category: `error_category_of(e)`, found by
/// argument-dependent lookup, names it.
template <class E>
concept error_code_enum = std::is_enum_v<E> && !std::is_same_v<E, errc> && requires(E e) {
  { error_category_of(e) } -> std::convertible_to<const error_category&>;
};

/// A failure: category and code, human sentence, and the driver status when a driver
/// call failed (0 otherwise). Copyable; cheap to move (a std::string and three words).
class error {
 public:
  /// One of xlogrt's own errors.
  error(errc code, std::string message, int driver_status = 0) noexcept
      : category_(&xlogrt_category()),
        message_(std::move(message)),
        value_(static_cast<int>(code)),
        driver_status_(driver_status) {}
  /// An error of another category: code `value` of `category`, which must outlive
  /// the error (see error_category).
  error(const error_category& category, int value, std::string message, int driver_status = 0) noexcept
      : category_(&category), message_(std::move(message)), value_(value), driver_status_(driver_status) {}
  /// An error whose code is a value of an error_code_enum.
  template <error_code_enum E>
  error(E code, std::string message, int driver_status = 0) noexcept
      : error(error_category_of(code), static_cast<int>(code), std::move(message), driver_status) {}

  /// xlogrt's code; `errc::user_defined` for an error of another category.
  errc code() const noexcept {
    return category_ == &xlogrt_category() ? static_cast<errc>(value_) : errc::user_defined;
  }
  /// The code within category(): `int(code())` for xlogrt's own errors.
  int value() const noexcept { return value_; }
  const error_category& category() const noexcept { return *category_; }
  /// Whether this is xlogrt's error `c` (never true for another category's error).
  bool is(errc c) const noexcept { return category_ == &xlogrt_category() && value_ == static_cast<int>(c); }
  /// Whether this is the error `c` of an error_code_enum's category.
  template <error_code_enum E>
  bool is(E c) const noexcept {
    return *category_ == error_category_of(c) && value_ == static_cast<int>(c);
  }
  const std::string& message() const noexcept { return message_; }
  int driver_status() const noexcept { return driver_status_; }

  /// "double_free: block 3#7 of ordinal 0 was already freed" for xlogrt's own codes;
  /// "quota/over_quota: tenant 3 ..." (category/code: sentence) for another category's.
  std::string what() const {
    std::string s;
    if (category_ != &xlogrt_category()) {
      s += category_->name();
      s += '/';
    }
    s += category_->message(value_);
    s += ": ";
    s += message_;
    return s;
  }

 private:
  const error_category* category_;
  std::string message_;
  int value_;
  int driver_status_;
};

}  // namespace xlogrt
