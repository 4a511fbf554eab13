// Accessors over one node's bytes (format.md#btree-node). Internal to the
// btree layer: the layers above see keys and values, never nodes.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "btree/btree.h"
#include "btree/disk_node.h"

namespace plyfs::btree_internal {

inline constexpr uint32_t kHeader = sizeof(disk::NodeHeader);
inline constexpr uint32_t kLeafItem = sizeof(disk::LeafItem);
inline constexpr uint32_t kInnerItem = sizeof(disk::InnerItem);

inline Key get_key(const disk::Key& k) { return Key{k.hi.get(), k.lo.get()}; }
inline void set_key(disk::Key& d, Key k) {
  d.hi.set(k.hi);
  d.lo.set(k.lo);
}

// One item as moved between nodes during splits and merges.
struct Item {
  Key key;
  std::vector<std::byte> value;  // leaf
  uint64_t child = 0, child_gen = 0;  // inner
  uint32_t size(bool leaf) const {
    return leaf ? kLeafItem + static_cast<uint32_t>(value.size()) : kInnerItem;
  }
};

class NodeView {
 public:
  explicit NodeView(std::span<std::byte> b) : b_(b) {}
  disk::NodeHeader& h() const { return *reinterpret_cast<disk::NodeHeader*>(b_.data()); }

  uint32_t bs() const { return static_cast<uint32_t>(b_.size()); }
  uint32_t capacity() const { return bs() - kHeader; }
  int level() const { return h().level; }
  bool leaf() const { return h().level == 0; }
  uint32_t n() const { return h().nitems.get(); }
  Generation gen() const { return Generation{h().generation.get()}; }
  BlockNo blockno() const { return BlockNo{h().blockno.get()}; }

  disk::LeafItem& litem(uint32_t i) const {
    return *reinterpret_cast<disk::LeafItem*>(b_.data() + kHeader + i * kLeafItem);
  }
  disk::InnerItem& iitem(uint32_t i) const {
    return *reinterpret_cast<disk::InnerItem*>(b_.data() + kHeader + i * kInnerItem);
  }
  Key key(uint32_t i) const { return get_key(leaf() ? litem(i).key : iitem(i).key); }
  void set_key_at(uint32_t i, Key k) const { set_key(leaf() ? litem(i).key : iitem(i).key, k); }

  std::span<const std::byte> value(uint32_t i) const {
    const auto& it = litem(i);
    return {b_.data() + it.value_offset.get(), it.value_len.get()};
  }
  BlockNo child(uint32_t i) const { return BlockNo{iitem(i).child.get()}; }
  Generation child_gen(uint32_t i) const { return Generation{iitem(i).child_gen.get()}; }
  void set_child(uint32_t i, BlockNo b, Generation g) const {
    iitem(i).child.set(b.v);
    iitem(i).child_gen.set(g.v);
  }

  // Starts loading every line of the item array: a binary search over a cold
  // node otherwise waits for each probe's line in turn.
  void prefetch_items() const {
    const uint32_t end = kHeader + n() * (leaf() ? kLeafItem : kInnerItem);
    for (uint32_t off = kHeader; off < end; off += 64) __builtin_prefetch(b_.data() + off);
  }

  // First slot whose key is >= k (n() if none).
  uint32_t lower_bound(Key k) const {
    uint32_t lo = 0, hi = n();
    while (lo < hi) {
      uint32_t mid = (lo + hi) / 2;
      if (key(mid) < k) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  // Inner: the child whose subtree may hold k (the last key <= k, or 0).
  uint32_t child_index(Key k) const {
    uint32_t i = lower_bound(k);
    if (i < n() && key(i) == k) return i;
    return i == 0 ? 0 : i - 1;
  }

  uint32_t used() const {
    if (!leaf()) return n() * kInnerItem;
    uint32_t u = n() * kLeafItem;
    for (uint32_t i = 0; i < n(); i++) u += litem(i).value_len.get();
    return u;
  }

  // Sets up an empty node of the given level.
  void init(int level, TreeId owner, Generation g, BlockNo self, uint64_t fs_id) const {
    std::memset(b_.data(), 0, b_.size());
    auto& hd = h();
    hd.magic.set(disk::kNodeMagic);
    hd.level = static_cast<uint8_t>(level);
    hd.owner.set(owner.v);
    hd.generation.set(g.v);
    hd.blockno.set(self.v);
    hd.fs_id.set(fs_id);
    hd.value_start.set(level == 0 ? bs() : 0);
  }

  // Leaf edits. Each returns false, changing nothing, when the node is full.
  bool leaf_insert(uint32_t i, Key k, std::span<const std::byte> v) const;
  bool leaf_replace(uint32_t i, std::span<const std::byte> v) const;
  void leaf_erase(uint32_t i) const;
  // Inner edits; the caller checks room first.
  bool inner_insert(uint32_t i, Key k, BlockNo child, Generation g) const;
  void inner_erase(uint32_t i) const;

  std::vector<Item> items() const;
  // Replaces the content with `items` (which must fit), keeping the header.
  void rebuild(const Item* first, size_t count) const;

 private:
  void compact() const;
  std::span<std::byte> b_;
};

}  // namespace plyfs::btree_internal
