// Deliberate damage to named fields of the items of filesystem trees
// (format.md#fs-tree), for fsck's tests and `plyctl debug corrupt` (the
// engine's structures are in lib/fsck/corrupt.h). An item is found by what
// it is (an inode by number, an entry by directory and name, an extent by
// file block) and a field by its name in format.md, never by a byte
// offset. The damage is written as a normal change of the tree and
// committed, so every checksum is right: only fsck's object passes and the
// layer's own decoding can find it.
#pragma once

#include <string>
#include <vector>

#include "commit/volume.h"
#include "fsck/corrupt.h"

namespace plyfs {

// XattrChunk: a chunk of an out-of-line xattr value (format.md#fs-xattr),
// found by the xattr's object and name and the chunk's byte offset.
enum class FsStruct { FsInfo, Inode, Dirent, Whiteout, Xattr, Extent, Inline, XattrChunk, Orphan };

struct FsTarget {
  FsStruct what = FsStruct::Inode;
  TreeId tree;
  uint64_t ino = 0;   // the object: the inode, the directory of an entry, the file of an extent
  std::string name;   // an entry's, a whiteout's or an xattr's name (also of an xattr chunk)
  uint64_t offset = 0;  // an extent's file block, an inline or xattr chunk's byte offset
  std::string field;    // a name from fs_corrupt_fields()
  // The device under the volume, for the "leaf." fields, which damage the
  // item where it lies in its leaf rather than change the tree.
  BlockDevice* dev = nullptr;
};

// Every struct also offers "key.hi" and "key.off": the item moves to
// another key (an object number or offset out of range, a cycle), as a
// program could have put it there. "leaf.key.hi", "leaf.key.lo",
// "leaf.value_offset" and "leaf.value_len" change the item's entry in its
// leaf in place instead (the leaf's checksum recomputed, nothing
// committed): the B-tree itself is damaged, a key can stand out of order
// (corrupt_leaf_item, lib/fsck/corrupt.h); "leaf.first.key.hi",
// "leaf.last.key.hi" (and .key.lo...) damage the first or last item of the
// leaf that holds the item. FsInfo's "name" is its first byte; "name.N" is
// byte N (0-31).
std::vector<std::string> fs_corrupt_fields(FsStruct s);
const char* fs_struct_name(FsStruct s);
Result<FsStruct> fs_struct_named(std::string_view s);

// Damages the field in the open generation and commits; returns one
// sentence saying what changed.
Result<std::string> corrupt_fs(Volume& vol, const FsTarget& t, const CorruptAction& a);

}  // namespace plyfs
