// Writing a repaired generation (fsck.h R1-R2). Internal to lib/fsck.
#pragma once

#include <set>

#include "fsck/fsck.h"

namespace plyfs::fsck_internal {

struct RebuildPlan {
  std::set<uint64_t> rebuild;  // user trees rebuilt from their readable items
};

struct RebuildResult {
  Generation written;
  uint64_t items_kept = 0;   // items of rebuilt trees carried over
  uint64_t items_dropped = 0;  // values referencing blocks outside the filesystem
  uint64_t trees_kept = 0, trees_rebuilt = 0, records_dropped = 0;
  uint64_t records_renumbered = 0;  // filed far past the tree id counter
  bool space_released = false;      // the old space tree's extents could not all be held
};

// Writes generation base.generation + 1 from the trees `base` reaches: the
// root and space trees rebuilt, the trees in plan.rebuild rebuilt from their
// readable items, every other tree kept as it is with recounted references.
Result<RebuildResult> rebuild_generation(BlockDevice& dev, const SuperInfo& base,
                                         const RebuildPlan& plan,
                                         const std::map<uint8_t, ValueRefs>& kinds);

}  // namespace plyfs::fsck_internal
