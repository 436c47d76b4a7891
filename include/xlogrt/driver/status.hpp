// SPDX-License-Identifier: Apache-2.0
#pragma once

// Driver statuses and their translation into xlogrt errors.
//
// Every driver reports failures with CUDA driver status numbers (CUresult values), so
// that SimDriver can inject exactly the status the real driver would return and the
// code above the driver cannot tell the two apart. The few statuses the library reacts
// to by name are listed here, so that this header needs no CUDA header.

#include <string>
#include <string_view>

#include "xlogrt/core/result.hpp"

namespace xlogrt::status {

inline constexpr int success = 0;
inline constexpr int invalid_value = 1;
inline constexpr int out_of_memory = 2;
inline constexpr int not_initialized = 3;
inline constexpr int deinitialized = 4;
inline constexpr int no_device = 100;
inline constexpr int invalid_device = 101;
inline constexpr int invalid_context = 201;
inline constexpr int invalid_handle = 400;
inline constexpr int illegal_state = 401;
inline constexpr int not_found = 500;
inline constexpr int not_ready = 600;
inline constexpr int illegal_address = 700;
inline constexpr int launch_failed = 719;
inline constexpr int not_supported = 801;
// Stream capture (cuStreamBeginCapture .. cuStreamEndCapture).
inline constexpr int stream_capture_unsupported = 900;  ///< not permitted while capturing
inline constexpr int stream_capture_invalidated = 901;  ///< the capture broke a rule earlier
inline constexpr int stream_capture_merge = 902;        ///< would merge two captures
inline constexpr int stream_capture_unmatched = 903;    ///< capture not begun on this stream
inline constexpr int stream_capture_unjoined = 904;     ///< a forked stream was not joined
inline constexpr int stream_capture_isolation = 905;    ///< a dependency crosses the capture
inline constexpr int stream_capture_implicit = 906;     ///< implicit legacy-stream dependency
inline constexpr int captured_event = 907;              ///< the event was recorded in a capture
inline constexpr int stream_capture_wrong_thread = 908; ///< ended on another thread
inline constexpr int unknown = 999;

/// Whether `s` is one of CUDA's sticky errors: a fault on the device (illegal address 700,
/// launch timeout 702, device assert 710, hardware stack error 714, illegal instruction
/// 715, misaligned address 716, invalid address space 717, invalid PC 718, launch failure
/// 719) that leaves the context unusable, so that every later call returns it too. Any
/// other failure may be transient.
constexpr bool sticky(int s) noexcept {
  switch (s) {
    case 700: case 702: case 710: case 714: case 715: case 716: case 717: case 718: case 719: return true;
    default: return false;
  }
}

/// The CUDA name of the statuses above ("CUDA_ERROR_OUT_OF_MEMORY"); empty for others.
constexpr std::string_view name(int s) noexcept {
  switch (s) {
    case success: return "CUDA_SUCCESS";
    case invalid_value: return "CUDA_ERROR_INVALID_VALUE";
    case out_of_memory: return "CUDA_ERROR_OUT_OF_MEMORY";
    case not_initialized: return "CUDA_ERROR_NOT_INITIALIZED";
    case deinitialized: return "CUDA_ERROR_DEINITIALIZED";
    case no_device: return "CUDA_ERROR_NO_DEVICE";
    case invalid_device: return "CUDA_ERROR_INVALID_DEVICE";
    case invalid_context: return "CUDA_ERROR_INVALID_CONTEXT";
    case invalid_handle: return "CUDA_ERROR_INVALID_HANDLE";
    case illegal_state: return "CUDA_ERROR_ILLEGAL_STATE";
    case not_found: return "CUDA_ERROR_NOT_FOUND";
    case not_ready: return "CUDA_ERROR_NOT_READY";
    case illegal_address: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case launch_failed: return "CUDA_ERROR_LAUNCH_FAILED";
    case not_supported: return "CUDA_ERROR_NOT_SUPPORTED";
    case stream_capture_unsupported: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case stream_capture_invalidated: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case stream_capture_merge: return "CUDA_ERROR_STREAM_CAPTURE_MERGE";
    case stream_capture_unmatched: return "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED";
    case stream_capture_unjoined: return "CUDA_ERROR_STREAM_CAPTURE_UNJOINED";
    case stream_capture_isolation: return "CUDA_ERROR_STREAM_CAPTURE_ISOLATION";
    case stream_capture_implicit: return "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    case captured_event: return "CUDA_ERROR_CAPTURED_EVENT";
    case stream_capture_wrong_thread: return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
    case unknown: return "CUDA_ERROR_UNKNOWN";
    default: return {};
  }
}

/// Which errc a failed driver status maps to.
constexpr errc to_errc(int s) noexcept {
  switch (s) {
    case out_of_memory: return errc::out_of_memory;
    case no_device:
    case invalid_device: return errc::no_device;
    case deinitialized: return errc::shutting_down;
    case illegal_address:
    case launch_failed: return errc::stream_fault;
    default: return errc::driver_error;
  }
}

/// The error for driver status `s` returned by `call` ("cuMemAllocAsync"), with
/// `status_name` from the driver (falls back to name(s)) and an optional context
/// sentence ("allocating 256 bytes on ordinal 0, stream 2").
inline error driver_failure(int s, std::string_view call, std::string_view status_name = {},
                            std::string_view context = {}) {
  std::string m(call);
  m += " failed with ";
  std::string_view n = status_name.empty() ? name(s) : status_name;
  if (n.empty()) {
    m += "status ";
  } else {
    m += n;
    m += " (";
  }
  m += std::to_string(s);
  if (!n.empty()) m += ")";
  if (!context.empty()) {
    m += " while ";
    m += context;
  }
  return error{to_errc(s), std::move(m), s};
}

}  // namespace xlogrt::status
