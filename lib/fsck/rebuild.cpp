#include "fsck/rebuild.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <iterator>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "alloc/disk_space.h"
#include "alloc/space.h"
#include "btree/disk_node.h"
#include "commit/verify.h"

namespace plyfs::fsck_internal {

namespace {

// What the walk of the repaired generation finds in use, and what the old
// generation reaches but the new one does not (held until durable, R1).
struct Census {
  std::unordered_map<uint64_t, uint32_t> node_refs;  // node block -> parents and roots
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> data;  // start -> (length, references)
  std::unordered_set<uint64_t> old_nodes;           // nodes of the old root/space/rebuilt trees
  std::map<uint64_t, uint64_t> old_data;            // extents the old space tree lists
};

void count_values(const ValueRefs& refs, Key k, std::span<const std::byte> v,
                  std::map<uint64_t, std::pair<uint64_t, uint32_t>>& data) {
  if (!refs) return;
  std::vector<ExtentRef> ext;
  refs(k, v, ext);
  for (const ExtentRef& e : ext) {
    auto& d = data[e.start.v];
    d.first = e.nblocks;
    d.second++;
  }
}

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

namespace {

Result<RebuildResult> rebuild(BlockDevice& dev, const SuperInfo& base, const RebuildPlan& plan,
                              const std::map<uint8_t, ValueRefs>& kinds, bool hold_unreadable) {
  RebuildResult res;
  const Generation g = next(base.generation);
  BlockCache cache(dev, base.block_size, 256ull << 20);
  Census c;
  std::vector<Problem> ignored;  // the check already reported them
  WalkMemo memo;
  auto refs_of = [&](uint8_t kind) {
    auto it = kinds.find(kind);
    return it == kinds.end() ? ValueRefs{} : it->second;
  };

  // The old root and space trees: only their records and nodes matter.
  std::vector<TreeInfo> records;
  WalkHooks old_meta;
  old_meta.on_node = [&](BlockNo b, int, Generation, uint64_t, bool) { c.old_nodes.insert(b.v); };
  old_meta.on_item = [&](Key k, std::span<const std::byte> v) {
    if (k.lo != 0) return;  // reserved keys are not carried over
    auto t = decode_root_record(TreeId{k.hi}, v, base, base.generation);
    // A record filed under a reserved id (a damaged key) is renumbered below.
    if (t && k.hi != kRootTreeId.v && k.hi != 2) records.push_back(*t);  // 2: the space tree
    else res.records_dropped++;
  };
  check_tree(cache, base.fs_id, base.root_tree, base.generation, old_meta, memo, ignored);
  // The old space tree lists what the old generation holds, including what
  // is reachable only through nodes too damaged to read: all of it is held.
  // A damaged length must not hold the whole device (the repair would find
  // no free block): a node's extent is one block, and an extent lies in its
  // group and ends where the next one starts (A1, format.md#space-item).
  old_meta.on_item = [&](Key k, std::span<const std::byte> v) {
    if (v.size() != sizeof(disk::SpaceItem) || k.lo != 0 || k.hi < base.first_block || k.hi >= base.total_blocks)
      return;
    disk::SpaceItem it;
    std::memcpy(&it, v.data(), sizeof it);
    const uint64_t group_end =
        base.first_block + ((k.hi - base.first_block) / SpaceManager::kGroupBlocks + 1) * SpaceManager::kGroupBlocks;
    c.old_data[k.hi] = it.kind.get() == 1 ? 1 : std::min(it.nblocks.get(), group_end - k.hi);
  };
  if (hold_unreadable)
    check_tree(cache, base.fs_id, base.space_tree, base.generation, old_meta, memo, ignored);
  for (auto it = c.old_data.begin(); it != c.old_data.end(); ++it) {
    const auto nx = std::next(it);
    const uint64_t end = nx == c.old_data.end() ? base.total_blocks : nx->first;
    it->second = std::min(it->second, end - it->first);
  }

  // Kept trees: every node and value they reach is in use, with the
  // references counted afresh (R2). They share one memo, so that a subtree
  // shared by clones is entered once and each further parent edge into it
  // counts one reference (T6). Rebuilt trees are read in full, each alone,
  // so that shared leaves still give up all their items.
  std::map<uint64_t, std::map<Key, std::vector<std::byte>>> salvaged;
  // A tree the plan keeps but whose walk finds damage is rebuilt too: the
  // check attributes a damaged node shared by several trees to the first
  // that reaches it, and a record filed under a damaged key may name a tree
  // by an id the plan does not know.
  std::set<uint64_t> rebuilt(plan.rebuild.begin(), plan.rebuild.end());
  {
    WalkMemo check_memo;
    for (const TreeInfo& t : records) {
      if (rebuilt.count(t.id.v)) continue;
      std::vector<Problem> found;
      check_tree(cache, base.fs_id, t.root, base.generation, WalkHooks{}, check_memo, found);
      if (!found.empty()) rebuilt.insert(t.id.v);
    }
  }
  WalkMemo kept_memo;
  for (int pass = 0; pass < 2; pass++) {
    for (const TreeInfo& t : records) {
      const bool rebuild = rebuilt.count(t.id.v) > 0;
      if (rebuild != (pass == 1)) continue;
      const ValueRefs vr = refs_of(t.kind);
      WalkHooks h;
      WalkMemo own;
      std::vector<Problem> found;
      if (!rebuild) {
        h.on_node = [&](BlockNo b, int, Generation, uint64_t, bool) { c.node_refs[b.v]++; };
        h.on_item = [&](Key k, std::span<const std::byte> v) { count_values(vr, k, v, c.data); };
        check_tree(cache, base.fs_id, t.root, base.generation, h, kept_memo, found);
        if (!found.empty())
          return Error::corrupt(t.root.block.v, "tree " + std::to_string(t.id.v) +
                                                    " was to be kept but is damaged: " +
                                                    found.front().message);
        res.trees_kept++;
      } else {
        auto& items = salvaged[t.id.v];
        h.on_node = [&](BlockNo b, int, Generation, uint64_t, bool) { c.old_nodes.insert(b.v); };
        h.on_item = [&](Key k, std::span<const std::byte> v) { items[k].assign(v.begin(), v.end()); };
        check_tree(cache, base.fs_id, t.root, base.generation, h, own, found);
        res.trees_rebuilt++;
      }
    }
  }
  for (auto& [id, items] : salvaged) {
    const TreeInfo* t = nullptr;
    for (const auto& r : records) if (r.id.v == id) t = &r;
    for (auto it = items.begin(); it != items.end();) {
      std::vector<ExtentRef> ext;
      if (const ValueRefs vr = refs_of(t->kind)) vr(it->first, it->second, ext);
      // A value that references blocks outside the filesystem cannot be
      // kept (verify's A3-ref-range, or B-shared-kind's tree): it leaves
      // the rebuilt tree.
      if (std::any_of(ext.begin(), ext.end(), [&](const ExtentRef& e) { return outside_filesystem(base, e); })) {
        it = items.erase(it);
        res.items_dropped++;
        continue;
      }
      count_values(refs_of(t->kind), it->first, it->second, c.data);
      res.items_kept++;
      ++it;
    }
  }

  // The new space: claims for what is in use, holds for what only the old
  // generation reaches (R1).
  auto sm = SpaceManager::fresh(cache, base.fs_id,
                                space_geometry(base));
  for (const auto& [b, n] : c.node_refs)
    PLY_CHECK(sm->claim(BlockNo{b}, 1, n, ExtentKind::Meta));
  for (const auto& [start, d] : c.data)
    PLY_CHECK(sm->claim(BlockNo{start}, d.first, d.second, ExtentKind::Data));
  for (uint64_t b : c.old_nodes)
    if (!c.node_refs.count(b)) PLY_CHECK(sm->hold_free_parts(BlockNo{b}, 1, g));
  for (const auto& [start, n] : c.old_data) PLY_CHECK(sm->hold_free_parts(BlockNo{start}, n, g));

  // New root tree, new space tree, rebuilt trees: all fresh nodes of g.
  PLY_CHECK(sm->create_tree(g));
  MutCtx m{g, sm->unshared(g)};
  BTree root(cache, base.fs_id, TreeConfig{kRootTreeId, false, Generation{0}, {}},
             PLY_TRY(BTree::create(cache, base.fs_id, kRootTreeId, m)));
  // A record filed under a reserved id or far past the tree id counter (a
  // damaged key) takes the id its root node names as its writer, if that is
  // one no other record has, else a new one: moving the counter that far
  // could overflow it, or waste the id space (format.md#root-record, R-id).
  const uint64_t id_limit = base.next_tree_id + (1ull << 32);
  auto in_range = [&](uint64_t id) { return id >= kFirstTreeId && id < id_limit; };
  std::set<uint64_t> ids;
  uint64_t next_id = base.next_tree_id;
  for (const TreeInfo& t : records)
    if (in_range(t.id.v)) ids.insert(t.id.v), next_id = std::max(next_id, t.id.v + 1);
  for (TreeInfo t : records) {
    auto s = salvaged.find(t.id.v);
    if (!in_range(t.id.v)) {
      uint64_t owner = 0;
      std::vector<std::byte> node(base.block_size);
      if (t.root.block.v < base.total_blocks && dev.read(t.root.block.v * base.block_size, node)) {
        disk::NodeHeader h;
        std::memcpy(&h, node.data(), sizeof h);
        owner = h.owner.get();
      }
      t.id = TreeId{in_range(owner) && owner < next_id && !ids.count(owner) ? owner : next_id++};
      ids.insert(t.id.v);
      res.records_renumbered++;
    }
    if (s != salvaged.end()) {
      BTree fresh(cache, base.fs_id, TreeConfig{t.id, false, Generation{0}, {}},
                  PLY_TRY(BTree::create(cache, base.fs_id, t.id, m)));
      for (const auto& [k, v] : s->second) PLY_CHECK(fresh.put(m, k, v));
      t.root = fresh.root();
      t.last_shared = Generation{0};  // nothing shares the fresh nodes
    }
    PLY_CHECK(root.put(m, Key{t.id.v, 0}, encode_root_record(t)));
  }
  PLY_CHECK(sm->fold(g));

  SuperInfo sb = base;
  sb.generation = g;
  sb.root_tree = root.root();
  sb.space_tree = sm->root();
  const SpaceCounters cnt = sm->counters();
  sb.used_blocks = cnt.used_blocks;
  sb.meta_blocks = cnt.meta_blocks;
  sb.data_blocks = cnt.data_blocks;
  sb.next_tree_id = next_id;
  sb.commit_time_ns = now_ns();
  PLY_CHECK(write_generation(dev, cache, sb));
  res.written = g;
  return res;
}

}  // namespace

Result<RebuildResult> rebuild_generation(BlockDevice& dev, const SuperInfo& base,
                                         const RebuildPlan& plan,
                                         const std::map<uint8_t, ValueRefs>& kinds) {
  auto r = rebuild(dev, base, plan, kinds, true);
  if (r || r.error().code != ENOSPC) return r;
  // The old space tree's extents left no room (damaged lengths that still
  // look plausible, or a full device): hold only what the old generation
  // reaches through readable nodes. What only an unreadable subtree held is
  // lost to the repair either way.
  auto again = PLY_TRY(rebuild(dev, base, plan, kinds, false));
  again.space_released = true;
  return again;
}

}  // namespace plyfs::fsck_internal
