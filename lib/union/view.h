// Views: named, ordered stacks of branches kept in the image's catalog
// (format.md#catalog), and the parsing of ad-hoc stacks for a mount.
//
// The catalog is a plain tree (kind 1) whose first item is a header with
// the magic "PLCT"; it is created with the first view. An image without
// one has an implicit default view: its default branch, read-write.
#pragma once

#include <string>
#include <vector>

#include "fs/fs.h"
#include "union/union.h"

namespace plyfs {

struct ViewLayer {
  TreeId tree;
  bool writable = false;
};

struct View {
  std::string name;
  bool is_default = false;
  std::vector<ViewLayer> layers;  // left (highest priority) to right
};

inline constexpr size_t kMaxViewLayers = 32;

Result<std::vector<View>> list_views(Volume& v);
// Creates or replaces the view of that name (one generation). Setting
// is_default clears it on every other view.
Result<void> put_view(Volume& v, const View& view);
Result<void> delete_view(Volume& v, std::string_view name);
// Inside a larger transaction (a snapshot or merge changes branches and the
// views that show them in one generation): every view, and a rewrite of
// each view for which `fn` returns true (a view left empty is deleted). The
// transaction reserved kViewBlocks per view written (A5): these reserve
// nothing, so that they cannot fail halfway for want of space.
inline constexpr uint64_t kViewBlocks = 16;
Result<std::vector<View>> list_views(Volume::Txn& t);
Result<void> put_view(Volume::Txn& t, const View& view);  // the caller checked the stack
Result<void> rewrite_views(Volume::Txn& t, const std::function<bool(View&)>& fn);

// Placement rules (format.md#placement-rules), kept in the catalog as items
// (2, rank) holding each rule's text, rank from 1. list: in rank order (EUCLEAN
// when one does not parse). set: replaces them all in one generation, after
// checking them against the volume's classes, and puts them in force on
// this volume (its PolicyState). load: puts the catalog's rules in force;
// whoever opens a multi-device volume to write files calls it.
Result<std::vector<PlacementRule>> list_placement_rules(Volume& v);
Result<std::vector<PlacementRule>> list_placement_rules(Volume::Txn& t);
Result<void> set_placement_rules(Volume& v, std::vector<PlacementRule> rules);
Result<void> load_placement_rules(Volume& v);

// The branch named `name` (or a tree id written as a number). Doomed trees
// (format.md#snapshots) have no name.
Result<BranchMeta> find_branch(Volume& v, std::string_view name);
// "top=rw:middle:base=ro" (Unionfs's dirs= syntax): left to right; a layer
// without a mode is read-write if it is the first, read-only otherwise.
Result<std::vector<ViewLayer>> parse_stack(Volume& v, std::string_view spec);
// What a mount shows when given no view or stack: the default view, or the
// default branch read-write when there is no view.
Result<std::vector<ViewLayer>> default_stack(Volume& v);
Result<std::vector<ViewLayer>> view_stack(Volume& v, std::string_view view);
// OLFS layer trees (format.md#catalog, "Layers"): a layer is a branch created
// empty over a parent (plyctl layer create), as opposed to a clone, which is
// a whole copy of its parent. Mounting layer X shows X over its ancestor
// chain: X read-write (unless flagged read-only), then each parent read-only,
// up to and including the first ancestor that is not a layer.
Result<bool> is_layer(Volume& v, const BranchMeta& b);
Result<std::vector<ViewLayer>> layer_stack(Volume& v, std::string_view name);
// The name rule (format.md#fs-info, "Names"), one for every name a branch,
// layer, snapshot or view gets: 1 to 32 bytes (ENAMETOOLONG beyond) of valid
// UTF-8; not "." or ".."; no control character (C0, DEL, C1); none of
// / \ : = , (paths, the stack syntax top=rw:base=ro, mount option lists);
// no leading '-' (an option) and no leading or trailing space (EINVAL).
// Every function here and in lib/snap that gives a name checks it; names
// that old images hold are read, listed, renamed and deleted as they are.
// `what` names the kind of name in the message ("branch", "view"...).
inline constexpr size_t kMaxNameBytes = 32;
inline constexpr std::string_view kNameForbidden = "/\\:=,";
Result<void> check_branch_name(std::string_view name, std::string_view what = "branch");
// A new empty layer `name` over branch `parent` (plyctl layer create, and
// mkdir in a mount's control folder, format.md#control-folder); its root
// starts with the parent root's owner and mode. EEXIST when a branch has the
// name. The check and the creation are one transaction, so one generation.
Result<BranchMeta> create_layer(Volume& v, std::string_view name, TreeId parent, bool read_only);
// A new empty branch `name` that is no layer (plyctl branch create): one
// generation; EEXIST when a branch has the name.
Result<BranchMeta> create_branch(Volume& v, std::string_view name, bool read_only);
// Gives branch `tree` a new name, in one generation; EEXIST when another
// branch has it. Views name branches by tree, so none changes.
Result<BranchMeta> rename_branch(Volume& v, TreeId tree, std::string_view name);

// A stack opened as a union, the way a mount serves it: its filesystems
// (as readers beside another instance when `reader`, Filesystem::open) and
// the union over them (read-only layers as the stack says; all read-only
// with `read_only`).
struct OpenUnion {
  std::vector<std::unique_ptr<Filesystem>> fs;
  std::unique_ptr<Union> u;
};
Result<OpenUnion> open_union(Volume& v, const std::vector<ViewLayer>& stack, bool reader,
                             bool read_only = false);

// Checks a stack against the branches: every tree exists, none twice, a
// branch flagged read-only is not writable.
Result<void> check_stack(Volume& v, const std::vector<ViewLayer>& s);
std::string format_stack(Volume& v, const std::vector<ViewLayer>& s);

// The catalog's invariant U4 (format.md#catalog), for fsck's object pass:
// the catalog reads back; every view names 1-32 existing branches, none
// twice, no READ_ONLY branch as writable; at most one view is the default.
// Code "U4-view"; only reads.
std::vector<Problem> check_views(Volume& v);
std::vector<Problem> check_views(BlockDevice& dev);  // opened read-only
// Mends what check_views finds, in the open generation (fsck -y; the
// caller commits): a layer naming no branch, a doomed one or a repeated one
// leaves its view, a read-only branch is shown read-only, only the first
// default view stays the default, and a view left empty is deleted.
// Returns what it did.
Result<std::vector<std::string>> repair_views(Volume& v);

// fsck's passes 5-6 for an image of filesystem trees and views: sets the
// hooks FsckOptions::object_checks (lib/fs's F1-F8, U1-U3, and U4 here;
// with `data` also every data block, fsck -c) and object_repair (both
// layers' repairs, committed as one generation).
struct FsckOptions;
void set_object_passes(FsckOptions& o, bool data);

}  // namespace plyfs
