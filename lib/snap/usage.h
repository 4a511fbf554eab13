// Space accounting per branch (format.md#accounting): what each branch
// reaches (referenced) and what deleting it would free (exclusive), data
// and metadata apart, as ZFS's referenced/usedbydataset and btrfs's qgroup
// rfer/excl. Nothing is stored: the figures are computed from the trees
// and the reference counts the engine keeps anyway, so they cost the
// writers nothing (issue 24's 2 % PostMark budget is spent on zero), and
// they are exact:
//  - exclusive is BTree::exclusive: the walk delete_branch's drop would
//    make, over a copy of the counts, so a delete frees exactly it;
//  - referenced counts each node and each extent the branch reaches once,
//    an extent whole (a partly overwritten one holds all its blocks).
// What it costs: exclusive follows what the branch holds alone (the walk
// stops at every node another tree still reaches); referenced follows the
// branch's size, once per root: a root written before the open generation
// never changes (format.md#btree-cow), so its figure is kept per volume
// and a snapshot is walked once per process, however often it is listed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "commit/volume.h"

namespace plyfs {

struct SpaceUse {
  uint64_t data = 0, metadata = 0;  // bytes
  uint64_t total() const { return data + metadata; }
  bool operator==(const SpaceUse&) const = default;
};

struct BranchSpace {
  SpaceUse referenced, exclusive;
};

// The figures of tree `tree` now.
Result<BranchSpace> branch_space(Volume& v, TreeId tree);
// The figures of many trees, by tree id: what a listing needs. Each tree's
// nodes are counted with a memo of shared subtrees (BTree::count_nodes),
// and its data follows from the tree before it (by id) by a diff of the
// two, which skips what they share: listing 1,000 snapshots of a branch
// reads about one branch and what changed between them, not 1,000 trees.
Result<std::map<uint64_t, BranchSpace>> branch_spaces(Volume& v, std::vector<TreeId> trees);

// plyctl du BRANCH: its figures, and for every other tree in `others`, the
// bytes of this branch that tree reaches too (what deleting the other tree
// would leave in place for this one), those sharing nothing left out.
struct BranchDu {
  BranchSpace space;
  std::vector<std::pair<TreeId, uint64_t>> shared;
};
Result<BranchDu> branch_du(Volume& v, TreeId tree, const std::vector<TreeId>& others);

}  // namespace plyfs
