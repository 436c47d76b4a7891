// SPDX-License-Identifier: Apache-2.0
// docs/architecture.md, "The Driver contract": code written against the Driver concept
// alone, run on SimDriver (and on CudaDriver when there is a GPU): stream order, an
// event between two streams, and a failure coming back as a result that names the call.
#include <xlogrt/driver/concept.hpp>
#include <xlogrt/driver/cuda_driver.hpp>
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/driver/status.hpp>

#include <cstdio>

using namespace xlogrt;

// [both]
static_assert(Driver<CudaDriver> && Driver<SimDriver>);
// [/both]

// [contract]
/// Fills 256 bytes on stream a, copies them to the host on stream b after an event
/// recorded on a, and returns the last byte. Every call names its stream, so only the
/// calls that take none (allocation, stream and event creation) need the current context.
template <Driver D>
result<int> fill_then_copy(D& d, typename D::context_t ctx) noexcept {
  if (auto r = d.ctx_make_current(ctx); !r) return std::move(r).error();
  auto ptr = d.mem_alloc(256);  // a failure is a result naming the call and its CUDA status
  if (!ptr) return std::move(ptr).error();
  auto a = d.stream_create();
  auto b = d.stream_create();
  auto done = d.event_create();
  if (!a || !b || !done) return error{errc::driver_error, "no stream or event (a sketch: it leaks here)"};
  unsigned char host[256] = {};
  // In order, left to right; each is stream-ordered as the CUDA driver API documents.
  result<void> steps[] = {d.memset_d8_async(*ptr, 7, 256, *a),  // on a
                          d.event_record(*done, *a),            // marks the fill
                          d.stream_wait_event(*b, *done),       // b waits for it ...
                          d.memcpy_dtoh_async(host, *ptr, 256, *b),  // ... before the copy
                          d.stream_synchronize(*b),
                          d.mem_free(*ptr),
                          d.event_destroy(*done),
                          d.stream_destroy(*a),
                          d.stream_destroy(*b)};
  for (auto& s : steps) {
    if (!s) return std::move(s).error();
  }
  return host[255];
}
// [/contract]

template <Driver D>
int run(D& d) {
  auto dev = d.device_get(0);
  if (!dev) return std::puts(dev.error().what().c_str()), 1;
  auto ctx = d.primary_ctx_retain(*dev);
  if (!ctx) return std::puts(ctx.error().what().c_str()), 1;
  auto byte = fill_then_copy(d, *ctx);
  if (!byte) return std::puts(byte.error().what().c_str()), 1;
  std::printf("%s driver: read back %d\n", D::kind, *byte);
  (void)d.primary_ctx_release(*dev);
  return *byte == 7 ? 0 : 1;
}

int main() {
  if (auto cuda = CudaDriver::open()) {
    if (auto n = (*cuda)->device_count(); n && *n > 0 && run(**cuda) != 0) return 1;
  }
  // [inject]
  SimDriver sim(SimConfig{.devices = 1});
  if (run(sim) != 0) return 1;
  // The simulator fails a chosen call with a CUDA status, as the real driver would.
  (void)sim.fail_nth("cuMemAlloc", 1, status::out_of_memory);
  auto ctx = sim.primary_ctx_retain(*sim.device_get(0));
  auto failed = fill_then_copy(sim, *ctx);
  std::printf("injected: %s\n", failed ? "no failure (a bug)" : failed.error().what().c_str());
  // [/inject]
  return !failed && failed.error().driver_status() == status::out_of_memory ? 0 : 1;
}
