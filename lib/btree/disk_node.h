// On-disk B+tree node (format.md#btree-node). One node fills one block.
#pragma once

#include <type_traits>

#include "util/endian.h"

namespace plyfs::disk {

inline constexpr uint32_t kNodeMagic = 0x4e594c50;  // "PLYN"

struct NodeHeader {        // format.md#btree-node
  le64 checksum;           // XXH3-64 over bytes [8, block_size)
  le32 magic;              // kNodeMagic
  uint8_t level;           // 0 = leaf
  uint8_t flags;           // none defined; must be 0
  le16 nitems;
  le64 owner;              // id of the tree that wrote this node
  le64 generation;         // generation in which the node was written
  le64 blockno;            // the node's own block number
  le64 fs_id;              // superblock fs_id: rejects blocks of an older mkfs
  le32 value_start;        // leaf: values lie in [value_start, block end); inner: 0
  le32 reserved0;          // 0
  le64 reserved1;          // 0
};
static_assert(sizeof(NodeHeader) == 64);

struct Key {               // compared as (hi, lo), unsigned
  le64 hi;
  le64 lo;
};
static_assert(sizeof(Key) == 16);

struct LeafItem {          // format.md#btree-node, leaf slots
  Key key;
  le32 value_offset;       // from the start of the block
  le32 value_len;
};
static_assert(sizeof(LeafItem) == 24);

struct InnerItem {         // format.md#btree-node, inner slots
  Key key;                 // the lowest key in the child's subtree
  le64 child;              // block number
  le64 child_gen;          // the child's header generation
};
static_assert(sizeof(InnerItem) == 32);

static_assert(std::is_trivially_copyable_v<NodeHeader> && std::is_trivially_copyable_v<LeafItem> &&
              std::is_trivially_copyable_v<InnerItem>);

}  // namespace plyfs::disk
