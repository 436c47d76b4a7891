// SPDX-License-Identifier: Apache-2.0
#pragma once

// VirtualCuda's members defined out of line (the face, resource/virtual_cuda.hpp, holds
// the design). Included at the end of that header.

#include <new>
#include <optional>
#include <string>

#include "xlogrt/resource/virtual_cuda.hpp"

namespace xlogrt {

namespace detail {
/// Host memory ran out in the arena's bookkeeping (std::map nodes).
inline error virtual_host_oom(const char* doing) {
  return error{errc::out_of_memory, std::string("VirtualCuda: host memory exhausted ") + doing};
}
}  // namespace detail

// ---- creation and teardown -----------------------------------------------------------

template <VirtualMemoryDriver D>
inline result<VirtualCuda<D>> VirtualCuda<D>::create(std::shared_ptr<StreamPool<D>> streams,
                                                     VirtualCudaOptions options) noexcept {
  const Device<D>& dev = *streams->device();
  D& d = dev.driver();
  if (auto r = dev.make_current(); !r) return std::move(r).error();
  auto gran = d.mem_granularity(dev.handle());
  if (!gran) return std::move(gran).error();
  const std::uint64_t page = gran->minimum;
  const std::size_t a = options.alignment;
  if (a < 256 || (a & (a - 1)) != 0 || a > page) {
    return error{errc::invalid_argument, "VirtualCudaOptions::alignment " + std::to_string(a) +
                                             " must be a power of two from 256 to the device's granularity (" +
                                             std::to_string(page) + ")"};
  }
  auto up = [page](std::uint64_t n) { return (n + page - 1) / page * page; };
  const std::uint64_t total = dev.info().total_bytes;
  std::uint64_t want = up(options.reserve_bytes != 0 ? options.reserve_bytes : 2 * total);
  auto va = d.mem_address_reserve(want, page);
  if (!va && options.reserve_bytes == 0 && va.error().driver_status() == status::out_of_memory) {
    want = up(total);
    va = d.mem_address_reserve(want, page);
  }
  if (!va) {
    const error& e = va.error();
    return error{e.code(), e.message() + " (VirtualCuda reserving its address range on ordinal " +
                               std::to_string(dev.ordinal()) + "; VirtualCudaOptions::reserve_bytes sets its size)",
                 e.driver_status()};
  }
  VirtualCuda v(std::move(streams));
  State& st = *v.state_;
  st.options = options;
  st.base = *va;  // freed with the state from here on
  st.size = want;
  st.granularity = page;
  st.counts.reserved_bytes = want;
  st.counts.granularity = page;
  // The small blocks' region: the last eighth of the range, whole pages, when both
  // regions hold at least one page.
  const std::uint64_t small_region = options.small_block_bytes != 0 ? want / 8 / page * page : 0;
  const std::uint64_t boundary = small_region != 0 ? want - small_region : 0;
  st.counts.small_region_bytes = small_region;
  try {
    st.pages.resize(want / page);
    st.spare.reserve(want / page);  // a page is mapped or spare: pushing a spare never allocates
    st.free.set_boundary(boundary);
    for (StreamFrees& f : st.frees) f.pending.set_boundary(boundary);
    if (boundary != 0) st.free.insert(boundary, small_region, 0);
    st.free.insert(0, want - small_region, 0);
  } catch (...) {
    return detail::virtual_host_oom("setting up the page table");
  }
  if (auto r = st.events.reserve(options.reserve_events); !r) return std::move(r).error();
  return v;
}

template <VirtualMemoryDriver D>
VirtualCuda<D>::State::~State() {
  D& d = device->driver();
  for (StreamFrees& f : frees) {
    if (f.has_event) events.release(f.event);
  }
  if (base == 0 || detail::process_exiting()) return;
  // A live block (a deferred free's too) keeps its memory valid: leave the range as it is.
  if (table.live_bytes() != 0) return;
  if (!device->make_current()) return;
  // cuMemUnmap does not wait for work using the pages (pending frees' last uses).
  if (!mapped.empty() && !d.ctx_synchronize()) return;
  const std::uint64_t g = granularity;
  for (const std::uint64_t p : mapped) {
    if (!d.mem_unmap(base + p * g, g)) return;  // the rest stays mapped, and the range reserved
    (void)d.mem_release(pages[p].phys);
  }
  for (const phys_t h : spare) (void)d.mem_release(h);
  (void)d.mem_address_free(base, size);
}

// ---- allocation ----------------------------------------------------------------------

template <VirtualMemoryDriver D>
inline result<DeviceBlock> VirtualCuda<D>::allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
  if (!detail::valid_request(*streams_, device_bytes_, bytes, stream)) [[unlikely]] {
    return detail::request_error(*streams_, bytes, stream);
  }
  if (capturing(streams_->at(stream))) [[unlikely]] {
    return error{errc::stream_misuse, "VirtualCuda cannot allocate on stream " + std::to_string(stream.value) +
                                          ": it is capturing a graph; put GraphPools above VirtualCuda (the default "
                                          "stack does) so that captures are served from a graph pool"};
  }
  State& st = *state_;
  const std::uint64_t need = round(bytes);
  std::optional<detail::RelaxedCapture<D>> relaxed;  // the mapping calls stay legal during a capture
  if (detail::capture_windows_open()) [[unlikely]] relaxed.emplace(driver());
  std::uint64_t off = 0;
  detail::FreeRanges* from = nullptr;
  std::uint64_t seq = 0;
  {
    std::unique_lock lock(st.mu);
    detail::FreeRanges& mine = st.frees[stream.value].pending;
    // The best fit among the ranges free everywhere and those pending on this stream, in
    // the request's region (1: the small blocks', or the only one), else in the other.
    const bool split = st.free.boundary() != 0;
    const std::size_t home = split && bytes > st.options.small_block_bytes ? 0 : 1;
    auto pick_in = [&](std::size_t region) {
      auto f = st.free.best_fit(need, region);
      auto p = mine.best_fit(need, region);
      if (p && (!f || p->bytes < f->bytes)) {
        from = &mine;
        off = p->offset;
        seq = p->seq;
      } else if (f) {
        from = &st.free;
        off = f->offset;
      }
      return from != nullptr;
    };
    auto pick = [&] {
      from = nullptr;
      seq = 0;
      return pick_in(home) || (split && pick_in(1 - home));
    };
    // Whether the picked range touches a page not mapped yet.
    auto needs_pages = [&] {
      for (std::uint64_t p = off / st.granularity; p <= (off + need - 1) / st.granularity; ++p) {
        if (!st.pages[p].mapped) return true;
      }
      return false;
    };
    if (!pick()) {
      // Frees on other streams the device has finished may make room.
      if (auto r = poll_locked(stream); !r) return std::move(r).error();
      if (!pick()) {
        return error{errc::out_of_memory,
                     "VirtualCuda on ordinal " + std::to_string(ordinal_) + ": no free range of " +
                         std::to_string(need) + " bytes in the reserved " + std::to_string(st.size) + " (" +
                         std::to_string(st.free.bytes()) + " free on every stream, " +
                         std::to_string(st.size - st.free.bytes()) +
                         " live or pending); raise VirtualCudaOptions::reserve_bytes or free blocks"};
      }
    } else if (st.spare.empty() && st.pending_requested.load(std::memory_order_relaxed) != 0 && needs_pages()) {
      // Before mapping pages: frees on other streams that the device has finished may
      // leave a range that is mapped already (a poll is cheaper than a page's mapping).
      auto freed = poll_locked(stream);
      if (!freed) return std::move(freed).error();
      if (*freed != 0) pick();  // finds at least the range it found before
    }
    try {
      from->take_front(off, need);
      if (auto r = map_range_locked(off, need); !r) {
        from->insert(off, need, seq);  // back where it was; the pages mapped on the way stay, idle
        return std::move(r).error();
      }
    } catch (...) {
      return detail::virtual_host_oom("carving a block (the range may stay unusable)");
    }
    const std::uint64_t held = st.physical_bytes();
    if (held > st.counts.peak_physical_bytes) st.counts.peak_physical_bytes = held;
  }
  auto id = st.table.insert(st.base + off, bytes, tag, [stream](Track& t) noexcept { t.start(stream); });
  if (!id) [[unlikely]] {
    std::lock_guard lock(st.mu);
    try {
      from->insert(off, need, seq);
    } catch (...) {
    }
    return std::move(id).error();
  }
  return DeviceBlock{st.base + off, bytes, stream, ordinal_, tag, *id};
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::map_range_locked(std::uint64_t offset, std::uint64_t bytes) noexcept {
  State& st = *state_;
  const std::uint64_t g = st.granularity;
  const std::uint64_t first = offset / g;
  const std::uint64_t last = (offset + bytes - 1) / g;
  bool current = false;
  auto make_current_once = [&]() -> result<void> {
    if (current) return ok();
    current = true;
    return make_current();
  };
  // The pages this call maps, so that a failure can undo them: the device then holds
  // what it held before the call (a page created here is released, one taken from the
  // spare or idle pages goes back to the spare list).
  struct Fresh {
    std::uint64_t page;
    bool created;
  };
  std::vector<Fresh> fresh;
  auto undo = [&](result<void> why) -> result<void> {
    for (const Fresh& f : fresh) {
      Page& pg = st.pages[f.page];
      if (!driver().mem_unmap(st.base + f.page * g, g)) continue;  // stays mapped, idle, counted
      st.mapped.erase(f.page);
      if (!f.created || !driver().mem_release(pg.phys)) {
        st.spare.push_back(pg.phys);
      } else {
        ++st.counts.pages_released;
      }
      pg = Page{};
    }
    return why;
  };
  st.carving = (last - first + 1) * g;
  struct Done {
    State& st;
    ~Done() { st.carving = 0; }
  } done{st};
  try {
    fresh.reserve(last - first + 1);
  } catch (...) {
    return detail::virtual_host_oom("mapping a block's pages");
  }
  for (std::uint64_t p = first; p <= last; ++p) {
    if (st.pages[p].mapped) continue;
    if (auto r = make_current_once(); !r) return undo(std::move(r));
    const std::uint64_t created_before = st.counts.pages_created;
    auto h = page_for_locked(last - p + 1);
    if (!h) return undo(std::move(h).error());
    const bool created = st.counts.pages_created != created_before;
    if (auto r = driver().mem_map(st.base + p * g, g, *h); !r) {
      if (!created || !driver().mem_release(*h)) {
        st.spare.push_back(*h);
      } else {
        ++st.counts.pages_released;
      }
      return undo(std::move(r));
    }
    st.pages[p] = Page{*h, true, false};
    fresh.push_back(Fresh{p, created});  // reserved: no allocation
    try {
      st.mapped.insert(p);
    } catch (...) {
      return undo(detail::virtual_host_oom("recording a mapped page"));
    }
  }
  // Access, one call per run of pages that lack it (mapped just now, or whose grant failed).
  for (std::uint64_t p = first; p <= last;) {
    if (st.pages[p].access) {
      ++p;
      continue;
    }
    std::uint64_t q = p;
    while (q < last && !st.pages[q + 1].access) ++q;
    if (auto r = make_current_once(); !r) return undo(std::move(r));
    if (auto r = driver().mem_set_access(st.base + p * g, (q - p + 1) * g, streams_->device()->handle()); !r) {
      return undo(std::move(r));
    }
    for (std::uint64_t k = p; k <= q; ++k) st.pages[k].access = true;
    p = q + 1;
  }
  return ok();
}

template <VirtualMemoryDriver D>
inline result<typename D::phys_t> VirtualCuda<D>::page_for_locked(std::uint64_t wanted) noexcept {
  State& st = *state_;
  auto take_spare = [&] {
    const phys_t h = st.spare.back();
    st.spare.pop_back();
    return h;
  };
  if (st.spare.empty() && st.options.remap_idle) {
    if (auto got = harvest_locked(wanted, false); !got) return std::move(got).error();
  }
  auto create = [&] {
    auto h = driver().mem_create(st.granularity, streams_->device()->handle());
    if (h) ++st.counts.pages_created;
    return h;
  };
  if (!st.spare.empty()) return take_spare();
  auto h = create();
  if (h || h.error().driver_status() != status::out_of_memory) return h;
  // Pressure: retire what the device has finished, take idle pages, and try again.
  if (auto r = poll_locked(StreamId{static_cast<std::uint32_t>(MAX_STREAMS)}); !r) return std::move(r).error();
  if (auto got = harvest_locked(wanted, true); !got) return std::move(got).error();
  if (!st.spare.empty()) return take_spare();
  auto again = create();
  if (again || again.error().driver_status() != status::out_of_memory) return again;
  return error{errc::out_of_memory,
               "VirtualCuda on ordinal " + std::to_string(ordinal_) + ": the device has no memory for another page of " +
                   std::to_string(st.granularity) + " bytes (" + again.error().message() + "); the resource holds " +
                   std::to_string(st.physical_bytes()) + " bytes of physical memory, " +
                   std::to_string(st.used_bytes()) +
                   " used by live and pending blocks and no idle page left; free blocks (and reap) or trim other "
                   "resources",
               status::out_of_memory};
}

template <VirtualMemoryDriver D>
inline result<std::uint64_t> VirtualCuda<D>::harvest_locked(std::uint64_t want, bool thorough) noexcept {
  State& st = *state_;
  const std::uint64_t g = st.granularity;
  // An upper bound of the idle bytes: those of the mapped pages (and of the pages of the
  // block being mapped, whose range counts as used already) that no block uses.
  const std::uint64_t cover = st.mapped.size() * g + st.carving;
  const std::uint64_t used = st.used_bytes();
  const std::uint64_t slack = cover > used ? cover - used : 0;
  if (!thorough && (slack < g || slack <= st.barren_slack)) return std::uint64_t{0};
  std::uint64_t got = 0;
  result<void> failed = ok();
  bool current = false;
  st.free.for_each_until([&](std::uint64_t off, std::uint64_t n) {
    const std::uint64_t pa = (off + g - 1) / g;  // the pages wholly inside [off, off + n)
    const std::uint64_t pb = (off + n) / g;
    for (auto it = st.mapped.lower_bound(pa); it != st.mapped.end() && *it < pb && got < want;) {
      if (!current) {
        current = true;
        if (auto r = make_current(); !r) {
          failed = std::move(r);
          return false;
        }
      }
      const std::uint64_t p = *it;
      if (auto r = driver().mem_unmap(st.base + p * g, g); !r) {
        failed = std::move(r);
        return false;
      }
      st.spare.push_back(st.pages[p].phys);
      st.pages[p] = Page{};
      it = st.mapped.erase(it);
      ++got;
      ++st.counts.pages_unmapped;
    }
    return got < want;
  });
  st.barren_slack = got == 0 ? slack : 0;
  if (!failed) return std::move(failed).error();
  return got;
}

template <VirtualMemoryDriver D>
inline result<std::size_t> VirtualCuda<D>::release_locked(std::uint64_t keep) noexcept {
  State& st = *state_;
  const std::uint64_t g = st.granularity;
  auto idle = [&] { return st.physical_bytes() - st.used_bytes(); };
  if (idle() <= keep) return std::size_t{0};
  std::size_t released = 0;
  auto release_spare = [&]() -> result<void> {
    while (!st.spare.empty() && idle() > keep) {
      if (auto r = driver().mem_release(st.spare.back()); !r) return r;
      st.spare.pop_back();
      released += g;
      ++st.counts.pages_released;
    }
    return ok();
  };
  if (auto r = make_current(); !r) return std::move(r).error();
  if (auto r = release_spare(); !r) return std::move(r).error();
  if (idle() > keep) {
    if (auto got = harvest_locked((idle() - keep + g - 1) / g, true); !got) return std::move(got).error();
    if (auto r = release_spare(); !r) return std::move(r).error();
  }
  return released;
}

// ---- frees and their retirement -------------------------------------------------------

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::queue_free_locked(std::size_t i, std::uint64_t offset, std::uint64_t rounded,
                                                      std::uint64_t requested) noexcept {
  State& st = *state_;
  try {
    if (st.options.unsafe_cross_stream_reuse_for_testing) [[unlikely]] {
      st.free.insert(offset, rounded, 0);
      st.retired_total.fetch_add(requested, std::memory_order_release);
      return ok();
    }
    StreamFrees& f = st.frees[i];
    // Merged only with the frees after the poll's latest mark (see FreeRanges), so that
    // what the mark covers retires when it is reached.
    f.pending.insert(offset, rounded, f.seq + 1, (f.armed ? f.mark_seq : f.retired_seq) + 1);
    ++f.seq;
    f.queued += requested;
  } catch (...) {
    return detail::virtual_host_oom("recording a free: the block is still live; free it again later");
  }
  st.pending_requested.fetch_add(requested, std::memory_order_release);
  return ok();
}

template <VirtualMemoryDriver D>
inline std::uint64_t VirtualCuda<D>::retire_locked(std::size_t i, std::uint64_t seq, std::uint64_t bytes) noexcept {
  State& st = *state_;
  StreamFrees& f = st.frees[i];
  if (seq <= f.retired_seq) return 0;
  try {
    f.pending.retire_into(st.free, seq);
  } catch (...) {
    return 0;  // what did not move stays pending, to retire with a later free's sequence
  }
  f.retired_seq = seq;
  const std::uint64_t n = bytes - f.retired;
  f.retired = bytes;
  st.pending_requested.fetch_sub(n, std::memory_order_release);
  st.retired_total.fetch_add(n, std::memory_order_release);
  return n;
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::deallocate(DeviceBlock&& b) noexcept {
  if (auto r = detail::check_block(b, ordinal_); !r) return r;
  auto s = streams_->get(b.alloc_stream());
  if (!s) return std::move(s).error();
  const stream_t a = *s;
  if (detail::capture_windows_open() && capturing(a)) [[unlikely]] return defer_free(std::move(b));
  State& st = *state_;
  auto r = st.table.erase_if(b.id(), &b, [&](Track& t) -> result<void> {
    if (auto w = t.for_each_other([&](Use& u) { return wait_for(t, a, u); }); !w) return w;
    {
      std::lock_guard lock(st.mu);
      if (auto q = queue_free_locked(b.alloc_stream().value, b.ptr() - st.base, round(b.bytes()), b.bytes()); !q) {
        return q;
      }
    }
    t.release_events(st.events);
    return ok();
  });
  if (!r) return r;
  const StreamId freed_on = b.alloc_stream();
  DeviceBlock gone = std::move(b);
  if (Cadence::due(gone.bytes())) (void)poll(freed_on);
  return ok();
}

template <VirtualMemoryDriver D>
inline result<std::size_t> VirtualCuda<D>::poll(StreamId named) noexcept {
  std::unique_lock polling(state_->poll_mu, std::try_to_lock);
  if (!polling.owns_lock()) return std::size_t{0};
  std::optional<detail::RelaxedCapture<D>> relaxed;  // its calls stay legal during a capture
  if (detail::capture_windows_open()) [[unlikely]] relaxed.emplace(driver());
  if (auto r = queue_deferred(); !r) return std::move(r).error();
  std::lock_guard lock(state_->mu);
  auto freed = poll_locked(named);
  if (!freed) return freed;
  if (state_->options.release_threshold != std::numeric_limits<std::uint64_t>::max()) {
    if (auto r = release_locked(state_->options.release_threshold); !r) return std::move(r).error();
  }
  return freed;
}

template <VirtualMemoryDriver D>
inline result<std::size_t> VirtualCuda<D>::poll_locked(StreamId named) noexcept {
  State& st = *state_;
  std::size_t freed = 0;
  const std::size_t n = streams_->size();
  for (std::size_t i = 0; i < n; ++i) {
    StreamFrees& f = st.frees[i];
    if (f.armed) {
      auto reached = driver().event_query(f.event);
      if (!reached) return std::move(reached).error();
      if (!*reached) continue;  // not there yet: look again next time
      freed += retire_locked(i, f.mark_seq, f.mark_bytes);
      f.armed = false;
    }
    if (f.seq <= f.retired_seq) continue;
    const StreamId id{static_cast<std::uint32_t>(i)};
    if (id != named && !streams_->owned(id)) continue;  // no call on a stream that may be gone
    const stream_t s = streams_->at(id);
    if (capturing(s)) continue;  // a query or a record would break the capture
    auto idle = driver().stream_query(s);
    if (!idle) return std::move(idle).error();
    if (*idle) {
      freed += retire_locked(i, f.seq, f.queued);
      continue;
    }
    if (!f.has_event) {
      auto e = st.events.acquire();
      if (!e) return std::move(e).error();
      f.event = *e;
      f.has_event = true;
    }
    if (auto r = driver().event_record(f.event, s); !r) return std::move(r).error();
    f.mark_seq = f.seq;
    f.mark_bytes = f.queued;
    f.armed = true;
  }
  return freed;
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::reap_pending() noexcept {
  if (auto r = make_current(); !r) return r;
  std::optional<detail::RelaxedCapture<D>> relaxed;
  if (detail::capture_windows_open()) [[unlikely]] relaxed.emplace(driver());
  if (auto r = queue_deferred(); !r) return r;
  if (auto r = reap_now(); !r) return r;
  if (state_->options.release_threshold != std::numeric_limits<std::uint64_t>::max()) {
    std::lock_guard lock(state_->mu);
    if (auto r = release_locked(state_->options.release_threshold); !r) return std::move(r).error();
  }
  return ok();
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::reap_now() noexcept {
  State& st = *state_;
  const std::size_t n = streams_->size();
  struct Seen {
    std::uint64_t seq = 0;
    std::uint64_t bytes = 0;
  };
  std::array<Seen, MAX_STREAMS> adopted{};
  bool adopted_pending = false;
  for (std::size_t i = 0; i < n; ++i) {
    Seen seen;
    {
      std::lock_guard lock(st.mu);
      const StreamFrees& f = st.frees[i];
      if (f.seq <= f.retired_seq) continue;
      seen = Seen{f.seq, f.queued};  // every free counted here is ordered before the synchronisation
    }
    const StreamId id{static_cast<std::uint32_t>(i)};
    if (!streams_->owned(id)) {
      adopted[i] = seen;
      adopted_pending = true;
      continue;
    }
    const stream_t s = streams_->at(id);
    if (capturing(s)) continue;
    if (auto r = driver().stream_synchronize(s); !r) return r;
    std::lock_guard lock(st.mu);
    retire_locked(i, seen.seq, seen.bytes);
  }
  if (adopted_pending && !detail::capture_windows_open()) {
    if (auto r = driver().ctx_synchronize(); !r) return r;
    std::lock_guard lock(st.mu);
    for (std::size_t i = 0; i < n; ++i) {
      if (adopted[i].seq != 0) retire_locked(i, adopted[i].seq, adopted[i].bytes);
    }
  }
  return ok();
}

template <VirtualMemoryDriver D>
inline result<std::size_t> VirtualCuda<D>::trim() noexcept {
  if (auto r = reap_pending(); !r) return std::move(r).error();
  std::optional<detail::RelaxedCapture<D>> relaxed;
  if (detail::capture_windows_open()) [[unlikely]] relaxed.emplace(driver());
  std::lock_guard lock(state_->mu);
  return release_locked(0);
}

template <VirtualMemoryDriver D>
inline VirtualStats VirtualCuda<D>::stats() const {
  const State& st = *state_;
  std::lock_guard lock(st.mu);
  VirtualStats s = st.counts;
  s.mapped_bytes = st.mapped.size() * st.granularity;
  s.physical_bytes = st.physical_bytes();
  s.used_bytes = st.used_bytes();
  std::uint64_t pending = 0;
  for (const StreamFrees& f : st.frees) pending += f.pending.bytes();
  s.pending_bytes = pending;
  s.free_ranges = st.free.count();
  return s;
}

// ---- frees during a capture -------------------------------------------------------------

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::defer_free(DeviceBlock&& b) noexcept {
  return state_->deferred.defer(state_->table, std::move(b));
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::queue_deferred() noexcept {
  // deallocate defers a block again while its stream still captures.
  return state_->deferred.drain([this](DeviceBlock&& b) { return deallocate(std::move(b)); });
}

// ---- recycling ----------------------------------------------------------------------------

template <VirtualMemoryDriver D>
result<DeviceBlock> VirtualCuda<D>::recycle_general(DeviceBlock& b, StreamId to, Park park) noexcept {
  if (auto r = detail::check_block(b, ordinal_); !r) return std::move(r).error();
  auto s = streams_->get(b.alloc_stream());
  if (!s) return std::move(s).error();
  if (!streams_->contains(to)) return streams_->unknown(to);
  const stream_t a = *s;
  if (b.id().generation == BlockTable<Track>::LAST_GENERATION) [[unlikely]] return recycle_moving(b, to, a, park);
  auto id = state_->table.renew(
      b.id(), &b,
      [&](Track& t) -> result<void> {
        if (auto r = end_life(t, b, to, a); !r) return r;
        t.start(to);
        return ok();
      },
      park);
  if (!id) return std::move(id).error();
  DeviceBlock next{b.ptr(), b.bytes(), to, ordinal_, b.tag(), *id};
  DeviceBlock gone = std::move(b);
  return next;
}

template <VirtualMemoryDriver D>
result<DeviceBlock> VirtualCuda<D>::recycle_moving(DeviceBlock& b, StreamId to, stream_t a, Park park) noexcept {
  auto fresh = state_->table.insert(b.ptr(), b.bytes(), b.tag(), [to](Track& t) noexcept { t.start(to); });
  if (!fresh) return std::move(fresh).error();
  if (park.to) (void)state_->table.park(*fresh);
  auto r = state_->table.erase_if(b.id(), &b, [&](Track& t) { return end_life(t, b, to, a); }, park.from);
  if (!r) {
    (void)state_->table.erase_if(*fresh, nullptr, [](Track&) { return ok(); }, park.to);
    return std::move(r).error();
  }
  DeviceBlock next{b.ptr(), b.bytes(), to, ordinal_, b.tag(), *fresh};
  DeviceBlock gone = std::move(b);
  return next;
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::end_life(Track& t, const DeviceBlock& b, StreamId to, stream_t a) noexcept {
  if (t.alloc_stream != b.alloc_stream()) {
    return error{errc::foreign_block, "block " + b.id().to_string() + " names stream " +
                                          std::to_string(b.alloc_stream().value) + ", not its alloc stream " +
                                          std::to_string(t.alloc_stream.value)};
  }
  if (to != b.alloc_stream() && !t.alone()) {
    return error{errc::invalid_argument, "block " + b.id().to_string() +
                                             " has uses on other streams: it can move to stream " +
                                             std::to_string(to.value) + " only once renewed on its own"};
  }
  if (auto w = t.for_each_other([&](Use& u) { return wait_for(t, a, u); }); !w) return w;
  t.release_events(state_->events);
  return ok();
}

// ---- tracking -----------------------------------------------------------------------------

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::prepare_block_use(BlockId id, StreamId use, Access access) noexcept {
  auto s = streams_->get(use);
  if (!s) return std::move(s).error();
  if (quiet_on(id, use)) return ok();
  return tracked(id, nullptr, [&](Track& t) -> result<void> {
    if (t.write.stream != use && !t.write_waited(use)) {
      if (auto w = wait_for(t, *s, t.write); !w) return w;
      t.mark_write_waited(use);
    }
    if (writes(access)) {
      for (Use& rd : t.reads) {
        if (rd.stream == use) continue;
        if (auto w = wait_for(t, *s, rd); !w) return w;
      }
    }
    return ok();
  });
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::resolve(Track& t, Use& u) noexcept {
  if (u.recorded) return ok();
  if (!u.has_event) {
    if (!t.spare.empty()) {
      u.event = t.spare.back();
      t.spare.pop_back();
    } else {
      auto e = state_->events.acquire();
      if (!e) return std::move(e).error();
      u.event = *e;
    }
    u.has_event = true;
  }
  auto s = streams_->get(u.stream);
  if (!s) return std::move(s).error();
  if (auto r = driver().event_record(u.event, *s); !r) return r;
  u.recorded = true;
  return ok();
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::wait_for(Track& t, stream_t waiter, Use& u) noexcept {
  if (auto r = resolve(t, u); !r) return r;
  return driver().stream_wait_event(waiter, u.event);
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::note_use(Track& t, Use& u) noexcept {
  u.recorded = false;
  if (u.stream == t.alloc_stream) return ok();  // ordered before the free already: recorded when someone waits
  return resolve(t, u);
}

template <VirtualMemoryDriver D>
inline result<void> VirtualCuda<D>::finish(BlockId id, StreamId use, Access access, const DeviceBlock* block) noexcept {
  if (!streams_->contains(use)) return streams_->unknown(use);
  // A use whose event could not be recorded is kept as a lazy one: its event is recorded
  // on its stream when the free or another stream must wait for it.
  auto lazily = [use](result<void> n) -> result<void> {
    if (n) return n;
    const error& e = n.error();
    return error{e.code(),
                 e.message() + "; the use is recorded all the same: its event is recorded on stream " +
                     std::to_string(use.value) + " when the free or another stream must wait for it",
                 e.driver_status()};
  };
  return tracked(id, block, [&](Track& t) -> result<void> {
    if (writes(access)) {
      const bool same = t.write.stream == use;
      Use next = same ? t.write : Use{.stream = use};
      result<void> n = note_use(t, next);
      if (!same) t.keep(t.write, state_->events);
      for (const Use& rd : t.reads) t.keep(rd, state_->events);
      t.reads.clear();
      t.write = next;
      t.waited = 0;
      return lazily(std::move(n));
    }
    for (Use& rd : t.reads) {
      if (rd.stream == use) return lazily(note_use(t, rd));
    }
    Use fresh{.stream = use};
    result<void> n = note_use(t, fresh);
    try {
      t.reads.push_back(fresh);
    } catch (...) {
      t.keep(fresh, state_->events);
      return error{errc::out_of_memory, "host memory exhausted recording a use of block " + id.to_string() +
                                            " on stream " + std::to_string(use.value) +
                                            ": the use is not recorded; synchronise that stream before the "
                                            "block's free or its next use on another stream"};
    }
    return lazily(std::move(n));
  });
}

}  // namespace xlogrt
