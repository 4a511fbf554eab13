// Branch lifecycle: snapshots, clones, merges, rollback, deletion and diff
// (format.md#snapshots). This layer sits on the filesystem layer and the
// catalog of views; it changes branches only through Filesystem and the
// view functions, and commits each operation atomically:
//
//  - snapshot and clone are one O(1) transaction each: a new tree sharing
//    the branch's root (btrfs and ZFS's snapshot). The branch itself, its
//    views and the mounts showing it do not change, so a mount never grows
//    deeper however many snapshots it takes;
//  - a branch keeps its tree id through a rollback and a merge: its content
//    is replaced (Filesystem::reset) in one transaction, and the old content
//    lives on as a doomed clone that the next read-write open, or a mount's
//    cleaner, drops, so that what freeing it costs is not the command's;
//  - a merge builds its result in a scratch tree flagged DOOMED (a clone of
//    the lower branch, O(1)), applying the upper branch's entries over many
//    generations, then swaps it in with one transaction. A crash before the
//    swap leaves the branches as they were and a doomed scratch tree; after
//    it, the merged branch and doomed trees. Doomed trees are dropped by the
//    next read-write open (drop_doomed), so the merge is there entirely or
//    not at all, and its cost follows the size of the upper branch (the
//    change), not of the lower one.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fs/fs.h"
#include "union/view.h"

namespace plyfs {

struct Retention;  // snap/retention.h

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
  BranchMeta frozen;  // the snapshot: a new read-only branch, flagged SNAPSHOT
  BranchMeta live;    // the branch it was taken of, unchanged
};
// A snapshot of branch `tree`: an O(1) read-only clone named `snap_name`,
// flagged SNAPSHOT, whose root record names `tree` as its origin. Nothing
// else changes: the branch, its views, the mounts that show it. A snapshot
// of a layer is a layer on the same parent (it shows the same view). One
// generation, whatever the size of the branch or the number of snapshots.
Result<Snapshot> snapshot(Volume& v, TreeId tree, std::string_view snap_name);
// The branch a snapshot of a stack freezes: its leftmost writable one.
Result<TreeId> snapshot_target(const std::vector<ViewLayer>& stack);
// The snapshots of branch `tree`, oldest first.
Result<std::vector<BranchMeta>> snapshots_of(Volume& v, TreeId tree);

// The automatic snapshots of branch `live` (those named
// snapshot_prefix(its name)...) that retention `r` does not keep, oldest
// first. Held ones are neither returned nor counted against the classes.
Result<std::vector<BranchMeta>> expired_snapshots(Volume& v, TreeId live, const Retention& r);

// Holds (held: true) or releases branch `tree` (zfs hold/release, format.md
// #snapshots, "Holds"): while held, delete_branch, a merge that would
// consume it and the automatic retention refuse or skip it (EBUSY). A
// rename, a rollback and changes to its content are fine: the hold follows
// the branch (its tree id). Idempotent: holding a held branch or releasing
// an unheld one succeeds and writes nothing. Returns the branch after.
Result<BranchMeta> set_held(Volume& v, TreeId tree, bool held);

// Sets branch `tree`'s quotas (format.md#quotas): the most bytes it may
// reference and hold exclusively; 0 removes a limit, nullopt keeps it.
// A limit below what the branch holds now is taken: the branch can only
// shrink until it is under it. Snapshots and clones do not inherit it.
struct QuotaChange {
  std::optional<uint64_t> referenced, exclusive;
};
Result<BranchMeta> set_quota(Volume& v, TreeId tree, const QuotaChange& q);

struct MergeStats {
  uint64_t entries = 0;    // entries of the upper branch applied
  uint64_t objects = 0;    // files and directories copied or replaced
  uint64_t removed = 0;    // names its whiteouts and replacements removed
  // The share of the upper branch's tree of names walked so far, 0 to 1
  // (each entry of a directory weighs the directory's share over its entry
  // count): for a progress line's percentage and ETA.
  double fraction = 0;
};
struct Merge {
  BranchMeta merged;           // the upper branch, with the merged content
  TreeId lower;                // the branch merged into
  bool lower_doomed = false;   // no other layer was on it: it went
  std::vector<TreeId> doomed;  // trees left to drop (old content, the lower branch)
  MergeStats stats;
};
// Merges branch `upper`, a layer, into the branch it is layered on (Unionfs's
// snapmerge): files replace theirs sharing extents, whiteouts delete, opaque
// directories replace. The upper branch keeps its tree id, name and flags
// and now holds what it showed over the lower one, on the lower branch's
// parent; the lower branch leaves every view, and goes unless other layers
// are made on it (they keep it). Refused (EBUSY) while a view shows the lower
// branch other than right below the upper one. `upper_fs`: the caller's open
// Filesystem of the upper branch (a mount's, which holds its open files), or
// null; the caller must not use it for the branch's new content (reopen).
// `progress` is called every 1024 entries.
Result<Merge> merge(Volume& v, TreeId upper, Filesystem* upper_fs = nullptr,
                    const std::function<void(const MergeStats&)>& progress = {});

struct Rollback {
  BranchMeta branch;       // the branch, same tree id, with its old content
  std::optional<BranchMeta> to;  // the snapshot it went back to; none: a layer emptied
  TreeId doomed;           // its content before, left to drop
};
// Discards a branch's changes: it takes the content of `to`, a snapshot (or
// clone) of it, or by default of its newest snapshot (ZFS's rollback); a
// layer without snapshots goes back to empty (OLFS). The branch keeps its
// tree id, name, flags and place in every view. One generation, O(1) (the
// old content is doomed, dropped later). Refused (EBUSY) while another
// branch is layered on it; EINVAL when it has nothing to go back to; EROFS
// for a read-only branch.
Result<Rollback> rollback(Volume& v, TreeId branch, std::optional<TreeId> to = std::nullopt);

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
struct DiffStats {
  uint64_t entries = 0;  // changes found so far
  // The share of the work done, 0 to 1, rising, for a progress line's
  // percentage and ETA. Between clones: the trees' share compared
  // (BTree::diff, each child node weighing its parent's share over the
  // parent's child count, a shared subtree skipped counting whole) is the
  // first half, and naming the changes found, each the same, the second.
  // Between views (a layer): each entry of a directory weighs the
  // directory's share over its entry count, as in a merge.
  double fraction = 0;
};
// `progress` hears how far the diff is: every 256 entries found, every 16
// steps of the walk, and at the end (fraction 1).
Result<std::vector<DiffEntry>> diff(Volume& v, TreeId from, TreeId to,
                                    const std::function<void(const DiffStats&)>& progress = {});
// Its JSON and text forms are model.h's (diff, diff_text).

}  // namespace plyfs
