// Per-branch space accounting (usage.h, format.md#accounting).
#include "snap/usage.h"

#include <algorithm>

#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "fs/fs.h"
#include "fs/quota.h"

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
  const TreeBlocks r = PLY_TRY(referenced_blocks(t, tree));  // the walk quotas count with
  SpaceUse u;
  u.metadata = r.nodes * v.block_size();
  u.data = r.extent_blocks * v.block_size();
  if (fixed) {
    std::lock_guard lk(memo.mu);
    memo.by_tree[tree.v] = {info.root.block.v, info.root.gen.v, u};
  }
  return u;
}

// The extents a tree's items reference, each with how many of its items
// reference it: the data figure of a tree follows from another's by the
// items a diff of the two finds (BTree::diff skips what they share).
struct ExtentCounts {
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> items_blocks;  // start -> (items, blocks)
  uint64_t blocks = 0;

  void add(uint64_t start, uint64_t n) {
    auto& [items, len] = items_blocks[start];
    if (items++ == 0) {
      len = n;
      blocks += n;
    }
  }
  // False if the tree held no such reference: the counts were not this
  // tree's predecessor's (it changed meanwhile).
  bool remove(uint64_t start) {
    auto it = items_blocks.find(start);
    if (it == items_blocks.end()) return false;
    if (--it->second.first == 0) {
      blocks -= it->second.second;
      items_blocks.erase(it);
    }
    return true;
  }
};

// Moves `c` from tree `from`'s items to tree `to`'s by their diff; false
// when `c` turned out not to be `from`'s.
Result<bool> follow_diff(Volume::Txn& t, TreeId from, TreeId to, ExtentCounts& c) {
  const ValueRefs refs = fs_kinds().begin()->second;
  std::vector<ExtentRef> ext;
  bool consistent = true;
  PLY_CHECK(t.diff(from, to, [&](Key k, std::optional<std::span<const std::byte>> a,
                                 std::optional<std::span<const std::byte>> b) {
    if (a) {
      ext.clear();
      refs(k, *a, ext);
      for (const ExtentRef& e : ext) consistent &= c.remove(e.start.v);
    }
    if (b) {
      ext.clear();
      refs(k, *b, ext);
      for (const ExtentRef& e : ext) c.add(e.start.v, e.nblocks);
    }
    return consistent;
  }));
  return consistent;
}

}  // namespace

Result<std::map<uint64_t, BranchSpace>> branch_spaces(Volume& v, std::vector<TreeId> trees) {
  // By id: snapshots of one branch are made one after another and differ
  // little from each other, so each follows from the one before by a diff.
  std::sort(trees.begin(), trees.end(), [](TreeId a, TreeId b) { return a.v < b.v; });
  auto& memo = v.extension<ReferencedMemo>();
  const uint64_t bs = v.block_size();
  BTree::CountMemo counts;
  ExtentCounts cur;
  std::optional<TreeId> cur_tree;  // the tree `cur` holds the extents of
  RootPtr cur_root{};
  std::map<uint64_t, BranchSpace> out;
  for (TreeId tree : trees) {
    BranchSpace& sp = out[tree.v];
    {
      auto t = PLY_TRY(v.begin());
      const TreeInfo info = PLY_TRY(t.tree_info(tree));
      const bool fixed = info.root.gen < t.gen();
      bool known = false;
      if (fixed) {
        std::lock_guard lk(memo.mu);
        auto it = memo.by_tree.find(tree.v);
        known = it != memo.by_tree.end() && it->second.block == info.root.block.v && it->second.gen == info.root.gen.v;
        if (known) sp.referenced = it->second.use;
      }
      if (!known) {
        sp.referenced.metadata = PLY_TRY(t.count_nodes(tree, counts)) * bs;
        bool followed = false;
        if (cur_tree) {
          followed = PLY_TRY(follow_diff(t, *cur_tree, tree, cur));
          // The diff read the predecessor's root as it is now: it must be
          // the root `cur` was counted from.
          followed = followed && PLY_TRY(t.tree_info(*cur_tree)).root == cur_root;
        }
        if (!followed) {
          cur = {};
          PLY_CHECK(t.reach(tree, [&](BlockNo b, uint64_t n, bool node) {
            if (!node) cur.add(b.v, n);
          }));
        }
        sp.referenced.data = cur.blocks * bs;
        // The tree may have changed during the walk: it can stand for its
        // root only if that did not move.
        const bool still = PLY_TRY(t.tree_info(tree)).root == info.root;
        cur_tree = still ? std::optional<TreeId>(tree) : std::nullopt;
        cur_root = info.root;
        if (fixed && still) {
          std::lock_guard lk(memo.mu);
          memo.by_tree[tree.v] = {info.root.block.v, info.root.gen.v, sp.referenced};
        }
      }
    }
    auto t = PLY_TRY(v.begin());
    BTree::DropStats d = PLY_TRY(t.exclusive(tree));
    sp.exclusive.metadata = d.nodes * bs;
    sp.exclusive.data = d.extent_blocks * bs;
  }
  return out;
}

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
