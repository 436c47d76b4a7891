// SPDX-License-Identifier: Apache-2.0
#pragma once

// FutureError: how a reactor's std::future reports the error that ended a wait.

#include <exception>
#include <utility>

#include "xlogrt/core/result.hpp"

namespace xlogrt {

/// The exception a when_done_future's get() throws when the wait ended in an error: the
/// boundary between xlogrt's error values and std::future, which carries errors only as
/// exceptions. Nothing in xlogrt throws it; std::future::get does.
///
/// Thread-safe: immutable.
class FutureError : public std::exception {
 public:
  explicit FutureError(xlogrt::error e) noexcept : error_(std::move(e)) {}
  const xlogrt::error& error() const noexcept { return error_; }
  const char* what() const noexcept override { return error_.message().c_str(); }

 private:
  xlogrt::error error_;
};

}  // namespace xlogrt
