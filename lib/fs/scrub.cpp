// Scrub (scrub.h, format.md#scrub).
#include "fs/scrub.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "fs/fs.h"
#include "fs/items.h"
#include "util/checksum.h"

namespace plyfs {

namespace {

using Clock = std::chrono::steady_clock;
// What one planning transaction gathers: the reads between two looks at
// the rate, the cancel flag and the progress.
constexpr uint64_t kBatchBytes = 16ull << 20;
// Adjacent blocks are read together, up to this much.
constexpr uint64_t kReadRun = 1ull << 20;

// Holds the scrub to `rate` bytes a second on average, from its start.
struct Limiter {
  uint64_t rate = 0, bytes = 0;
  Clock::time_point start = Clock::now();
  void add(uint64_t n) {
    bytes += n;
    if (!rate) return;
    const auto due = start + std::chrono::duration<double>(double(bytes) / double(rate));
    if (due > Clock::now()) std::this_thread::sleep_until(due);
  }
};

struct PlannedNode {
  uint64_t block, gen;
  int level;
};

// A data block to check: where it is, what its checksum must be, and the
// item that says so (to confirm a failure and name the file).
struct PlannedBlock {
  uint64_t disk, csum;
  uint64_t tree;
  Key item;
  uint32_t index;  // the block's place in the item's extent
};


std::string tree_name(const std::map<uint64_t, std::string>& names, uint64_t tree) {
  if (tree == 1) return "(root tree)";
  if (tree == 2) return "(space tree)";
  auto it = names.find(tree);
  return it != names.end() ? it->second : "(tree " + std::to_string(tree) + ")";
}

}  // namespace

Result<ScrubReport> scrub(Volume& v, const ScrubOptions& o) {
  const auto t0 = Clock::now();
  ScrubReport rep;
  const uint64_t bs = v.block_size();
  std::map<uint64_t, std::string> names;
  for (const auto& b : PLY_TRY(Filesystem::branches(v))) names[b.tree.v] = b.name;
  std::vector<TreeInfo> trees;
  {
    auto t = PLY_TRY(v.begin());
    trees = PLY_TRY(t.list_trees());
  }
  const uint64_t total = v.space_stats().used_blocks * bs;
  uint64_t done = 0;
  Limiter lim{o.rate_bytes};
  auto read = [&](uint64_t n) {
    done += n;
    rep.bytes += n;
    lim.add(n);
    if (o.progress) o.progress(done, std::max(total, done));
  };
  auto cancelled = [&] { return o.cancel && o.cancel->load(std::memory_order_relaxed); };

  // --- Metadata: the nodes every tree reaches, each once, planned under
  // one transaction (through the cache: the structure), then read from
  // the device and verified. Nodes of a generation not yet durable are
  // not on the device yet.
  std::vector<PlannedNode> nodes;
  std::vector<std::pair<PlannedNode, std::string>> suspects;  // and why
  {
    auto t = PLY_TRY(v.begin());
    const Generation durable = v.durable_generation();
    std::unordered_set<uint64_t> seen;
    const BTree::NodeFn keep = [&](BlockNo b, Generation g, int level, const Error* bad) {
      if (g > durable) return;
      if (bad) suspects.push_back({PlannedNode{b.v, g.v, level}, bad->message()});
      else nodes.push_back(PlannedNode{b.v, g.v, level});
    };
    PLY_CHECK(t.walk_system_nodes(seen, keep));
    for (const auto& ti : trees) {
      auto r = t.walk_nodes(ti.id, seen, keep);
      if (!r && r.error().code != ENOENT) return r.error();  // ENOENT: deleted since the listing
    }
  }
  for (size_t i = 0; i < nodes.size() && !cancelled(); i++) {
    const PlannedNode& n = nodes[i];
    if (auto r = v.verify_node_on_device(BlockNo{n.block}, Generation{n.gen}, n.level); !r)
      suspects.push_back({n, r.error().message()});
    rep.metadata_blocks++;
    read(bs);
  }
  // Confirmed under one transaction: a node still reached as planned (its
  // generation too) and still failing; each tree that reaches it named.
  if (!suspects.empty()) {
    auto t = PLY_TRY(v.begin());
    std::unordered_map<uint64_t, std::vector<uint64_t>> reached;  // block -> trees
    std::unordered_map<uint64_t, uint64_t> gen_of;
    for (const auto& [n, why] : suspects) reached[n.block];
    auto note = [&](uint64_t tree) {
      return [&, tree](BlockNo b, Generation g, int, const Error*) {
        auto it = reached.find(b.v);
        if (it == reached.end()) return;
        it->second.push_back(tree);
        gen_of[b.v] = g.v;
      };
    };
    {
      std::unordered_set<uint64_t> seen;
      PLY_CHECK(t.walk_system_nodes(seen, note(0)));
    }
    for (const auto& ti : trees) {
      std::unordered_set<uint64_t> seen;  // per tree: every tree reaching a node is named
      auto r = t.walk_nodes(ti.id, seen, note(ti.id.v));
      if (!r && r.error().code != ENOENT) return r.error();
    }
    for (const auto& [n, why] : suspects) {
      auto& who = reached[n.block];
      if (who.empty() || gen_of[n.block] != n.gen) continue;  // freed or rewritten since the plan
      auto again = v.verify_node_on_device(BlockNo{n.block}, Generation{n.gen}, n.level);
      if (again) continue;
      ScrubDamage d;
      d.block = n.block;
      d.metadata = true;
      d.error = again.error().message();
      d.reason = again.error().code == EIO ? ScrubDamage::Reason::Unreadable : ScrubDamage::Reason::Corrupt;
      std::sort(who.begin(), who.end());
      who.erase(std::unique(who.begin(), who.end()), who.end());
      for (uint64_t tree : who) {
        // The root and space trees are walked together (tree 0 above):
        // name the one whose node it is by where it lies.
        d.refs.push_back(ScrubRef{tree == 0 ? "(root or space tree)" : tree_name(names, tree), ""});
      }
      rep.damage.push_back(std::move(d));
    }
  }

  // --- Data: every block a filesystem tree's extent items map, each once
  // (a bitmap of the blocks checked), in batches planned under a
  // transaction and read outside it.
  std::vector<bool> checked(v.total_blocks());
  std::vector<PlannedBlock> bad;
  std::vector<std::byte> buf;
  for (const auto& ti : trees) {
    if (ti.kind != disk::kKindFs) continue;
    Key from = Key::min();
    for (bool more = true; more && !cancelled();) {
      std::vector<PlannedBlock> batch;
      {
        auto t = PLY_TRY(v.begin());
        more = false;
        auto r = t.scan(ti.id, from, Key::max(), [&](Key k, std::span<const std::byte> val) {
          if (batch.size() * bs >= kBatchBytes) {
            from = k;
            more = true;
            return false;
          }
          if (fsitems::type_of(k) != disk::ItemType::Extent) return true;
          auto e = fsitems::decode_extent(k, val);
          if (!e || e->prealloc()) return true;  // a malformed item is fsck's to report
          // A compressed item's checksums cover its stored frame: verified
          // without decompressing (format.md#fs-compress).
          for (uint32_t i = 0; i < e->stored_count(); i++) {
            const uint64_t d = e->stored_first() + i;
            if (d >= checked.size() || checked[d]) continue;
            checked[d] = true;
            batch.push_back(PlannedBlock{d, e->csums[i], ti.id.v, k, i});
          }
          return true;
        });
        if (!r) {
          if (r.error().code == ENOENT) break;  // the tree was dropped since
          return r.error();
        }
      }
      std::sort(batch.begin(), batch.end(), [](const auto& a, const auto& b) { return a.disk < b.disk; });
      for (size_t i = 0; i < batch.size();) {
        size_t j = i + 1;
        while (j < batch.size() && batch[j].disk == batch[j - 1].disk + 1 && (j - i) * bs < kReadRun) j++;
        buf.resize((j - i) * bs);
        auto r = v.read_data_uncached(BlockNo{batch[i].disk}, buf);
        for (size_t k = i; k < j; k++)
          if (!r || xxh3(std::span(buf).subspan((k - i) * bs, bs)) != batch[k].csum) bad.push_back(batch[k]);
        rep.data_blocks += j - i;
        read((j - i) * bs);
        i = j;
      }
    }
  }
  // Confirmed under one transaction: the item still maps the block with
  // that checksum, and a second read still fails it.
  std::map<uint64_t, ScrubDamage> damaged;  // disk block -> damage
  if (!bad.empty()) {
    auto t = PLY_TRY(v.begin());
    std::vector<std::byte> one(bs);
    for (const auto& b : bad) {
      auto val = t.get(TreeId{b.tree}, b.item);
      if (!val || !*val) continue;
      auto e = fsitems::decode_extent(b.item, **val);
      if (!e || e->prealloc() || b.index >= e->stored_count() || e->stored_first() + b.index != b.disk ||
          e->csums[b.index] != b.csum)
        continue;  // rewritten since the plan
      auto r = v.read_data_uncached(BlockNo{b.disk}, one);
      if (r && xxh3(one) == b.csum) continue;
      ScrubDamage d;
      d.block = b.disk;
      d.error = r ? "data checksum mismatch" : "cannot read the block: " + r.error().message();
      d.reason = r ? ScrubDamage::Reason::Checksum : ScrubDamage::Reason::Unreadable;
      damaged.emplace(b.disk, std::move(d));
    }
  }
  // Every file of every branch that maps a damaged block.
  if (!damaged.empty()) {
    for (const auto& ti : trees) {
      if (ti.kind != disk::kKindFs) continue;
      std::map<uint64_t, std::set<uint64_t>> inos;  // disk block -> inodes
      {
        auto t = PLY_TRY(v.begin());
        auto r = t.scan(ti.id, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> val) {
          if (fsitems::type_of(k) != disk::ItemType::Extent) return true;
          auto e = fsitems::decode_extent(k, val);
          if (!e || e->prealloc()) return true;
          const uint64_t lo = e->stored_first();
          for (auto it = damaged.lower_bound(lo); it != damaged.end() && it->first < lo + e->stored_count(); ++it)
            inos[it->first].insert(k.hi);
          return true;
        });
        if (!r && r.error().code != ENOENT) return r.error();
      }
      if (inos.empty()) continue;
      auto fs = Filesystem::open(v, ti.id, true);
      for (const auto& [blk, set] : inos)
        for (uint64_t ino : set) {
          std::string path;
          if (fs) {
            auto p = (*fs)->path(ino);
            path = p && *p ? **p : "(inode " + std::to_string(ino) + ", no name)";
          } else {
            path = "(inode " + std::to_string(ino) + ")";
          }
          damaged[blk].refs.push_back(ScrubRef{tree_name(names, ti.id.v), path});
        }
    }
    for (auto& [blk, d] : damaged) rep.damage.push_back(std::move(d));
  }
  rep.cancelled = cancelled();
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rep;
}

}  // namespace plyfs
