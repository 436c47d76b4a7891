// SPDX-License-Identifier: Apache-2.0
#pragma once

// How the fuzz harnesses report a broken invariant: one sentence on stderr, then abort
// (a crash, for libFuzzer).

#include <cstdio>
#include <cstdlib>
#include <string>

namespace xlogrt::fuzz {

[[noreturn]] inline void broken(const std::string& what) {
  std::fprintf(stderr, "xlogrt fuzz: invariant broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace xlogrt::fuzz

#define XF_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) ::xlogrt::fuzz::broken(std::string(#cond) + ": " + (__VA_ARGS__)); \
  } while (0)
