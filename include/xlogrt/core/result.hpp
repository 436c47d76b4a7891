// SPDX-License-Identifier: Apache-2.0
#pragma once

// result<T>: the value of a fallible call, or the error that says why it failed, in the
// shape of std::expected<T, xlogrt::error>. Errors are values in xlogrt: nothing on a hot
// path throws, nothing aborts on bad input.
//
// Two ways in: `*r` / `r->` are unchecked (a debug build asserts), for code that has
// tested `r` already, as every hot path does; `r.value()` is checked and throws
// bad_result_access, carrying the error, when there is none. The monadic members
// (and_then, transform, or_else, transform_error) and value_or compose calls without
// an `if (!r) return r.error();` at every step.

#include <cassert>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/error.hpp"

namespace xlogrt {

template <class T>
class result;

/// Thrown by result<T>::value() on a result that holds an error (as
/// std::bad_expected_access is): the one place in xlogrt's core that throws, at the
/// caller's request. Carries the error; what() is the error's what().
class bad_result_access : public std::exception {
 public:
  explicit bad_result_access(xlogrt::error e) : error_(std::move(e)), what_(error_.what()) {}
  const xlogrt::error& error() const& noexcept { return error_; }
  xlogrt::error&& error() && noexcept { return std::move(error_); }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  xlogrt::error error_;
  std::string what_;
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

// value() on an error: throws bad_result_access, or, built without exceptions, prints
// the error and aborts (the caller asked for a value there is not).
// Out of line, so that a checked value() adds only a flag test and a call to its caller.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_bad_result_access(xlogrt::error&& e) {
#if defined(__cpp_exceptions)
  throw bad_result_access(std::move(e));
#else
  std::fprintf(stderr, "xlogrt: result::value() on an error: %s\n", e.what().c_str());
  std::abort();
#endif
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_bad_result_access(const xlogrt::error& e) {
  throw_bad_result_access(xlogrt::error(e));
}

template <class R>
struct is_result : std::false_type {};
template <class U>
struct is_result<result<U>> : std::true_type {};
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

  /// The value. Unchecked: @pre has_value() (asserted in debug builds).
  T& operator*() & noexcept { return (assert(has_), value_); }
  const T& operator*() const& noexcept { return (assert(has_), value_); }
  T&& operator*() && noexcept { return (assert(has_), std::move(value_)); }
  T* operator->() noexcept { return (assert(has_), std::addressof(value_)); }
  const T* operator->() const noexcept { return (assert(has_), std::addressof(value_)); }

  /// The value. Checked: throws bad_result_access, carrying the error, when there is none.
  T& value() & {
    if (!has_) [[unlikely]] detail::throw_bad_result_access(err_);
    return value_;
  }
  const T& value() const& {
    if (!has_) [[unlikely]] detail::throw_bad_result_access(err_);
    return value_;
  }
  T&& value() && {
    if (!has_) [[unlikely]] detail::throw_bad_result_access(std::move(err_));
    return std::move(value_);
  }

  /// The value, or `fallback` converted to T when there is none.
  template <class U = std::remove_cv_t<T>>
  T value_or(U&& fallback) const& {
    static_assert(std::is_copy_constructible_v<T> && std::is_convertible_v<U&&, T>);
    return has_ ? value_ : static_cast<T>(std::forward<U>(fallback));
  }
  template <class U = std::remove_cv_t<T>>
  T value_or(U&& fallback) && {
    static_assert(std::is_move_constructible_v<T> && std::is_convertible_v<U&&, T>);
    return has_ ? std::move(value_) : static_cast<T>(std::forward<U>(fallback));
  }

  /// The error. Unchecked: @pre !has_value() (asserted in debug builds).
  const xlogrt::error& error() const& noexcept { return (assert(!has_), err_); }
  xlogrt::error&& error() && noexcept { return (assert(!has_), std::move(err_)); }

  /// `f(value)`, a result<U>, or this error as a result<U>.
  template <class F> auto and_then(F&& f) & { return and_then_(*this, std::forward<F>(f)); }
  template <class F> auto and_then(F&& f) const& { return and_then_(*this, std::forward<F>(f)); }
  template <class F> auto and_then(F&& f) && { return and_then_(std::move(*this), std::forward<F>(f)); }

  /// `f(value)` as a result<U> (result<void> when f returns nothing), or this error.
  template <class F> auto transform(F&& f) & { return transform_(*this, std::forward<F>(f)); }
  template <class F> auto transform(F&& f) const& { return transform_(*this, std::forward<F>(f)); }
  template <class F> auto transform(F&& f) && { return transform_(std::move(*this), std::forward<F>(f)); }

  /// This value, or `f(error)`, a result<T> (which may recover, or fail otherwise).
  template <class F> result or_else(F&& f) const& { return or_else_(*this, std::forward<F>(f)); }
  template <class F> result or_else(F&& f) && { return or_else_(std::move(*this), std::forward<F>(f)); }

  /// This value, or the xlogrt::error that `f(error)` returns (to add context, say).
  template <class F> result transform_error(F&& f) const& { return transform_error_(*this, std::forward<F>(f)); }
  template <class F> result transform_error(F&& f) && { return transform_error_(std::move(*this), std::forward<F>(f)); }

 private:
  // The monadic members, once for every value category of *this.
  template <class Self, class F>
  static auto and_then_(Self&& self, F&& f) {
    using R = std::remove_cvref_t<std::invoke_result_t<F, decltype((std::forward<Self>(self).value_))>>;
    static_assert(detail::is_result<R>::value, "and_then: f must return an xlogrt::result");
    if (self.has_) [[likely]] return std::invoke(std::forward<F>(f), std::forward<Self>(self).value_);
    return R(std::forward<Self>(self).err_);
  }
  template <class Self, class F>
  static auto transform_(Self&& self, F&& f) {
    using U = std::remove_cv_t<std::invoke_result_t<F, decltype((std::forward<Self>(self).value_))>>;
    if (self.has_) [[likely]] {
      if constexpr (std::is_void_v<U>) {
        std::invoke(std::forward<F>(f), std::forward<Self>(self).value_);
        return result<U>();  // U, not void: a dependent name, looked up once result<void> exists
      } else {
        return result<U>(std::invoke(std::forward<F>(f), std::forward<Self>(self).value_));
      }
    }
    return result<U>(std::forward<Self>(self).err_);
  }
  template <class Self, class F>
  static result or_else_(Self&& self, F&& f) {
    using R = std::remove_cvref_t<std::invoke_result_t<F, decltype((std::forward<Self>(self).err_))>>;
    static_assert(std::is_same_v<R, result>, "or_else: f must return a result of the same type");
    if (self.has_) [[likely]] return result(std::forward<Self>(self).value_);
    return std::invoke(std::forward<F>(f), std::forward<Self>(self).err_);
  }
  template <class Self, class F>
  static result transform_error_(Self&& self, F&& f) {
    using E = std::remove_cvref_t<std::invoke_result_t<F, decltype((std::forward<Self>(self).err_))>>;
    static_assert(std::is_same_v<E, xlogrt::error>, "transform_error: f must return an xlogrt::error");
    if (self.has_) [[likely]] return result(std::forward<Self>(self).value_);
    return result(std::invoke(std::forward<F>(f), std::forward<Self>(self).err_));
  }


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

  /// Unchecked: @pre has_value() (asserted in debug builds). Does nothing.
  void operator*() const noexcept { assert(has_); }
  /// Checked: throws bad_result_access, carrying the error, when this is one.
  void value() const& {
    if (!has_) [[unlikely]] detail::throw_bad_result_access(err_);
  }
  void value() && {
    if (!has_) [[unlikely]] detail::throw_bad_result_access(std::move(err_));
  }

  /// The error. Unchecked: @pre !has_value() (asserted in debug builds).
  const xlogrt::error& error() const& noexcept { return (assert(!has_), err_); }
  xlogrt::error&& error() && noexcept { return (assert(!has_), std::move(err_)); }

  /// `f()`, a result<U>, on success; this error as a result<U> otherwise.
  template <class F> auto and_then(F&& f) const& { return and_then_(*this, std::forward<F>(f)); }
  template <class F> auto and_then(F&& f) && { return and_then_(std::move(*this), std::forward<F>(f)); }

  /// `f()` as a result<U> (result<void> when f returns nothing) on success; this error otherwise.
  template <class F> auto transform(F&& f) const& { return transform_(*this, std::forward<F>(f)); }
  template <class F> auto transform(F&& f) && { return transform_(std::move(*this), std::forward<F>(f)); }

  /// Success, or `f(error)`, a result<void>.
  template <class F> result or_else(F&& f) const& { return or_else_(*this, std::forward<F>(f)); }
  template <class F> result or_else(F&& f) && { return or_else_(std::move(*this), std::forward<F>(f)); }

  /// Success, or the xlogrt::error that `f(error)` returns.
  template <class F> result transform_error(F&& f) const& { return transform_error_(*this, std::forward<F>(f)); }
  template <class F> result transform_error(F&& f) && { return transform_error_(std::move(*this), std::forward<F>(f)); }

 private:
  template <class Self, class F>
  static auto and_then_(Self&& self, F&& f) {
    using R = std::remove_cvref_t<std::invoke_result_t<F>>;
    static_assert(detail::is_result<R>::value, "and_then: f must return an xlogrt::result");
    if (self.has_) [[likely]] return std::invoke(std::forward<F>(f));
    return R(std::forward<Self>(self).err_);
  }
  template <class Self, class F>
  static auto transform_(Self&& self, F&& f) {
    using U = std::remove_cv_t<std::invoke_result_t<F>>;
    if (self.has_) [[likely]] {
      if constexpr (std::is_void_v<U>) {
        std::invoke(std::forward<F>(f));
        return result<void>();
      } else {
        return result<U>(std::invoke(std::forward<F>(f)));
      }
    }
    return result<U>(std::forward<Self>(self).err_);
  }
  template <class Self, class F>
  static result or_else_(Self&& self, F&& f) {
    using R = std::remove_cvref_t<std::invoke_result_t<F, decltype((std::forward<Self>(self).err_))>>;
    static_assert(std::is_same_v<R, result>, "or_else: f must return a result<void>");
    if (self.has_) [[likely]] return result();
    return std::invoke(std::forward<F>(f), std::forward<Self>(self).err_);
  }
  template <class Self, class F>
  static result transform_error_(Self&& self, F&& f) {
    using E = std::remove_cvref_t<std::invoke_result_t<F, decltype((std::forward<Self>(self).err_))>>;
    static_assert(std::is_same_v<E, xlogrt::error>, "transform_error: f must return an xlogrt::error");
    if (self.has_) [[likely]] return result();
    return result(std::invoke(std::forward<F>(f), std::forward<Self>(self).err_));
  }

  union {
    xlogrt::error err_;
  };
  bool has_;
};

/// The success value of result<void>, for readability: `return ok();`.
inline result<void> ok() noexcept { return {}; }

}  // namespace xlogrt

// Passing an error on, in a function that returns a result (of any T):
//   XLOGRT_TRY(expr);             expr's error is returned; its value, if any, dropped
//   XLOGRT_TRY_ASSIGN(decl, expr) expr's error is returned, else its value moved into
//                                 `decl` (`auto x`, `Device<D>* p`, an existing variable)
// Each evaluates expr once. The monadic members compose a chain of calls; these pass on
// the error of a step whose value later steps need.
#define XLOGRT_TRY(expr)                                                          \
  do {                                                                            \
    if (auto xlogrt_try_result_ = (expr); !xlogrt_try_result_) [[unlikely]]      \
      return std::move(xlogrt_try_result_).error();                               \
  } while (false)
#define XLOGRT_TRY_CONCAT_IMPL_(a, b) a##b
#define XLOGRT_TRY_CONCAT_(a, b) XLOGRT_TRY_CONCAT_IMPL_(a, b)
#define XLOGRT_TRY_ASSIGN_IMPL_(tmp, decl, expr)            \
  auto tmp = (expr);                                        \
  if (!tmp) [[unlikely]] return std::move(tmp).error();     \
  decl = std::move(*tmp)
#define XLOGRT_TRY_ASSIGN(decl, expr) XLOGRT_TRY_ASSIGN_IMPL_(XLOGRT_TRY_CONCAT_(xlogrt_try_, __LINE__), decl, expr)
