// Branch lifecycle: snapshots, clones, merges, rollback, deletion and diff
// (format.md#snapshots). This layer sits on the filesystem layer and the
// catalog of views; it changes branches only through Filesystem and the
// view functions, and commits each operation atomically:
//
//  - snapshot, clone, rollback and delete are one transaction each, so one
//    generation, whatever the size of the branch (O(1) but for delete and
//    rollback, which free what only the old tree used);
//  - a merge builds its result in a scratch tree flagged DOOMED (a clone of
//    the lower branch, O(1)), applying the upper branch's entries over many
//    generations, and then swaps it in with one transaction that renames it,
//    clears its flag, dooms the two old branches and rewrites every view. A
//    crash before the swap leaves the old branches and a doomed scratch tree;
//    a crash after it, the merged branch and two doomed trees. Doomed trees
//    are dropped by the next read-write open (drop_doomed), so the merge is
//    there entirely or not at all, and its cost follows the size of the
//    upper branch (the change), not of the lower one.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fs/fs.h"
#include "union/view.h"

namespace plyfs {

// Drops every doomed tree: what an unfinished merge or rollback left, or
// the branches a finished one replaced. Read-write opens call it before
// anything else (plyctl, the daemon). Returns how many it dropped.
// `progress`: what was freed so far, summed over the trees (BTree::drop).
Result<size_t> drop_doomed(Volume& v, const BTree::DropProgress& progress = {});

// A new writable (unless read_only) branch `name`, sharing every block of
// `src` (btrfs's snapshot): O(1), one generation.
Result<BranchMeta> clone_branch(Volume& v, TreeId src, std::string_view name, bool read_only);

// A name for a snapshot of `base`: base@YYMMDD-HHMMSS (base cut to fit 32
// bytes), with .N added if a branch has it already. Every such name starts
// with snapshot_prefix(base).
Result<std::string> snapshot_name(Volume& v, std::string_view base);
std::string snapshot_prefix(std::string_view base);

struct Snapshot {
  BranchMeta frozen;              // the old writable branch, now read-only
  BranchMeta live;                // the new empty branch layered on it
  std::vector<ViewLayer> stack;   // the stack afterwards
};
// Unionfs's snapshot of a stack: its leftmost writable branch T is renamed
// `snap_name` and becomes read-only; a new empty branch layered on T takes
// T's old name and T's place as the writable branch. Every view that
// writes to T changes the same way. If a plain mount showed T (no default
// view), a default view "default" now shows the new stack. One generation,
// O(1).
Result<Snapshot> snapshot(Volume& v, const std::vector<ViewLayer>& stack, std::string_view snap_name);

struct MergeStats {
  uint64_t entries = 0;    // entries of the upper branch applied
  uint64_t objects = 0;    // files and directories copied or replaced
  uint64_t removed = 0;    // names its whiteouts and replacements removed
};
struct Merge {
  BranchMeta merged;       // the result: the upper branch's name and flags
  TreeId upper, lower;     // the two branches it replaced (doomed now)
  MergeStats stats;
};
// Merges branch `upper`, a layer, into the branch it is layered on (Unionfs's
// snapmerge): files replace theirs sharing extents, whiteouts delete, opaque
// directories replace. The result shows exactly what `upper` over `lower`
// showed; it takes the upper branch's name, read-only flag and place in
// every view (the lower branch leaves them), and the lower branch's parent.
// Refused (EBUSY) while another branch is layered on the lower one or a view
// shows the lower one other than right below the upper one. `upper_fs`: the
// caller's open Filesystem of the upper branch (a mount's, which holds its
// open files), or null. `progress` is called every 1024 entries.
Result<Merge> merge(Volume& v, TreeId upper, Filesystem* upper_fs = nullptr,
                    const std::function<void(const MergeStats&)>& progress = {});

// Discards a layer's changes (OLFS): the branch is replaced by an empty
// layer on the same parent, with its name and flags, in every view. One
// generation. Refused (EBUSY) while another branch is layered on it; EINVAL
// for a branch that is not a layer (a clone or a base: delete it instead).
Result<BranchMeta> rollback(Volume& v, TreeId branch);

// Deletes a branch and frees every block no other tree references. Refused
// (EBUSY) while a view shows it or a layer is made on it. One transaction,
// however large the branch: `progress` hears the nodes and extents freed so
// far as the walk goes (BTree::drop).
Result<void> delete_branch(Volume& v, TreeId branch, const BTree::DropProgress& progress = {});

// What changed from branch `from` to branch `to` (zfs diff): paths added,
// removed, modified (attributes, data or xattrs) or renamed. When one tree
// is a clone of the other (or both of a common one), subtrees the two still
// share are skipped without reading them, so the cost follows the size of
// the change; when `to` is a layer on `from`, only the layer is read.
// A renamed object is one R entry (plus M at the new path if it changed too),
// in a layer as in a clone, but for a hard-linked object that lost or gained
// more than one name in a layer: that one shows as - and + (ambiguous).
enum class Change : char { Added = '+', Removed = '-', Modified = 'M', Renamed = 'R' };
struct DiffEntry {
  Change change;
  std::string path, new_path;  // new_path: renames only
  uint8_t type;                // DT_* of the object
};
// `progress` hears how many entries were found so far, every 256.
Result<std::vector<DiffEntry>> diff(Volume& v, TreeId from, TreeId to,
                                    const std::function<void(uint64_t)>& progress = {});
// Its JSON and text forms are model.h's (diff, diff_text).

}  // namespace plyfs
