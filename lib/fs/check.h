// Checks of the filesystem objects in filesystem trees: the invariants
// F1-F6 of format.md#fs-invariants. fsck.plyfs runs them as its pass 5
// through FsckOptions::object_checks; they only read.
#pragma once

#include <vector>

#include "btree/btree.h"
#include "commit/volume.h"

namespace plyfs {

// Every problem found in every filesystem tree of the volume's durable
// generation. Codes: F1-info, F2-dirent, F2-nlink, F3-parent, F4-extent,
// F4-blocks, F5-inline, F6-orphan-item, F-item (an item that does not decode
// or has an unknown type); with `data`, also F7-data: every data block is
// read and compared with its checksum (fsck -c).
std::vector<Problem> check_filesystems(Volume& vol, bool data = false);
// The same on a device, opened read-only (fsck's pass 5 hook).
std::vector<Problem> check_filesystems(BlockDevice& dev, bool data = false);
// The volume such checks read: read-only, with the filesystem kinds.
Result<std::unique_ptr<Volume>> open_to_check(BlockDevice& dev);

}  // namespace plyfs
