// SPDX-License-Identifier: Apache-2.0
#pragma once

// The stack harness shared by the stack fuzzer (fuzz_stacks.cpp) and the fault matrix
// (fault_matrix.cpp): one shipped stack on a SimDriver in manual mode (no executor
// thread: stream work runs only when the harness steps the device or a call waits for
// it, so a run is deterministic and fast), driven one operation at a time, with every
// invariant checked after every operation:
// - accounting exact across the layers and the simulator: the caller's bytes against
//   bytes_outstanding (exact after a successful reap_pending, bounded by the frees not
//   yet reaped before it), Statistics' current bytes and count, the ordinal's Budget
//   against the Budget layer, the simulator's live blocks and bytes against the base
//   resource;
// - 0 hazards from SimDriver's checker;
// - every error named (a known errc and a sentence), and of a kind the operation may
//   return; a driver status only while a failure is injected;
// - a refused free leaves the block with the caller, untouched; an accepted one
//   empties it; forged and stale blocks are refused;
// - at the end, with the injections cleared, every block frees, and nothing is left in
//   any layer nor on the simulated device.
// A broken invariant prints one sentence and aborts (a crash, for libFuzzer).
//
// Known bugs. Inputs that reach a known, open bug would make every fuzzing run stop on
// the same crash, so the decoder steers around the bugs XLOGRT_FUZZ_KNOWN_BUGS does not
// name ("all", or a comma-separated list of issue #16's bug numbers). Unset, it names
// every bug of issue #16, all of which are fixed, so the decoder steers around none.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include "../resource/stack_registry.hpp"
#include "fuzz_check.hpp"
#include "reactor_waits.hpp"

namespace xlogrt::fuzz {

/// Issue #16's bugs the decoder avoids unless XLOGRT_FUZZ_KNOWN_BUGS names them.
inline bool known_bug_enabled(int n) {
  static const std::string env = [] {
    const char* v = std::getenv("XLOGRT_FUZZ_KNOWN_BUGS");
    return std::string(v ? v : "1,2,3,4,5,6,7,8,9");
  }();
  if (env == "all") return true;
  std::size_t i = 0;
  while (i < env.size()) {
    std::size_t j = env.find(',', i);
    if (j == std::string::npos) j = env.size();
    if (env.substr(i, j - i) == std::to_string(n)) return true;
    i = j + 1;
  }
  return false;
}

inline bool trace_on() {
  static const bool on = std::getenv("XLOGRT_FUZZ_TRACE") != nullptr;
  return on;
}

/// Bytes read one at a time, little-endian for wider values, 0 past the end: the same
/// decoding on every compiler (no distributions, no unsequenced reads).
class ByteReader {
 public:
  ByteReader(const std::uint8_t* p, std::size_t n) noexcept : p_(p), n_(n) {}
  bool done() const noexcept { return i_ >= n_; }
  std::uint8_t u8() noexcept { return i_ < n_ ? p_[i_++] : 0; }
  std::uint16_t u16() noexcept {
    const std::uint16_t lo = u8();
    const std::uint16_t hi = u8();
    return static_cast<std::uint16_t>(lo | (hi << 8));
  }
  std::uint32_t u32() noexcept {
    const std::uint32_t lo = u16();
    const std::uint32_t hi = u16();
    return lo | (hi << 16);
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t i_ = 0;
};

namespace detail {
template <template <class...> class L, class S>
constexpr bool has_layer() {
  if constexpr (xlogrt::detail::is_layer_v<S, L>) {
    return true;
  } else if constexpr (requires(S& s) { s.upstream(); }) {
    return has_layer<L, std::remove_cvref_t<decltype(std::declval<S&>().upstream())>>();
  } else {
    return false;
  }
}
}  // namespace detail

/// Every shipped stack the harness drives, on SimDriver: entries of the registry, so each
/// also runs in the conformance suite. The order is the corpus's: an input's first byte
/// picks a stack by its index here.
using Stacks = std::tuple<
    testing::Entry<AsyncCuda<SimDriver>>,
    testing::Entry<DirectCuda<SimDriver>>,
    testing::Entry<Budget<AsyncCuda<SimDriver>>>,
    testing::Entry<Budget<DirectCuda<SimDriver>>>,
    testing::Entry<Statistics<AsyncCuda<SimDriver>>>,
    testing::Entry<Logging<AsyncCuda<SimDriver>, RingSink>>,
    testing::Entry<Budget<Statistics<Logging<AsyncCuda<SimDriver>, NullSink>>>>,
    testing::Entry<DebugGuard<AsyncCuda<SimDriver>>>,
    testing::Entry<DebugGuard<DirectCuda<SimDriver>>>,  // bug #9's stack
    testing::Entry<Cached<AsyncCuda<SimDriver>>>,
    testing::Entry<DefaultStackOn<SimDriver>>>;
static_assert(testing::all_registered<Stacks, SimDriver>, "a fuzzed stack is missing from AllStacks");
inline constexpr std::size_t stack_count = std::tuple_size_v<Stacks>;

inline constexpr std::uint32_t STREAMS = 4;
inline constexpr std::size_t MAX_HELD = 48;
inline constexpr std::size_t DEVICE_BYTES = std::size_t{64} << 20;

/// Entry points a failure may be injected into: every SimDriver entry point.
inline constexpr auto& entry_points = xlogrt::detail::sim::call_names;

inline SimConfig sim_config(std::uint64_t seed) {
  SimConfig c;
  c.devices = 1;
  c.memory_bytes = DEVICE_BYTES;
  c.executor = SimExecutor::manual;
  c.seed = seed;
  // A small quarantine: freed ranges come back into use soon, so a run touches few
  // distinct pages of the simulated device (use after free is the checker's to find).
  c.quarantine_bytes = std::size_t{256} << 10;
  c.quarantine_blocks = 16;
  c.fill_memory = false;  // nothing reads bytes it did not write (DebugGuard writes its guards)
  c.host_mapped_bytes = std::size_t{2} << 20;
  return c;
}

/// Kinds of forged block (the fields of a held block, one changed).
enum class Forge : std::uint8_t {
  ptr_up, bytes_up, bytes_down, gen_up, gen_down, index_up, owner_low, ordinal,
  empty_id, bad_stream,
  owner_high,    // bug #9 on DebugGuard stacks
  other_stream,  // bug #2
  other_tag,     // bug #3
  count_,
};

template <class F>
class Harness {
 public:
  using Stack = typename F::type;
  static constexpr bool tracking = Stack::supports_block_use_tracking;
  static constexpr bool cached = detail::has_layer<Cached, Stack>();
  static constexpr bool guarded = detail::has_layer<DebugGuard, Stack>();
  static constexpr bool budgeted = detail::has_layer<Budget, Stack>();
  static constexpr bool counted = detail::has_layer<Statistics, Stack>();
  static constexpr bool async_base = detail::has_layer<AsyncCuda, Stack>();

  explicit Harness(std::uint64_t seed) : sim_(sim_config(seed)) {
    auto in = device_budget(sim_, 0);
    XF_CHECK(in.has_value(), "device_budget(sim, 0)");
    base_in_use_ = in->in_use;
  }

  /// Builds the device, the stream pool and the stack; false (the error checked) when a
  /// step failed, as an injected failure may make it.
  bool build() {
    auto pool = StreamPool<SimDriver>::open(sim_, 0, STREAMS);
    if (!pool) return setup_failed(pool.error(), "StreamPool::create");
    streams_ = *pool;
    auto s = F::make(streams_);
    if (!s) return setup_failed(s.error(), "building the stack");
    stack_.emplace(std::move(*s));
    check("build");
    return true;
  }
  bool built() const { return stack_.has_value(); }
  SimDriver& sim() { return sim_; }
  Stack& stack() { return *stack_; }
  std::size_t held() const { return held_.size(); }

  // --- operations -------------------------------------------------------------------

  void alloc(std::size_t bytes, std::uint32_t stream, std::uint32_t tag) {
    if (held_.size() >= MAX_HELD) return;
    trace("allocate " + std::to_string(bytes) + " on stream " + std::to_string(stream));
    auto b = stack_->allocate(bytes, StreamId{stream}, AllocTag{tag});
    if (!b) {
      // A step after the upstream allocation failed and the layer freed what it had: on
      // an asynchronous base that free counts until the next reap (guards included).
      if (b.error().driver_status() != 0 && async_base && bytes < DEVICE_BYTES) pending_hi_ += bytes + 2 * guard();
      // ...and when that free failed too, DebugGuard keeps the block, counted, until a
      // later call frees it (bug 7).
      if (guarded && b.error().message().find("DebugGuard keeps it") != std::string::npos) {
        unfreed_hi_ += bytes + 2 * guard();
        unfreed_device_hi_ += (bytes + 2 * guard() + 255) / 256 * 256;
      }
      named(b.error(), "allocate",
            {errc::zero_bytes, errc::too_large, errc::out_of_memory, errc::out_of_budget, errc::unknown_stream});
      XF_CHECK(bytes != 0 || b.error().code() == errc::zero_bytes, "allocate(0) gave " + b.error().what());
      // Budget charges before the upstream sees the stream: a bad stream may be out_of_budget.
      XF_CHECK(stream < STREAMS || b.error().code() == errc::unknown_stream || bytes == 0 ||
                   b.error().code() == errc::too_large || (budgeted && b.error().code() == errc::out_of_budget) ||
                   b.error().driver_status() != 0,
               "allocate on a bad stream gave " + b.error().what());
    } else {
      XF_CHECK(bytes != 0, "allocate(0) succeeded");
      XF_CHECK(stream < STREAMS, "allocate on stream " + std::to_string(stream) + " succeeded");
      const DeviceBlock& x = *b;
      XF_CHECK(!x.empty() && x.ptr() != 0, "allocate gave an empty block");
      XF_CHECK(cached ? x.bytes() >= bytes : x.bytes() == bytes,
               "allocate(" + std::to_string(bytes) + ") gave " + std::to_string(x.bytes()) + " bytes");
      XF_CHECK(x.alloc_stream() == StreamId{stream} && x.tag() == AllocTag{tag} && x.device_ordinal() == 0,
               "allocate gave a block with the wrong stream, tag or ordinal");
      XF_CHECK(x.ptr() % 8 == 0, "allocate gave a pointer that is not 8-byte aligned");
      for (const auto& h : held_) {
        const bool disjoint = h.b.ptr() + h.b.bytes() <= x.ptr() || x.ptr() + x.bytes() <= h.b.ptr();
        XF_CHECK(disjoint, "allocate gave a block overlapping a live one");
        XF_CHECK(h.b.id() != x.id(), "allocate gave the id of a live block");
      }
      held_.push_back(Held{std::move(*b), false});
    }
    check("allocate");
  }

  void free(std::size_t i) {
    if (held_.empty()) return;
    i %= held_.size();
    Held& h = held_[i];
    const Fields before = fields(h.b);
    trace("deallocate " + h.b.id().to_string());
    auto r = stack_->deallocate(std::move(h.b));
    if (r) {
      XF_CHECK(h.b.empty(), "an accepted free left the block with the caller");
      pending_hi_ += before.bytes + (async_base ? 2 * guard() : 0);  // a queued free counts whole
      stale_.push_back(before);
      if (stale_.size() > 64) stale_.erase(stale_.begin());
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      named(r.error(), "deallocate", {});
      XF_CHECK(!h.b.empty() && fields(h.b) == before,
               "a refused free (" + r.error().what() + ") did not leave the block with the caller, untouched");
      // DebugGuard over a base that does not track poisoned the block and could not wait
      // for the poison: it says so, and the caller orders its later uses after the alloc
      // stream, as told.
      if (r.error().message().find("order later uses after that stream") != std::string::npos) {
        host_sync(before.stream.value);
      }
    }
    check("deallocate");
  }

  /// A use of held block i on `stream`: prepare, a simulated kernel, finish (tracking
  /// stacks); on a stack that does not track, the kernel and the caller's own
  /// synchronisation of a stream other than the alloc stream.
  void use(std::size_t i, std::uint32_t stream, Access access, bool record_instead) {
    if (held_.empty()) return;
    i %= held_.size();
    Held& h = held_[i];
    trace("use " + h.b.id().to_string() + " on stream " + std::to_string(stream));
    // record_block_use records a read: it orders the free after the work, and no later
    // use after it, so a write must be finished with finish_block_use.
    if (record_instead) access = Access::Read;
    if constexpr (tracking) {
      auto p = stack_->prepare_block_use(h.b.id(), StreamId{stream}, access);
      if (!p) {
        named(p.error(), "prepare_block_use", {errc::unknown_stream});
        XF_CHECK(stream >= STREAMS || p.error().driver_status() != 0,
                 "prepare_block_use on a good stream failed: " + p.error().what());
        check("prepare_block_use");
        return;
      }
      XF_CHECK(stream < STREAMS, "prepare_block_use on stream " + std::to_string(stream) + " succeeded");
      launch(h, stream, access);
      auto f = record_instead ? stack_->record_block_use(h.b, StreamId{stream})
                              : stack_->finish_block_use(h.b.id(), StreamId{stream}, access);
      if (!f) {
        named(f.error(), "finish_block_use", {});
        // The use is not recorded: the caller orders it before the free itself (a
        // failed finish leaves the use unrecorded, issue #16).
        host_sync(stream);
      }
      if (stream != h.b.alloc_stream().value) h.cross = true;
    } else {
      if (stream >= STREAMS) return;
      (void)access;
      launch(h, stream, access);
      host_sync(stream);  // no tracking: the caller orders every use itself
    }
    check("use");
  }

  /// record_block_use with no work behind it (legal: the free waits for nothing real).
  void record(std::size_t i, std::uint32_t stream) {
    if constexpr (tracking) {
      if (held_.empty()) return;
      Held& h = held_[i % held_.size()];
      trace("record " + h.b.id().to_string() + " on stream " + std::to_string(stream));
      auto r = stack_->record_block_use(h.b, StreamId{stream});
      if (!r) {
        named(r.error(), "record_block_use", {errc::unknown_stream});
        XF_CHECK(stream >= STREAMS || r.error().driver_status() != 0,
                 "record_block_use on a good stream failed: " + r.error().what());
      } else {
        XF_CHECK(stream < STREAMS, "record_block_use on stream " + std::to_string(stream) + " succeeded");
        if (stream != h.b.alloc_stream().value) h.cross = true;
      }
      check("record_block_use");
    }
  }

  /// A block with the fields of held block i, one of them changed: every call with it
  /// must be refused (but a use of one whose tag alone differs), and the real block must
  /// be unharmed.
  void forge(std::size_t i, Forge kind, std::uint32_t stream) {
    if (held_.empty()) return;
    Held& h = held_[i % held_.size()];
    if (kind == Forge::owner_high && guarded && !known_bug_enabled(9)) kind = Forge::owner_low;
    // Bug #2's root (the alloc stream is not compared with the table's) also lets
    // DirectCuda free, and AsyncCuda record, a block whose alloc stream is out of range.
    if ((kind == Forge::other_stream || kind == Forge::bad_stream) && !known_bug_enabled(2)) kind = Forge::ptr_up;
    Fields f = fields(h.b);
    switch (kind) {
      case Forge::ptr_up: f.ptr += 256; break;
      case Forge::bytes_up: f.bytes += 1; break;
      case Forge::bytes_down:
        if (f.bytes < 2) return;
        f.bytes -= 1;
        break;
      case Forge::gen_up: f.id.generation += 1; break;
      case Forge::gen_down: f.id.generation -= 1; break;
      case Forge::index_up: f.id.index += 1; break;
      case Forge::owner_low: f.id.owner ^= 1; break;
      case Forge::ordinal: f.ordinal = 1 + stream % 15; break;
      case Forge::empty_id: f.id = BlockId{}; break;
      case Forge::bad_stream: f.stream = StreamId{STREAMS + stream % 8}; break;
      case Forge::owner_high: f.id.owner ^= 0x10000u << (stream % 16); break;
      case Forge::other_stream:
        f.stream = StreamId{(f.stream.value + 1 + stream % (STREAMS - 1)) % STREAMS};
        break;
      case Forge::other_tag: f.tag = AllocTag{f.tag.value + 1}; break;
      case Forge::count_: return;
    }
    trace("forge " + std::to_string(static_cast<int>(kind)) + " of " + h.b.id().to_string());
    refused(f, "a forged block (kind " + std::to_string(static_cast<int>(kind)) + ")", stream % STREAMS,
            kind == Forge::other_tag);
    check("forge");
  }

  /// A block freed earlier, presented again: refused.
  void stale(std::size_t j, std::uint32_t stream) {
    if (stale_.empty()) return;
    const Fields f = stale_[j % stale_.size()];
    trace("stale " + f.id.to_string());
    refused(f, "a stale block", stream % STREAMS);
    check("stale");
  }

  void reap() {
    trace("reap_pending");
    auto r = stack_->reap_pending();
    if (!r) {
      named(r.error(), "reap_pending", {});
    } else {
      reaped_ = true;
    }
    check("reap_pending");
    reaped_ = false;
    if (r) {
      pending_hi_ = 0;
      if constexpr (cached) trimmed_seen_ = cache()->stats().trimmed_bytes;
    }
  }

  void trim() {
    if constexpr (cached) {
      trace("trim");
      (void)cache()->trim();
      check("trim");
    }
  }

  void step(unsigned n) {
    trace("step " + std::to_string(n));
    for (unsigned k = 0; k < n && sim_.step(); ++k) {
    }
    check("step");
  }

  void set_budget(std::size_t limit) {
    trace("budget " + std::to_string(limit));
    XF_CHECK(set_device_budget(sim_, 0, limit).has_value(), "set_device_budget");
    check("set_device_budget");
  }

  /// Arms a failure of entry point `call` (an index into entry_points). `steer`: skip
  /// the entry points that reach a known DebugGuard bug (the fuzzer's choice; the fault
  /// matrix injects everywhere and marks those cases expected to fail).
  void inject(std::size_t call, int n, int status, bool always, bool steer = true) {
    const std::string_view name = entry_points[call % entry_points.size()];
    if (guarded && steer) {
      // Issue #16, bugs 1, 5, 6 and 7: DebugGuard under a failing guard check, a failing
      // free below it, or a failing guard write.
      if (!known_bug_enabled(1) && (name == "cuStreamSynchronize" || name == "cuMemcpyDtoHAsync")) return;
      if (!known_bug_enabled(6) && !known_bug_enabled(7) && name == "cuMemsetD8Async") return;
      if (!known_bug_enabled(5) && !known_bug_enabled(7) &&
          (name == "cuMemFreeAsync" || name == "cuMemFree" || name == "cuStreamWaitEvent" ||
           name == "cuEventRecord" || name == "cuEventCreate" || name == "cuCtxSetCurrent")) {
        return;
      }
    }
    trace("inject " + std::string(name) + " n=" + std::to_string(n) + (always ? " always" : ""));
    const SimInjection in = always ? sim_.fail_always(name, status) : sim_.fail_nth(name, n, status);
    XF_CHECK(in.armed, "arming an injection: " + in.problem);
    armed_ = true;
  }

  void clear_injections() {
    sim_.clear_failures();
    armed_ = false;
  }

  /// Reactor waits on the harness's streams (reactor_waits.hpp). `op`: 0 a callback,
  /// 1 a future, 2 a StreamPoint with callbacks, on stream `a` % (STREAMS + 1) (the last:
  /// outside the pool); 3 one more callback on the latest point; 4 settle (every stream
  /// run dry, every wait completed); 5 destroy the reactor; 6 a failure injected into an
  /// entry point the reactor calls. The reactor is created by the first wait, with
  /// 1 + b % 4 slots and flag writes unless b & 0x80.
  void reactor_op(unsigned op, std::uint8_t a, std::uint8_t b) {
    static constexpr std::string_view reactor_calls[] = {
        "cuStreamWriteValue32", "cuLaunchHostFunc", "cuStreamQuery", "cuMemHostAlloc",
        "cuMemHostGetDevicePointer", "cuMemFreeHost", "cuCtxSetCurrent", "cuLaunchKernel"};
    if (!waits_) {
      waits_.emplace(sim_, streams_, STREAMS,
                     [this](const error& e, const char* what, std::initializer_list<errc> allowed) { named(e, what, allowed); });
    }
    trace("reactor op " + std::to_string(op) + " " + std::to_string(a) + " " + std::to_string(b));
    if (op <= 2) {
      waits_->create(1 + b % 4, (b & 0x80) == 0);
      waits_->arm(a % (STREAMS + 1), op, (b >> 2) % 3);
    } else if (op == 3) {
      waits_->attach_late();
    } else if (op == 4) {
      waits_->settle();
    } else if (op == 5) {
      waits_->destroy();
    } else {
      const std::string_view name = reactor_calls[a % std::size(reactor_calls)];
      const std::size_t call = static_cast<std::size_t>(
          std::find(std::begin(entry_points), std::end(entry_points), name) - std::begin(entry_points));
      XF_CHECK(call < std::size(entry_points), "no entry point " + std::string(name));
      inject(call, 1 + b % 8, b & 0x40 ? status::illegal_address : status::unknown, (b & 0x30) == 0x30);
    }
    check("reactor op");
  }

  /// A few calls with bad streams: all refused with unknown_stream.
  void bad_streams(std::uint32_t pick) {
    static constexpr std::uint32_t bad[] = {STREAMS, STREAMS + 1, 255, 256, 0x10000, 0xFFFFFFFEu, 0xFFFFFFFFu};
    std::uint32_t s = bad[pick % std::size(bad)];
    trace("bad stream " + std::to_string(s));
    alloc(256, s, 0);
    if (!held_.empty()) {
      Held& h = held_[pick % held_.size()];
      if constexpr (tracking) {
        auto p = stack_->prepare_block_use(h.b.id(), StreamId{s}, Access::ReadWrite);
        XF_CHECK(!p, "prepare_block_use on stream " + std::to_string(s) + " succeeded");
        named(p.error(), "prepare_block_use", {errc::unknown_stream});
        // Issue #16, bug 4: finish with 0xffffffff passes on a block that is not quiet.
        if (s != 0xFFFFFFFFu || known_bug_enabled(4)) {
          auto f = stack_->finish_block_use(h.b.id(), StreamId{s}, Access::ReadWrite);
          XF_CHECK(!f, "finish_block_use on stream " + std::to_string(s) + " succeeded");
          named(f.error(), "finish_block_use", {errc::unknown_stream});
        }
        auto r = stack_->record_block_use(h.b, StreamId{s});
        XF_CHECK(!r, "record_block_use on stream " + std::to_string(s) + " succeeded");
        named(r.error(), "record_block_use", {errc::unknown_stream});
      }
    }
    check("bad streams");
  }

  /// Clears the injections and the budget, frees everything, drains every layer and the
  /// device, destroys the stack, and requires that nothing is left anywhere.
  void finish() {
    clear_injections();
    // The reactor first: it holds the stream pool. Waits still armed are cancelled; the
    // host functions they leave in the streams run below, and free their tickets.
    waits_.reset();
    XF_CHECK(clear_device_budget(sim_, 0).has_value(), "clear_device_budget");
    if (stack_) {
      trace("finish");
      while (!held_.empty()) {
        Held& h = held_.back();
            const std::string id = h.b.id().to_string();
        const std::size_t bytes = h.b.bytes();
        auto r = stack_->deallocate(std::move(h.b));
        XF_CHECK(r.has_value(), "freeing block " + id + " at the end: " + r.error().what());
        XF_CHECK(h.b.empty(), "an accepted free left the block with the caller");
        // As in free(): a block the layers do not keep (one of no size class) is queued.
        pending_hi_ += bytes + (async_base ? 2 * guard() : 0);
        held_.pop_back();
      }
      trim();
      auto r = stack_->reap_pending();
      XF_CHECK(r.has_value(), "reap_pending at the end: " + r.error().what());
      pending_hi_ = 0;
      if constexpr (cached) trimmed_seen_ = cache()->stats().trimmed_bytes;
      reaped_ = true;
      check("the end");
      XF_CHECK(stack_->bytes_outstanding() == 0,
               "bytes_outstanding is " + std::to_string(stack_->bytes_outstanding()) + " with nothing held");
      stack_.reset();
    }
    streams_.reset();
    sim_.run_until_idle();
    hazards("the end");
    auto st = sim_.memory_stats(0);
    XF_CHECK(st.has_value(), "memory_stats");
    XF_CHECK(st->live_blocks == 0 && st->allocated == 0 && st->free_pending == 0,
             "the device still holds " + std::to_string(st->live_blocks) + " blocks, " +
                 std::to_string(st->allocated) + " bytes allocated and " + std::to_string(st->free_pending) +
                 " pending after the stack is gone");
    auto in = device_budget(sim_, 0);
    XF_CHECK(in->in_use == base_in_use_,
             "the budget of ordinal 0 has " + std::to_string(in->in_use) + " bytes in use, " +
                 std::to_string(base_in_use_) + " before");
  }

 private:
  struct Held {
    DeviceBlock b;
    bool cross;  // used (or recorded) on a stream other than its alloc stream
  };
  struct Fields {
    std::uint64_t ptr;
    std::size_t bytes;
    StreamId stream;
    std::uint32_t ordinal;
    AllocTag tag;
    BlockId id;
    friend bool operator==(const Fields&, const Fields&) = default;
  };
  static Fields fields(const DeviceBlock& b) {
    return Fields{b.ptr(), b.bytes(), b.alloc_stream(), b.device_ordinal(), b.tag(), b.id()};
  }
  static DeviceBlock make(const Fields& f) { return DeviceBlock{f.ptr, f.bytes, f.stream, f.ordinal, f.tag, f.id}; }

  void trace(const std::string& s) {
    if (trace_on()) std::fprintf(stderr, "  op: %s\n", s.c_str());
  }

  bool setup_failed(const error& e, const char* what) {
    named(e, what, {});
    XF_CHECK(armed_, std::string(what) + " failed with no failure injected: " + e.what());
    return false;
  }

  /// Every error carries a known code and a sentence; a driver status appears only while
  /// a failure is injected (or a budget limits the ordinal); otherwise the code is one of
  /// `allowed`.
  void named(const error& e, const char* op, std::initializer_list<errc> allowed) {
    const auto c = static_cast<unsigned>(e.code());
    XF_CHECK(c >= static_cast<unsigned>(errc::invalid_argument) && c <= static_cast<unsigned>(errc::sink_failure),
             std::string(op) + " returned an unnamed error code " + std::to_string(c));
    XF_CHECK(!e.message().empty(), std::string(op) + " returned an error with no message");
    XF_CHECK(to_string(e.code()) != "unknown", std::string(op) + " returned an unnamed error");
    const bool driver_oom = e.code() == errc::out_of_memory && e.driver_status() == status::out_of_memory &&
                            std::find(allowed.begin(), allowed.end(), errc::out_of_memory) != allowed.end();
    if (e.driver_status() != 0 && !driver_oom) {
      XF_CHECK(armed_, std::string(op) + " returned a driver error with no failure injected: " + e.what());
      return;
    }
    if (allowed.size() == 0) {
      XF_CHECK(false, std::string(op) + " failed with no failure injected: " + e.what());
    }
    XF_CHECK(std::find(allowed.begin(), allowed.end(), e.code()) != allowed.end(),
             std::string(op) + " returned " + std::string(to_string(e.code())) + ": " + e.what());
  }

  void launch(Held& h, std::uint32_t stream, Access access) {
    auto s = streams_->get(StreamId{stream});
    XF_CHECK(s.has_value(), "stream handle");
    const SimAccess a{h.b.ptr(), h.b.bytes(), access};
    auto r = sim_.launch_kernel(*s, std::span<const SimAccess>(&a, 1), {}, "fuzz");
    if (!r) named(r.error(), "cuLaunchKernel", {});
  }

  /// The caller ordering a stream's work before the host (a stack that does not track,
  /// or a use left unrecorded): synchronise, with the injections cleared if it fails.
  void host_sync(std::uint32_t stream) {
    auto s = streams_->get(StreamId{stream});
    XF_CHECK(s.has_value(), "stream handle");
    if (auto r = sim_.stream_synchronize(*s); !r) {
      named(r.error(), "cuStreamSynchronize", {});
      clear_injections();
      auto again = sim_.stream_synchronize(*s);
      XF_CHECK(again.has_value(), "cuStreamSynchronize with no injection: " + again.error().what());
    }
  }

  /// Every call with the block of fields `f` is refused, with a code of a refusal, and
  /// the block stays with the caller.
  /// `tag_only`: f differs from a live block in its tag alone, which a free refuses and a
  /// use does not look at (a use does not depend on the tag).
  void refused(const Fields& f, const std::string& what, std::uint32_t stream, bool tag_only = false) {
    static constexpr std::initializer_list<errc> refusals = {
        errc::foreign_block, errc::double_free, errc::stale_block, errc::empty_block,
        errc::unknown_stream, errc::invalid_argument};
    DeviceBlock b = make(f);
    auto r = stack_->deallocate(std::move(b));
    XF_CHECK(!r, "freeing " + what + " " + f.id.to_string() + " succeeded");
    named(r.error(), "deallocate", refusals);
    XF_CHECK(f.id.valid() ? fields(b) == f : b.empty(), "a refused free of " + what + " changed the block");
    if constexpr (tracking) {
      if (f.id.valid() && !tag_only) {
        auto rec = stack_->record_block_use(b, StreamId{stream});
        XF_CHECK(!rec, "record_block_use of " + what + " " + f.id.to_string() + " succeeded");
        named(rec.error(), "record_block_use", refusals);
        const bool id_changed = [&] {
          for (const auto& h : held_) {
            if (h.b.id() == f.id) return false;
          }
          return true;
        }();
        if (id_changed) {
          auto p = stack_->prepare_block_use(f.id, StreamId{stream}, Access::Read);
          XF_CHECK(!p, "prepare_block_use of " + what + " " + f.id.to_string() + " succeeded");
          named(p.error(), "prepare_block_use", refusals);
          auto q = stack_->finish_block_use(f.id, StreamId{stream}, Access::Read);
          XF_CHECK(!q, "finish_block_use of " + what + " " + f.id.to_string() + " succeeded");
          named(q.error(), "finish_block_use", refusals);
        }
      }
    }
  }

  auto* cache() { return find_layer<Cached>(*stack_); }
  std::size_t guard() {
    if constexpr (guarded) {
      return find_layer<DebugGuard>(*stack_)->options().guard_bytes;
    } else {
      return 0;
    }
  }

  void hazards(const char* after) {
    const auto hz = sim_.hazards();
    if (!hz.empty()) broken(std::string("after ") + after + ", " + std::to_string(hz.size()) + " hazards; the first: " + to_string(hz.front()));
    XF_CHECK(sim_.hazards_dropped() == 0, "hazards dropped");
  }

  void check(const char* after) {
    hazards(after);
    std::size_t held_bytes = 0;
    std::size_t device_bytes = 0;
    const std::size_t g = guard();
    for (const auto& h : held_) {
      held_bytes += h.b.bytes();
      device_bytes += (h.b.bytes() + 2 * g + 255) / 256 * 256;
    }
    const std::string where = std::string(" after ") + after;
    // Upstream blocks DebugGuard keeps after a failed allocate and a failed undo: counted
    // below and on the device until it frees them; the bounds are exact again once none is.
    std::size_t unfreed = 0;
    if constexpr (guarded) unfreed = find_layer<DebugGuard>(*stack_)->unfreed_blocks();
    if (unfreed == 0) {
      // Freed at last: over an asynchronous base those frees count until the next reap.
      if (async_base) pending_hi_ += unfreed_hi_;
      unfreed_hi_ = unfreed_device_hi_ = 0;
    }
    std::size_t slack = pending_hi_ + unfreed_hi_;
    if constexpr (cached) slack += cache()->stats().trimmed_bytes - trimmed_seen_;
    const std::size_t bo = stack_->bytes_outstanding();
    XF_CHECK(bo >= held_bytes && bo <= held_bytes + slack,
             "bytes_outstanding is " + std::to_string(bo) + ", the caller holds " + std::to_string(held_bytes) +
                 " and frees not yet reaped are at most " + std::to_string(slack) + where);
    if (reaped_ && unfreed == 0) {
      XF_CHECK(bo == held_bytes, "bytes_outstanding is " + std::to_string(bo) + " after a reap, the caller holds " +
                                     std::to_string(held_bytes) + where);
    }
    if constexpr (counted) {
      const auto snap = find_layer<Statistics>(*stack_)->snapshot();
      XF_CHECK(snap.total.current_bytes == held_bytes && snap.total.current_count == held_.size(),
               "Statistics says " + std::to_string(snap.total.current_bytes) + " bytes in " +
                   std::to_string(snap.total.current_count) + " blocks, the caller holds " +
                   std::to_string(held_bytes) + " in " + std::to_string(held_.size()) + where);
    }
    if constexpr (budgeted) {
      auto* bl = find_layer<Budget>(*stack_);
      const std::size_t in_use = device_budget(sim_, 0)->in_use - base_in_use_;
      const std::size_t layer = bl->bytes_outstanding();
      XF_CHECK(in_use >= layer, "the budget has " + std::to_string(in_use) + " bytes in use, its layer holds " +
                                    std::to_string(layer) + where);
      if (reaped_) {
        XF_CHECK(in_use == layer, "the budget has " + std::to_string(in_use) + " bytes in use after a reap, its layer holds " +
                                      std::to_string(layer) + where);
      }
    }
    if constexpr (guarded) {
      XF_CHECK(find_layer<DebugGuard>(*stack_)->live_blocks() == held_.size(),
               "DebugGuard has " + std::to_string(find_layer<DebugGuard>(*stack_)->live_blocks()) +
                   " live blocks, the caller holds " + std::to_string(held_.size()) + where);
    }
    auto st = sim_.memory_stats(0);
    XF_CHECK(st.has_value(), "memory_stats");
    std::size_t base_live = held_.size() + unfreed;
    if constexpr (async_base) base_live = find_layer<AsyncCuda>(*stack_)->live_blocks();
    if constexpr (async_base && !cached) {
      XF_CHECK(base_live == held_.size() + unfreed,
               "AsyncCuda has " + std::to_string(base_live) + " live blocks, the caller holds " +
                   std::to_string(held_.size()) + " and DebugGuard keeps " + std::to_string(unfreed) + where);
    }
    XF_CHECK(st->live_blocks == base_live, "the device has " + std::to_string(st->live_blocks) +
                                               " live blocks, the base resource " + std::to_string(base_live) + where);
    if constexpr (!cached) {
      XF_CHECK(st->allocated >= device_bytes && st->allocated <= device_bytes + unfreed_device_hi_,
               "the device has " + std::to_string(st->allocated) + " bytes allocated, the caller's blocks take " +
                   std::to_string(device_bytes) + " and those DebugGuard keeps at most " +
                   std::to_string(unfreed_device_hi_) + where);
    }
    if (reaped_) {
      XF_CHECK(st->free_pending == 0, "the device has " + std::to_string(st->free_pending) +
                                          " bytes of frees that have not run after a reap" + where);
    }
  }

  SimDriver sim_;  // declared first: destroyed last
  std::shared_ptr<StreamPool<SimDriver>> streams_;
  std::optional<Stack> stack_;
  std::vector<Held> held_;
  std::vector<Fields> stale_;
  std::size_t pending_hi_ = 0;
  std::size_t unfreed_hi_ = 0;         // bytes of the upstream blocks DebugGuard keeps, at most
  std::size_t unfreed_device_hi_ = 0;  // the same on the device (256-byte granules)
  std::uint64_t trimmed_seen_ = 0;
  std::size_t base_in_use_ = 0;
  bool armed_ = false;
  bool reaped_ = false;
  std::optional<ReactorWaits> waits_;  // last: destroyed first, before the streams
};

}  // namespace xlogrt::fuzz
