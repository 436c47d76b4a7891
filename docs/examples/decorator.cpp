// SPDX-License-Identifier: Apache-2.0
// docs/architecture.md, "Writing a decorator": a policy decorator on xlogrt::Adaptor,
// which forwards every member of the upstream's concepts that the decorator does not
// declare. Compiled over the real driver (DeviceRuntime<MaxRequest<AsyncCuda<CudaDriver>>>)
// and run on the GPU when there is one, else on SimDriver.
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/resource/adaptor.hpp>
#include <xlogrt/runtime.hpp>

#include <cstdio>
#include <string>

using namespace xlogrt;

// [decorator]
/// Refuses requests above `max_bytes`; everything else passes through unchanged.
template <class Up>
struct MaxRequest : Adaptor<Up> {
  using Adaptor<Up>::Adaptor;  // MaxRequest(Up upstream)
  std::size_t max_bytes = std::size_t{16} << 20;

  result<DeviceBlock> allocate(std::size_t bytes, StreamId s, AllocTag t) noexcept {
    if (bytes > max_bytes) {
      XLOGRT_TRY(check_request(this->upstream(), bytes, s));  // bad input is named first, as everywhere
      return error{errc::too_large, "MaxRequest: " + std::to_string(bytes) + " bytes asked"};
    }
    return this->upstream().allocate(bytes, s, t);
  }
};
// [/decorator]

// [checks]
// Over AsyncCuda the decorator tracks and reaches the driver, so it can sit under
// DebugGuard or at the top of a DeviceRuntime on the real driver:
static_assert(TrackingResource<MaxRequest<AsyncCuda<CudaDriver>>>);
static_assert(DriverResource<MaxRequest<AsyncCuda<CudaDriver>>>);
using GpuRuntime = DeviceRuntime<Statistics<MaxRequest<AsyncCuda<CudaDriver>>>>;
using SimRuntime = DeviceRuntime<Statistics<MaxRequest<AsyncCuda<SimDriver>>>>;
// [/checks]

template <class Runtime>
int demo(Runtime& rt) {
  // [use]
  auto small = rt.allocate(4096, StreamId{0}, AllocTag{1});
  auto large = rt.allocate(std::size_t{64} << 20, StreamId{0}, AllocTag{2});
  if (!small || large) return 1;
  std::printf("4 KiB allocated; 64 MiB refused: %s\n", large.error().what().c_str());
  auto unknown = rt.allocate(std::size_t{64} << 20, StreamId{99}, AllocTag{3});
  if (unknown || unknown.error().code() != errc::unknown_stream) return 1;  // bad input before the limit
  // Forwarded members work through the decorator: tracking, reaping, accounting.
  if (!rt.prepare_block_use(small->id(), StreamId{1}, Access::Read)) return 1;
  if (!rt.finish_block_use(small->id(), StreamId{1}, Access::Read)) return 1;
  if (!rt.deallocate(std::move(*small)) || !rt.reap_pending()) return 1;
  // [/use]
  std::printf("%zu bytes outstanding\n", rt.bytes_outstanding());
  return large.error().code() == errc::too_large && rt.bytes_outstanding() == 0 ? 0 : 1;
}

int main() {
  if (auto rt = GpuRuntime::try_get(0)) return demo(**rt);
  auto rt = SimRuntime::try_get(0);
  if (!rt) return std::puts(rt.error().what().c_str()), 1;
  return demo(**rt);
}
