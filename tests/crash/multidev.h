// The crash harness on volumes of several devices (format.md#multi-device,
// docs/testing.md#several-devices): each member recorded on its own in one
// global order (crashlog.h, MultiLog), crash states that cut that order once
// and keep, per member independently, any subset of the writes since that
// member's own last flush, and the protocol checks across the members:
//   M1 no superblock write on any member before every node write of its
//      generation, on every member, was covered by a successful flush of
//      the member that holds it (C1 across devices); and on each member the
//      superblock is alone between two of its flushes (P1);
//   M2 on each member, generation G goes to slot G % 2, one generation
//      after the other (P2, C2);
//   M5 a commit is acknowledged only after every member flushed its
//      superblock (C4 on every device).
// The commit these check is format.md#multi-device's "Commit" paragraph.
#pragma once

#include "harness.h"

namespace plyfs::crash {

std::vector<Violation> check_multi_protocol(const Run& run);

// The oracle on one state: the members' crash states assembled into a set
// as recorded, then check_image with the generation bounds across the set
// (MultiLog::gen_lo, gen_hi).
std::string check_multi_state(const Run& run, const MultiSpec& spec, bool write_check, PlantedBug bug);

// check_run for a run of several devices (run.multi): the protocol checks,
// then every enumerated state through check_multi_state. Tiers as for one
// device: T0 after every member's flush, nothing open kept; T1 after every
// write, every member keeping all it has open; T3 the T1 states with the
// last write torn (and, right after a superblock reached every member, all
// copies torn alike); T2 before every member's flush and at the end, every
// combination of the members' open writes when they are at most
// `exhaustive_k` in all (8 in the suite), else per member keep-none, keep-all, drop-one,
// keep-one and per block class against the others' all, and random subsets
// of each member on its own.
void check_multi_run(const Workload& w, const Run& run, const Sampling& s, uint64_t seed, Totals& t,
                     const std::string& only = "", bool verbose = false);

// What the workload says about placement (format.md#placement): every
// extent on the slowest class, and for `multidev/tiny-meta` nodes spilled
// off the metadata device. Empty when it holds.
std::string check_multi_placement(const Workload& w, const Run& run);

}  // namespace plyfs::crash
