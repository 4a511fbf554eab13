// Per-branch space accounting (usage.h, format.md#accounting).
#include "snap/usage.h"

#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace plyfs {

namespace {

// Referenced figures of roots that can no longer change, per volume: a
// node written before the open generation is never changed in place
// (format.md#btree-cow), so a root block and generation name one content
// for as long as the root is alive; a freed block handed out again comes
// back with a newer generation, so a stale entry is never matched.
// One entry per tree (its newest figure), so that a daemon listing a
// changing branch for days keeps one entry for it, not one per root.
struct ReferencedMemo {
  struct Entry {
    uint64_t block = 0, gen = 0;
    SpaceUse use;
  };
  std::mutex mu;
  std::unordered_map<uint64_t, Entry> by_tree;
};

// Every block the tree reaches, once: nodes, and extents by their first
// block (an extent is counted whole, however many items map part of it).
struct Reached {
  std::unordered_map<uint64_t, uint64_t> extents;  // start -> blocks
  uint64_t nodes = 0;
  std::unordered_set<uint64_t> node_blocks;  // only when asked (branch_du)
  bool keep_nodes = false;

  BTree::ReachFn fn() {
    return [this](BlockNo b, uint64_t n, bool node) {
      if (node) {
        nodes++;
        if (keep_nodes) node_blocks.insert(b.v);
      } else {
        extents.emplace(b.v, n);
      }
    };
  }
  SpaceUse use(uint32_t block_size) const {
    SpaceUse u;
    u.metadata = nodes * block_size;
    for (const auto& [start, n] : extents) u.data += n * block_size;
    return u;
  }
};

Result<SpaceUse> referenced(Volume& v, Volume::Txn& t, TreeId tree) {
  TreeInfo info = PLY_TRY(t.tree_info(tree));
  auto& memo = v.extension<ReferencedMemo>();
  // A root of the open generation may still change in place.
  const bool fixed = info.root.gen < t.gen();
  if (fixed) {
    std::lock_guard lk(memo.mu);
    auto it = memo.by_tree.find(tree.v);
    if (it != memo.by_tree.end() && it->second.block == info.root.block.v && it->second.gen == info.root.gen.v)
      return it->second.use;
  }
  Reached r;
  PLY_CHECK(t.reach(tree, r.fn()));
  SpaceUse u = r.use(v.block_size());
  if (fixed) {
    std::lock_guard lk(memo.mu);
    memo.by_tree[tree.v] = {info.root.block.v, info.root.gen.v, u};
  }
  return u;
}

}  // namespace

Result<BranchSpace> branch_space(Volume& v, TreeId tree) {
  // One Txn per figure: a commit waits for a Txn, and a large branch's
  // walk should not hold one back longer than it must.
  BranchSpace out;
  {
    auto t = PLY_TRY(v.begin());
    out.referenced = PLY_TRY(referenced(v, t, tree));
  }
  auto t = PLY_TRY(v.begin());
  BTree::DropStats d = PLY_TRY(t.exclusive(tree));
  out.exclusive.metadata = d.nodes * v.block_size();
  out.exclusive.data = d.extent_blocks * v.block_size();
  return out;
}

Result<BranchDu> branch_du(Volume& v, TreeId tree, const std::vector<TreeId>& others) {
  BranchDu out;
  out.space = PLY_TRY(branch_space(v, tree));
  Reached mine;
  mine.keep_nodes = true;
  {
    auto t = PLY_TRY(v.begin());
    PLY_CHECK(t.reach(tree, mine.fn()));
  }
  for (TreeId o : others) {
    if (o == tree) continue;
    // The other tree's blocks that are this one's too, each once.
    std::unordered_set<uint64_t> seen;
    uint64_t blocks = 0;
    auto t = PLY_TRY(v.begin());
    PLY_CHECK(t.reach(o, [&](BlockNo b, uint64_t n, bool node) {
      if (node) {
        if (mine.node_blocks.count(b.v)) blocks++;
      } else if (mine.extents.count(b.v) && seen.insert(b.v).second) {
        blocks += n;
      }
    }));
    if (blocks) out.shared.emplace_back(o, blocks * v.block_size());
  }
  return out;
}

}  // namespace plyfs
