// On-disk space-tree item (format.md#space-item).
#pragma once

#include <type_traits>

#include "util/endian.h"

namespace plyfs::disk {

// Key: (hi = first block of the extent, lo = 0).
struct SpaceItem {
  le64 nblocks;   // extent length in blocks, >= 1
  le32 refs;      // references (A3), >= 1
  le16 kind;      // 1 = metadata (a tree node), 2 = file data
  le16 reserved;  // 0
};
static_assert(sizeof(SpaceItem) == 16);
static_assert(std::is_trivially_copyable_v<SpaceItem>);

}  // namespace plyfs::disk
