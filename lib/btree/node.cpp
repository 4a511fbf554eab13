#include "btree/node.h"

#include <algorithm>

namespace plyfs::btree_internal {

bool NodeView::leaf_insert(uint32_t i, Key k, std::span<const std::byte> v) const {
  const uint32_t need = kLeafItem + static_cast<uint32_t>(v.size());
  uint32_t items_end = kHeader + n() * kLeafItem;
  if (h().value_start.get() - items_end < need) {
    if (used() + need > capacity()) return false;
    compact();
  }
  std::byte* base = b_.data() + kHeader;
  std::memmove(base + (i + 1) * kLeafItem, base + i * kLeafItem, (n() - i) * kLeafItem);
  uint32_t vs = h().value_start.get() - static_cast<uint32_t>(v.size());
  if (!v.empty()) std::memcpy(b_.data() + vs, v.data(), v.size());
  h().value_start.set(vs);
  auto& it = litem(i);
  set_key(it.key, k);
  it.value_offset.set(vs);
  it.value_len.set(static_cast<uint32_t>(v.size()));
  h().nitems.set(static_cast<uint16_t>(n() + 1));
  return true;
}

bool NodeView::leaf_replace(uint32_t i, std::span<const std::byte> v) const {
  auto& it = litem(i);
  const uint32_t old_len = it.value_len.get();
  const uint32_t len = static_cast<uint32_t>(v.size());
  if (len <= old_len) {  // shrinking leaves a hole that compact() reclaims
    if (len) std::memcpy(b_.data() + it.value_offset.get(), v.data(), len);
    it.value_len.set(len);
    return true;
  }
  const uint32_t items_end = kHeader + n() * kLeafItem;
  if (h().value_start.get() - items_end < len) {
    if (used() - old_len + len > capacity()) return false;
    it.value_len.set(0);
    compact();
  }
  uint32_t vs = h().value_start.get() - len;
  std::memcpy(b_.data() + vs, v.data(), len);
  h().value_start.set(vs);
  it.value_offset.set(vs);
  it.value_len.set(len);
  return true;
}

void NodeView::leaf_erase(uint32_t i) const {
  std::byte* base = b_.data() + kHeader;
  std::memmove(base + i * kLeafItem, base + (i + 1) * kLeafItem, (n() - i - 1) * kLeafItem);
  h().nitems.set(static_cast<uint16_t>(n() - 1));
  std::memset(base + n() * kLeafItem, 0, kLeafItem);
  if (n() == 0) h().value_start.set(bs());
}

bool NodeView::inner_insert(uint32_t i, Key k, BlockNo child, Generation g) const {
  if ((n() + 1) * kInnerItem > capacity()) return false;
  std::byte* base = b_.data() + kHeader;
  std::memmove(base + (i + 1) * kInnerItem, base + i * kInnerItem, (n() - i) * kInnerItem);
  set_key(iitem(i).key, k);
  set_child(i, child, g);
  h().nitems.set(static_cast<uint16_t>(n() + 1));
  return true;
}

void NodeView::inner_erase(uint32_t i) const {
  std::byte* base = b_.data() + kHeader;
  std::memmove(base + i * kInnerItem, base + (i + 1) * kInnerItem, (n() - i - 1) * kInnerItem);
  h().nitems.set(static_cast<uint16_t>(n() - 1));
  std::memset(base + n() * kInnerItem, 0, kInnerItem);
}

std::vector<Item> NodeView::items() const {
  std::vector<Item> out(n());
  for (uint32_t i = 0; i < n(); i++) {
    out[i].key = key(i);
    if (leaf()) {
      auto v = value(i);
      out[i].value.assign(v.begin(), v.end());
    } else {
      out[i].child = child(i).v;
      out[i].child_gen = child_gen(i).v;
    }
  }
  return out;
}

void NodeView::rebuild(const Item* first, size_t count) const {
  // Zero the body: moved items leave no copies behind in this node. (Holes
  // left by leaf_erase/leaf_replace keep old bytes until the next compaction
  // or rebuild; readers ignore them, format.md#btree-node.)
  std::memset(b_.data() + kHeader, 0, bs() - kHeader);
  h().nitems.set(static_cast<uint16_t>(count));
  if (!leaf()) {
    h().value_start.set(0);
    for (size_t i = 0; i < count; i++) {
      set_key(iitem(static_cast<uint32_t>(i)).key, first[i].key);
      set_child(static_cast<uint32_t>(i), BlockNo{first[i].child}, Generation{first[i].child_gen});
    }
    return;
  }
  uint32_t pos = bs();
  for (size_t i = 0; i < count; i++) {
    const auto& v = first[i].value;
    pos -= static_cast<uint32_t>(v.size());
    if (!v.empty()) std::memcpy(b_.data() + pos, v.data(), v.size());
    auto& it = litem(static_cast<uint32_t>(i));
    set_key(it.key, first[i].key);
    it.value_offset.set(pos);
    it.value_len.set(static_cast<uint32_t>(v.size()));
  }
  h().value_start.set(pos);
}

void NodeView::compact() const {
  // Repack the values against the end of the block, in slot order.
  std::vector<std::byte> tmp;
  tmp.reserve(bs());
  std::vector<uint32_t> lens(n());
  for (uint32_t i = 0; i < n(); i++) {
    auto v = value(i);
    lens[i] = static_cast<uint32_t>(v.size());
    tmp.insert(tmp.end(), v.begin(), v.end());
  }
  uint32_t pos = bs(), src = 0;
  for (uint32_t i = 0; i < n(); i++) {
    pos -= lens[i];
    if (lens[i]) std::memcpy(b_.data() + pos, tmp.data() + src, lens[i]);
    src += lens[i];
    litem(i).value_offset.set(pos);
  }
  const uint32_t items_end = kHeader + n() * kLeafItem;
  std::memset(b_.data() + items_end, 0, pos - items_end);
  h().value_start.set(pos);
}

}  // namespace plyfs::btree_internal
