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

// The item of tree `tree` whose key is (key_hi, key_lo), damaged where it
// lies in its leaf: its "key.hi", "key.lo", "value_offset" or "value_len"
// (format.md#btree-node); with "first." or "last." before the field, that
// item of the same leaf. Nothing moves, so a key changed this way can
// stand out of order in a leaf whose checksum is right (unless
// !a.fix_checksum): the last item's key past the next leaf's keys is a
// leaf that verifies on its own (T1 is broken between the leaves).
Result<std::string> corrupt_leaf_item(BlockDevice& dev, uint64_t tree, uint64_t key_hi, uint64_t key_lo,
                                      const std::string& field, const CorruptAction& a);

}  // namespace plyfs
