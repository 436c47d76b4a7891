// SPDX-License-Identifier: Apache-2.0
#pragma once

// load_cuda_driver(): finds libcuda at run time and fills a CudaApi, or says precisely
// why it cannot. Called by CudaDriver::open() under its lock; not part of the public API.
//
// Order of the checks, and the error each one gives:
//   1. dlopen $XLOGRT_LIBCUDA, or libcuda.so.1          fails -> errc::no_driver
//   2. dlsym cuInit and cuDriverGetVersion               absent -> errc::no_driver
//   3. cuDriverGetVersion >= 12.0                        older  -> errc::driver_too_old
//   4. dlsym cuGetProcAddress_v2 (new in CUDA 12.0)      absent -> errc::driver_too_old
//   5. cuInit(0)      CUDA_ERROR_NO_DEVICE -> errc::no_device, other failure -> no_driver
//   6. cuGetProcAddress for every table row              absent -> errc::driver_too_old
//      and for every optional row                        absent -> opens; the optional
//                                                        group stays null (cuda_api.hpp)
//   7. cuDeviceGetCount > 0                              zero   -> errc::no_device
// The version is read before cuInit because cuDriverGetVersion needs no initialisation,
// and an old driver is best reported as old whatever else is wrong with the machine.
// Before cuInit has run, a failure unloads the library again; once cuInit has run the
// library stays loaded (its initialisation may have started threads and registered exit
// handlers, and unmapping its code under them would crash).

#include <dlfcn.h>

#include <bit>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/detail/cuda_api.hpp"
#include "xlogrt/driver/status.hpp"

namespace xlogrt::detail {

/// A successfully loaded driver: its table, version and the file it came from.
struct LoadedCuda {
  CudaApi api;
  int version = 0;      ///< cuDriverGetVersion, e.g. 12080
  std::string library;  ///< the name given to dlopen
  /// Empty when every optional entry was resolved; else a sentence naming the driver and
  /// the optional entries it lacks (the whole optional group is then null).
  std::string optional_missing;
};

/// "12.8" for 12080.
inline std::string cuda_version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

/// The environment variable that names the driver library to load instead of
/// libcuda.so.1 (a full path, or a name the dynamic loader searches for).
inline constexpr const char* libcuda_env = "XLOGRT_LIBCUDA";

/// Loads and checks the driver; see the file comment for the order and the errors.
/// Not thread-safe: callers serialise it (CudaDriver::open holds a lock).
inline result<LoadedCuda> load_cuda_driver() {
  LoadedCuda out;
  const char* env = std::getenv(libcuda_env);
  const bool from_env = env != nullptr && *env != '\0';
  out.library = from_env ? env : "libcuda.so.1";
  const std::string quoted = "'" + out.library + "'";
  const std::string named_by =
      from_env ? std::string(" (named by ") + libcuda_env + ")" : std::string();

  // 1. The file.
  void* lib = ::dlopen(out.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    std::string m = "could not load the CUDA driver library " + quoted + named_by;
    if (why != nullptr) m += std::string(": ") + why;
    m += from_env ? std::string("; point ") + libcuda_env +
                        " at an existing libcuda.so.1, or unset it to use the system driver"
                  : std::string("; install the NVIDIA driver, or set ") + libcuda_env +
                        " to the full path of libcuda.so.1";
    return error{errc::no_driver, std::move(m)};
  }
  auto unload = [&] { ::dlclose(lib); };
  auto sym = [&](const char* name) { return ::dlsym(lib, name); };

  // 2. Is it a CUDA driver at all?
  void* init = sym("cuInit");
  void* get_version = sym("cuDriverGetVersion");
  if (init == nullptr || get_version == nullptr) {
    unload();
    return error{errc::no_driver,
                 quoted + named_by + " is not a CUDA driver library (it exports no " +
                     (init == nullptr ? "cuInit" : "cuDriverGetVersion") + "); point " +
                     libcuda_env + " at the NVIDIA driver's libcuda.so.1"};
  }
  out.api.cuInit_ = std::bit_cast<PFN_cuInit_v2000>(init);
  out.api.cuDriverGetVersion_ = std::bit_cast<PFN_cuDriverGetVersion_v2020>(get_version);

  // 3. Its version.
  int version = 0;
  if (CUresult s = out.api.cuDriverGetVersion_(&version); s != CUDA_SUCCESS) {
    unload();
    return error{errc::no_driver,
                 "cuDriverGetVersion of " + quoted + named_by + " failed with status " +
                     std::to_string(static_cast<int>(s)) +
                     "; check the NVIDIA driver installation (nvidia-smi)",
                 static_cast<int>(s)};
  }
  out.version = version;
  const std::string needs = "xlogrt needs CUDA " +
                            cuda_version_string(min_cuda_driver_version) +
                            " or newer; install a newer NVIDIA driver";
  if (version < min_cuda_driver_version) {
    unload();
    return error{errc::driver_too_old, "the CUDA driver " + quoted + named_by +
                                           " supports CUDA " + cuda_version_string(version) +
                                           " (driver version " + std::to_string(version) +
                                           "), but " + needs};
  }

  // 4. The entry point resolver.
  void* gpa = sym("cuGetProcAddress_v2");
  if (gpa == nullptr) {
    unload();
    return error{errc::driver_too_old, "the CUDA driver " + quoted + named_by +
                                           " does not export cuGetProcAddress_v2, but " +
                                           needs};
  }
  out.api.cuGetProcAddress_ = std::bit_cast<PFN_cuGetProcAddress_v12000>(gpa);

  // 5. Initialise. From here on the library is never unloaded (see the file comment).
  if (CUresult s = out.api.cuInit_(0); s != CUDA_SUCCESS) {
    const int st = static_cast<int>(s);
    // The table is not resolved yet; cuGetErrorName (one ABI since CUDA 6.0) names the
    // status if the library exports it, and needs no initialisation.
    const char* name = nullptr;
    if (void* f = sym("cuGetErrorName")) {
      if (std::bit_cast<PFN_cuGetErrorName_v6000>(f)(s, &name) != CUDA_SUCCESS) name = nullptr;
    }
    std::string m = status::driver_failure(st, "cuInit", name ? name : "").message();
    if (st == status::no_device) {
      m += ": the CUDA driver " + quoted + named_by +
           " found no usable GPU; check that nvidia-smi lists one and that "
           "CUDA_VISIBLE_DEVICES does not hide it";
      return error{errc::no_device, std::move(m), st};
    }
    m += ": the CUDA driver " + quoted + named_by +
         " could not start; check the driver installation with nvidia-smi (a stub "
         "libcuda, or a driver library that does not match the kernel module, fails here)";
    return error{errc::no_driver, std::move(m), st};
  }

  // 6. Every entry point, at the version of its ABI; `missing` collects the required
  // ones that are absent, or the optional ones while those are being resolved.
  std::string missing;
  auto resolve = [&](const char* name, int ver, auto& slot) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    const CUresult s =
        out.api.cuGetProcAddress_(name, &p, ver, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q);
    if (s == CUDA_SUCCESS && q == CU_GET_PROC_ADDRESS_SUCCESS && p != nullptr) {
      slot = std::bit_cast<std::remove_reference_t<decltype(slot)>>(p);
      return;
    }
    if (!missing.empty()) missing += ", ";
    missing += std::string(name) + " (CUDA " + cuda_version_string(ver) + " ABI";
    if (s != CUDA_SUCCESS) {
      missing += ", cuGetProcAddress status " + std::to_string(static_cast<int>(s));
    } else if (q == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) {
      missing += ", version not sufficient";
    } else {
      missing += ", not found";
    }
    missing += ")";
  };
#define XLOGRT_CUDA_API_RESOLVE(sym, ver) resolve(#sym, ver, out.api.sym##_);
  XLOGRT_CUDA_API_ENTRIES(XLOGRT_CUDA_API_RESOLVE)
  if (!missing.empty()) {
    return error{errc::driver_too_old, "the CUDA driver " + quoted + named_by + ", CUDA " +
                                           cuda_version_string(version) + ", lacks " +
                                           missing + "; " + needs};
  }
  XLOGRT_CUDA_API_OPTIONAL_ENTRIES(XLOGRT_CUDA_API_RESOLVE)
#undef XLOGRT_CUDA_API_RESOLVE
  if (!missing.empty()) {
    // All or nothing (cuda_api.hpp): a member of the group never finds half of it.
#define XLOGRT_CUDA_API_CLEAR(sym, ver) out.api.sym##_ = nullptr;
    XLOGRT_CUDA_API_OPTIONAL_ENTRIES(XLOGRT_CUDA_API_CLEAR)
#undef XLOGRT_CUDA_API_CLEAR
    out.optional_missing = "the CUDA driver " + quoted + named_by + ", CUDA " +
                           cuda_version_string(version) + ", lacks " + missing;
  }

  // 7. At least one device.
  int count = 0;
  if (CUresult s = out.api.cuDeviceGetCount_(&count); s != CUDA_SUCCESS) {
    const int st = static_cast<int>(s);
    return status::driver_failure(st, "cuDeviceGetCount", {}, "opening the CUDA driver");
  }
  if (count <= 0) {
    return error{errc::no_device,
                 "the CUDA driver " + quoted + named_by +
                     " reports no GPU (cuDeviceGetCount is 0); check that nvidia-smi lists "
                     "one and that CUDA_VISIBLE_DEVICES does not hide it"};
  }
  return out;
}

}  // namespace xlogrt::detail
