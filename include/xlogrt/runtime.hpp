// SPDX-License-Identifier: Apache-2.0
#pragma once

// The umbrella header: everything a program that runs xlogrt on the GPU uses, the
// layers in order (core, driver, device, resource, runtime, memory) and the completion
// reactor beside them.
//
// Not included: the simulated driver, <xlogrt/sim/sim_driver.hpp>, which a test or a
// program without a GPU includes itself (it is most of what a TU of this header would
// otherwise compile), and the interop adaptors under <xlogrt/interop/>, which need the
// headers of the library they adapt to.

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/device.hpp"
#include "xlogrt/device/event_pool.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/cuda_driver.hpp"
#include "xlogrt/memory/device_buffer.hpp"
#include "xlogrt/memory/launch.hpp"
#include "xlogrt/memory/launch_kernel.hpp"
#include "xlogrt/reactor/awaitable.hpp"
#include "xlogrt/reactor/pinned_flags.hpp"
#include "xlogrt/reactor/point.hpp"
#include "xlogrt/reactor/reactor.hpp"
#include "xlogrt/reactor/slot_table.hpp"
#include "xlogrt/resource/any_resource.hpp"
#include "xlogrt/resource/async_cuda.hpp"
#include "xlogrt/resource/budget.hpp"
#include "xlogrt/resource/budget_ledger.hpp"
#include "xlogrt/resource/cached.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/debug_guard.hpp"
#include "xlogrt/resource/direct_cuda.hpp"
#include "xlogrt/runtime/env_config.hpp"
#include "xlogrt/resource/find_layer.hpp"
#include "xlogrt/resource/live_blocks.hpp"
#include "xlogrt/resource/logging.hpp"
#include "xlogrt/resource/pool_or_virtual.hpp"
#include "xlogrt/resource/request_checks.hpp"
#include "xlogrt/resource/statistics.hpp"
#include "xlogrt/resource/virtual_cuda.hpp"
#include "xlogrt/runtime/default_stack.hpp"
#include "xlogrt/runtime/device_runtime.hpp"
