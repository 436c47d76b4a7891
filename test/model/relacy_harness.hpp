// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the Relacy model tests share: run a suite over every schedule (or N random ones),
// keep Relacy's report in a buffer that never allocates, and require a pass or a given
// failure. Include it after "relacy_atomics.hpp" (which brings <relacy/relacy.hpp>).

#include <catch2/catch.hpp>

#include <iostream>
#include <ostream>
#include <streambuf>
#include <string>

namespace xlogrt_model {

struct Outcome {
  rl::test_result_e result;
  rl::iteration_t iterations;
  std::string log;
};

/// Where Relacy writes its report: a fixed buffer that never allocates. Relacy prints the
/// failing schedule's history while its context is still active, so a std::ostringstream
/// that grows there hands its old buffer to Relacy's operator delete, which takes it for
/// a block of the model's heap and crashes. Text beyond the buffer is dropped.
class FixedLog : public std::streambuf {
 public:
  FixedLog() { reset(); }
  void reset() { setp(buf_, buf_ + sizeof buf_); }
  std::string text() const { return std::string(pbase(), pptr()); }

 protected:
  int_type overflow(int_type ch) override { return traits_type::not_eof(ch); }

 private:
  char buf_[1 << 16];
};

/// Explores every schedule when `full`, else `iterations` random ones.
template <class Suite>
Outcome explore(bool full, rl::iteration_t iterations) {
  static FixedLog buf;  // static: kept off the stack
  buf.reset();
  std::ostream log(&buf);
  rl::test_params p;
  p.output_stream = &log;
  p.progress_stream = &log;
  if (full) {
    p.search_type = rl::fair_full_search_scheduler_type;
  } else {
    p.search_type = rl::random_scheduler_type;
    p.iteration_count = iterations;
  }
  rl::simulate<Suite>(p);
  return {p.test_result, p.stop_iteration, buf.text()};
}

template <class Suite>
void require_pass(bool full, rl::iteration_t iterations = 0) {
  const Outcome o = explore<Suite>(full, iterations);
  INFO(o.log);
  REQUIRE(std::string(rl::test_result_str(o.result)) == "SUCCESS");
  std::cout << "  " << Catch::getResultCapture().getCurrentTestName() << ": " << o.iterations
            << (full ? " schedules (full search)" : " random schedules") << ", all passed\n";
}

template <class Suite>
void require_caught(rl::test_result_e expected, bool full, rl::iteration_t iterations = 0) {
  const Outcome o = explore<Suite>(full, iterations);
  INFO("Relacy's report of the mutant run:\n" << o.log);
  REQUIRE(std::string(rl::test_result_str(o.result)) ==
          std::string(rl::test_result_str(expected)));
  std::cout << "  " << Catch::getResultCapture().getCurrentTestName() << ": caught ("
            << rl::test_result_str(o.result) << ") at schedule " << o.iterations << "\n";
}

}  // namespace xlogrt_model
