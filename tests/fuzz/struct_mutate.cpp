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
  return m;
}

size_t whole_patches(const uint8_t* data, size_t size) {
  size_t i = 0;
  while (i + 8 <= size && i + 8 + data[i + 6] <= size) i += 8 + data[i + 6];
  return i;
}

std::string append_struct_patch(std::vector<uint8_t>& input, const NodeMap& m, std::mt19937_64& rng) {
  if (m.nodes.empty() || m.block_size != 4096 || rng() % 20 == 0) return super_patch(input, m, rng);
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
