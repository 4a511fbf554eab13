#include "fsck/corrupt.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <iterator>

#include "alloc/disk_space.h"
#include "btree/disk_node.h"
#include "commit/disk_root.h"
#include "commit/disk_superblock.h"
#include "commit/superblock.h"
#include "util/checksum.h"

namespace plyfs {

namespace {

struct FieldPos {
  size_t offset, width;
};

struct Named {
  const char* name;
  size_t offset, width;
};

#define SB0(f) {#f, offsetof(disk::SuperSector0, f), sizeof(disk::SuperSector0::f)}
const Named kSuperFields[] = {
    {"magic", offsetof(disk::SuperSector0, magic), 8},
    SB0(version_major), SB0(version_minor), SB0(compat), SB0(ro_compat), SB0(incompat),
    {"uuid", offsetof(disk::SuperSector0, uuid), 8},
    {"label", offsetof(disk::SuperSector0, label), 8},
    SB0(block_size), SB0(sector_size), SB0(total_blocks), SB0(generation), SB0(slot), SB0(flags),
    SB0(fs_id),
    {"root_tree.block", offsetof(disk::SuperSector0, root_tree) + offsetof(disk::RootPtr, block), 8},
    {"root_tree.generation", offsetof(disk::SuperSector0, root_tree) + offsetof(disk::RootPtr, generation), 8},
    {"root_tree.level", offsetof(disk::SuperSector0, root_tree) + offsetof(disk::RootPtr, level), 1},
    {"space_tree.block", offsetof(disk::SuperSector0, space_tree) + offsetof(disk::RootPtr, block), 8},
    {"space_tree.generation", offsetof(disk::SuperSector0, space_tree) + offsetof(disk::RootPtr, generation), 8},
    {"space_tree.level", offsetof(disk::SuperSector0, space_tree) + offsetof(disk::RootPtr, level), 1},
    SB0(next_tree_id), SB0(next_inode), SB0(first_block), SB0(used_blocks), SB0(meta_blocks),
    SB0(data_blocks), SB0(reserve_blocks), SB0(mkfs_time_ns), SB0(commit_time_ns),
    {"reserved", offsetof(disk::SuperSector0, reserved), 8},
    {"stamp.0", 504, 8}, {"stamp.1", 1016, 8}, {"stamp.2", 1528, 8}, {"stamp.3", 2040, 8},
    {"stamp.4", 2552, 8}, {"stamp.5", 3064, 8}, {"stamp.6", 3576, 8}, {"stamp.7", 4088, 8},
    {"checksum", 4080, 8},
};
#undef SB0

#define NH(f) {#f, offsetof(disk::NodeHeader, f), sizeof(disk::NodeHeader::f)}
const Named kNodeHeader[] = {NH(checksum), NH(magic), NH(level), NH(flags), NH(nitems), NH(owner),
                             NH(generation), NH(blockno), NH(fs_id), NH(value_start),
                             NH(reserved0), NH(reserved1)};
#undef NH

#define SI(f) {#f, offsetof(disk::SpaceItem, f), sizeof(disk::SpaceItem::f)}
const Named kSpaceFields[] = {SI(nblocks), SI(refs), SI(kind), SI(reserved)};
#undef SI

#define RR(f) {#f, offsetof(disk::RootRecord, f), sizeof(disk::RootRecord::f)}
const Named kRecordFields[] = {RR(root_block), RR(root_gen), RR(level), RR(kind), RR(flags),
                               RR(reserved0), RR(created_gen), RR(last_shared_gen),
                               RR(cloned_from), {"reserved1", offsetof(disk::RootRecord, reserved1), 8}};
#undef RR

template <size_t N>
std::optional<FieldPos> lookup(const Named (&table)[N], const std::string& name) {
  for (const auto& f : table)
    if (name == f.name) return FieldPos{f.offset, f.width};
  return std::nullopt;
}

uint64_t get_le(const std::byte* p, size_t w) {
  uint64_t v = 0;
  for (size_t i = w; i-- > 0;) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}
void put_le(std::byte* p, size_t w, uint64_t v) {
  for (size_t i = 0; i < w; i++, v >>= 8) p[i] = static_cast<std::byte>(v & 0xff);
}

Result<std::string> apply(std::byte* p, size_t width, const CorruptAction& a) {
  const uint64_t before = get_le(p, width);
  uint64_t after = before;
  const uint64_t mask = width >= 8 ? ~0ull : (1ull << (8 * width)) - 1;
  switch (a.how) {
    case Damage::Set: after = a.value; break;
    case Damage::Zero: after = 0; break;
    case Damage::Add: after = before + a.value; break;
    case Damage::Flip:
      if (a.bit >= 8 * width)
        return Error::invalid("bit " + std::to_string(a.bit) + " is outside a " +
                              std::to_string(width) + "-byte field");
      after = before ^ (1ull << a.bit);
  }
  put_le(p, width, after & mask);
  return std::to_string(before) + " -> " + std::to_string(after & mask);
}

Result<std::vector<std::byte>> read_block(BlockDevice& dev, uint64_t b, uint32_t bs) {
  std::vector<std::byte> buf(bs);
  if (b >= dev.size_bytes() / bs) return Error::invalid("block " + std::to_string(b) + " is outside the device");
  PLY_CHECK(dev.read(b * bs, buf));
  return buf;
}

// Walks a tree down to the leaf holding key (hi, lo): (block, slot). Every
// count and child read on the way is checked against the block: the tool
// runs on images damaged on purpose.
Result<std::pair<uint64_t, uint32_t>> find_item(BlockDevice& dev, uint32_t bs, uint64_t root,
                                                 uint64_t k, uint64_t lo = 0) {
  uint64_t b = root;
  for (int depth = 0; depth < 18; depth++) {
    auto buf = PLY_TRY(read_block(dev, b, bs));
    const auto* h = reinterpret_cast<const disk::NodeHeader*>(buf.data());
    const uint32_t n = h->nitems.get();
    const uint32_t isz = h->level == 0 ? sizeof(disk::LeafItem) : sizeof(disk::InnerItem);
    if (64 + n * isz > bs) return Error::corrupt(b, "node item count out of range");
    auto key_at = [&](uint32_t i) {
      const auto* kp = reinterpret_cast<const disk::Key*>(buf.data() + 64 + i * isz);
      return std::pair<uint64_t, uint64_t>(kp->hi.get(), kp->lo.get());
    };
    const std::pair<uint64_t, uint64_t> want(k, lo);
    if (h->level == 0) {
      for (uint32_t i = 0; i < n; i++)
        if (key_at(i) == want) return std::pair{b, i};
      return Error::io(ENOENT, "no item with key (" + std::to_string(k) + ", " + std::to_string(lo) + ")");
    }
    uint32_t child = 0;
    for (uint32_t i = 0; i < n; i++)
      if (key_at(i) <= want) child = i;
    b = reinterpret_cast<const disk::InnerItem*>(buf.data() + 64 + child * isz)->child.get();
  }
  return Error::corrupt(root, "tree deeper than any valid tree");
}

Result<std::string> corrupt_node_field(std::vector<std::byte>& buf, const std::string& field,
                                       const CorruptAction& a) {
  const auto* h = reinterpret_cast<const disk::NodeHeader*>(buf.data());
  if (auto f = lookup(kNodeHeader, field)) return apply(buf.data() + f->offset, f->width, a);
  // item.I.<part> or value.I
  unsigned idx = 0;
  char part[32] = {};
  const bool leaf = h->level == 0;
  const size_t isz = leaf ? sizeof(disk::LeafItem) : sizeof(disk::InnerItem);
  if (std::sscanf(field.c_str(), "item.%u.%31s", &idx, part) == 2) {
    if (64 + (idx + 1) * isz > buf.size()) return Error::invalid("item index out of range");
    std::byte* it = buf.data() + 64 + idx * isz;
    const std::string p = part;
    if (p == "key.hi") return apply(it, 8, a);
    if (p == "key.lo") return apply(it + 8, 8, a);
    if (leaf && p == "value_offset") return apply(it + 16, 4, a);
    if (leaf && p == "value_len") return apply(it + 20, 4, a);
    if (!leaf && p == "child") return apply(it + 16, 8, a);
    if (!leaf && p == "child_gen") return apply(it + 24, 8, a);
    return Error::invalid("no item field '" + p + "' in a " + (leaf ? "leaf" : "inner node"));
  }
  if (leaf && std::sscanf(field.c_str(), "value.%u", &idx) == 1) {
    if (64 + (idx + 1) * isz > buf.size()) return Error::invalid("item index out of range");
    const auto* it = reinterpret_cast<const disk::LeafItem*>(buf.data() + 64 + idx * isz);
    const uint32_t off = it->value_offset.get(), len = it->value_len.get();
    if (len == 0 || off + len > buf.size()) return Error::invalid("the value is empty or out of range");
    return apply(buf.data() + off, std::min<uint32_t>(8, len), a);
  }
  return Error::invalid("no node field '" + field + "'");
}

void seal_node_bytes(std::vector<std::byte>& buf) {
  put_le(buf.data(), 8, xxh3(buf.data() + 8, buf.size() - 8));
}

}  // namespace

Result<std::string> corrupt_leaf_item(BlockDevice& dev, uint64_t tree, uint64_t key_hi, uint64_t key_lo,
                                      const std::string& field, const CorruptAction& a) {
  static const char* const kFields[] = {"key.hi", "key.lo", "value_offset", "value_len"};
  // "first." and "last.": that item of the leaf instead, so that a key can
  // be moved past the leaf's neighbours while the leaf's own order holds.
  std::string f = field;
  int which = 0;
  if (f.starts_with("first.")) which = 1, f = f.substr(6);
  else if (f.starts_with("last.")) which = 2, f = f.substr(5);
  if (std::find(std::begin(kFields), std::end(kFields), f) == std::end(kFields))
    return Error::invalid("no leaf item field '" + field +
                          "' ([first.|last.]key.hi, key.lo, value_offset, value_len)");
  auto ch = read_superblocks(dev);
  if (!ch) return Error::invalid("no valid superblock to find the tree by: " + ch.error().reason);
  const uint32_t bs = ch->info.block_size;
  // The tree's root, from its root record (format.md#root-record).
  auto [rleaf, ridx] = PLY_TRY(find_item(dev, bs, ch->info.root_tree.block.v, tree));
  auto rbuf = PLY_TRY(read_block(dev, rleaf, bs));
  const auto* rit = reinterpret_cast<const disk::LeafItem*>(rbuf.data() + 64 + ridx * sizeof(disk::LeafItem));
  const uint32_t roff = rit->value_offset.get();
  if (roff > bs || bs - roff < sizeof(disk::RootRecord)) return Error::corrupt(rleaf, "root record out of range");
  disk::RootRecord rec;
  std::memcpy(&rec, rbuf.data() + roff, sizeof rec);
  auto [leaf, idx] = PLY_TRY(find_item(dev, bs, rec.root_block.get(), key_hi, key_lo));
  auto buf = PLY_TRY(read_block(dev, leaf, bs));
  const uint32_t n = reinterpret_cast<const disk::NodeHeader*>(buf.data())->nitems.get();  // find_item checked it
  if (which == 1) idx = 0;
  if (which == 2) idx = n - 1;
  const disk::Key* kp = reinterpret_cast<const disk::Key*>(buf.data() + 64 + idx * sizeof(disk::LeafItem));
  key_hi = kp->hi.get(), key_lo = kp->lo.get();
  auto what = PLY_TRY(corrupt_node_field(buf, "item." + std::to_string(idx) + "." + f, a));
  if (a.fix_checksum) seal_node_bytes(buf);
  PLY_CHECK(dev.write(leaf * bs, buf));
  PLY_CHECK(dev.flush());
  return "tree " + std::to_string(tree) + " item (" + std::to_string(key_hi) + ", " + std::to_string(key_lo) +
         "), item " + std::to_string(idx) + " of leaf " + std::to_string(leaf) + ", " + field + ": " + what;
}

const char* corrupt_struct_name(CorruptStruct s) {
  switch (s) {
    case CorruptStruct::Superblock: return "superblock";
    case CorruptStruct::Node: return "node";
    case CorruptStruct::SpaceItem: return "space-item";
    case CorruptStruct::RootRecord: return "root-record";
  }
  return "?";
}

std::vector<std::string> corrupt_fields(CorruptStruct s) {
  std::vector<std::string> out;
  switch (s) {
    case CorruptStruct::Superblock: for (const auto& f : kSuperFields) out.push_back(f.name); break;
    case CorruptStruct::Node:
      for (const auto& f : kNodeHeader) out.push_back(f.name);
      for (const char* f : {"item.N.key.hi", "item.N.key.lo", "item.N.value_offset",
                            "item.N.value_len", "item.N.child", "item.N.child_gen", "value.N"})
        out.push_back(f);
      break;
    case CorruptStruct::SpaceItem: for (const auto& f : kSpaceFields) out.push_back(f.name); break;
    case CorruptStruct::RootRecord: for (const auto& f : kRecordFields) out.push_back(f.name); break;
  }
  return out;
}

Result<std::string> corrupt(BlockDevice& dev, const CorruptTarget& t, const CorruptAction& a) {
  // The superblock that locates everything else.
  int slot = t.slot;
  SuperInfo sb;
  {
    auto ch = read_superblocks(dev);
    if (ch) {
      sb = ch->info;
      if (slot < 0) slot = ch->slot;
    } else if (t.what != CorruptStruct::Superblock || slot < 0) {
      return Error::invalid("no valid superblock to find the structure by: " + ch.error().reason);
    }
  }
  const bool fix = a.fix_checksum && t.field != "checksum";

  if (t.what == CorruptStruct::Superblock) {
    if (slot != 0 && slot != 1) return Error::invalid("superblock slot must be 0 or 1");
    auto f = lookup(kSuperFields, t.field);
    if (!f) return Error::invalid("no superblock field '" + t.field + "'");
    std::vector<std::byte> buf(disk::kSuperSize);
    PLY_CHECK(dev.read(disk::kSuperOffset[slot], buf));
    auto what = PLY_TRY(apply(buf.data() + f->offset, f->width, a));
    if (fix) put_le(buf.data() + 4080, 8, xxh3(buf.data(), 4080));
    PLY_CHECK(dev.write(disk::kSuperOffset[slot], buf));
    PLY_CHECK(dev.flush());
    return "superblock slot " + std::to_string(slot) + " " + t.field + ": " + what;
  }

  const uint32_t bs = sb.block_size;
  uint64_t block = t.locator;
  std::string field = t.field;
  std::string where = "node " + std::to_string(block);
  if (t.what == CorruptStruct::SpaceItem || t.what == CorruptStruct::RootRecord) {
    const bool space = t.what == CorruptStruct::SpaceItem;
    auto f = space ? lookup(kSpaceFields, t.field) : lookup(kRecordFields, t.field);
    if (!f) return Error::invalid(std::string("no ") + corrupt_struct_name(t.what) + " field '" + t.field + "'");
    auto [leaf, idx] = PLY_TRY(find_item(dev, bs, (space ? sb.space_tree : sb.root_tree).block.v, t.locator));
    auto buf = PLY_TRY(read_block(dev, leaf, bs));
    const auto* it = reinterpret_cast<const disk::LeafItem*>(buf.data() + 64 + idx * sizeof(disk::LeafItem));
    const uint32_t off = it->value_offset.get();
    if (off + f->offset + f->width > bs) return Error::corrupt(leaf, "item value out of range");
    auto what = PLY_TRY(apply(buf.data() + off + f->offset, f->width, a));
    if (fix) seal_node_bytes(buf);
    PLY_CHECK(dev.write(leaf * bs, buf));
    PLY_CHECK(dev.flush());
    return std::string(corrupt_struct_name(t.what)) + " " + std::to_string(t.locator) + " (in node " +
           std::to_string(leaf) + ") " + t.field + ": " + what;
  }
  auto buf = PLY_TRY(read_block(dev, block, bs));
  auto what = PLY_TRY(corrupt_node_field(buf, field, a));
  if (fix) seal_node_bytes(buf);
  PLY_CHECK(dev.write(block * bs, buf));
  PLY_CHECK(dev.flush());
  return where + " " + field + ": " + what;
}

}  // namespace plyfs
