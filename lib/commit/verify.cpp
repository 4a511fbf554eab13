#include "commit/verify.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "alloc/disk_space.h"
#include "commit/disk_root.h"

namespace plyfs {

std::string VerifyReport::summary() const {
  std::string s;
  for (const auto& p : problems) {
    s += p.code;
    if (p.block != Error::kNoBlock) s += " block " + std::to_string(p.block);
    s += ": " + p.message + "\n";
  }
  return s;
}

namespace {

struct Extent {
  uint64_t nblocks;
  uint32_t refs;
  uint16_t kind;
};

}  // namespace

Result<VerifyReport> verify_image(BlockDevice& dev, const VerifyOptions& opts) {
  VerifyReport rep;
  rep.choice = PLY_TRY(read_superblocks(dev));
  const SuperInfo sb = opts.super ? *opts.super : rep.choice.info;
  auto problem = [&](const char* code, uint64_t block, std::string msg) {
    rep.problems.push_back(Problem{code, block, std::move(msg)});
  };
  for (int slot = 0; slot < 2; slot++) {
    const auto& r = rep.choice.reports[slot];
    if (r.state != SlotState::Valid)
      problem("S-slot", Error::kNoBlock,
              "superblock slot " + std::to_string(slot) + " is " + slot_state_name(r.state) + ": " +
                  r.detail);
  }

  BlockCache cache(dev, sb.block_size, opts.cache_bytes);
  WalkMemo memo;
  // Expected references per block: parent pointers, root pointers, value
  // references (A3). Blocks reached as tree nodes must be metadata extents.
  std::unordered_map<uint64_t, uint64_t> expected;
  std::unordered_map<uint64_t, uint16_t> expected_kind;
  std::unordered_map<uint64_t, uint64_t> expected_len;  // data extents: referenced length
  auto reach = [&](uint64_t b, uint16_t kind, uint64_t len) {
    expected[b]++;
    auto [it, fresh] = expected_kind.try_emplace(b, kind);
    if (!fresh && it->second != kind)
      problem("A-double-use", b, "block is used both as a tree node and as file data");
    if (kind == 2) {
      auto [lit, first] = expected_len.try_emplace(b, len);
      if (!first && lit->second != len)
        problem("A-double-length", b, "values reference this extent with different lengths");
    }
  };
  // A node's owner is the tree that wrote it: the root and space trees are
  // never shared, so theirs is their own id; a user tree's node may have been
  // written by a clone's source or a clone, so any user tree id will do.
  uint64_t walking = 0;
  uint8_t walking_kind = 0;
  // Trees of different kinds never share a node (a graft between them is
  // refused; B-shared-kind, format.md#btree-invariants): the walk reads a
  // shared node's values once, as the kind of the first tree that reached
  // it, so a node reached from a tree of another kind would leave that
  // tree's references uncounted.
  struct Reached {
    uint64_t tree;
    uint8_t kind;
  };
  std::unordered_map<uint64_t, Reached> reached_by;
  auto node_hooks = [&](std::function<void(Key, std::span<const std::byte>)> on_item) {
    WalkHooks h;
    h.on_node = [&](BlockNo b, int, Generation, uint64_t owner, bool first) {
      reach(b.v, 1, 1);
      if (walking >= kFirstTreeId) {
        auto [it, fresh] = reached_by.try_emplace(b.v, Reached{walking, walking_kind});
        if (!fresh && it->second.kind != walking_kind)
          problem("B-shared-kind", b.v,
                  "node is shared with tree " + std::to_string(it->second.tree) +
                      ", a tree of another kind; its values are read as that tree's");
      }
      if (!first) return;
      rep.nodes++;
      const bool plausible = walking < kFirstTreeId ? owner == walking
                                                     : owner >= kFirstTreeId && owner < sb.next_tree_id;
      if (!plausible)
        problem("B-owner", b.v, "node claims to be written by tree " + std::to_string(owner));
    };
    h.on_item = std::move(on_item);
    return h;
  };

  // Problems found from here on are attributed to the tree being walked.
  size_t attributed = rep.problems.size();
  auto attribute = [&](uint64_t tree) {
    for (; attributed < rep.problems.size(); attributed++) rep.problems[attributed].tree = tree;
  };

  // The root tree, collecting the root records.
  std::vector<TreeInfo> trees;
  walking = 1;
  check_tree(cache, sb.fs_id, sb.root_tree, sb.generation,
             node_hooks([&](Key k, std::span<const std::byte> v) {
               if (k.lo != 0) {
                 problem("R-key", Error::kNoBlock, "root tree item with an unknown key type");
                 return;
               }
               if (v.size() != sizeof(disk::RootRecord)) {
                 problem("R-size", Error::kNoBlock,
                         "root record of tree " + std::to_string(k.hi) + " has the wrong size");
                 return;
               }
               disk::RootRecord r;
               std::memcpy(&r, v.data(), sizeof r);
               TreeInfo t{TreeId{k.hi}, r.kind,
                          RootPtr{BlockNo{r.root_block.get()}, Generation{r.root_gen.get()}, r.level},
                          Generation{r.created_gen.get()}, Generation{r.last_shared_gen.get()},
                          TreeId{r.cloned_from.get()}};
               if (k.hi < kFirstTreeId || k.hi >= sb.next_tree_id)
                 problem("R-id", Error::kNoBlock,
                         "tree id " + std::to_string(k.hi) + " is outside [256, next_tree_id)");
               if (t.created > sb.generation || t.last_shared > sb.generation ||
                   t.root.gen > sb.generation)
                 problem("R-gen", Error::kNoBlock,
                         "tree " + std::to_string(k.hi) + " has generations newer than the superblock");
               if (t.root.block.v < sb.first_block || t.root.block.v >= sb.total_blocks ||
                   t.kind == 0 || t.root.level > 16 || r.flags.get() != 0 ||
                   r.reserved0.get() != 0 || r.reserved1[0].get() != 0 ||
                   r.reserved1[1].get() != 0) {
                 problem("R-range", Error::kNoBlock,
                         "root record of tree " + std::to_string(k.hi) + " is out of range");
                 return;
               }
               trees.push_back(t);
             }),
             memo, rep.problems);
  attribute(1);

  // The space tree, collecting the extents.
  std::map<uint64_t, Extent> extents;
  walking = 2;
  check_tree(cache, sb.fs_id, sb.space_tree, sb.generation,
             node_hooks([&](Key k, std::span<const std::byte> v) {
               if (v.size() != sizeof(disk::SpaceItem) || k.lo != 0) {
                 problem("A-item", k.hi, "space item with a bad key or size");
                 return;
               }
               disk::SpaceItem it;
               std::memcpy(&it, v.data(), sizeof it);
               if (it.reserved.get() != 0)
                 problem("A-item", k.hi, "space item with non-zero reserved bytes");
               extents[k.hi] = Extent{it.nblocks.get(), it.refs.get(), it.kind.get()};
             }),
             memo, rep.problems);
  attribute(2);

  // Every tree.
  for (const TreeInfo& t : trees) {
    rep.trees++;
    if (t.kind != kKindPlain && !opts.kinds.count(t.kind))
      problem("R-kind", t.root.block.v,
              "tree " + std::to_string(t.id.v) + " is of kind " + std::to_string(t.kind) +
                  ", unknown here: the extents its values reference cannot be counted");
    auto kit = opts.kinds.find(t.kind);
    const ValueRefs refs = kit == opts.kinds.end() ? ValueRefs{} : kit->second;
    std::vector<ExtentRef> ext;
    walking = t.id.v;
    walking_kind = t.kind;
    const bool fed = opts.feed && opts.feed->begin_tree(t);
    const size_t problems_before = rep.problems.size();
    auto hooks = node_hooks([&](Key k, std::span<const std::byte> v) {
                 rep.items++;
                 if (fed) opts.feed->item(k, v);
                 if (!refs) return;
                 ext.clear();
                 refs(k, v, ext);
                 for (const ExtentRef& e : ext) {
                   // A reference outside the filesystem names no extent at
                   // all: the value is damaged (fsck rebuilds its tree without it).
                   if (outside_filesystem(sb, e)) {
                     problem("A3-ref-range", e.start.v,
                             "a value references " + std::to_string(e.nblocks) + " blocks at " +
                                 std::to_string(e.start.v) + ", outside the filesystem");
                     continue;
                   }
                   reach(e.start.v, 2, e.nblocks);
                 }
               });
    // A node met again (shared with an earlier tree) hands over no items.
    bool complete = true;
    if (fed) {
      auto on_node = std::move(hooks.on_node);
      hooks.on_node = [&, on_node](BlockNo b, int level, Generation g, uint64_t owner, bool first) {
        if (!first) complete = false;
        on_node(b, level, g, owner, first);
      };
    }
    check_tree(cache, sb.fs_id, t.root, sb.generation, hooks, memo, rep.problems);
    if (fed) opts.feed->end_tree(complete && rep.problems.size() == problems_before);
    attribute(t.id.v);
  }

  // A3, A4: the space tree against what was found.
  uint64_t used = 0, meta = 0, data = 0, prev_end = sb.first_block;
  const SpaceGeometry geo = space_geometry(sb);
  for (const auto& [start, e] : extents) {
    // A multi-device volume: no extent where no device is (format.md#placement).
    for (const auto& h : geo.holes)
      if (start < h.start + h.nblocks && start + e.nblocks > h.start) {
        problem("A-hole", start, "extent lies where no device of the volume is (a gap, or a device's reserved area)");
        break;
      }
    rep.extents++;
    used += e.nblocks;
    (e.kind == 1 ? meta : data) += e.nblocks;
    if (start < prev_end || e.nblocks == 0 || start + e.nblocks > sb.total_blocks)
      problem("A-overlap", start, "extent overlaps another or lies outside the filesystem");
    prev_end = std::max(prev_end, start + e.nblocks);
    if (e.kind != 1 && e.kind != 2) problem("A-kind", start, "extent of unknown kind");
    if (e.nblocks && start >= sb.first_block &&
        (start - sb.first_block) / SpaceManager::kGroupBlocks !=
            (start + e.nblocks - 1 - sb.first_block) / SpaceManager::kGroupBlocks)
      problem("A-group", start, "extent crosses a 32768-block group boundary");
    if (e.refs == 0) problem("A-item", start, "extent with zero references");
    auto it = expected.find(start);
    const uint64_t want = it == expected.end() ? 0 : it->second;
    if (want == 0) {
      problem("A3-leak", start, "extent of " + std::to_string(e.nblocks) + " blocks with " +
                                    std::to_string(e.refs) + " references is not referenced");
    } else if (want != e.refs) {
      problem(want > e.refs ? "A3-refs-low" : "A3-refs-high", start,
              "extent has " + std::to_string(e.refs) + " references, " + std::to_string(want) +
                  " found");
    }
    if (want && expected_kind[start] == 1 && (e.kind != 1 || e.nblocks != 1))
      problem("A-kind", start, "a tree node's extent is not a one-block metadata extent");
    if (want && expected_kind[start] == 2 && e.kind != 2)
      problem("A-kind", start, "a data extent is recorded as metadata");
    if (want && expected_kind[start] == 2 && expected_len[start] != e.nblocks)
      problem("A-length", start, "a value references " + std::to_string(expected_len[start]) +
                                     " blocks of an extent of " + std::to_string(e.nblocks));
  }
  // No two things the trees reach may share a block unless they are the same
  // extent (shared through a reference count).
  std::vector<std::pair<uint64_t, uint64_t>> reached;
  reached.reserve(expected.size());
  for (const auto& [b, n] : expected) {
    auto l = expected_len.find(b);
    reached.emplace_back(b, l == expected_len.end() ? 1 : std::max<uint64_t>(1, l->second));
  }
  std::sort(reached.begin(), reached.end());
  for (size_t i = 1; i < reached.size(); i++)
    if (reached[i - 1].first + reached[i - 1].second > reached[i].first)
      problem("A-double-use", reached[i].first, "two extents the trees reference overlap");
  if (opts.collect_reachable) rep.reachable = std::move(reached);
  for (const auto& [b, n] : expected)
    if (!extents.count(b))
      problem("A3-missing", b, "referenced " + std::to_string(n) + " times but free in the space tree");
  if (used != sb.used_blocks || meta != sb.meta_blocks || data != sb.data_blocks)
    problem("A4-counters", Error::kNoBlock,
            "superblock counts " + std::to_string(sb.used_blocks) + " used blocks (" +
                std::to_string(sb.meta_blocks) + " metadata), the space tree " +
                std::to_string(used) + " (" + std::to_string(meta) + ")");
  return rep;
}

}  // namespace plyfs
