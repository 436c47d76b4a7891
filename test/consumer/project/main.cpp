// SPDX-License-Identifier: Apache-2.0
#include <xlogrt/runtime.hpp>

#include <cstdio>

int main() {
  xlogrt::DeviceBlock empty;
  std::printf("xlogrt consumer: empty block %s\n", empty.empty() ? "is empty" : "is not empty");
  return empty.empty() ? 0 : 1;
}
