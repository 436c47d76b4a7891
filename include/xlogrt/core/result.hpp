// SPDX-License-Identifier: Apache-2.0
#pragma once

// result<T>: the value of a fallible call, or the error that says why it failed.
// Errors are values in xlogrt: nothing on a hot path throws, nothing aborts on bad
// input. An error carries a code (what kind of failure), a sentence a person can act
// on (what failed, with which ordinal / stream / tag / bytes), and the driver status
// when a driver call was the cause.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

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

namespace detail {
// An error's move and destruction, kept out of line: results are moved and dropped on
// every allocator call, and the success path should carry only a flag test, not a
// string's move or free inlined beside it (which spread the hot code over more cache
// lines and, once GCC gave up inlining the destructor, cost a call per result).
[[gnu::cold, gnu::noinline]] inline void move_error(error* to, error& from) noexcept {
  std::construct_at(to, std::move(from));
}
[[gnu::cold, gnu::noinline]] inline void destroy_error(error& e) noexcept { e.~error(); }
}  // namespace detail

/// Either a T or an error. Converts implicitly from both, so a function returns
/// `value` or `error{...}` alike; `if (!r) return r.error();` propagates.
///
/// A hand-written tagged union rather than std::variant: results are made and dropped
/// on every allocator call, and variant's out-of-line reset and index bookkeeping
/// showed up there. Here the success branch comes first and costs a flag test (plus
/// T's own work, none when T is trivial); the error branch is [[unlikely]].
template <class T>
class [[nodiscard]] result {
  static_assert(!std::is_reference_v<T>, "result<T&> is not supported; use T*");
  static_assert(std::is_nothrow_move_constructible_v<xlogrt::error>);  // the noexcept moves rely on it

 public:
  using value_type = T;

  template <class U = T>
    requires std::is_constructible_v<T, U&&> &&
             (!std::is_same_v<std::remove_cvref_t<U>, result>) &&
             (!std::is_same_v<std::remove_cvref_t<U>, xlogrt::error>)
  result(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>)  // NOLINT: implicit by design
      : value_(std::forward<U>(v)), has_(true) {}
  result(xlogrt::error e) noexcept : err_(std::move(e)), has_(false) {}  // NOLINT

  // The flag is stored after the member, as a constant: the optimizer may think the
  // string's bytewise copy into err_ overwrote a flag stored before it, and then loses
  // track of which member is live (seen as false -Wmaybe-uninitialized in callers).
  result(const result& o) requires std::is_copy_constructible_v<T>
  {
    if (o.has_) [[likely]] {
      std::construct_at(std::addressof(value_), o.value_);
      has_ = true;
    } else [[unlikely]] {
      std::construct_at(std::addressof(err_), o.err_);
      has_ = false;
    }
  }
  [[gnu::always_inline]] result(result&& o) noexcept(std::is_nothrow_move_constructible_v<T>)
    requires std::is_move_constructible_v<T>
  {
    if (o.has_) [[likely]] {
      std::construct_at(std::addressof(value_), std::move(o.value_));
      has_ = true;
    } else [[unlikely]] {
      detail::move_error(std::addressof(err_), o.err_);
      has_ = false;
    }
  }

  result& operator=(const result& o)
    requires std::is_copy_constructible_v<T> && std::is_copy_assignable_v<T>
  {
    if (has_ && o.has_) [[likely]] {
      value_ = o.value_;
    } else [[unlikely]] {
      if (has_) {
        become_error(xlogrt::error(o.err_));  // copy first: a throwing copy changes nothing
      } else if (o.has_) {
        become_value(o.value_);
      } else {
        err_ = o.err_;
      }
    }
    return *this;
  }
  result& operator=(result&& o) noexcept(std::is_nothrow_move_constructible_v<T> &&
                                         std::is_nothrow_move_assignable_v<T>)
    requires std::is_move_constructible_v<T> && std::is_move_assignable_v<T>
  {
    if (has_ && o.has_) [[likely]] {
      value_ = std::move(o.value_);
    } else [[unlikely]] {
      if (has_) {
        become_error(std::move(o.err_));
      } else if (o.has_) {
        become_value(std::move(o.value_));
      } else {
        err_ = std::move(o.err_);
      }
    }
    return *this;
  }

  [[gnu::always_inline]] ~result() {
    if (has_) [[likely]] {
      if constexpr (!std::is_trivially_destructible_v<T>) value_.~T();
    } else [[unlikely]] {
      detail::destroy_error(err_);
    }
  }

  bool has_value() const noexcept { return has_; }
  explicit operator bool() const noexcept { return has_value(); }

  /// @pre has_value()
  T& value() & noexcept { return value_; }
  const T& value() const& noexcept { return value_; }
  T&& value() && noexcept { return std::move(value_); }
  T& operator*() & noexcept { return value(); }
  const T& operator*() const& noexcept { return value(); }
  T&& operator*() && noexcept { return std::move(*this).value(); }
  T* operator->() noexcept { return &value(); }
  const T* operator->() const noexcept { return &value(); }

  /// @pre !has_value()
  const xlogrt::error& error() const& noexcept { return err_; }
  xlogrt::error&& error() && noexcept { return std::move(err_); }

 private:
  void become_error(xlogrt::error&& e) noexcept {
    if constexpr (!std::is_trivially_destructible_v<T>) value_.~T();
    std::construct_at(std::addressof(err_), std::move(e));
    has_ = false;
  }

  // The error is dropped only once the T can no longer fail to appear, so a throwing
  // T leaves *this holding its error, never neither.
  template <class A>
  void become_value(A&& a) {
    if constexpr (std::is_nothrow_constructible_v<T, A&&>) {
      err_.~error();
      std::construct_at(std::addressof(value_), std::forward<A>(a));
    } else if constexpr (std::is_nothrow_move_constructible_v<T>) {
      T tmp(std::forward<A>(a));
      err_.~error();
      std::construct_at(std::addressof(value_), std::move(tmp));
    } else {
      xlogrt::error saved(std::move(err_));
      err_.~error();
      try {
        std::construct_at(std::addressof(value_), std::forward<A>(a));
      } catch (...) {
        std::construct_at(std::addressof(err_), std::move(saved));
        throw;
      }
    }
    has_ = true;
  }

  union {
    T value_;
    xlogrt::error err_;
  };
  bool has_;
};

/// The value-less result: success, or an error. The error is constructed only on
/// failure, so success is a flag and nothing else.
template <>
class [[nodiscard]] result<void> {
 public:
  using value_type = void;
  result() noexcept : has_(true) {}
  result(xlogrt::error e) noexcept : err_(std::move(e)), has_(false) {}  // NOLINT

  // The flag is stored after the error, as in result<T>.
  result(const result& o) : has_(true) {
    if (!o.has_) [[unlikely]] {
      std::construct_at(std::addressof(err_), o.err_);
      has_ = false;
    }
  }
  [[gnu::always_inline]] result(result&& o) noexcept : has_(true) {
    if (!o.has_) [[unlikely]] {
      detail::move_error(std::addressof(err_), o.err_);
      has_ = false;
    }
  }
  result& operator=(const result& o) {
    if (!has_ || !o.has_) [[unlikely]] {  // success <- success has nothing to do
      if (o.has_) {
        err_.~error();
        has_ = true;
      } else if (has_) {
        std::construct_at(std::addressof(err_), o.err_);  // a throwing copy leaves success
        has_ = false;
      } else {
        err_ = o.err_;
      }
    }
    return *this;
  }
  result& operator=(result&& o) noexcept {
    if (!has_ || !o.has_) [[unlikely]] {  // success <- success has nothing to do
      if (o.has_) {
        err_.~error();
        has_ = true;
      } else if (has_) {
        std::construct_at(std::addressof(err_), std::move(o.err_));
        has_ = false;
      } else {
        err_ = std::move(o.err_);
      }
    }
    return *this;
  }
  [[gnu::always_inline]] ~result() {
    if (!has_) [[unlikely]] detail::destroy_error(err_);
  }

  bool has_value() const noexcept { return has_; }
  explicit operator bool() const noexcept { return has_value(); }
  const xlogrt::error& error() const& noexcept { return err_; }
  xlogrt::error&& error() && noexcept { return std::move(err_); }

 private:
  union {
    xlogrt::error err_;
  };
  bool has_;
};

/// The success value of result<void>, for readability: `return ok();`.
inline result<void> ok() noexcept { return {}; }

}  // namespace xlogrt
