// SPDX-License-Identifier: Apache-2.0
// A library built without xlogrt_torch.map, for the test that shows check_exports.py
// catches a library exporting C++ symbols besides its xlogrt_* functions.
#include <string>

std::string xlogrt_leak_name(int x) { return "leak " + std::to_string(x); }

extern "C" int xlogrt_leak(int x) { return static_cast<int>(xlogrt_leak_name(x).size()); }
