// The accounting of snap/usage.h checked against brute force: every tree's
// blocks collected independently (nodes by BTree::reach, extents by scanning
// every item through the tree kind's value references), referenced as their
// count and exclusive as the blocks no other tree of the volume reaches.
#pragma once

#include <map>
#include <set>

#include "fs/fs.h"
#include "snap/usage.h"
#include "test_util.h"

namespace plyfs::test {

struct Blocks {
  std::set<uint64_t> nodes;
  std::map<uint64_t, uint64_t> extents;  // start -> blocks
};

inline Blocks blocks_of(Volume& v, const TreeInfo& info) {
  Blocks b;
  auto t = must(v.begin());
  must(t.reach(info.id, [&](BlockNo n, uint64_t, bool node) {
    if (node) REQUIRE(b.nodes.insert(n.v).second);  // a tree reaches a node once
  }));
  auto kinds = fs_kinds();
  auto it = kinds.find(info.kind);
  if (it == kinds.end()) return b;
  std::vector<ExtentRef> ext;
  must(t.scan(info.id, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> val) {
    it->second(k, val, ext);
    return true;
  }));
  for (const ExtentRef& e : ext) b.extents[e.start.v] = e.nblocks;
  return b;
}

// Checks every tree's figures (branch_space) against brute force; returns
// them, by tree id.
inline std::map<uint64_t, BranchSpace> check_accounting(Volume& v) {
  std::vector<TreeInfo> trees;
  {
    auto t = must(v.begin());
    trees = must(t.list_trees());
  }
  const uint64_t bs = v.block_size();
  std::map<uint64_t, Blocks> all;
  for (const auto& info : trees) all[info.id.v] = blocks_of(v, info);
  std::map<uint64_t, BranchSpace> out;
  for (const auto& info : trees) {
    if (info.kind != fs_kinds().begin()->first) continue;
    INFO("tree " << info.id.v);
    const Blocks& mine = all[info.id.v];
    BranchSpace want;
    want.referenced.metadata = mine.nodes.size() * bs;
    for (const auto& [s, n] : mine.extents) want.referenced.data += n * bs;
    for (uint64_t n : mine.nodes) {
      bool shared = false;
      for (const auto& [id, o] : all) shared |= id != info.id.v && o.nodes.count(n);
      if (!shared) want.exclusive.metadata += bs;
    }
    for (const auto& [s, n] : mine.extents) {
      bool shared = false;
      for (const auto& [id, o] : all) shared |= id != info.id.v && o.extents.count(s);
      if (!shared) want.exclusive.data += n * bs;
    }
    BranchSpace got = must(branch_space(v, info.id));
    CHECK(got.referenced == want.referenced);
    CHECK(got.exclusive == want.exclusive);
    out[info.id.v] = got;
  }
  // The listing's way (each tree from the one before it by a diff) agrees.
  std::vector<TreeId> ids;
  for (const auto& [id, sp] : out) ids.push_back(TreeId{id});
  for (const auto& [id, sp] : must(branch_spaces(v, ids))) {
    INFO("tree " << id << " in a listing");
    CHECK(sp.referenced == out[id].referenced);
    CHECK(sp.exclusive == out[id].exclusive);
  }
  return out;
}

// Deletes branch `tree` through `del` (which gets a progress callback to
// pass on) and checks that it freed exactly the exclusive figure reported
// just before.
template <class Delete>
void delete_checked(Volume& v, TreeId tree, Delete&& del) {
  BranchSpace before = must(branch_space(v, tree));
  BTree::DropStats last{};
  del([&](const BTree::DropStats& st) { last = st; });
  CHECK(last.fraction == 1);
  CHECK(last.nodes * v.block_size() == before.exclusive.metadata);
  CHECK(last.extent_blocks * v.block_size() == before.exclusive.data);
}

}  // namespace plyfs::test
