// The workloads the crash harness runs (docs/testing.md#workloads).
#pragma once

#include <vector>

#include "workload.h"

namespace plyfs::crash {

// The committed state every bounded sequence starts from: a plain tree deep
// enough for inner nodes, a clone of it that shares most nodes, a tree whose
// values reference data extents, a small plain tree.
std::vector<Op> ace_setup();
// The core operations, one per argument class (ACE's instances).
std::vector<Op> ace_instances();
// ACE-style sequences of `length` operations (1..3) over the instances, each
// followed by a persistence point (commit or none; the last always commit).
// seq-1 and seq-2 are enumerated whole; seq-3 is sampled with `seed`.
std::vector<Workload> ace(size_t length, uint64_t seed, size_t sample);
// Targeted scenarios: many generations, splits and merges in one commit,
// dropping a large shared tree, near-full devices.
std::vector<Workload> scenarios();
// Volumes of two and three devices (format.md#multi-device): puts, erases,
// clones, drops and commits; a metadata device so small that nodes spill
// onto the others; data extents on the slow devices; many generations.
std::vector<Workload> multidev_workloads();
// Long random workloads against the model.
Workload random_workload(uint64_t seed, size_t nops);

}  // namespace plyfs::crash
