// Deliberate damage to named fields of named on-disk structures, for fsck's
// tests and `plyctl debug corrupt` (like btrfs-corrupt-block). Never raw byte
// offsets: a field is found by structure and name (format.md), so the tests
// keep meaning the same thing when the layout changes.
#pragma once

#include <string>
#include <vector>

#include "blockdev/blockdev.h"
#include "util/result.h"

namespace plyfs {

enum class CorruptStruct { Superblock, Node, SpaceItem, RootRecord };

struct CorruptTarget {
  CorruptStruct what = CorruptStruct::Superblock;
  int slot = -1;          // superblock: 0 or 1; -1: the slot opening would choose
  uint64_t locator = 0;   // node: block; space item: extent start; root record: tree id
  std::string field;      // a name from corrupt_fields()
};

enum class Damage { Set, Flip, Zero, Add };

struct CorruptAction {
  Damage how = Damage::Flip;
  uint64_t value = 0;        // Set, Add
  unsigned bit = 0;          // Flip
  bool fix_checksum = true;  // recompute the checksum so the field checks must find it
};

// The fields a structure offers. Node fields name an item by index:
// "item.3.key.hi"; the number is any item index the node has.
std::vector<std::string> corrupt_fields(CorruptStruct s);
const char* corrupt_struct_name(CorruptStruct s);

// Damages the field and returns one sentence saying what changed.
Result<std::string> corrupt(BlockDevice& dev, const CorruptTarget& t, const CorruptAction& a);

}  // namespace plyfs
