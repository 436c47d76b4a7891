// SPDX-License-Identifier: Apache-2.0
// Catch2's main, compiled once into a static library that every test links.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
