// Structure-aware mutations (struct_mutate.h). The layouts come from the
// on-disk headers (format.md#btree-node, #superblock), so the mutations
// follow the format.
#include "struct_mutate.h"

#include <cstddef>
#include <cstring>
#include <set>

#include "blockdev/test_devices.h"
#include "btree/btree.h"
#include "btree/disk_node.h"
#include "commit/disk_superblock.h"
#include "commit/superblock.h"
#include "commit/volume.h"
#include "fs/items.h"
#include "util/checksum.h"

namespace plyfs::fuzz {

namespace {

uint64_t load(const std::vector<uint8_t>& b, size_t at, size_t w) {
  uint64_t v = 0;
  for (size_t i = w; i-- > 0;) v = v << 8 | b[at + i];
  return v;
}

void walk(BlockDevice& dev, const SuperInfo& sb, uint64_t tree, const RootPtr& root, NodeMap& out,
          std::set<uint64_t>& seen) {
  BlockCache cache(dev, sb.block_size, 4 << 20);
  WalkMemo memo;
  std::vector<Problem> problems;
  WalkHooks h;
  h.on_node = [&](BlockNo b, int level, Generation, uint64_t, bool first) {
    if (!first || !seen.insert(b.v).second) return;
    NodeMap::Node n;
    n.block = b.v;
    n.tree = tree;
    n.level = level;
    n.bytes.resize(sb.block_size);
    if (!dev.read(b.v * sb.block_size, std::span(reinterpret_cast<std::byte*>(n.bytes.data()), n.bytes.size())))
      return;
    out.nodes.push_back(std::move(n));
  };
  check_tree(cache, sb.fs_id, root, sb.generation, h, memo, problems);
}

// A value that breaks something, given the field's current value, its
// neighbours' and the image's numbers.
uint64_t pick(std::mt19937_64& rng, uint64_t cur, uint64_t prev, uint64_t next, const NodeMap& m,
              uint64_t width_mask) {
  const uint64_t choices[] = {cur + 1,
                              cur - 1,
                              prev,
                              next,
                              next + 1,
                              prev - 1,
                              0,
                              1,
                              ~0ull,
                              1ull << 63,
                              0x10000000000001fbull,  // issue 21's key
                              m.next_inode,
                              m.next_inode - 1,
                              m.next_inode + 1,
                              m.total_blocks,
                              m.total_blocks - 1,
                              m.first_block - 1,
                              cur ^ (1ull << (rng() % 64)),
                              cur * 2,
                              rng()};
  return choices[rng() % std::size(choices)] & width_mask;
}

uint64_t mask(size_t w) { return w >= 8 ? ~0ull : (1ull << (8 * w)) - 1; }

void emit(std::vector<uint8_t>& input, uint64_t block, uint32_t off, size_t w, uint64_t v) {
  uint8_t head[8];
  const uint32_t b = uint32_t(block);
  const uint16_t o = uint16_t(off);
  std::memcpy(head, &b, 4);
  std::memcpy(head + 4, &o, 2);
  head[6] = uint8_t(w);
  head[7] = 1;  // re-seal the node's or the superblock's checksum
  input.insert(input.end(), head, head + 8);
  for (size_t i = 0; i < w; i++) input.push_back(uint8_t(v >> (8 * i)));
}

// `bytes` at `off` of `block` (absolute), with flags (bit 0: re-seal).
void emit_bytes(std::vector<uint8_t>& input, uint64_t block, uint32_t off, const std::vector<uint8_t>& bytes,
                uint8_t flags) {
  uint8_t head[8];
  const uint32_t b = uint32_t(block);
  const uint16_t o = uint16_t(off);
  std::memcpy(head, &b, 4);
  std::memcpy(head + 4, &o, 2);
  head[6] = uint8_t(bytes.size());
  head[7] = flags;
  input.insert(input.end(), head, head + 8);
  input.insert(input.end(), bytes.begin(), bytes.end());
}

// The compressed extent items of a leaf of a filesystem tree.
void leaf_frames(BlockDevice& dev, const NodeMap::Node& n, uint32_t bs, NodeMap& out) {
  const auto& b = n.bytes;
  const uint32_t nitems = uint32_t(load(b, offsetof(disk::NodeHeader, nitems), 2));
  for (uint32_t i = 0; i < nitems; i++) {
    const size_t item = 64 + i * sizeof(disk::LeafItem);
    if (item + sizeof(disk::LeafItem) > b.size()) return;
    const Key k{load(b, item, 8), load(b, item + 8, 8)};
    const uint32_t voff = uint32_t(load(b, item + 16, 4)), vlen = uint32_t(load(b, item + 20, 4));
    if (fsitems::type_of(k) != disk::ItemType::Extent || voff > b.size() || vlen > b.size() - voff) continue;
    auto e = fsitems::decode_extent(k, std::span(reinterpret_cast<const std::byte*>(b.data()) + voff, vlen));
    if (!e || !e->compressed() || e->disk_nblocks > 64) continue;
    NodeMap::Frame f;
    f.node = n.block;
    f.value = voff;
    f.ino = k.hi;
    f.file_blk = fsitems::off_of(k);
    f.disk_start = e->disk_start;
    f.disk_nblocks = e->disk_nblocks;
    f.frame_bytes = e->frame_bytes;
    f.ram_blocks = e->ram_blocks;
    f.stored.resize(e->disk_nblocks * bs);
    if (!dev.read(e->disk_start * bs, std::span(reinterpret_cast<std::byte*>(f.stored.data()), f.stored.size())))
      continue;
    out.frames.push_back(std::move(f));
  }
}

std::string super_patch(std::vector<uint8_t>& input, const NodeMap& m, std::mt19937_64& rng) {
  struct F {
    const char* name;
    size_t off, w;
  };
  static const F fields[] = {
      {"next_inode", offsetof(disk::SuperSector0, next_inode), 8},
      {"next_tree_id", offsetof(disk::SuperSector0, next_tree_id), 8},
      {"used_blocks", offsetof(disk::SuperSector0, used_blocks), 8},
      {"meta_blocks", offsetof(disk::SuperSector0, meta_blocks), 8},
      {"data_blocks", offsetof(disk::SuperSector0, data_blocks), 8},
      {"total_blocks", offsetof(disk::SuperSector0, total_blocks), 8},
      {"incompat", offsetof(disk::SuperSector0, incompat), 8},
      {"root_tree.block", offsetof(disk::SuperSector0, root_tree) + offsetof(disk::RootPtr, block), 8},
      {"space_tree.block", offsetof(disk::SuperSector0, space_tree) + offsetof(disk::RootPtr, block), 8},
      {"root_tree.level", offsetof(disk::SuperSector0, root_tree) + offsetof(disk::RootPtr, level), 1},
  };
  const F& f = fields[rng() % std::size(fields)];
  const int slot = int(rng() % 2);
  const uint64_t at = disk::kSuperOffset[slot] + f.off;
  const uint64_t v = pick(rng, 0, 0, 0, m, mask(f.w));
  emit(input, at / 4096, uint32_t(at % 4096), f.w, v);
  return "superblock slot " + std::to_string(slot) + " " + f.name + " = " + std::to_string(v);
}

}  // namespace

NodeMap map_nodes(const MemDevice& base) {
  NodeMap m;
  auto dev = base.clone();
  auto ch = read_superblocks(*dev);
  if (!ch) return m;
  const SuperInfo& sb = ch->info;
  m.total_blocks = sb.total_blocks;
  m.first_block = sb.first_block;
  m.next_inode = sb.next_inode;
  m.block_size = sb.block_size;
  std::set<uint64_t> seen;
  walk(*dev, sb, 1, sb.root_tree, m, seen);
  walk(*dev, sb, 2, sb.space_tree, m, seen);
  VolumeOptions vo;
  vo.read_only = true;
  vo.kinds = {};  // only the trees' roots are needed
  if (auto vol = Volume::open(*dev, vo))
    if (auto txn = (*vol)->begin())
      if (auto trees = txn->list_trees())
        for (const auto& t : *trees) walk(*dev, sb, t.id.v, t.root, m, seen);
  for (const auto& n : m.nodes)
    if (n.level == 0 && n.tree >= 256 && sb.block_size == 4096) leaf_frames(*dev, n, sb.block_size, m);
  return m;
}

std::string append_frame_patch(std::vector<uint8_t>& input, const NodeMap& m, size_t index, FrameDamage kind,
                               uint64_t variant) {
  const NodeMap::Frame& f = m.frames[index % m.frames.size()];
  const uint32_t bs = m.block_size;
  const uint64_t d = f.disk_nblocks;
  std::string where = "compressed extent of inode " + std::to_string(f.ino) + " at file block " +
                      std::to_string(f.file_blk) + " (frame of " + std::to_string(f.frame_bytes) + " bytes in " +
                      std::to_string(d) + " blocks at " + std::to_string(f.disk_start) + ", " +
                      std::to_string(f.ram_blocks) + " blocks decoded): ";
  // The item's fields: re-sealed patches of the leaf.
  auto field = [&](uint32_t at, uint32_t cur, std::initializer_list<uint64_t> values, const char* name) {
    const std::vector<uint64_t> vs(values);
    const uint32_t v = uint32_t(vs[variant % vs.size()]);
    emit(input, f.node, f.value + uint32_t(sizeof(disk::Extent)) + at, 4, v);
    return where + name + " " + std::to_string(cur) + " -> " + std::to_string(v);
  };
  if (kind == FrameDamage::FrameBytes)
    return field(offsetof(disk::ExtentFrame, frame_bytes), f.frame_bytes,
                 {f.frame_bytes / 2, f.frame_bytes - 1, (d - 1) * bs + 1, d * bs, f.frame_bytes + 1, d * bs + 1,
                  0, 1, 0xffffffffu},
                 "frame_bytes");
  if (kind == FrameDamage::RamBlocks)
    return field(offsetof(disk::ExtentFrame, ram_blocks), f.ram_blocks,
                 {f.ram_blocks + 1, disk::kMaxExtentBlocks, f.ram_blocks - 1, d + 1, disk::kMaxExtentBlocks + 1,
                  d, 2, f.ram_blocks * 2, 0xffffffffu},
                 "ram_blocks");
  // The stored bytes [at, at + n), all in one block, xor-ed with a pattern
  // that changes every one of them.
  const auto& z = f.stored;
  uint64_t at = 0, n = 1;
  std::string what;
  switch (kind) {
    case FrameDamage::Magic:
      at = variant % 4, n = 1 + variant / 4 % (4 - at), what = "frame magic";
      break;
    case FrameDamage::ContentSize: {
      // RFC 8878 3.1.1.1: the descriptor, the window descriptor unless
      // single-segment, the dictionary id, then the content size.
      const uint8_t desc = z.size() > 4 ? z[4] : 0;
      const bool single = desc & 0x20;
      const unsigned fcs_flag = desc >> 6, did = desc & 3;
      const uint64_t fcs_at = 5 + (single ? 0 : 1) + (did == 3 ? 4 : did);
      const uint64_t fcs_len = fcs_flag == 0 ? (single ? 1 : 0) : 1ull << fcs_flag;
      if (fcs_len == 0) {
        at = 4, n = 1, what = "frame header descriptor";
      } else {
        at = fcs_at + variant % fcs_len, n = 1, what = "frame content size";
      }
      break;
    }
    case FrameDamage::Tail:
      n = 1 + variant % 8;
      at = f.frame_bytes > n ? f.frame_bytes - n : 0;
      what = "frame tail";
      break;
    default:
      at = f.frame_bytes ? variant % f.frame_bytes : 0, n = 1 + variant / 7 % 4, what = "frame bytes";
      break;
  }
  const uint64_t blk = at / bs;
  if (blk >= d) return where + "nothing (no such byte)";
  n = std::min<uint64_t>(n, (blk + 1) * bs - at);
  std::vector<uint8_t> block(z.begin() + long(blk * bs), z.begin() + long((blk + 1) * bs));
  std::vector<uint8_t> bytes(n);
  for (uint64_t i = 0; i < n; i++) {
    const uint8_t x = uint8_t(1 + (variant >> (8 * (i % 8)) & 0xff) % 255);
    bytes[i] = block[at % bs + i] ^ x;
    block[at % bs + i] = bytes[i];
  }
  emit_bytes(input, f.disk_start + blk, uint32_t(at % bs), bytes, 0);
  // The item's checksum of that stored block, recomputed: the damage is
  // the decoder's to find (and fsck -c's F7-data).
  const uint64_t sum = xxh3(block.data(), block.size());
  emit(input, f.node,
       f.value + uint32_t(sizeof(disk::Extent) + sizeof(disk::ExtentFrame) + 8 * blk), 8, sum);
  return where + what + " at byte " + std::to_string(at) + " (" + std::to_string(n) +
         " bytes), the block's checksum re-sealed";
}

size_t whole_patches(const uint8_t* data, size_t size) {
  size_t i = 0;
  while (i + 8 <= size && i + 8 + data[i + 6] <= size) i += 8 + data[i + 6];
  return i;
}

std::string append_struct_patch(std::vector<uint8_t>& input, const NodeMap& m, std::mt19937_64& rng) {
  if (m.nodes.empty() || m.block_size != 4096 || rng() % 20 == 0) return super_patch(input, m, rng);
  if (!m.frames.empty() && rng() % 5 == 0) {
    const size_t i = rng() % m.frames.size();
    const auto kind = FrameDamage(rng() % 6);
    return append_frame_patch(input, m, i, kind, rng());
  }
  const NodeMap::Node& n = m.nodes[rng() % m.nodes.size()];
  const auto& b = n.bytes;
  const uint32_t nitems = uint32_t(load(b, offsetof(disk::NodeHeader, nitems), 2));
  const bool leaf = n.level == 0;
  const size_t isz = leaf ? sizeof(disk::LeafItem) : sizeof(disk::InnerItem);
  std::string where = "node " + std::to_string(n.block) + " (tree " + std::to_string(n.tree) + ") ";
  size_t off = 0, w = 8;
  uint64_t prev = 0, next = 0;
  std::string field;
  const unsigned roll = unsigned(rng() % 100);
  if (nitems == 0 || roll < 6) {
    struct F {
      const char* name;
      size_t off, w;
    };
    static const F header[] = {{"nitems", offsetof(disk::NodeHeader, nitems), 2},
                               {"level", offsetof(disk::NodeHeader, level), 1},
                               {"generation", offsetof(disk::NodeHeader, generation), 8},
                               {"owner", offsetof(disk::NodeHeader, owner), 8},
                               {"value_start", offsetof(disk::NodeHeader, value_start), 4}};
    const F& f = header[rng() % std::size(header)];
    off = f.off, w = f.w, field = f.name;
  } else {
    // The first and last items more often: their keys border the siblings.
    uint32_t i = uint32_t(rng() % nitems);
    if (rng() % 3 == 0) i = rng() % 2 ? 0 : nitems - 1;
    const size_t item = 64 + i * isz;
    if (item + isz > b.size()) return super_patch(input, m, rng);
    where += "item " + std::to_string(i) + " ";
    auto neighbour = [&](uint32_t j, size_t at) { return j < nitems ? load(b, 64 + j * isz + at, 8) : 0; };
    if (roll < 40) {  // key.hi
      off = item, field = "key.hi";
      prev = neighbour(i - 1, 0), next = neighbour(i + 1, 0);
    } else if (roll < 55) {  // key.lo: the type byte or the offset
      off = item + 8, field = "key.lo";
      prev = neighbour(i - 1, 8), next = neighbour(i + 1, 8);
      if (rng() % 2) {
        off = item + 15, w = 1, field = "key.lo type";
        prev = prev >> 56, next = next >> 56;
      }
    } else if (!leaf) {  // child or child_gen
      const bool gen = roll >= 85;
      off = item + (gen ? 24 : 16), field = gen ? "child_gen" : "child";
      const auto& other = m.nodes[rng() % m.nodes.size()];
      prev = other.block, next = neighbour(i + 1, gen ? 24 : 16);
    } else if (roll < 70) {  // value_offset or value_len
      const bool len = rng() % 2;
      off = item + (len ? 20 : 16), w = 4, field = len ? "value_len" : "value_offset";
      prev = load(b, 64 + (i ? i - 1 : i + 1 < nitems ? i + 1 : i) * isz + 16, 4);
      next = load(b, item + (len ? 16 : 20), 4);
    } else {  // a field of the value: 1, 2, 4 or 8 bytes, aligned
      const uint32_t voff = uint32_t(load(b, item + 16, 4)), vlen = uint32_t(load(b, item + 20, 4));
      if (vlen == 0 || voff >= b.size() || vlen > b.size() - voff) return super_patch(input, m, rng);
      static const size_t widths[] = {1, 2, 4, 8};
      w = widths[rng() % 4];
      while (w > vlen) w /= 2;
      const uint32_t at = uint32_t(rng() % (vlen - w + 1)) / uint32_t(w) * uint32_t(w);
      off = voff + at, field = "value byte " + std::to_string(at);
      prev = neighbour(i, 0), next = m.next_inode;
    }
  }
  if (off + w > b.size()) return super_patch(input, m, rng);
  const uint64_t cur = load(b, off, w);
  const uint64_t v = pick(rng, cur, prev, next, m, mask(w));
  emit(input, n.block, uint32_t(off), w, v);
  return where + field + ": " + std::to_string(cur) + " -> " + std::to_string(v);
}

}  // namespace plyfs::fuzz
