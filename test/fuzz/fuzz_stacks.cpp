// SPDX-License-Identifier: Apache-2.0
// The stack fuzzer: bytes decoded into a stack choice and a sequence of operations
// (allocate, free, uses across streams, records, forged and stale blocks, bad streams,
// reaps, trims, device steps, budget changes, failures injected into any driver entry
// point, reactor waits), run through stack_harness.hpp, which checks every invariant after every
// operation. Built for libFuzzer (test/fuzz/run.sh) and, with replay_main.cpp, as a
// plain executable that replays the corpus in the host suite.
//
// Input layout (bytes read one at a time, so every compiler decodes the same ops):
//   [0] stack (mod the number of stacks)  [1] scheduler seed
//   [2] bit 0: inject a failure before the stack is built, from bytes [3..5];
//       bit 7: reactor waits on (a flag, so that the inputs kept from before the waits
//       existed mostly decode as they did)
//   then ops: one byte of kind (mod 16), then the kind's operand bytes; with reactor
//   waits on, a kind byte of 249 to 255 is a reactor wait (Harness::reactor_op) and two
//   operand bytes.

#include <cstddef>
#include <cstdint>

#include "stack_harness.hpp"

namespace {

using namespace xlogrt;
using namespace xlogrt::fuzz;

std::size_t size_of(std::uint8_t v, ByteReader& in) {
  // Mostly small blocks: the simulator fills every allocated and freed byte, and that
  // is most of what a run costs.
  if (v < 192) return 1 + std::size_t{v} * 61 + in.u8();
  if (v < 240) return std::size_t(v - 191) * 4096;
  switch (v) {
    case 240: return 256;
    case 241: return 0;
    case 242: return SIZE_MAX;
    case 243: return std::size_t{1} << 40;
    case 244: return std::size_t{4} << 20;
    case 245: return DEVICE_BYTES + 1;
    case 246: return 512;
    default: return std::size_t{1} << (v - 236);  // 2 KiB .. 512 KiB
  }
}

constexpr int statuses[] = {status::out_of_memory, status::unknown, status::invalid_value,
                            status::illegal_address};

constexpr std::size_t limits[] = {SIZE_MAX,        0,  4096, 65536, std::size_t{1} << 20, std::size_t{8} << 20,
                                  std::size_t{32} << 20, SIZE_MAX};

template <class F>
void run(ByteReader& in, std::uint64_t seed, std::uint8_t flags) {
  Harness<F> h(seed);
  if (flags & 1) {
    const std::uint8_t call = in.u8();
    const std::uint8_t n = in.u8();
    const std::uint8_t st = in.u8();
    h.inject(call, 1 + n % 8, statuses[st % 4], false);
  }
  if (h.built() || h.build()) {
    for (int ops = 0; ops < 256 && !in.done(); ++ops) {
      const std::uint8_t byte = in.u8();
      if ((flags & 0x80) != 0 && byte >= 249) {  // a reactor wait (7 kinds), two operands
        const std::uint8_t a = in.u8();
        const std::uint8_t b = in.u8();
        h.reactor_op(byte - 249u, a, b);
        continue;
      }
      const std::uint8_t kind = byte % 16;
      switch (kind) {
        case 0:
        case 1: {
          const std::uint8_t v = in.u8();
          const std::size_t bytes = size_of(v < 240 ? v : static_cast<std::uint8_t>(v % 192), in);
          const std::uint8_t s = in.u8();
          h.alloc(bytes, s % STREAMS, (s >> 4) % 4);
          break;
        }
        case 2:
        case 3: h.free(in.u8()); break;
        case 4: {
          const std::uint8_t i = in.u8();
          const std::uint8_t a = in.u8();
          h.use(i, a % STREAMS, static_cast<Access>(1 + (a >> 2) % 3), (a & 0x80) != 0);
          break;
        }
        case 5: {
          const std::uint8_t i = in.u8();
          h.record(i, in.u8() % STREAMS);
          break;
        }
        case 6: {
          const std::uint8_t i = in.u8();
          const std::uint8_t k = in.u8();
          h.forge(i, static_cast<Forge>(k % static_cast<std::uint8_t>(Forge::count_)), k >> 4);
          break;
        }
        case 7: {
          const std::uint8_t j = in.u8();
          h.stale(j, in.u8());
          break;
        }
        case 8: h.reap(); break;
        case 9: h.step(in.u8() % 8); break;
        case 10: h.trim(); break;
        case 11: h.set_budget(limits[in.u8() % 8]); break;
        case 12: {
          const std::uint8_t call = in.u8();
          const std::uint8_t n = in.u8();
          const std::uint8_t st = in.u8();
          h.inject(call, 1 + n % 40, statuses[st % 4], (st & 0x70) == 0x70);
          break;
        }
        case 13: h.clear_injections(); break;
        case 14: h.bad_streams(in.u8()); break;
        case 15: {
          const std::uint8_t v = in.u8();
          const std::uint8_t s = in.u8();
          h.alloc(size_of(static_cast<std::uint8_t>(240 + v % 16), in), s % STREAMS, s >> 4);
          break;
        }
      }
    }
  }
  h.finish();
}

template <std::size_t... I>
void dispatch(std::size_t which, ByteReader& in, std::uint64_t seed, std::uint8_t flags,
              std::index_sequence<I...>) {
  ((which == I ? run<std::tuple_element_t<I, Stacks>>(in, seed, flags) : void()), ...);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ByteReader in(data, size);
  const std::size_t which = in.u8() % stack_count;
  const std::uint64_t seed = 1 + in.u8();
  const std::uint8_t flags = in.u8();
  dispatch(which, in, seed, flags, std::make_index_sequence<stack_count>{});
  return 0;
}
