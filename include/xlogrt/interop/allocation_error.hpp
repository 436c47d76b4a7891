// SPDX-License-Identifier: Apache-2.0
#pragma once

// allocation_error: the exception the throwing bridges (cuda::mr, Thrust) raise when the
// stack refuses an allocation, carrying the xlogrt error.

#include <new>
#include <string>
#include <utility>

#include "xlogrt/core/result.hpp"

namespace xlogrt {

/// A std::bad_alloc (what cuda::mr resources and Thrust allocators are expected to throw,
/// and what RMM's pool catches to try a smaller growth) that keeps the stack's error:
/// code() is out_of_memory, out_of_budget, invalid_argument, ...; what() is the message.
class allocation_error : public std::bad_alloc {
 public:
  explicit allocation_error(error e) : error_(std::move(e)), what_(error_.what()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  errc code() const noexcept { return error_.code(); }
  const error& xlogrt_error() const noexcept { return error_; }

 private:
  error error_;
  std::string what_;
};

}  // namespace xlogrt
