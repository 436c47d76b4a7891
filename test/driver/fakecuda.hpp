// SPDX-License-Identifier: Apache-2.0
#pragma once

// The state a fake libcuda (fakecuda.cpp) exposes to the tests, through its exported
// function fakecuda_state(). The fake exists so that CudaDriver's loading, version
// checks, entry-point versions, argument mapping, error mapping and exit guard are
// tested on machines with no GPU: it counts every call that reaches it, records the
// last call and every cuGetProcAddress request, and can be told to fail one call.

#include <atomic>
#include <cstdint>

struct FakeCudaRequest {
  char symbol[64];
  int version;              // cudaVersion asked for
  unsigned long long flags; // cuGetProcAddress flags
  int variant;              // ABI version of the variant handed out; 0: none
};

struct FakeCudaState {
  std::atomic<long> calls{0};       // every entry point call, bootstrap ones included
  std::atomic<int> init_calls{0};   // cuInit
  std::atomic<int> set_current_calls{0};

  // The last call that reached the fake.
  char last_symbol[64] = {};
  int last_variant = 0;             // ABI version of the variant that ran (3020: _v2)
  unsigned long long last_args[6] = {};

  // Failure injection: the entry point named fail_symbol returns fail_status.
  char fail_symbol[64] = {};
  int fail_status = 0;

  int query_status = 0;             // what cuStreamQuery and cuEventQuery return
  unsigned long long stream_id_salt = 0;  // cuStreamGetId returns handle * 7 + salt
  void* current_ctx = nullptr;      // what cuCtxGetCurrent reports
  int zero_attribute = -1;          // a CUdevice_attribute cuDeviceGetAttribute reports as 0

  FakeCudaRequest requests[128] = {};
  int n_requests = 0;
};

extern "C" FakeCudaState* fakecuda_state();
