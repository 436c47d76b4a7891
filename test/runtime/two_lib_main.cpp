// SPDX-License-Identifier: Apache-2.0
// Two shared libraries of one process both include xlogrt and ask for the runtime of
// ordinal 0: with default visibility they share one singleton table, so they get the
// same runtime (see DeviceRuntime's class comment).
#include <cstdio>

void* xlogrt_two_lib_a();
void* xlogrt_two_lib_b();

int main() {
  void* a = xlogrt_two_lib_a();
  void* b = xlogrt_two_lib_b();
  std::printf("library a: %p, library b: %p\n", a, b);
  return (a != nullptr && a == b) ? 0 : 1;
}
