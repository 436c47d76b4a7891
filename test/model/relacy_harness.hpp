// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the Relacy model tests share: the sized deletes Relacy needs, a search (every
// schedule, a preemption bound, or N random ones), Relacy's report kept in a buffer that
// never allocates, and the checks that a suite passes or that a mutant is caught with the
// failure it causes. Include it after "relacy_atomics.hpp" (which brings
// <relacy/relacy.hpp>), in the one translation unit of a model executable.

#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <iostream>
#include <ostream>
#include <streambuf>
#include <string>

// Relacy replaces the global operator new (inline, in its header) with one that allocates
// from the model's heap while a model runs and from malloc otherwise, but it defines
// neither the sized deletes that C++14 code calls nor a delete that code outside this
// translation unit reaches. Without the definitions below, libstdc++ would hand a block
// from the model's heap to glibc's free. With them, every delete of the process goes to
// Relacy's, which knows which heap a block came from. (Hence: one translation unit per
// executable includes this header.)
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete[](p); }
[[gnu::used]] static void (*const keep_relacy_delete)(void*) noexcept = &::operator delete;
[[gnu::used]] static void (*const keep_relacy_delete_array)(void*) noexcept =
    &::operator delete[];

namespace xlogrt_model {

/// Where Relacy writes its report: a fixed buffer that never allocates. Relacy prints the
/// failing schedule's history while its context is still active, so a std::ostringstream
/// that grows there hands its old buffer to Relacy's operator delete, which takes it for
/// a block of the model's heap and crashes. Text beyond the buffer is dropped.
class FixedLog : public std::streambuf {
 public:
  FixedLog() { clear(); }
  void clear() { setp(buf_.data(), buf_.data() + buf_.size()); }
  std::string text() const { return std::string(pbase(), pptr()); }

 protected:
  int_type overflow(int_type c) override { return traits_type::not_eof(c); }  // full: drop

 private:
  std::array<char, 1 << 20> buf_{};
};

struct Outcome {
  rl::test_result_e result;
  rl::iteration_t iterations;
  std::string log;
};

/// How a model is explored: every schedule (full), every schedule with at most `bound`
/// preemptions (context-bound), or `iterations` random schedules.
struct Search {
  rl::scheduler_type_e type;
  unsigned bound = 0;
  rl::iteration_t iterations = 0;
  std::string what() const {
    if (type == rl::fair_full_search_scheduler_type) return "every schedule";
    if (type == rl::fair_context_bound_scheduler_type) {
      return "every schedule with at most " + std::to_string(bound) + " preemption" +
             (bound == 1 ? "" : "s");
    }
    return "random schedules";
  }
};
constexpr Search full() { return {rl::fair_full_search_scheduler_type}; }
constexpr Search bounded(unsigned preemptions) {
  return {rl::fair_context_bound_scheduler_type, preemptions};
}
constexpr Search random(rl::iteration_t n) { return {rl::random_scheduler_type, 0, n}; }

template <class Suite>
Outcome explore(const Search& search) {
  static FixedLog buffer;  // 1 MiB: kept off the stack
  buffer.clear();
  std::ostream log(&buffer);
  rl::test_params p;
  p.output_stream = &log;
  p.progress_stream = &log;
  p.search_type = search.type;
  p.context_bound = search.bound;
  if (search.iterations != 0) p.iteration_count = search.iterations;
  rl::simulate<Suite>(p);
  return {p.test_result, p.stop_iteration, buffer.text()};
}

/// The protocol as shipped must pass; on failure, Relacy's history is the report.
template <class Suite>
void require_pass(const Search& search) {
  const Outcome o = explore<Suite>(search);
  INFO(o.log);
  REQUIRE(std::string(rl::test_result_str(o.result)) == "SUCCESS");
  std::cout << "  " << Catch::getResultCapture().getCurrentTestName() << ": passed, "
            << o.iterations << " schedules (" << search.what() << ")\n";
}

/// A mutant must be caught, with the failure it is expected to cause.
template <class Suite>
void require_caught(rl::test_result_e expected, const Search& search) {
  const Outcome o = explore<Suite>(search);
  INFO("Relacy's report of the mutant run:\n" << o.log);
  REQUIRE(std::string(rl::test_result_str(o.result)) ==
          std::string(rl::test_result_str(expected)));
  std::cout << "  " << Catch::getResultCapture().getCurrentTestName() << ": "
            << rl::test_result_str(o.result) << " found at schedule " << o.iterations << " ("
            << search.what() << ")\n";
}

}  // namespace xlogrt_model
