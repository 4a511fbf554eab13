// Checks and repairs of the filesystem objects in filesystem trees: the
// invariants F1-F9 and U1-U3 of format.md#fs-invariants. fsck.plyfs runs
// the checks as its passes 5 and 6 through FsckOptions::object_checks, and
// the repairs through FsckOptions::object_repair (format.md#fs-repair).
#pragma once

#include <vector>

#include "btree/btree.h"
#include "commit/volume.h"
#include "fsck/fsck.h"

namespace plyfs {

// Every problem found in every filesystem tree of the volume's durable
// generation. Codes: F1-info, F2-dirent, F2-name, F2-hash, F2-dup,
// F2-nlink, F2-dirsize, F2-unattached, F3-parent, F3-unattached, F4-extent,
// F4-blocks, F5-inline, F6-orphan-item, F6-orphan-named, F8-ino, F-item (an
// item that does not decode or has an unknown type), F-xattr-value,
// F-xattr-chunk, F-xattr-feature (F9, out-of-line xattr values),
// F-held-feature (a held branch without HELD_BRANCHES), F-quota-feature (a
// quota without BRANCH_QUOTAS), U1-whiteout,
// U1-conflict, U2-opaque, U3-branch; with `data`, also F7-data: every data
// block is read and compared with its checksum (fsck -c). Each problem says
// what its repair costs (Problem::repair).
std::vector<Problem> check_filesystems(Volume& vol, bool data = false);
// The same checks of one filesystem tree as the open generation holds it
// (a received branch before it is named, send.h S2); the branch-table
// checks that look across trees (U3) are not made.
std::vector<Problem> check_filesystem_tree(Volume& vol, TreeId tree);
// Repairs what check_filesystems finds, in the open generation of a
// read-write volume (the caller commits, so the repair lands whole): only
// the Safe repairs unless `lossy`. Returns what it did, a sentence each.
// With `data`, data blocks are checked as well (F7) and those that fail
// become holes (lossy).
Result<std::vector<std::string>> repair_filesystems(Volume& vol, bool lossy, bool data = false);
// The same on a device, opened read-only (fsck's pass 5 hook).
std::vector<Problem> check_filesystems(BlockDevice& dev, bool data = false);
// The same checks fed by fsck's walk of passes 2-4 (FsckOptions::
// object_feed), which reads every node once; null if the device does not
// open as a volume.
std::unique_ptr<ObjectChecker> feed_filesystems(BlockDevice& dev, bool data = false);
// The volume such checks read: read-only, with the filesystem kinds.
Result<std::unique_ptr<Volume>> open_to_check(BlockDevice& dev);

}  // namespace plyfs
