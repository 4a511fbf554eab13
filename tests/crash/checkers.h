// Protocol checkers on a recorded log (docs/testing.md), citing the commit
// invariants of lib/commit/volume.h and format.md#commit-invariants:
//   P1 a superblock write is alone between two flushes (C1, and nothing else
//      shares its epoch);
//   P2 generation G goes to slot G % 2, one generation after the other (C2);
//   P3 no write touches a block that a generation recovery could select
//      reaches: the newest durable one, or one whose superblock write was
//      issued and not yet flushed (C3, A1, A2);
//   P4 every block a commit writes is a self-describing node of that
//      generation: magic, checksum, its own address, the generation, fs_id;
//   P5 a commit is acknowledged only after the flush that follows its
//      superblock write (C4).
// P6, recovery writes nothing (C6), is checked on every crash state.
//   P7 no discard covers a block that a generation recovery could select
//      reaches (A6; the same selectable generations as P3).
#pragma once

#include <string>
#include <vector>

#include "workload.h"

namespace plyfs::crash {

struct Violation {
  std::string check;  // P1..P5, P7
  size_t pos;         // log position
  std::string what;
};

std::vector<Violation> check_protocol(const Run& run);

}  // namespace plyfs::crash
