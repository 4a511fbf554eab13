// Node verification on read, and the whole-tree walker that tests and fsck
// use to check T1-T5 (format.md#btree-invariants).
#include <algorithm>

#include "btree/btree.h"
#include "btree/node.h"
#include "util/checksum.h"

namespace plyfs {

using namespace btree_internal;

inline constexpr int kMaxLevel = 16;

void seal_node(std::span<std::byte> block) {
  NodeView v(block);
  v.h().checksum.set(xxh3(block.subspan(8)));
}

Result<void> verify_node(std::span<const std::byte> block, BlockNo b, uint64_t fs_id,
                         Generation expect_gen, int expect_level) {
  const uint32_t bs = static_cast<uint32_t>(block.size());
  // NodeView wants mutable bytes; verification only reads.
  NodeView v(std::span<std::byte>(const_cast<std::byte*>(block.data()), block.size()));
  const auto& h = v.h();
  auto bad = [&](const std::string& why) { return Error::corrupt(b.v, "B-tree node: " + why); };
  if (h.magic.get() != disk::kNodeMagic) return bad("bad magic (not a node)");
  if (h.checksum.get() != xxh3(block.subspan(8))) return bad("checksum mismatch");
  if (h.blockno.get() != b.v)
    return bad("written for block " + std::to_string(h.blockno.get()) + " (misdirected write)");
  if (h.fs_id.get() != fs_id) return bad("belongs to another filesystem (fs_id mismatch)");
  if (h.generation.get() != expect_gen.v)
    return bad("generation " + std::to_string(h.generation.get()) + ", its parent expects " +
               std::to_string(expect_gen.v) + " (lost or stale write)");
  if (h.level != expect_level || h.level > kMaxLevel)
    return bad("level " + std::to_string(h.level) + ", expected " + std::to_string(expect_level));
  if (h.flags != 0 || h.reserved0.get() != 0 || h.reserved1.get() != 0)
    return bad("unknown flags or non-zero reserved fields");
  const uint32_t n = h.nitems.get();
  if (v.leaf()) {
    const uint32_t vs = h.value_start.get();
    if (kHeader + n * kLeafItem > vs || vs > bs) return bad("item area overlaps the values");
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    ranges.reserve(n);
    for (uint32_t i = 0; i < n; i++) {
      const auto& it = v.litem(i);
      uint32_t off = it.value_offset.get(), len = it.value_len.get();
      if (len > BTree::max_value_len(bs) || off < vs || off > bs || len > bs - off)
        return bad("value " + std::to_string(i) + " lies outside the value area");
      if (len) ranges.emplace_back(off, len);
      if (i > 0 && !(v.key(i - 1) < v.key(i))) return bad("keys out of order");
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); i++)
      if (ranges[i - 1].first + ranges[i - 1].second > ranges[i].first)
        return bad("two values overlap");
  } else {
    if (h.value_start.get() != 0) return bad("inner node with a value area");
    if (n == 0 || kHeader + n * kInnerItem > bs) return bad("bad item count");
    for (uint32_t i = 0; i < n; i++) {
      if (v.child_gen(i) > v.gen()) return bad("child generation newer than the node");
      if (i > 0 && !(v.key(i - 1) < v.key(i))) return bad("keys out of order");
    }
  }
  return ok();
}

namespace {

struct Walker {
  BlockCache& cache;
  uint64_t fs_id;
  Generation max_gen;
  const WalkHooks& hooks;
  WalkMemo& memo;
  std::vector<Problem>& problems;

  void problem(const char* code, uint64_t block, std::string msg) {
    problems.push_back(Problem{code, block, std::move(msg)});
  }

  struct Ctx { uint64_t fs_id; Generation gen; int level; };
  static Result<void> verify_cb(const void* c, BlockNo b, std::span<const std::byte> bytes) {
    auto* x = static_cast<const Ctx*>(c);
    return verify_node(bytes, b, x->fs_id, x->gen, x->level);
  }

  // Checks the subtree at b. `low` is the separator its parent holds for it
  // (T2), `high` the next separator (exclusive bound, T1).
  std::optional<WalkMemo::Summary> walk(BlockNo b, Generation g, int level,
                                        std::optional<Key> low, std::optional<Key> high,
                                        bool is_root) {
    if (g > max_gen)
      problem("T5-gen-future", b.v,
              "node generation " + std::to_string(g.v) + " is newer than the superblock's " +
                  std::to_string(max_gen.v));
    auto memo_it = memo.nodes.find(b.v);
    if (memo_it != memo.nodes.end()) {
      const auto s = memo_it->second;
      if (hooks.on_node) hooks.on_node(b, level, g, 0, false);
      if (!s.clean)
        problem("B-node-shared", b.v, "shares a subtree that was found damaged above");
      if (!s.ok) return std::nullopt;
      // A second parent's pointer must expect the generation the first's did
      // (the node verified against it): else it is a stale pointer.
      if (s.gen != g) {
        problem("B-node-corrupt", b.v,
                "B-tree node: generation " + std::to_string(s.gen.v) + ", another parent expects " +
                    std::to_string(g.v) + " (lost or stale write)");
        return std::nullopt;
      }
      if (s.level != level) problem("T3-level", b.v, "shared node reached at two levels");
      bounds(b, s, low, high);
      return s;
    }
    Ctx ctx{fs_id, g, level};
    auto r = cache.get(b, BlockCache::Verifier{verify_cb, &ctx});
    if (!r) {
      problem(r.error().is_corruption() ? "B-node-corrupt" : "B-node-unreadable", b.v,
              r.error().reason);
      memo.nodes[b.v] = WalkMemo::Summary{{}, {}, level, false, false};
      return std::nullopt;
    }
    BlockCache::Ref ref = *r;
    NodeView v(ref->bytes());
    if (v.gen() != g || v.level() != level) {
      problem("T5-pointer", b.v, "cached node does not match its parent pointer");
      return std::nullopt;
    }
    if (hooks.on_node) hooks.on_node(b, level, g, v.h().owner.get(), true);
    const size_t problems_before = problems.size();
    if (!is_root && v.used() < v.capacity() / 4)
      problem("T4-underfull", b.v,
              "node uses " + std::to_string(v.used()) + " of " + std::to_string(v.capacity()) +
                  " bytes, under a quarter");
    if (is_root && !v.leaf() && v.n() < 2)
      problem("T4-root", b.v, "inner root with fewer than two children");
    if (!is_root && v.n() == 0) problem("T4-empty", b.v, "empty non-root node");

    WalkMemo::Summary s{{}, {}, level, true, true, g};
    if (v.n() > 0) {
      s.min = v.key(0);
      s.max = v.key(v.n() - 1);
    }
    if (v.leaf()) {
      if (hooks.on_item)
        for (uint32_t i = 0; i < v.n(); i++) hooks.on_item(v.key(i), v.value(i));
    } else {
      for (uint32_t i = 0; i < v.n(); i++) {
        std::optional<Key> next = i + 1 < v.n() ? std::optional<Key>(v.key(i + 1)) : high;
        auto cs = walk(v.child(i), v.child_gen(i), level - 1, v.key(i), next, false);
        if (cs && i + 1 == v.n()) s.max = cs->max;
      }
    }
    s.clean = problems.size() == problems_before;
    memo.nodes[b.v] = s;
    if (v.n() > 0) bounds(b, s, low, high);
    return s;
  }

  void bounds(BlockNo b, const WalkMemo::Summary& s, std::optional<Key> low,
              std::optional<Key> high) {
    if (low && s.min != *low)
      problem("T2-separator", b.v, "lowest key differs from the parent's separator");
    if (high && !(s.max < *high))
      problem("T1-key-order", b.v, "keys reach the next sibling's range");
  }
};

}  // namespace

void check_tree(BlockCache& cache, uint64_t fs_id, const RootPtr& root, Generation max_gen,
                const WalkHooks& hooks, WalkMemo& memo, std::vector<Problem>& problems) {
  Walker w{cache, fs_id, max_gen, hooks, memo, problems};
  w.walk(root.block, root.gen, root.level, std::nullopt, std::nullopt, true);
}

}  // namespace plyfs
