// SPDX-License-Identifier: Apache-2.0
// The Driver conformance suite over SimDriver (the process-wide instance, threaded, as
// every stack over SimDriver uses it), and the proof that the suite can fail: each
// mutant driver breaks one promise and must be caught by the property about it.

#include <catch2/catch.hpp>

#include <string>

#include "driver_conformance.hpp"
#include "mutant_driver.hpp"

using namespace xlogrt;
using namespace xlogrt::drvtest;

TEST_CASE("SimDriver meets the Driver conformance suite", "[driver][conformance]") {
  SimDriver* sim = *SimDriver::open();
  sim->clear_hazards();
  driver_conformance_suite<SimDriver>();
  // The suite orders everything it touches, so the hazard checker has nothing to say.
  const auto hazards = sim->hazards();
  INFO((hazards.empty() ? std::string() : to_string(hazards.front())));
  CHECK(hazards.empty());
}

TEST_CASE("the mutants' wrapper, with nothing broken, meets the suite", "[driver][mutant]") {
  driver_conformance_suite<MutantDriver<Break::none>>();
}

namespace {

/// Property `prop` must find the breakage B, with a sentence containing `expected`.
template <Break B>
void require_caught(Property<MutantDriver<B>> prop, const std::string& expected) {
  const auto failures = run_property<MutantDriver<B>>(prop);
  INFO("what the property reported:\n  " << joined(failures));
  REQUIRE_FALSE(failures.empty());
  bool named = false;
  for (const auto& f : failures) named = named || f.find(expected) != std::string::npos;
  CHECK(named);
}

}  // namespace

TEST_CASE("mutant: an event reached before its stream gets there is caught", "[driver][mutant]") {
  constexpr Break B = Break::event_record_early;
  require_caught<B>(&events_order_streams<MutantDriver<B>>, "event_query is true behind a closed gate");
}

TEST_CASE("mutant: a stream_wait_event that orders nothing is caught", "[driver][mutant]") {
  constexpr Break B = Break::wait_ignored;
  require_caught<B>(&events_order_streams<MutantDriver<B>>,
                    "work enqueued after stream_wait_event ran before the event");
}

TEST_CASE("mutant: a device-to-host copy that jumps its stream's queue is caught", "[driver][mutant]") {
  constexpr Break B = Break::dtoh_ignores_stream_order;
  require_caught<B>(&stream_order<MutantDriver<B>>, "bytes read back are not the last fill 0x55");
}

TEST_CASE("mutant: a free that does not wait for its stream is caught", "[driver][mutant]") {
  constexpr Break B = Break::free_not_stream_ordered;
  require_caught<B>(&free_is_stream_ordered<MutantDriver<B>>, "t's work ran before the free");
}

TEST_CASE("mutant: an event_query that accepts a null event is caught", "[driver][mutant]") {
  constexpr Break B = Break::null_event_accepted;
  require_caught<B>(&bad_input_is_refused<MutantDriver<B>>, "event_query(null event) succeeded");
}

TEST_CASE("mutant: one stream id for every stream is caught", "[driver][mutant]") {
  constexpr Break B = Break::constant_stream_id;
  require_caught<B>(&streams_and_ids<MutantDriver<B>>, "the same id");
}

TEST_CASE("mutant: an unknown attribute answered with 0 is caught", "[driver][mutant]") {
  constexpr Break B = Break::unknown_attribute_is_zero;
  require_caught<B>(&devices_and_attributes<MutantDriver<B>>,
                    "device_attribute(device 0, DeviceAttr 99) succeeded");
}

TEST_CASE("mutant: a ctx_synchronize that waits for nothing is caught", "[driver][mutant]") {
  constexpr Break B = Break::ctx_synchronize_ignored;
  require_caught<B>(&ctx_synchronize_waits_for_every_stream<MutantDriver<B>>,
                    "ctx_synchronize returned before a destroyed stream's work ran");
}

TEST_CASE("mutant: a mem_set_access that grants nothing is caught", "[driver][mutant][vmm]") {
  constexpr Break B = Break::set_access_ignored;
  require_caught<B>(&vmm_stitched_round_trip<MutantDriver<B>>, "CUDA_ERROR_ILLEGAL_ADDRESS");
}

TEST_CASE("mutant: a mem_unmap that keeps the mapping is caught", "[driver][mutant][vmm]") {
  constexpr Break B = Break::unmap_ignored;
  require_caught<B>(&vmm_mem_info_follows_physical_memory<MutantDriver<B>>,
                    "did not rise after the last unmap");
}
