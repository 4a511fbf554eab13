// On-disk root record: one per tree, in the root tree (format.md#root-record).
#pragma once

#include <type_traits>

#include "util/endian.h"

namespace plyfs::disk {

// Key: (hi = tree id, lo = 0). Other lo values are reserved.
struct RootRecord {
  le64 root_block;
  le64 root_gen;          // the root node's header generation
  uint8_t level;          // the root node's level
  uint8_t kind;           // what the tree holds (format.md#tree-kinds)
  le16 flags;             // none defined; 0
  le32 reserved0;
  le64 created_gen;
  le64 last_shared_gen;   // the last generation in which the tree was cloned
  le64 cloned_from;       // the source tree of a clone, 0 otherwise
  le64 reserved1[2];
};
static_assert(sizeof(RootRecord) == 64);
static_assert(std::is_trivially_copyable_v<RootRecord>);

}  // namespace plyfs::disk
