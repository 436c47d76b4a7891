// SPDX-License-Identifier: Apache-2.0
#pragma once

// The umbrella header: everything a user of xlogrt needs.

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
